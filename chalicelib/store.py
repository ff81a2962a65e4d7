"""The Redis gateway: the only code that knows key names and Lua scripts.

Every key of one target shares the hash tag `{type:id}`, so each script runs in one cluster slot.
Each client-facing method is one script call: one round trip.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from chalicelib.targets import Target

# Beside chalicelib/ in the repository, and at the package root when deployed (vendor/lua links to it).
LUA_DIR = Path(__file__).resolve().parent.parent / "lua"

RedisClient = Union[redis.Redis, redis.RedisCluster]


def connect(url: str, *, cluster: bool = False) -> RedisClient:
    """A client that fails fast: short timeouts and no blind retry (scripts are not all idempotent)."""
    options = dict(
        decode_responses=True,
        socket_connect_timeout=0.2,
        socket_timeout=0.5,
        retry=Retry(NoBackoff(), 0),
    )
    if cluster:
        return redis.RedisCluster.from_url(url, **options)
    return redis.Redis.from_url(url, **options)


def load_script(client: RedisClient, name: str) -> redis.commands.core.Script:
    """`lua/<name>.lua`, registered once and then called by SHA."""
    return client.register_script((LUA_DIR / f"{name}.lua").read_text())


@dataclass(frozen=True)
class Waiting:
    """In line: `ahead` users not yet admitted have a smaller seq."""

    seq: int
    ahead: int
    created: bool = False


@dataclass(frozen=True)
class Admitted:
    """Holds the entry token `token`; `issued_now` when this very call admitted the user."""

    token: str
    issued_now: bool


class Full:
    """The line is at capacity."""


class Gone:
    """Neither in line nor holding a live token."""


Place = Union[Waiting, Admitted, Full, Gone]


class QueueKeys:
    """Key names of one target's queue state."""

    def __init__(self, prefix: str, target: Target) -> None:
        self.base = f"{prefix}:{{{target}}}"
        self.waiting = f"{self.base}:waiting"
        self.heartbeat = f"{self.base}:heartbeat"
        self.seq = f"{self.base}:seq"
        self.mark = f"{self.base}:mark"
        self.registered = f"{self.base}:registered"

    def token(self, user_id: int) -> str:
        return f"{self.base}:token:{user_id}"


class QueueStore:
    """Queue state of every target, in one Redis (or Redis Cluster)."""

    def __init__(self, client: RedisClient, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.targets_key = f"{prefix}:targets"
        self._enter = load_script(client, "enter")
        self._status = load_script(client, "status")
        self._leave = load_script(client, "leave")

    def keys(self, target: Target) -> QueueKeys:
        return QueueKeys(self.prefix, target)

    def enter(
        self, target: Target, user_id: int, now_ms: int, max_waiting: int, idle_ttl_ms: int,
        candidate_token: str, token_ttl_ms: int,
    ) -> Place:
        """Put `user_id` in line (same seq if already there); `candidate_token` is kept only if this admits them."""
        k = self.keys(target)
        reply = self._enter(
            keys=[k.waiting, k.heartbeat, k.seq, k.mark, k.token(user_id), k.registered],
            args=[user_id, now_ms, max_waiting, idle_ttl_ms, candidate_token, token_ttl_ms],
        )
        if reply[0] == "WAITING" and reply[4]:
            self._register(target)
        return _place(reply)

    def status(self, target: Target, user_id: int, now_ms: int, candidate_token: str, token_ttl_ms: int) -> Place:
        """Where `user_id` stands; refreshes their heartbeat, and admits them if the mark has passed their seq."""
        k = self.keys(target)
        return _place(self._status(
            keys=[k.waiting, k.heartbeat, k.mark, k.token(user_id)],
            args=[user_id, now_ms, candidate_token, token_ttl_ms],
        ))

    def leave(self, target: Target, user_id: int) -> bool:
        """Take `user_id` out of line; True if they were in it."""
        k = self.keys(target)
        return bool(self._leave(keys=[k.waiting, k.heartbeat, k.token(user_id)], args=[user_id]))

    def _register(self, target: Target) -> None:
        # The registry lives in another slot, so it cannot be written by enter.lua; this second round
        # trip happens once per queue lifetime. The random score lets the pump drop an idle target
        # only if nobody registered it again in between.
        self.client.zadd(self.targets_key, {str(target): random.getrandbits(52)})


def _place(reply: list) -> Place:
    kind = reply[0]
    if kind == "WAITING":
        return Waiting(seq=int(reply[1]), ahead=int(reply[2]), created=len(reply) > 3 and reply[3] == 1)
    if kind == "ADMITTED":
        return Admitted(token=reply[1], issued_now=reply[2] == 1)
    if kind == "FULL":
        return Full()
    return Gone()
