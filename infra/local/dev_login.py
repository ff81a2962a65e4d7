"""The local stand-in for a shop's identity provider, for `VQ_IDENTITY=jwt make run` and the browser tests.

It makes an RSA key for the run, publishes its public half as the JWKS the API verifies against (VQ_JWKS), and
signs JWTs for whoever signs in at the demo shop's `/login` (infra/local/demo_shop.py): a form that asks for a
user name and sends the browser back to the waiting room with the JWT and the page's `state` in the URL fragment, as
a shop's login must (docs/identity.md: the page). Nothing checks a password: it is a demo.
"""

from __future__ import annotations

import json
import time

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

ISSUER = "http://127.0.0.1/dev-login"
AUDIENCE = "virtual-queue-local"
KID = "dev-1"


class DevLogin:
    """A throwaway signing key, its JWKS, and the JWTs it signs (`ttl_s` long)."""

    def __init__(self, ttl_s: int = 3600) -> None:
        self.ttl_s = ttl_s
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwks(self) -> dict:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self._key.public_key()))
        return {"keys": [{**public, "kid": KID, "use": "sig", "alg": "RS256"}]}

    def token(self, user: str, ttl_s: int | None = None, **claims: object) -> str:
        """A JWT naming `user`, valid for `ttl_s` (negative: already expired)."""
        now = int(time.time())
        payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": user, "iat": now, "exp": now + (ttl_s or self.ttl_s)}
        return jwt.encode({**payload, **claims}, self._key, algorithm="RS256", headers={"kid": KID})

    def env(self, login_url: str) -> dict[str, str]:
        """The API's settings for this provider; the page sends a shopper to `login_url` for a new JWT."""
        return {
            "VQ_IDENTITY": "jwt",
            "VQ_JWKS": json.dumps(self.jwks()),
            "VQ_JWT_ISSUER": ISSUER,
            "VQ_JWT_AUDIENCE": AUDIENCE,
            "VQ_LOGIN_URL": login_url,
        }
