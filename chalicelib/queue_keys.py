"""Key names of the queue's state, the only code that builds them (what each key holds: chalicelib/data_model.py).
Every key of one target shares the hash tag `{type:id}`, so each script runs in one cluster slot; the few keys
outside the targets' slots are the prefix's own. A target whose line spans N sub-lines (its `shards` setting,
docs/sharding.md) keeps sub-line 0 under `{type:id}`, so a 1-shard target's keys never move, and sub-line i > 0
under a tag of its own, `{type:id#i}` or `{type:id#i.k}` (`sub_line_tag`): each sub-line is a whole set of the keys
below, in a slot of its own."""

from __future__ import annotations

import itertools
import re
import zlib

from redis.crc import REDIS_CLUSTER_HASH_SLOTS as SLOTS
from redis.crc import key_slot

from chalicelib.targets import Target


class QueueKeys:
    """Key names of one target's queue state."""

    def __init__(self, prefix: str, target: Target, shard: int = 0, shards: int = 1) -> None:
        """Sub-line `shard` of a line of `shards` (a sub-line's tag past the first depends on the count)."""
        self.base = f"{prefix}:{{{sub_line_tag(target, shard, shards)}}}"
        self.waiting = f"{self.base}:waiting"
        self.heartbeat = f"{self.base}:heartbeat"
        self.seq = f"{self.base}:seq"
        self.mark = f"{self.base}:mark"
        self.registered = f"{self.base}:registered"
        self.tick = f"{self.base}:tick"
        self.config = f"{self.base}:config"
        self.prequeue = f"{self.base}:prequeue"
        self.draw = f"{self.base}:draw"
        self.active = f"{self.base}:active"
        self.stats = f"{self.base}:stats"
        self.waits = f"{self.base}:waits"
        self.admissions = f"{self.base}:admissions"
        self.revoked = f"{self.base}:revoked"
        self.ended = f"{self.base}:ended"
        self.health = f"{self.base}:health"
        self.purchases = f"{self.base}:purchases"
        self.events = f"{self.base}:events"
        self.budget = f"{self.base}:budget"
        self.pace = f"{self.base}:pace"
        self.fence = f"{self.base}:fence"
        self.departed = f"{self.base}:departed"
        self.passed = f"{self.base}:passed"
        self.window = f"{self.base}:window"
        self.line = f"{self.base}:line"
        self.plan = f"{self.base}:plan"

    def token(self, user_id: str) -> str:
        # After the target's hash tag: a brace in a user id cannot move the key to another slot.
        return f"{self.base}:token:{user_id}"

    def consumed(self, token_id: str) -> str:
        return f"{self.base}:consumed:{token_id}"


def sub_line_tag(target: Target, shard: int, shards: int) -> str:
    """The hash tag of sub-line `shard` of `target`'s line of `shards`: sub-line 0's is the target's own; sub-line
    i > 0 takes the first of `type:id#i`, `type:id#i.1`, `type:id#i.2`, ... whose slot lies in window (g0 + i) mod N
    of the slot space cut in N equal windows, g0 being the window of sub-line 0's slot, within an eighth of a window
    of where sub-line 0 lies in its own. So the sub-lines lie about a window apart, evenly over the slots: on a
    cluster whose slots are split evenly over M node groups, each holds ceil(N/M) sub-lines at most (one each when
    M is N or a multiple), where tags taken by chance would often put 2-3 on one. A window holds only the slots
    every even split puts there, however it rounds its ends (ceil(w*16384/N) to floor((w+1)*16384/N)). About 4N
    CRC16s (8N near a window's end): callers cache the keys."""
    if not 0 <= shard < shards:
        raise ValueError(f"no sub-line {shard} in a line of {shards}")
    if shard == 0:
        return str(target)
    first = key_slot(str(target).encode())
    home = first * shards // SLOTS
    window = (home + shard) % shards
    aim = _window_start(window, shards) + first - _window_start(home, shards)
    reach = SLOTS // (8 * shards) + 1
    low = max(_window_start(window, shards), aim - reach)
    high = min((window + 1) * SLOTS // shards, aim + reach)
    tags = (f"{target}#{shard}.{n}" if n else f"{target}#{shard}" for n in itertools.count())
    return next(tag for tag in tags if low <= key_slot(tag.encode()) < high)


def _window_start(window: int, shards: int) -> int:
    """The first slot every even split of the slots over `shards` puts in `window`: ceil(window * 16384 / shards)."""
    return -(-window * SLOTS // shards)


def shard_of(user_id: str, shards: int) -> int:
    """The sub-line a user belongs to in a line of `shards` sub-lines: stable for the user, spread evenly over users,
    so entering again, polling, leaving and buying reach the one node that holds the user's place."""
    return zlib.crc32(user_id.encode()) % shards if shards > 1 else 0


class GlobalKeys:
    """Key names outside the targets' slots: the registry the pump visits, the targets operators opened, the pump
    lock, the stored flag configuration."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.targets = f"{prefix}:targets"
        self.open = f"{prefix}:open"
        self.pump_lock = f"{prefix}:pump-lock"
        self.flag = f"{prefix}:flag"
        # Every target's `config` (each sub-line's), to SCAN for; the glob also matches a user's key whose id ends
        # in ":config", so a match counts only if it is a target's (`is_config`).
        self.configs = f"{prefix}:{{*}}:config"
        self._config = re.compile(re.escape(prefix) + r":\{[a-z-]+:[0-9]+(#[0-9]+(\.[0-9]+)?)?\}:config")
        self._first_config = re.compile(re.escape(prefix) + r":\{[a-z-]+:[0-9]+\}:config")

    def is_config(self, key: str) -> bool:
        """Whether `key`, found by `configs`, is a target's `config` (of any of its sub-lines)."""
        return self._config.fullmatch(key) is not None

    def is_first_config(self, key: str) -> bool:
        """Whether `key` is a target's sub-line 0's `config`: one per target."""
        return self._first_config.fullmatch(key) is not None
