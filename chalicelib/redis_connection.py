"""The connection to Redis (or Redis Cluster): a client that fails fast, circuit breakers that stop paying
timeouts, and what a failing Redis means to the queue (StoreUnavailable, StoreFull, StoreMoving).

A cluster's topology changing under a sale is not an outage (docs/architecture.md#when-redis-fails): a slot
migrating answers TRYAGAIN, ASK or MOVED, a shard failing over refuses connections and may answer CLUSTERDOWN.
`guarded` retries what never ran within MOVING_BUDGET_S and then refuses (StoreMoving: 503, nobody let in); only
a node with no live copy of its data is Redis down (StoreUnavailable: the queue fails open).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import pybreaker
import redis
from redis._parsers.commands import CommandsParser
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.connection import Connection, Encoder
from redis.crc import key_slot
from redis.credentials import CredentialProvider
from redis.exceptions import (
    AskError,
    ClusterError,
    NoScriptError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.lock import Lock
from redis.retry import Retry

RedisClient = redis.Redis | redis.RedisCluster
T = TypeVar("T")

# How long a call keeps retrying a slot that is moving before the queue answers 503 with Retry-After. Redirections
# (MOVED, ASK) and a key caught between two MIGRATE batches settle within milliseconds, a CLUSTERDOWN between a
# primary's failure and its replica's promotion within about a second; a whole migration window of TRYAGAIN or a
# failover takes seconds, which no request should wait out: it comes back after Retry-After instead. Every request
# on a moving slot holds its Lambda this long and one more attempt (~0.1 s): at 1,000 requests/s on that target,
# 600 more concurrent executions, of the account's 1,000 by default; far inside API Gateway's 29 s.
MOVING_BUDGET_S = 0.5
# Breakers kept per container in a cluster, one per slot used lately (docs/architecture.md#when-redis-fails).
MAX_BREAKERS = 1024


class StoreUnavailable(Exception):
    """Queue state cannot be read or written now: Redis failed, or the circuit breaker is skipping it."""


class StoreRefused(StoreUnavailable):
    """Redis holds the queue state but refuses this call for now: nobody is let in, the caller answers 503."""


class StoreFull(StoreRefused):
    """Redis is out of memory (`noeviction`): it reads, but refuses writes. Full, not down: nobody is let in."""


class StoreMoving(StoreRefused):
    """The target's slot is moving to another node (a resharding) or its shard is failing over: it answers again
    within seconds, from one node or another. Moving, not down: nobody is let in."""


class FailingOver(redis.ConnectionError):
    """A cluster node could not be reached, but another node of its shard answers: the cluster is promoting a
    replica. Not retried: the call may have reached the node before it failed."""


# What a failing Redis raises: redis-py's cluster client raises RedisClusterException (not a RedisError) when it
# cannot reach any node to learn the slot map.
REDIS_FAILURES = (redis.RedisError, RedisClusterException)
# What a cluster answers while a slot moves or a shard fails over. ClusterError is CLUSTERDOWN, or redis-py giving
# up on TRYAGAIN and redirections (_Cluster); SlotNotCoveredError a slot the client's map has no node for.
MOVING = (ClusterError, TryAgainError, AskError, SlotNotCoveredError, FailingOver)
# Of those, the answers given before the command ran: retrying them cannot apply a script twice.
_NEVER_RAN = (ClusterError, TryAgainError, AskError, SlotNotCoveredError)


class Breaker(pybreaker.CircuitBreaker):
    """pybreaker's circuit breaker without its lock around the whole guarded call: with that lock, concurrent
    calls (a threaded server) wait for each other's timeouts one after another, far past the timeout budget.
    State changes keep their own locks; at worst a few concurrent calls make the half-open trial together.
    Out of memory and a moving slot are answers, not outages: they never open the breaker."""

    def __init__(self, fail_max: int, reset_timeout: float) -> None:
        super().__init__(fail_max=fail_max, reset_timeout=reset_timeout, exclude=[redis.OutOfMemoryError, *MOVING])

    def call(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        state = self.state
        if state.name != pybreaker.STATE_CLOSED or self.fail_counter or self._listeners:
            return state.call(func, *args, **kwargs)
        # Closed with no failure counted, as on nearly every call: a success changes nothing, so only a failure
        # goes through the state's bookkeeping (which counts it, may open the breaker, and raises).
        try:
            return func(*args, **kwargs)
        except BaseException as err:
            state._handle_error(err, reraise=False)
            raise


class Breakers:
    """The circuit breakers of one container: one per slot on a cluster (a target's keys share one slot, so one per
    target), one for a single Redis. A node that fails opens the breakers of the targets it serves, and no other
    target fails open for it. The MAX_BREAKERS slots used last keep theirs (one forgotten starts closed again)."""

    def __init__(self, fail_max: int, reset_timeout: float, per_slot: bool) -> None:
        make = functools.partial(Breaker, fail_max=fail_max, reset_timeout=reset_timeout)
        self._one = make()
        self._per_slot = per_slot
        self._of_slot: Callable[[int], Breaker] = functools.lru_cache(maxsize=MAX_BREAKERS)(lambda slot: make())

    def of(self, key: str | None) -> Breaker:
        """The breaker of the slot `key` is in (None: a call on keys of many slots, which shares one)."""
        if not self._per_slot or key is None:
            return self._one
        return self._of_slot(key_slot(key.encode()))


def guarded(client: RedisClient, breaker: Breaker, key: str | None, call: Callable[..., T], *args: Any) -> T:
    """`call(*args)`, a client-facing Redis call on `key`'s slot, through `breaker`; a failing Redis is a Store*:
    StoreFull (out of memory), StoreMoving (the slot moves or its shard fails over: retried within MOVING_BUDGET_S
    while nothing ran), StoreUnavailable (down, or skipped by the open breaker)."""
    deadline = time.monotonic() + MOVING_BUDGET_S
    delay_s = 0.05
    while True:
        try:
            return breaker.call(_told_apart, client, key, call, *args)
        except redis.OutOfMemoryError as err:
            raise StoreFull(str(err)) from err
        except _NEVER_RAN as err:
            if not is_cluster(client):  # a cluster node behind a client not told it is one: misconfigured, down
                raise StoreUnavailable(type(err).__name__) from err
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                raise StoreMoving(type(err).__name__) from err
        except FailingOver as err:
            raise StoreMoving(type(err).__name__) from err
        except (*REDIS_FAILURES, pybreaker.CircuitBreakerError) as err:
            raise StoreUnavailable(type(err).__name__) from err
        time.sleep(min(delay_s, left_s))
        delay_s = min(delay_s * 2, 0.2)


def _told_apart(client: RedisClient, key: str | None, call: Callable[..., T], *args: Any) -> T:
    """`call(*args)`; a node that cannot be reached while its shard answers is FailingOver, not down."""
    try:
        return call(*args)
    except (redis.ConnectionError, redis.TimeoutError) as err:
        if key is not None and _shard_answers(client, key, getattr(err, "connection", None)):
            raise FailingOver(str(err)) from err
        raise


def _shard_answers(client: RedisClient, key: str, failed: Any) -> bool:
    """Whether a node of `key`'s shard other than `failed` (the node or connection that failed) answers a PING:
    the data lives on, and the cluster will promote that replica, or already has."""
    cluster = _cluster_of(client)
    if cluster is None:
        return False
    failed_at = (getattr(failed, "host", None), getattr(failed, "port", None))
    for node in cluster.nodes_manager.slots_cache.get(key_slot(key.encode()), []):
        if (node.host, node.port) == failed_at:
            continue
        try:
            if cluster.get_redis_connection(node).ping():
                return True
        except REDIS_FAILURES:
            continue
    return False


def node_names(client: RedisClient, keys: Sequence[str]) -> list[str] | None:
    """The node serving each of `keys`, by name, as the cluster client's slot map has it now; None for a single
    Redis (or a cluster client that has not reached the cluster yet)."""
    cluster = _cluster_of(client)
    if cluster is None:
        return None
    return [cluster.get_node_from_key(key).name for key in keys]


def is_cluster(client: RedisClient) -> bool:
    """Whether `client` speaks to a Redis Cluster."""
    return isinstance(client, (_ClusterOnFirstUse, redis.RedisCluster))


def _cluster_of(client: RedisClient) -> redis.RedisCluster | None:
    """The RedisCluster behind `client`, if it is one and has its slot map."""
    if isinstance(client, _ClusterOnFirstUse):
        return client._client
    return client if isinstance(client, redis.RedisCluster) else None


class SecretPassword(CredentialProvider):
    """The AUTH password `read()` gives (a Secrets Manager secret, cached), asked as each connection opens: a token
    rotated in its secret reaches the next connections without a restart (docs/operations.md: rotating the
    cache's AUTH token). Failing to read it is failing to connect, which the queue answers as Redis down."""

    def __init__(self, read: Callable[[], str]) -> None:
        self._read = read

    def get_credentials(self) -> tuple[str]:
        try:
            return (self._read(),)
        except Exception as err:  # any failure to fetch: never the secret's value
            raise redis.ConnectionError(f"cannot read the Redis AUTH token: {type(err).__name__}") from None


def connect(url: str, *, cluster: bool = False, password: Callable[[], str] | None = None) -> RedisClient:
    """A client that fails fast: short timeouts and no blind retry (scripts are not all idempotent). `password`
    gives the AUTH token whenever a connection opens; the URL then carries none."""
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_connect_timeout": 0.2,
        "socket_timeout": 0.5,
        "retry": Retry(NoBackoff(), 0),
    }
    if password is not None:
        options["credential_provider"] = SecretPassword(password)
    if cluster:
        return cast(redis.RedisCluster, _ClusterOnFirstUse(url, options))
    return _ConnectionPerThread.from_url(url, **options)


class _ConnectionPerThread(redis.Redis):
    """A client whose commands go over a connection of the calling thread's own, made on its first command.

    A Lambda container serves one request at a time on one thread. Taking a connection from the pool and giving
    it back around every command (a poll of the socket, two locks, four metric records) cost a third of a script
    call's client CPU. redis-py's own `single_connection_client` connects as the client is built (a cold start
    during an outage would then fail instead of failing open), and makes every thread wait for the one connection
    (a threaded server's calls would pay each other's timeouts). redis-py sends a command over `connection` when
    there is one; here it is the thread's, checked before each command as the pool checks its connections. A
    thread's connection closes when the thread ends; pipelines still take theirs from the pool.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._thread_local = threading.local()  # before redis.Redis.__init__, which sets `connection`
        super().__init__(*args, **kwargs)

    @property
    def connection(self) -> Connection | None:
        return getattr(self._thread_local, "connection", None)

    @connection.setter
    def connection(self, connection: Connection | None) -> None:
        self._thread_local.connection = connection

    def lock(self, name: str, **options: Any) -> Lock:  # type: ignore[override]  # redis-py's options, by name
        return _Lock(self, name, **options)

    def execute_command(self, *args: Any, **options: Any) -> Any:
        connection = self.connection
        if connection is None:
            # Made as the pool makes its own (it connects on its first send), but not counted against the pool's
            # 100: threads come and go in a threaded server, and a thread's connection closes with it.
            pool = self.connection_pool
            self.connection = pool.connection_class(**pool.connection_kwargs)
        elif connection.is_connected and _closed_by_server(connection):
            connection.disconnect()  # a restart or a failover: connect again rather than fail this command
        return super().execute_command(*args, **options)


def _closed_by_server(connection: Connection) -> bool:
    """Whether an idle connection has something to read: the server closed it (as redis-py's pool checks)."""
    try:
        return connection.can_read()
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return True


class _ClusterOnFirstUse:
    """A RedisCluster built on its first command. Building one asks a node for the slot map, so building it up
    front would turn a cold start during an outage into an error instead of a fail-open answer."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        self._url, self._options = url, options
        self._client: redis.RedisCluster | None = None

    def lock(self, name: str, **options: Any) -> Lock:
        return _Lock(cast(redis.RedisCluster, self), name, **options)  # it answers what a RedisCluster would

    def get_encoder(self) -> Encoder:
        options = self._options
        return Encoder(
            options.get("encoding", "utf-8"),
            options.get("encoding_errors", "strict"),
            options.get("decode_responses", False),
        )

    def __getattr__(self, name: str) -> Any:
        if callable(getattr(redis.RedisCluster, name, None)):
            return lambda *args, **kwargs: getattr(self._connected(), name)(*args, **kwargs)
        return getattr(self._connected(), name)

    def _connected(self) -> redis.RedisCluster:
        # Unlocked: two threads may both build one, and the spare is dropped; a lock would make concurrent
        # requests wait out each other's connect timeouts while the cluster is down.
        if self._client is None:
            try:
                client = _Cluster.from_url(self._url, **self._options)
            except RedisClusterException as err:
                raise redis.ConnectionError(str(err)) from None
            client.commands_parser = _ScriptKeys(client.commands_parser)
            self._client = client
        return self._client


class _Cluster(redis.RedisCluster):
    """redis-py's cluster client, giving up on a moving slot sooner: after 4 answers of TRYAGAIN, ASK or MOVED (~0.1
    s) rather than 16 (~0.4 s), its pipelines too. `guarded` retries within MOVING_BUDGET_S, and a pump tick
    stretched by redis-py's retries of one moving target would delay every other target's admissions."""

    RedisClusterRequestTTL = 4

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        pipe.RedisClusterRequestTTL = self.RedisClusterRequestTTL
        return pipe


class _Lock(Lock):
    """redis-py's Lock (the pump lock) with scripts run from their text where a node does not hold them. redis-py's
    would load a lost script on every primary first: one primary failing over would stop the pump on any node."""

    # Its own, not those another client registered for Lock (typed None there).
    lua_release: Script | None = None  # type: ignore[assignment]
    lua_extend: Script | None = None  # type: ignore[assignment]
    lua_reacquire: Script | None = None  # type: ignore[assignment]

    def register_scripts(self) -> None:
        # Registering is hashing the text: it needs no node, so a cold start builds no cluster client here (the
        # pump would not start while the cluster hangs).
        cls = type(self)
        if cls.lua_release is None:
            cls.lua_release = _ScriptOrText(self.redis, cls.LUA_RELEASE_SCRIPT)
            cls.lua_extend = _ScriptOrText(self.redis, cls.LUA_EXTEND_SCRIPT)
            cls.lua_reacquire = _ScriptOrText(self.redis, cls.LUA_REACQUIRE_SCRIPT)


class _ScriptOrText(Script):
    """redis-py's Script, run from its text where the server does not hold it (one round trip, never a load on
    every node first)."""

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        keys, client = list(keys or []), client or self.registered_client
        try:
            return client.evalsha(self.sha, len(keys), *keys, *(args or []))
        except NoScriptError:
            return client.eval(self.script, len(keys), *keys, *(args or []))


class _ScriptKeys(CommandsParser):
    """redis-py's table of where each command's keys are, reading a script call's keys from the call itself.

    For a command whose keys move (EVAL, EVALSHA) redis-py asks the cluster's default node (COMMAND GETKEYS), and
    its cluster pipeline does so for every script it sends: one round trip more per script in a pump tick, and a
    pump stalled for every target while that one node is down (docs/guarantees.md#a-resharding-or-a-node-failover).
    """

    def __init__(self, parsed: CommandsParser) -> None:
        self.__dict__.update(vars(parsed))  # the table the client read as it started (not read again)

    def get_keys(self, redis_conn: Any, *args: Any) -> Any:
        if str(args[0]).upper() in ("EVAL", "EVALSHA") and len(args) > 2:
            return list(args[3 : 3 + int(args[2])])
        return super().get_keys(redis_conn, *args)
