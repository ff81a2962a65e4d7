"""Long-lived objects, built lazily once per Lambda container (or local process) and then reused."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from aws_lambda_powertools.utilities.feature_flags.base import StoreProvider

from chalicelib import aws
from chalicelib.config import ConfigError, Settings, load_keyring, load_settings
from chalicelib.flags import AppConfigSession, JsonFileStore, QueueSwitch
from chalicelib.identity import HeaderIdentity, Identity, JwtIdentity
from chalicelib.purchase import PurchaseGate
from chalicelib.queue import WaitingRoom
from chalicelib.redis_connection import Breakers, connect
from chalicelib.store import QueueStore
from chalicelib.tokens import TokenSigner

if TYPE_CHECKING:
    from chalicelib.events import Publisher


@functools.cache
def settings() -> Settings:
    return load_settings()


@functools.cache
def signer() -> TokenSigner:
    s = settings()
    if not s.signs_tokens:
        raise ConfigError("this function was started without signing keys (VQ_SIGNS_TOKENS=false)")
    if not s.keys_secret_id:
        return TokenSigner(s.keyring)
    # Keys from Secrets Manager are read on first use, then again now and then, so a rotation reaches running
    # containers. The provider is taken here: the refresh runs in the background and must not build clients there.
    return TokenSigner(
        None,
        refresh=functools.partial(load_keyring, secrets=aws.secrets()),
        max_age_s=s.keys_max_age_s,
        retry_after_s=s.retry_after_s,
    )


@functools.cache
def identity() -> Identity:
    """How callers are identified (VQ_IDENTITY): their X-User-Id, or a verified bearer JWT."""
    s = settings()
    return HeaderIdentity() if s.jwt is None else JwtIdentity(s.jwt, s.retry_after_s)


@functools.cache
def switch() -> QueueSwitch:
    s = settings()
    source: StoreProvider
    if s.appconfig is not None:
        application, environment, profile = s.appconfig
        source = AppConfigSession(
            application,
            environment,
            profile,
            aws.client("appconfigdata"),
            poll_interval_s=s.flag_poll_s,
        )
    else:
        source = JsonFileStore(s.flags_file)
    return QueueSwitch(source, default=s.queue_enabled_default)


def deployed_flag() -> dict:
    """The flag configuration AppConfig serves now, read by a session of its own (flag_sync, on a rollback)."""
    appconfig = settings().appconfig
    if appconfig is None:
        raise ConfigError("VQ_APPCONFIG_* is not set: there is no deployed flag to read")
    session = AppConfigSession(*appconfig, aws.client("appconfigdata"), poll_interval_s=settings().flag_poll_s)
    session.poll()
    return session.get_configuration()


@functools.cache
def store() -> QueueStore:
    url = settings().redis_url
    if url is None:
        raise ConfigError("REDIS_URL is not set (`make run` starts an embedded Valkey and sets it)")
    # The AUTH token stays out of the function's environment (where anyone allowed to read its configuration would
    # see it): read from its secret as connections open, cached like the signing keys.
    auth_secret_id = settings().redis_auth_secret_id
    password = (
        functools.partial(aws.secrets().get, auth_secret_id, max_age=settings().keys_max_age_s)
        if auth_secret_id
        else None
    )
    # One breaker per slot on a cluster: one node's trouble never fails another node's targets open.
    breakers = Breakers(
        fail_max=settings().breaker_failures,
        reset_timeout=settings().breaker_cooldown_ms / 1000,
        per_slot=settings().redis_cluster,
    )
    return QueueStore(
        connect(url, cluster=settings().redis_cluster, password=password),
        settings().key_prefix,
        breakers,
        outbox_cap=settings().events_cap if settings().events_on else 0,
    )


@functools.cache
def publisher() -> Publisher | None:
    """The pump's publisher of state-change events: to EventBridge deployed, to a file locally, else none."""
    from chalicelib.events import EventBridgeSink, FileSink, Publisher  # the pump's alone: not on the API's cold start

    s = settings()
    if s.event_bus:
        # Bounded timeouts and retries: an event not sent now stays in the outbox and goes in a later round.
        return Publisher(store(), EventBridgeSink(aws.client("events"), s.event_bus))
    if s.events_file:
        return Publisher(store(), FileSink(s.events_file))
    return None


@functools.cache
def waiting_room() -> WaitingRoom:
    return WaitingRoom(store(), signer(), settings(), switch())


@functools.cache
def purchase_gate() -> PurchaseGate:
    return PurchaseGate(store(), signer(), settings(), switch())


def reset() -> None:
    """Forget everything built, so the next use reads the environment again (tests, key rotation)."""
    for built in (settings, signer, identity, switch, store, publisher, waiting_room, purchase_gate):
        built.cache_clear()
    aws.reset()
