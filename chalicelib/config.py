"""The one place that reads configuration from the environment.

Every variable, its default and what it means: docs/configuration.md (tests/test_configuration.py keeps that
table and this module in step).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from chalicelib import polling
from chalicelib.targets import TARGET_TYPES

ROOT = Path(__file__).resolve().parent.parent
KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")
MIN_SECRET_LENGTH = 32
ORIGIN_TIMEOUT_MAX_MS = 10_000


class ConfigError(RuntimeError):
    """The environment does not describe a runnable waiting room."""


@dataclass(frozen=True)
class Keyring:
    """Signing secrets by key id; `active_kid` signs, every listed key verifies."""

    secrets: Mapping[str, bytes] = field(repr=False)  # never in a log line or a traceback
    active_kid: str = ""

    @classmethod
    def from_json(cls, text: str | None, active_kid: str | None) -> Keyring:
        if not text:
            raise ConfigError(
                "VQ_TOKEN_KEYS is not set: give a JSON object of key id -> secret "
                '(e.g. {"k1": "<at least 32 random characters>"}). '
                "There is no default signing key."
            )
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"VQ_TOKEN_KEYS is not valid JSON: {exc.msg}") from None
        if not isinstance(raw, dict) or not raw:
            raise ConfigError("VQ_TOKEN_KEYS must be a non-empty JSON object")
        for kid, secret in raw.items():
            if not KEY_ID.fullmatch(kid):
                raise ConfigError(f"VQ_TOKEN_KEYS: key id {kid!r} must be 1-32 of [A-Za-z0-9_-]")
            if not isinstance(secret, str) or len(secret) < MIN_SECRET_LENGTH:
                raise ConfigError(
                    f"VQ_TOKEN_KEYS: the secret of key {kid!r} must be a string of "
                    f"at least {MIN_SECRET_LENGTH} characters"
                )
        if active_kid is None:
            if len(raw) != 1:
                raise ConfigError("VQ_TOKEN_ACTIVE_KID must name the signing key when several are given")
            active_kid = next(iter(raw))
        if active_kid not in raw:
            raise ConfigError(f"VQ_TOKEN_ACTIVE_KID {active_kid!r} is not a key of VQ_TOKEN_KEYS")
        return cls({kid: secret.encode() for kid, secret in raw.items()}, active_kid)

    @classmethod
    def from_secret(cls, text: str) -> Keyring:
        """The keyring in a Secrets Manager secret: `{"activeKid": "k2", "keys": {"k1": "...", "k2": "..."}}`,
        or flat, `{"activeKid": "k2", "k1": "...", "k2": "..."}` (every other field is a key): the shape
        CloudFormation can generate, as GenerateSecretString fills one top-level field of a template."""
        try:
            value = json.loads(text)
            active_kid = value["activeKid"]
            keys = value["keys"] if "keys" in value else {k: v for k, v in value.items() if k != "activeKid"}
        except (ValueError, TypeError, KeyError):
            raise ConfigError('the signing key secret must be JSON {"activeKid": ..., "keys": {...}}') from None
        return cls.from_json(json.dumps(keys), active_kid)


def load_keyring(env: Mapping[str, str] = os.environ, secrets: Any = None) -> Keyring:
    """Signing keys: from Secrets Manager (cached; `secrets`, else aws.secrets(), the provider) when
    `VQ_TOKEN_KEYS_SECRET_ID` is set, else from the environment."""
    secret_id = env.get("VQ_TOKEN_KEYS_SECRET_ID")
    if not secret_id:
        return Keyring.from_json(env.get("VQ_TOKEN_KEYS"), env.get("VQ_TOKEN_ACTIVE_KID") or None)
    from chalicelib import aws  # boto3 is only paid for where the secret is used

    try:
        text = (secrets or aws.secrets()).get(secret_id, max_age=_positive_int(env, "VQ_KEYS_MAX_AGE_S", 300))
    except Exception as err:  # any failure to fetch: say which secret, never its value
        raise ConfigError(f"cannot read the signing keys from secret {secret_id!r}: {type(err).__name__}") from None
    return Keyring.from_secret(text)


@dataclass(frozen=True)
class JwtSettings:
    """How `VQ_IDENTITY=jwt` verifies a caller: the issuer's keys (inline or at a URL), the claims that must match,
    and the claim that names the user (docs/identity.md)."""

    issuer: str
    audience: str
    jwks: Mapping[str, Any] | None  # VQ_JWKS, parsed; or
    jwks_url: str | None  # VQ_JWKS_URL
    user_claim: str = "sub"
    leeway_s: int = 30
    jwks_max_age_s: int = 600


@dataclass(frozen=True)
class Settings:
    """Everything the waiting room is tuned by."""

    redis_url: str | None
    key_prefix: str
    # From VQ_TOKEN_KEYS; None when this function signs nothing, or when the keys are in Secrets Manager
    # (`keys_secret_id`), where the signer reads them on first use (tokens.py), never at start-up.
    keyring: Keyring | None
    signs_tokens: bool = True
    redis_cluster: bool = False
    redis_auth_secret_id: str | None = None
    batch_size: int = 100
    tick_ms: int = 2000
    max_waiting: int = 100_000
    targets_open_on_first_use: bool = False
    heartbeat_timeout_s: int = 60
    # Within this many seconds of waiting from their turn, users poll their place (their heartbeat); further back
    # they read /line, at least every line_read_cap_s (docs/architecture.md#the-presence-window).
    presence_window_s: int = 120
    line_read_cap_s: int = 300
    token_ttl_s: int = 300
    outage_token_ttl_s: int = 60
    queue_idle_ttl_s: int = 1800
    max_evict_per_tick: int = 1000
    catchup_ticks: int = 5
    pump_lease_ticks: int = 3
    # Each target type's downstream (its TargetType's origin_variable); None: its purchases answer 503.
    origins: Mapping[str, str | None] = field(default_factory=dict)
    origin_timeout_ms: int = 5000
    keys_max_age_s: int = 300
    keys_secret_id: str | None = None
    appconfig: tuple[str, str, str] | None = None  # application, environment, profile
    flags_file: Path = ROOT / "infra" / "flags.json"
    flag_poll_s: int = 15
    queue_enabled_default: bool = True
    fail_open: bool = True
    breaker_failures: int = 3
    breaker_cooldown_ms: int = 1000
    event_bus: str | None = None
    events_file: Path | None = None
    events_cap: int = 100_000
    jwt: JwtSettings | None = None  # None: VQ_IDENTITY=header, the caller is X-User-Id
    login_url: str | None = None
    max_purchase_body_bytes: int = 16_384
    # The Idempotency-Key as the IETF draft's structured-field String (`"<id>"`), else bare (`<id>`): origin.py.
    idempotency_key_string: bool = True

    @property
    def admissions_per_second(self) -> float:
        return self.batch_size * 1000 / self.tick_ms

    @property
    def events_on(self) -> bool:
        """Whether the scripts write state-change events: only where the pump publishes them."""
        return bool(self.event_bus or self.events_file)

    @property
    def retry_after_s(self) -> int:
        """The Retry-After of a full or unavailable queue: one tick, at least a second."""
        return max(1, math.ceil(self.tick_ms / 1000))


def _positive_int(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    text = env.get(name)
    if text is None or text == "":
        return default
    if not re.fullmatch(r"[0-9]{1,9}", text) or int(text) < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {text!r}")
    return int(text)


def _bounded_int(env: Mapping[str, str], name: str, default: int, lowest: int, highest: int) -> int:
    value = _positive_int(env, name, default, minimum=lowest)
    if value > highest:
        raise ConfigError(f"{name} must be an integer from {lowest} to {highest}, got {value}")
    return value


def _origin_url(env: Mapping[str, str], name: str) -> str | None:
    text = env.get(name)
    if not text:
        return None
    if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", text):
        raise ConfigError(f"{name} must be an http(s) URL without query or fragment, got {text!r}")
    # Purchase paths are appended to it, so a trailing slash would double up.
    return text.rstrip("/")


def _choice(env: Mapping[str, str], name: str, choices: Mapping[str, bool], default: str) -> bool:
    text = env.get(name) or default
    if text not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {text!r}")
    return choices[text]


def _url(env: Mapping[str, str], name: str) -> str | None:
    """An https URL (http only to this machine, for local runs), or None when unset."""
    text = env.get(name)
    if not text:
        return None
    parts = urlsplit(text)
    local = parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost")
    if not re.fullmatch(r"[\x21-\x7e]{1,2000}", text) or not (parts.scheme == "https" or local) or not parts.hostname:
        raise ConfigError(f"{name} must be an https URL (http only to 127.0.0.1 or localhost), got {text[:100]!r}")
    return text


def _jwt(env: Mapping[str, str]) -> JwtSettings | None:
    if not _choice(env, "VQ_IDENTITY", {"header": False, "jwt": True}, "header"):
        return None
    missing = [name for name in ("VQ_JWT_ISSUER", "VQ_JWT_AUDIENCE") if not env.get(name)]
    if missing:
        raise ConfigError(f"VQ_IDENTITY=jwt needs {' and '.join(missing)}")
    inline, url = env.get("VQ_JWKS"), _url(env, "VQ_JWKS_URL")
    if bool(inline) == bool(url):
        raise ConfigError("VQ_IDENTITY=jwt needs the issuer's keys: VQ_JWKS (a JWKS document) or VQ_JWKS_URL, not both")
    jwks = None
    if inline:
        try:
            jwks = json.loads(inline)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"VQ_JWKS is not valid JSON: {exc.msg}") from None
        if not isinstance(jwks, dict) or not isinstance(jwks.get("keys"), list):
            raise ConfigError('VQ_JWKS must be a JWKS document: {"keys": [...]}')
    claim = env.get("VQ_JWT_USER_CLAIM") or "sub"
    if not re.fullmatch(r"[A-Za-z0-9_:./-]{1,64}", claim):
        raise ConfigError(f"VQ_JWT_USER_CLAIM must be a claim name, got {claim!r}")
    return JwtSettings(
        issuer=env["VQ_JWT_ISSUER"],
        audience=env["VQ_JWT_AUDIENCE"],
        jwks=jwks,
        jwks_url=url,
        user_claim=claim,
        leeway_s=_bounded_int(env, "VQ_JWT_LEEWAY_S", 30, 0, 300),
        jwks_max_age_s=_bounded_int(env, "VQ_JWKS_MAX_AGE_S", 600, 60, 86_400),
    )


def _appconfig(env: Mapping[str, str]) -> tuple[str, str, str] | None:
    names = ("VQ_APPCONFIG_APPLICATION", "VQ_APPCONFIG_ENVIRONMENT", "VQ_APPCONFIG_PROFILE")
    values = tuple(env.get(name) or "" for name in names)
    if not any(values):
        return None
    if not all(values):
        raise ConfigError(f"set all of {', '.join(names)} or none of them")
    return values  # type: ignore[return-value]


def load_settings(env: Mapping[str, str] = os.environ) -> Settings:
    """Read and validate the settings; raises ConfigError with a readable message."""
    prefix = env.get("VQ_KEY_PREFIX", "vq")
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", prefix):
        raise ConfigError("VQ_KEY_PREFIX must be 1-64 of [A-Za-z0-9_.:-] (no braces: they make hash tags)")
    heartbeat_timeout_s = _positive_int(env, "VQ_HEARTBEAT_TIMEOUT_S", 60)
    problem = polling.heartbeat_problem(heartbeat_timeout_s)
    if problem:
        raise ConfigError(f"VQ_HEARTBEAT_TIMEOUT_S: {problem}")
    # Unset, at least twice the heartbeat timeout (a long heartbeat widens it); set, checked against it.
    presence_window_s = _positive_int(env, "VQ_PRESENCE_WINDOW_S", max(120, 2 * heartbeat_timeout_s))
    if presence_window_s < 2 * heartbeat_timeout_s:
        # A place crossing into the window must be evicted, if silent, before the mark reaches it.
        raise ConfigError(
            f"VQ_PRESENCE_WINDOW_S ({presence_window_s}) must be at least twice VQ_HEARTBEAT_TIMEOUT_S "
            f"({heartbeat_timeout_s}): a silent user would be evicted only after the mark passed them"
        )
    signs_tokens = _choice(env, "VQ_SIGNS_TOKENS", {"true": True, "false": False}, "true")
    return Settings(
        redis_url=env.get("REDIS_URL") or None,
        key_prefix=prefix,
        keyring=load_keyring(env) if signs_tokens and not env.get("VQ_TOKEN_KEYS_SECRET_ID") else None,
        signs_tokens=signs_tokens,
        redis_cluster=_choice(env, "VQ_REDIS_CLUSTER", {"true": True, "false": False}, "false"),
        redis_auth_secret_id=env.get("VQ_REDIS_AUTH_SECRET_ID") or None,
        batch_size=_positive_int(env, "VQ_BATCH_SIZE", 100),
        tick_ms=_positive_int(env, "VQ_TICK_MS", 2000, minimum=100),
        max_waiting=_positive_int(env, "VQ_MAX_WAITING", 100_000),
        targets_open_on_first_use=_choice(env, "VQ_TARGETS_OPEN_ON_FIRST_USE", {"true": True, "false": False}, "false"),
        heartbeat_timeout_s=heartbeat_timeout_s,
        presence_window_s=presence_window_s,
        line_read_cap_s=_positive_int(env, "VQ_LINE_READ_CAP_S", 300),
        token_ttl_s=_positive_int(env, "VQ_TOKEN_TTL_S", 300),
        outage_token_ttl_s=_positive_int(env, "VQ_OUTAGE_TOKEN_TTL_S", 60),
        queue_idle_ttl_s=_positive_int(env, "VQ_QUEUE_IDLE_TTL_S", 1800),
        max_evict_per_tick=_positive_int(env, "VQ_MAX_EVICT_PER_TICK", 1000),
        catchup_ticks=_positive_int(env, "VQ_CATCHUP_TICKS", 5),
        pump_lease_ticks=_positive_int(env, "VQ_PUMP_LEASE_TICKS", 3),
        origins={kind.name: _origin_url(env, kind.origin_variable) for kind in TARGET_TYPES.values()},
        # At most 10 s, so a purchase fits the API function's timeout (docs/deploy.md: timeouts).
        origin_timeout_ms=_bounded_int(env, "VQ_ORIGIN_TIMEOUT_MS", 5000, 100, ORIGIN_TIMEOUT_MAX_MS),
        keys_max_age_s=_positive_int(env, "VQ_KEYS_MAX_AGE_S", 300),
        keys_secret_id=env.get("VQ_TOKEN_KEYS_SECRET_ID") or None,
        appconfig=_appconfig(env),
        flags_file=Path(env.get("VQ_FLAGS_FILE") or Settings.flags_file),
        flag_poll_s=_bounded_int(env, "VQ_FLAG_POLL_S", 15, 15, 86_400),
        queue_enabled_default=_choice(env, "VQ_QUEUE_ENABLED_DEFAULT", {"true": True, "false": False}, "true"),
        fail_open=_choice(env, "VQ_FAIL_MODE", {"open": True, "closed": False}, "open"),
        breaker_failures=_positive_int(env, "VQ_BREAKER_FAILURES", 3),
        breaker_cooldown_ms=_positive_int(env, "VQ_BREAKER_COOLDOWN_MS", 1000),
        event_bus=env.get("VQ_EVENT_BUS") or None,
        events_file=Path(env["VQ_EVENTS_FILE"]) if env.get("VQ_EVENTS_FILE") else None,
        events_cap=_positive_int(env, "VQ_EVENTS_CAP", 100_000),
        jwt=_jwt(env),
        login_url=_url(env, "VQ_LOGIN_URL"),
        max_purchase_body_bytes=_positive_int(env, "VQ_MAX_PURCHASE_BODY_BYTES", 16_384),
        idempotency_key_string=_choice(env, "VQ_IDEMPOTENCY_KEY_FORMAT", {"string": True, "bare": False}, "string"),
    )
