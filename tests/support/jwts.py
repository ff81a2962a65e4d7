"""A stand-in identity provider for the tests of VQ_IDENTITY=jwt: its keys (RSA, EC P-256, and an HS256 secret), its
JWKS, and JWTs signed as a shop's provider signs them, or as an attacker would.

The keys are made once per test run; `jwt_env` is the environment that points the app at them.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import time

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

ISSUER = "https://login.shop.example/"
AUDIENCE = "virtual-queue"
SECRET = "hs256-test-secret-0123456789abcdefghijklmnop"


@functools.cache
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@functools.cache
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@functools.cache
def other_rsa_key() -> rsa.RSAPrivateKey:
    """A key the provider never published: what an attacker signs with."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def public_jwk(kid: str, key=None) -> dict:
    """The public JWK of the RSA key (or `key`), under `kid`."""
    public = (key or rsa_key()).public_key()
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(public))
    return {**jwk, "kid": kid, "use": "sig", "alg": "RS256"}


def jwks(*, ec_too: bool = True, secret_too: bool = True) -> dict:
    """The provider's JWKS: RSA `rsa-1`, EC P-256 `ec-1`, oct `hs-1`."""
    keys = [public_jwk("rsa-1")]
    if ec_too:
        keys.append({**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(ec_key().public_key())), "kid": "ec-1"})
    if secret_too:
        keys.append({"kty": "oct", "kid": "hs-1", "k": b64(SECRET.encode())})
    return {"keys": keys}


def jwt_env(**more: str) -> dict[str, str]:
    """The settings of VQ_IDENTITY=jwt with this provider's JWKS inline."""
    return {
        "VQ_IDENTITY": "jwt",
        "VQ_JWKS": json.dumps(jwks()),
        "VQ_JWT_ISSUER": ISSUER,
        "VQ_JWT_AUDIENCE": AUDIENCE,
        **more,
    }


def claims(user: str = "auth0|7", ttl_s: int = 3600, **more) -> dict:
    now = int(time.time())
    return {"iss": ISSUER, "aud": AUDIENCE, "sub": user, "iat": now, "exp": now + ttl_s, **more}


def sign(payload: dict, alg: str = "RS256", kid: str | None = "rsa-1", key=None) -> str:
    """A JWT of `payload` signed with the provider's key for `alg` (or `key`)."""
    if key is None:
        key = {"RS256": rsa_key(), "ES256": ec_key(), "HS256": SECRET.encode()}[alg]
    headers = {"kid": kid} if kid is not None else {}
    return jwt.encode(payload, key, algorithm=alg, headers=headers)


def token(user: str = "auth0|7", **more) -> str:
    """A valid RS256 JWT for `user`."""
    return sign(claims(user, **more))


def bearer(user: str = "auth0|7", **more) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(user, **more)}"}


def hand_signed(header: dict, payload: dict, secret: bytes | None) -> str:
    """A JWT signed by hand: HS256 with `secret`, or unsigned (`alg: none`) when None. PyJWT refuses to make
    either of the attacks these stand for."""
    head = b64(json.dumps(header).encode()) + "." + b64(json.dumps(payload).encode())
    if secret is None:
        return head + "."
    return head + "." + b64(hmac.new(secret, head.encode(), hashlib.sha256).digest())


def public_pem() -> bytes:
    return (
        rsa_key().public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def realistic_claims(user: str = "auth0|65f1c0d2e4b0a1b2c3d4e5f6") -> dict:
    """The claims of an OIDC access token as Auth0 or Cognito issue them: about 1 KB signed."""
    return claims(
        user,
        azp="Xq3f9T2bLm8Rk1vW0yZp5sDn7hJc4gAe",
        scope="openid profile email offline_access read:orders write:orders",
        permissions=["read:orders", "write:orders", "read:profile"],
        gty="authorization_code",
        auth_time=int(time.time()) - 120,
        nonce="n-0S6_WzA2Mj",
        sid="b1f9d3c2-7e4a-4c8b-9f2d-3a6e5c1b0d7f",
        email="shopper@example.com",
        email_verified=True,
        name="A. Shopper",
        vq_invites=["limited-drop:1", "ticketing-event:77"],
    )
