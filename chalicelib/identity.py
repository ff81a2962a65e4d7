"""Who is calling: the one place that knows how a caller is identified (docs/identity.md).

`VQ_IDENTITY=header` takes the caller's word in `X-User-Id`, for local runs and for a deployment behind the shop's
own gateway that sets the header. `VQ_IDENTITY=jwt` verifies an `Authorization: Bearer` JWT of the shop's identity
provider against its keys (a JWKS document inline, or fetched from a URL), issuer and audience; the user is one
claim (`sub` by default), and `vq_invites` lists the targets of an invite-only sale the user may enter. The routes
and the purchase authorizer ask `Identity.caller`; the queue only ever sees the verified user id.

A key's type fixes its algorithm (RSA: RS256, EC P-256: ES256, oct: HS256), never the token's header, so `none`
and a public key used as an HMAC secret are refused. Verified tokens are kept per container until they expire,
keyed by their SHA-256, so a poll re-verifies nothing (docs/benchmarks.md: identity).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import jwt

from chalicelib.config import ConfigError, JwtSettings, Settings
from chalicelib.errors import QueueUnavailable, Unauthenticated
from chalicelib.observability import count, logger
from chalicelib.refresh import BackgroundRefresh
from chalicelib.targets import Target, parse_user_id, valid_user_id

INVITES_CLAIM = "vq_invites"
# The algorithm each key type verifies, and nothing else.
ALGORITHMS = {"RSA": "RS256", "EC": "ES256", "oct": "HS256"}
MIN_SECRET_BYTES = 32  # an HS256 key shorter than its hash is guessable
MAX_JWT_CHARS = 8192  # refused before any work: a realistic JWT is 1 to 2 KB
VERIFIED_KEPT = 10_000  # verified tokens kept per container, at most (about 4 MB)
UNKNOWN_KEY_REFETCH_S = 60  # an unknown `kid` fetches the JWKS again at most this often
FETCH_TIMEOUT_S = 2.0  # per connect and per read, as every other outbound call (chalicelib/aws.py)
FETCH_WAIT_S = 3.0  # how long a request waits for a fetch it needs (the first, or one for an unknown kid)
MAX_JWKS_BYTES = 256 * 1024
_BEARER = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +([A-Za-z0-9._~+/-]+=*) *")
# What each of PyJWT's refusals means, in the 401's words (the first that matches; InvalidSignatureError is a
# DecodeError). The library's own names stay out of the answer.
_REFUSALS: tuple[tuple[type[Exception], str], ...] = (
    (jwt.ExpiredSignatureError, "the JWT has expired"),
    (jwt.ImmatureSignatureError, "the JWT is not valid yet: its nbf or iat is ahead of now"),
    (jwt.InvalidSignatureError, "the JWT's signature does not verify"),
    (jwt.InvalidAlgorithmError, "the JWT is signed with another algorithm than its key's"),
    (jwt.InvalidIssuerError, "the JWT was issued by another issuer than VQ_JWT_ISSUER"),
    (jwt.InvalidAudienceError, "the JWT is for another audience than VQ_JWT_AUDIENCE"),
    (jwt.InvalidIssuedAtError, "the JWT's iat claim is not a time"),
    (jwt.DecodeError, "the JWT is malformed: its payload, or an exp or nbf that is not a number"),
)


@dataclass(frozen=True)
class Caller:
    """A verified caller: their user id, and the targets their invites name (docs/identity.md: invite-only)."""

    user_id: str
    invites: frozenset[str] = frozenset()

    def invited_to(self, target: Target) -> bool:
        return str(target) in self.invites


class Identity(Protocol):
    def caller(self, headers: Mapping[str, str]) -> Caller:
        """The caller of a request with `headers` (names in lower case, or a case-insensitive mapping).
        Raises InvalidArgument or Unauthenticated; QueueUnavailable when the keys cannot be had."""
        ...


class HeaderIdentity:
    """`X-User-Id`, as set by an upstream the shop trusts. It carries no invites."""

    def caller(self, headers: Mapping[str, str]) -> Caller:
        return Caller(parse_user_id(headers.get("x-user-id")))


def page_identity(settings: Settings) -> dict[str, str | None]:
    """What the waiting-room page must know of the mode: how to send its shopper, and where to sign in again
    (docs/identity.md: the page)."""
    if settings.jwt is None:
        return {"mode": "header"}
    return {"mode": "jwt", "userClaim": settings.jwt.user_claim, "loginUrl": settings.login_url}


def fetch_jwks(url: str) -> Any:
    """The JSON document at `url`, within FETCH_TIMEOUT_S per connect and read and MAX_JWKS_BYTES."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as answer:  # noqa: S310 (https, checked in config)
        body = answer.read(MAX_JWKS_BYTES + 1)
    if len(body) > MAX_JWKS_BYTES:
        raise ValueError(f"the JWKS is larger than {MAX_JWKS_BYTES} bytes")
    return json.loads(body)


def signing_keys(document: object) -> dict[str | None, jwt.PyJWK]:
    """The usable signing keys of a JWKS document, by `kid`, each with the one algorithm its type allows. A key
    without a kid is filed under None. Keys of other types or uses, or too weak, are left out."""
    keys: dict[str | None, jwt.PyJWK] = {}
    entries = document.get("keys") if isinstance(document, dict) else None
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
            continue
        algorithm = ALGORITHMS.get(entry.get("kty"))  # type: ignore[arg-type]
        if algorithm is None or entry.get("alg", algorithm) != algorithm:
            continue
        if algorithm == "ES256" and entry.get("crv") != "P-256":
            continue
        try:
            key = jwt.PyJWK(entry, algorithm)
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError):
            continue
        if algorithm == "HS256" and len(key.key) < MIN_SECRET_BYTES:
            continue
        kid = entry.get("kid")
        keys[kid if isinstance(kid, str) else None] = key
    return keys


class JwtIdentity:
    """Verifies bearer JWTs of one issuer and audience against the issuer's keys."""

    def __init__(
        self,
        settings: JwtSettings,
        retry_after_s: int,
        fetch: Callable[[str], Any] = fetch_jwks,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.retry_after_s = retry_after_s
        self._fetch = fetch
        self._clock = clock
        self._monotonic = monotonic
        self._verified: dict[bytes, tuple[Caller, float]] = {}
        self._keys: dict[str | None, jwt.PyJWK] | None = None
        self._document = ""  # the JWKS the keys came from, as canonical JSON
        self._fetched_at = float("-inf")  # when the keys in hand were fetched (monotonic)
        self._fetch_failed = False  # the last fetch failed: an unknown kid may be a key we cannot see
        self._unknown_fetch_at = float("-inf")
        self._lock = threading.Lock()
        self._refresh = BackgroundRefresh(self._fetch_keys, "jwks-refresh")
        if settings.jwks is not None:
            self._use_keys(settings.jwks)
            if not self._keys:
                raise ConfigError("VQ_JWKS holds no usable signing key (RSA, EC P-256, or oct of 32+ bytes)")
        else:
            self._refresh.start()  # the first fetch starts with the container, not with its first request

    def caller(self, headers: Mapping[str, str]) -> Caller:
        header = headers.get("authorization")
        if not header:
            count("Unauthenticated")
            raise Unauthenticated("Authorization: Bearer <JWT> is required", invalid_token=False)
        match = _BEARER.fullmatch(header) if len(header) <= MAX_JWT_CHARS else None
        if match is None:
            raise self._refused("Authorization must be Bearer and a JWT")
        return self.verify(match[1])

    def verify(self, token: str) -> Caller:
        """The caller `token` proves, from the cache of verified tokens when it was verified before."""
        digest = hashlib.sha256(token.encode("ascii")).digest()
        known = self._verified.get(digest)
        if known is not None and self._clock() < known[1]:
            return known[0]
        caller, expires_at = self._verify(token)
        verified = self._verified
        if len(verified) >= VERIFIED_KEPT:
            del verified[next(iter(verified))]  # the oldest entry
        verified[digest] = (caller, expires_at)
        return caller

    def _verify(self, token: str) -> tuple[Caller, float]:
        s = self.settings
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except (jwt.InvalidTokenError, ValueError, TypeError):
            raise self._refused("the bearer token is not a JWT") from None
        key = self._key(kid if isinstance(kid, str) else None)
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[key.algorithm_name],
                audience=s.audience,
                issuer=s.issuer,
                leeway=s.leeway_s,
                # `sub` and `jti` are not judged by the library: the user claim is checked below, where a number
                # is taken as its decimal text (PyJWT refuses a numeric `sub`), and `jti` is not used.
                options={"require": ["exp", "iss", "aud"], "verify_sub": False, "verify_jti": False},
            )
        except jwt.MissingRequiredClaimError as err:
            raise self._refused(f"the JWT has no {err.claim} claim") from None
        except (jwt.InvalidTokenError, ValueError, TypeError) as err:  # whatever the token holds: never a 500
            detail = next((words for kind, words in _REFUSALS if isinstance(err, kind)), "the JWT is not valid here")
            raise self._refused(detail) from None
        user = claims.get(s.user_claim)
        if isinstance(user, int) and not isinstance(user, bool):
            user = str(user)
        if not valid_user_id(user):
            raise self._refused(f"the JWT's {s.user_claim} claim is not a user id (1 to 128 printable ASCII)")
        invites = claims.get(INVITES_CLAIM)
        named = frozenset(i for i in invites if isinstance(i, str)) if isinstance(invites, list) else frozenset()
        return Caller(user, named), float(claims["exp"]) + s.leeway_s

    def _key(self, kid: str | None) -> jwt.PyJWK:
        """The key `kid` names: fetched afresh (at most once a minute) when it is unknown; QueueUnavailable when
        the keys cannot be had, Unauthenticated when the issuer has no such key."""
        if self.settings.jwks_url is not None:
            self._keep_fresh()
        keys = self._keys
        key = _lookup(keys, kid)
        if key is None and self.settings.jwks_url is not None and keys is not None:
            with self._lock:
                if self._monotonic() - self._unknown_fetch_at >= UNKNOWN_KEY_REFETCH_S:
                    self._unknown_fetch_at = self._monotonic()
                    self._refresh.start()
                    self._refresh.wait(FETCH_WAIT_S)
            keys = self._keys
            key = _lookup(keys, kid)
        if key is not None:
            return key
        if keys is None or self._fetch_failed:
            count("JwksUnavailable")
            raise QueueUnavailable(self.retry_after_s)
        raise self._refused("the JWT is signed by no key of the issuer")

    def _keep_fresh(self) -> None:
        if self._monotonic() - self._fetched_at >= self.settings.jwks_max_age_s:
            self._refresh.start()
        if self._keys is None:
            self._refresh.wait(FETCH_WAIT_S)

    def _fetch_keys(self) -> None:
        url = self.settings.jwks_url
        assert url is not None
        try:
            document = self._fetch(url)
            if not signing_keys(document):
                raise ValueError("no usable signing key")
        except Exception as err:  # any failure to fetch or read: keep the keys in hand, try again in a minute
            self._fetch_failed = True
            self._fetched_at = self._monotonic() - self.settings.jwks_max_age_s + UNKNOWN_KEY_REFETCH_S
            count("JwksUnavailable")
            logger.warning("JWKS not fetched; keeping the keys in hand", extra={"reason": type(err).__name__})
            return
        self._fetch_failed = False
        self._fetched_at = self._monotonic()
        self._use_keys(document)

    def _use_keys(self, document: Any) -> None:
        text = json.dumps(document, sort_keys=True)
        if text != self._document:
            # New keys: a key withdrawn takes the verdicts on its tokens with it.
            self._keys, self._document, self._verified = signing_keys(document), text, {}

    def _refused(self, detail: str) -> Unauthenticated:
        count("Unauthenticated")
        return Unauthenticated(detail)


def _lookup(keys: dict[str | None, jwt.PyJWK] | None, kid: str | None) -> jwt.PyJWK | None:
    if not keys:
        return None
    if kid is None and len(keys) == 1:
        return next(iter(keys.values()))  # an issuer with one key may leave kid out
    return keys.get(kid)
