"""The one place that reads configuration from the environment.

| variable | default | meaning |
|---|---|---|
| `REDIS_URL` | unset | queue state; unset means the local stack starts an embedded Valkey |
| `VQ_KEY_PREFIX` | `vq` | prefix of every Redis key (tests use a unique one per run) |
| `VQ_TOKEN_KEYS` | required | JSON object: key id -> signing secret (at least 32 characters) |
| `VQ_TOKEN_ACTIVE_KID` | the only key id | key id that signs; the others still verify (rotation) |
| `VQ_BATCH_SIZE` | 100 | users admitted per tick |
| `VQ_TICK_MS` | 2000 | length of one admission tick |
| `VQ_MAX_WAITING` | 100000 | capacity of one target's line |
| `VQ_HEARTBEAT_TIMEOUT_S` | 60 | a user who has not polled for this long is evicted |
| `VQ_TOKEN_TTL_S` | 300 | lifetime of an entry token |
| `VQ_QUEUE_IDLE_TTL_S` | 1800 | an untouched queue's keys expire after this |
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Mapping

KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")
MIN_SECRET_LENGTH = 32


class ConfigError(RuntimeError):
    """The environment does not describe a runnable waiting room."""


@dataclass(frozen=True)
class Keyring:
    """Signing secrets by key id; `active_kid` signs, every listed key verifies."""

    secrets: Mapping[str, bytes]
    active_kid: str

    @classmethod
    def from_json(cls, text: str | None, active_kid: str | None) -> "Keyring":
        if not text:
            raise ConfigError(
                "VQ_TOKEN_KEYS is not set: give a JSON object of key id -> secret "
                '(e.g. {"k1": "<at least 32 random characters>"}). '
                "There is no default signing key."
            )
        try:
            raw = json.loads(text)
        except ValueError as exc:
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


@dataclass(frozen=True)
class Settings:
    """Everything the waiting room is tuned by."""

    redis_url: str | None
    key_prefix: str
    keyring: Keyring
    batch_size: int = 100
    tick_ms: int = 2000
    max_waiting: int = 100_000
    heartbeat_timeout_s: int = 60
    token_ttl_s: int = 300
    queue_idle_ttl_s: int = 1800

    @property
    def admissions_per_second(self) -> float:
        return self.batch_size * 1000 / self.tick_ms


def _positive_int(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    text = env.get(name)
    if text is None or text == "":
        return default
    if not re.fullmatch(r"[0-9]{1,9}", text) or int(text) < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {text!r}")
    return int(text)


def load_settings(env: Mapping[str, str] = os.environ) -> Settings:
    """Read and validate the settings; raises ConfigError with a readable message."""
    prefix = env.get("VQ_KEY_PREFIX", "vq")
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", prefix):
        raise ConfigError("VQ_KEY_PREFIX must be 1-64 of [A-Za-z0-9_.:-] (no braces: they make hash tags)")
    return Settings(
        redis_url=env.get("REDIS_URL") or None,
        key_prefix=prefix,
        keyring=Keyring.from_json(env.get("VQ_TOKEN_KEYS"), env.get("VQ_TOKEN_ACTIVE_KID") or None),
        batch_size=_positive_int(env, "VQ_BATCH_SIZE", 100),
        tick_ms=_positive_int(env, "VQ_TICK_MS", 2000, minimum=100),
        max_waiting=_positive_int(env, "VQ_MAX_WAITING", 100_000),
        heartbeat_timeout_s=_positive_int(env, "VQ_HEARTBEAT_TIMEOUT_S", 60),
        token_ttl_s=_positive_int(env, "VQ_TOKEN_TTL_S", 300),
        queue_idle_ttl_s=_positive_int(env, "VQ_QUEUE_IDLE_TTL_S", 1800),
    )
