"""Long-lived objects, built lazily once per Lambda container (or local process) and then reused."""

from __future__ import annotations

import functools

from chalicelib.config import ConfigError, Settings, load_settings
from chalicelib.queue import WaitingRoom
from chalicelib.store import QueueStore, connect
from chalicelib.tokens import TokenSigner


@functools.cache
def settings() -> Settings:
    return load_settings()


@functools.cache
def signer() -> TokenSigner:
    return TokenSigner(settings().keyring)


@functools.cache
def store() -> QueueStore:
    url = settings().redis_url
    if url is None:
        raise ConfigError("REDIS_URL is not set (`make run` starts an embedded Valkey and sets it)")
    return QueueStore(connect(url), settings().key_prefix)


@functools.cache
def waiting_room() -> WaitingRoom:
    return WaitingRoom(store(), signer(), settings())


def reset() -> None:
    """Forget everything built, so the next use reads the environment again (tests, key rotation)."""
    for built in (settings, signer, store, waiting_room):
        built.cache_clear()
