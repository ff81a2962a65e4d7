"""The Redis gateway: the only code that calls the Lua scripts, with the keys of queue_keys.py (what each holds:
data_model.py).

Each client-facing method is one script call: one round trip; one pump tick is one pipeline for every target.
What the scripts answer is in answers.py, the connection and its failures in redis_connection.py, loading and
pipelining scripts in scripts.py.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from redis.lock import Lock

from chalicelib import shop_health, waits
from chalicelib.answers import OtherEntry, Place, QueueFigures, TargetTick, place_of
from chalicelib.errors import QueueError
from chalicelib.flags import QUEUED, Decision
from chalicelib.observability import logger
from chalicelib.queue_keys import GlobalKeys, QueueKeys, shard_of
from chalicelib.redis_connection import (
    REDIS_FAILURES,
    Breaker,
    Breakers,
    RedisClient,
    StoreMoving,
    guarded,
    is_cluster,
)
from chalicelib.scripts import Call, load_script, run_pipelined
from chalicelib.sharding import PAUSED, SHAPE_POINTS, SOLD_OUT, Front, Plan, front_of, merged_line, plan_of, sub_line
from chalicelib.target_config import UNCONDITIONAL, Precondition, TargetConfig
from chalicelib.targets import Target, parse_target
from chalicelib.tokens import EntryGrant, EntryToken, GrantTerms, QueueTicket

# How long enter trusts a target's registration before refreshing it (heals a registration lost to a fault).
REGISTRATION_REFRESH_MS = 60_000
# How long a token's one-time marker (and a revocation) outlives the token. A token's expiry is judged by the
# clock of whichever function reads it, the marker's TTL by Redis: the margin covers clocks apart by that much
# and a purchase that was verified in time but reaches Redis late.
CLOCK_SKEW_MARGIN_MS = 60_000
# The config field that makes a target known (lua/configure.lua).
KNOWN_SINCE = "known_since_ms"
# The opening's committed seed and its commitment, kept in the config hash until the draw (lua/configure.lua).
DRAW_SEED, DRAW_COMMITMENT = "draw_seed", "draw_commitment"
# A sharded line's pre-queue block of seqs, 'first last', the same on every sub-line (lua/configure.lua).
DRAW_BLOCK = "draw_block"
# Config fields that are not the operator's: a configuration's version leaves them out (lua/configure.lua).
_NOT_THE_OPERATORS = (KNOWN_SINCE, "flag_version", DRAW_SEED, DRAW_COMMITMENT, DRAW_BLOCK)
# A sharded line's pre-queue block starts this far above every seq its sub-lines handed out and the clock (us):
# enters that reach a sub-line while configure writes the others get seqs below it. It spans at least as long
# (lua/enter.lua's MIN_BLOCK_US).
BLOCK_MARGIN_US = 1_000_000
# Targets whose count of sub-lines a container remembers (learnt from the scripts that refused another count).
MAX_SHARD_COUNTS = 4096
# The outbox (lua/outbox.lua): how long a stream outlives its last event when nothing publishes it. A
# registration for the sake of events lasts as long.
OUTBOX_TTL_MS = 86_400_000
# A target an operator opened keeps the scheduled pump ticking from OPEN_LOOKAHEAD_MS before its opening (or its
# configuration, when it opens at once) to OPEN_KEPT_MS after, users or not (docs/deploy.md: what it costs idle):
# two EventBridge periods ahead, so the run that starts before the opening is already ticking at it.
OPEN_LOOKAHEAD_MS = 120_000
OPEN_KEPT_MS = 1_800_000
# How far above its own clock a fence puts the seq of a node that lost writes (docs/failover.md#the-fences): the
# seqs the old primary handed out are below its clock, and this covers the new node's clock running up to a second
# behind the old one's beyond the time the failover took.
FENCE_MARGIN_US = 1_000_000
# The ETA's range counts at most one leave of a user in this long (lua/leave.lua), and the safety net lets a user
# pass at most once in it (lua/enter.lua): ten minutes, the prior's horizon (chalicelib/eta.py). Long beside one
# shopper's visit, short beside a sale.
DEPARTURE_WINDOW_MS = 600_000
PASS_WINDOW_MS = 600_000
# Most places one tick starts the heartbeat clock of as they cross into the presence window (line.lua): about a
# batch does each tick, and at an opening the whole window; the edge goes on from the last one at the next tick.
MAX_CROSSINGS = 5000


@dataclass(frozen=True)
class Defaults:
    """The global settings a target's own configuration overrides, and the idle TTL of queue keys."""

    max_waiting: int
    batch: int
    tick_ms: int
    idle_ttl_ms: int
    open_on_first_use: bool = False  # a first enter opens an unknown target


@dataclass(frozen=True)
class PumpRules:
    """How one pump tick treats every target."""

    tick_ms: int
    batch: int
    catchup_ticks: int
    heartbeat_timeout_ms: int
    max_evict: int
    idle_ttl_ms: int
    presence_window_s: int = 120
    line_read_cap_s: int = 300
    following: shop_health.FollowRules = shop_health.FollowRules()


class QueueStore:
    """Queue state of every target, in one Redis (or Redis Cluster)."""

    def __init__(
        self,
        client: RedisClient,
        prefix: str,
        breakers: Breakers | None = None,
        outbox_cap: int = 0,
    ) -> None:
        self.client = client
        self.prefix = prefix
        # The outbox's ARGV of every reporting script: most unpublished events kept per target (0: no events, as
        # where nothing publishes them), and the outbox's TTL.
        self.outbox = {"outbox_cap": outbox_cap, "outbox_ttl_ms": OUTBOX_TTL_MS}
        # After a few failures in a row, client calls on a slot skip Redis for a cool-down instead of each paying the
        # timeout: one breaker per slot on a cluster, so one node's trouble fails no other node's targets open.
        self.breakers = breakers or Breakers(fail_max=3, reset_timeout=5, per_slot=is_cluster(client))
        self.global_keys = GlobalKeys(prefix)
        # A target's key names, built once rather than on every call (a poll would build 18 names to send 10).
        # Bounded: a request can name any target id.
        self.keys: Callable[..., QueueKeys] = functools.lru_cache(maxsize=4096)(functools.partial(QueueKeys, prefix))
        # Each target's count of sub-lines as this container last learnt it (docs/sharding.md): a request routes by
        # it without asking, and the script it reaches refuses another count than its sub-line's, which then is
        # learnt here; each pump tick learns what the configuration says then. Insertion-ordered and bounded: the
        # oldest learnt is forgotten first (and counts as 1 again).
        self._shards: dict[Target, int] = {}
        self._enter = load_script(client, "enter")
        self._status = load_script(client, "status")
        self._leave = load_script(client, "leave")
        self._stats = load_script(client, "stats")
        self._configure = load_script(client, "configure")
        self._admit = load_script(client, "admit")
        self._evict = load_script(client, "evict")
        self._line = load_script(client, "line")
        self._front = load_script(client, "front")
        self._plan = load_script(client, "plan")
        self._forget_target = load_script(client, "forget_target")
        self._consume = load_script(client, "consume")
        self._restore = load_script(client, "restore")
        self._observe_purchase = load_script(client, "observe_purchase")
        self._adjust_rate = load_script(client, "adjust_rate")
        self._raise_mark = load_script(client, "raise_mark")

    def enter(
        self,
        target: Target,
        user_id: str,
        now_ms: int,
        terms: GrantTerms,
        defaults: Defaults,
        decision: Decision = QUEUED,
        invited: bool = False,
    ) -> Place:
        """Put `user_id` in line, or in the pre-queue before opening (same place if already there), or, with the
        target's safety net on and nobody waiting, admit them at once; if this call admits them, their entry token's
        grant is drawn by `terms` from the entry it admits. An invite-only target takes only users `invited` to it."""
        shards = self.shard_count(target)
        reply = self._enter_on(target, shards, user_id, now_ms, terms, defaults, decision, invited)
        if reply.tag == "SHARDS":
            shards = self._relearnt(target, reply.shards, shard_of(user_id, shards))
            reply = self._enter_on(target, shards, user_id, now_ms, terms, defaults, decision, invited)
            if reply.tag == "SHARDS":
                raise _resized(target)
        # Only a new place in line asks for it (status.lua's answers have no `register`).
        if getattr(reply, "register", 0):
            self._register(target, defaults.idle_ttl_ms)
        return place_of(reply, shards)

    def _enter_on(
        self,
        target: Target,
        shards: int,
        user_id: str,
        now_ms: int,
        terms: GrantTerms,
        defaults: Defaults,
        decision: Decision,
        invited: bool,
    ) -> Any:
        """enter.lua's reply on `user_id`'s sub-line of a line of `shards`."""
        call = self.enter_call(target, shards, user_id, now_ms, terms, defaults, decision, invited)
        return self._enter.read(self._guarded(self._enter.run, call.keys, call.args))

    def enter_call(
        self,
        target: Target,
        shards: int,
        user_id: str,
        now_ms: int,
        terms: GrantTerms,
        defaults: Defaults,
        decision: Decision = QUEUED,
        invited: bool = False,
    ) -> Call:
        """enter.lua's call on `user_id`'s sub-line of a line of `shards`, as `enter` sends it (benchmarks pipeline
        many)."""
        k = self.keys(target, shard_of(user_id, shards), shards)
        keys, args = self._enter.order(
            waiting=k.waiting,
            heartbeat=k.heartbeat,
            seq=k.seq,
            mark=k.mark,
            token=k.token(user_id),
            registered=k.registered,
            stats=k.stats,
            config=k.config,
            prequeue=k.prequeue,
            draw=k.draw,
            active=k.active,
            budget=k.budget,
            events=k.events,
            pace=k.pace,
            passed=k.passed,
            user_id=user_id,
            now_ms=now_ms,
            default_max_waiting=defaults.max_waiting,
            idle_ttl_ms=defaults.idle_ttl_ms,
            entry_key=terms.entry_key,
            grant_expires_s=terms.expires_at,
            grant_ttl_ms=terms.expires_at * 1000 - now_ms,
            grant_expires_ms=terms.expires_at * 1000,
            registration_refresh_ms=REGISTRATION_REFRESH_MS,
            default_batch=defaults.batch,
            default_tick_ms=defaults.tick_ms,
            open_on_first_use=int(defaults.open_on_first_use),
            invited=int(invited),
            **self.outbox,
            flag_version=decision.flag_version,
            queued=int(decision.queued),
            pass_window_ms=PASS_WINDOW_MS,
            shards=shards,
        )
        return Call(self._enter, keys, args)

    def status(
        self,
        target: Target,
        user_id: str,
        now_ms: int,
        grant: EntryGrant | None,
        ticket: QueueTicket,
        defaults: Defaults,
        decision: Decision = QUEUED,
    ) -> Place:
        """Where the entry `ticket` names stands; refreshes its heartbeat, and admits it (with `grant`) if the mark
        has passed its seq. Without a grant (a poll that is not expected to admit), such a poll answers Due.

        On admission the wait since the ticket's entry goes into the target's wait-time histogram, and beside it
        how it compares with the estimate the ticket's entry was first told (the ETA's accuracy).
        """
        shards = self.shard_count(target)
        reply = self._status_on(target, shards, user_id, now_ms, grant, ticket, defaults, decision)
        if reply.tag == "SHARDS":
            shards = self._relearnt(target, reply.shards, shard_of(user_id, shards))
            reply = self._status_on(target, shards, user_id, now_ms, grant, ticket, defaults, decision)
            if reply.tag == "SHARDS":
                raise _resized(target)
        return place_of(reply, shards)

    def _status_on(
        self,
        target: Target,
        shards: int,
        user_id: str,
        now_ms: int,
        grant: EntryGrant | None,
        ticket: QueueTicket,
        defaults: Defaults,
        decision: Decision,
    ) -> Any:
        """status.lua's reply on `user_id`'s sub-line of a line of `shards`."""
        k = self.keys(target, shard_of(user_id, shards), shards)
        named = {
            "waiting": k.waiting,
            "heartbeat": k.heartbeat,
            "mark": k.mark,
            "token": k.token(user_id),
            "stats": k.stats,
            "pace": k.pace,
            "config": k.config,
            "prequeue": k.prequeue,
            "draw": k.draw,
            "ended": k.ended,
            "fence": k.fence,
            "user_id": user_id,
            "now_ms": now_ms,
            "default_batch": defaults.batch,
            "default_tick_ms": defaults.tick_ms,
            "ticket_entry": ticket.seq,
            "flag_version": decision.flag_version,
            "queued": int(decision.queued),
            "shards": shards,
        }
        if grant is not None:
            wait_ms = max(0, now_ms - ticket.entered_at_ms)
            told = ticket.told
            named.update(
                waits=k.waits,
                active=k.active,
                grant=grant.text,
                grant_ttl_ms=grant.expires_at * 1000 - now_ms,
                grant_expires_ms=grant.expires_at * 1000,
                wait_ms=wait_ms,
                wait_bucket=waits.bucket_of(wait_ms / 1000),
                told_inside="" if told is None else int(told.holds(wait_ms / 1000)),
                told_error_bucket="" if told is None else waits.bucket_of(abs(wait_ms / 1000 - told.eta_s)),
                idle_ttl_ms=defaults.idle_ttl_ms,
            )
        keys, args = self._status.order(**named)
        return self._status.read(self._guarded(self._status.run, keys, args))

    def leave(
        self, target: Target, user_id: str, entry: int, now_ms: int, idle_ttl_ms: int, default_tick_ms: int
    ) -> bool | OtherEntry:
        """Take `user_id`'s entry numbered `entry` (its ticket's seq) out of line (or the pre-queue), revoking an
        entry token it holds unused; True if it was in line, OtherEntry (and nothing changes) if `entry` is not
        their current entry. The ETA counts the leave as a departure only after a tick in line, once per user in
        DEPARTURE_WINDOW_MS (lua/leave.lua)."""
        left = self._leave_on(target, self.shard_count(target), user_id, entry, now_ms, idle_ttl_ms, default_tick_ms)
        if left == -2:
            left = self._leave_on(target, self._reread(target), user_id, entry, now_ms, idle_ttl_ms, default_tick_ms)
            if left == -2:
                raise _resized(target)
        return OtherEntry() if left == -1 else left == 1

    def _leave_on(
        self,
        target: Target,
        shards: int,
        user_id: str,
        entry: int,
        now_ms: int,
        idle_ttl_ms: int,
        default_tick_ms: int,
    ) -> int:
        """leave.lua's reply on `user_id`'s sub-line of a line of `shards`."""
        k = self.keys(target, shard_of(user_id, shards), shards)
        keys, args = self._leave.order(
            waiting=k.waiting,
            heartbeat=k.heartbeat,
            token=k.token(user_id),
            stats=k.stats,
            prequeue=k.prequeue,
            active=k.active,
            revoked=k.revoked,
            events=k.events,
            ended=k.ended,
            mark=k.mark,
            config=k.config,
            departed=k.departed,
            user_id=user_id,
            ticket_entry=entry,
            now_ms=now_ms,
            clock_skew_margin_ms=CLOCK_SKEW_MARGIN_MS,
            idle_ttl_ms=idle_ttl_ms,
            **self.outbox,
            default_tick_ms=default_tick_ms,
            departure_window_ms=DEPARTURE_WINDOW_MS,
            shards=shards,
        )
        return self._guarded(self._leave.run, keys, args)

    def raise_mark(self, target: Target, seq: int, tick_ms: int, idle_ttl_ms: int) -> bool:
        """Move the admitted mark up to `seq` (never down), and count the ticks of `tick_ms` up to now as applied:
        the admissions a container made by dead reckoning while Redis could not be asked. True if it moved."""
        k = self.keys(target)
        keys, args = self._raise_mark.order(mark=k.mark, tick=k.tick, seq=seq, tick_ms=tick_ms, idle_ttl_ms=idle_ttl_ms)
        return self._guarded(self._raise_mark.run, keys, args) == 1

    def consume(self, token: EntryToken, consumption_id: str, now_ms: int, open_on_first_use: bool = False) -> str:
        """Use `token` for a purchase: a `Consumption`. The marker lives the token's life and the clock-skew margin.
        Its target must be known (an operator opened it), unless targets `open_on_first_use`. On the sub-line of the
        token's user, where their entry was admitted (the line is not resized while a token is live)."""
        used = self._consume_on(self.shard_count(token.target), token, consumption_id, now_ms, open_on_first_use)
        if used == "SHARDS":
            shards = self._reread(token.target)
            used = self._consume_on(shards, token, consumption_id, now_ms, open_on_first_use)
            if used == "SHARDS":
                raise _resized(token.target)
        return used

    def _consume_on(
        self, shards: int, token: EntryToken, consumption_id: str, now_ms: int, open_on_first_use: bool
    ) -> str:
        """consume.lua's reply on the token's sub-line of a line of `shards`."""
        k = self.keys(token.target, shard_of(token.user_id, shards), shards)
        ttl_ms = max(1, token.expires_at * 1000 - now_ms + CLOCK_SKEW_MARGIN_MS)
        keys, args = self._consume.order(
            consumed=k.consumed(token.token_id),
            active=k.active,
            revoked=k.revoked,
            config=k.config,
            consumption_id=consumption_id,
            marker_ttl_ms=ttl_ms,
            user_id=token.user_id,
            token_id=token.token_id,
            open_on_first_use=int(open_on_first_use),
            minted=token.minted,
            now_ms=now_ms,
            shards=shards,
        )
        return self._guarded(self._consume.run, keys, args)

    def restore(self, token: EntryToken, consumption_id: str) -> bool:
        """Undo consumption `consumption_id` of `token` (the shop certainly did not take the order); False if the
        token expired or was used again since."""
        return self._settle(token, consumption_id, "unused")

    def mark_unknown(self, token: EntryToken, consumption_id: str) -> bool:
        """Record that consumption `consumption_id` of `token` has no certain outcome: the token stays used, and a
        later purchase with it is forwarded again under the same Idempotency-Key."""
        return self._settle(token, consumption_id, "unknown")

    def _settle(self, token: EntryToken, consumption_id: str, outcome: str) -> bool:
        k = self._token_keys(token)
        keys, args = self._restore.order(
            consumed=k.consumed(token.token_id),
            active=k.active,
            events=k.events,
            stats=k.stats,
            revoked=k.revoked,
            config=k.config,
            waiting=k.waiting,
            mark=k.mark,
            consumption_id=consumption_id,
            user_id=token.user_id,
            token_expires_ms=token.expires_at * 1000,
            outcome=outcome,
            token_id=token.token_id,
            **self.outbox,
        )
        return bool(self._guarded(self._restore.run, keys, args))

    def write_back(self, used: Sequence[tuple[EntryToken, bool]], now_ms: int) -> None:
        """Record purchases made while Redis was unreachable: each (token, outcome known) becomes a one-time
        marker, 'unknown' unless the outcome was known. A marker already there stands."""

        def send() -> None:
            pipe = self.client.pipeline(transaction=False)
            for token, known in used:
                ttl_ms = max(1, token.expires_at * 1000 - now_ms + CLOCK_SKEW_MARGIN_MS)
                marker = "written-back" if known else "unknown"
                pipe.set(self._token_keys(token).consumed(token.token_id), marker, nx=True, px=ttl_ms)
            pipe.execute()

        self._guarded(send)

    def stats(self, target: Target, now_ms: int) -> QueueFigures:
        """The target's counters: one round trip, and one more for a sharded line's other sub-lines, whose figures
        are summed with sub-line 0's (the configuration, the draw and the shop's health are sub-line 0's)."""
        first = self._stats.read(self._guarded(self._stats.run, *self._stats_call(target, 0, 1, now_ms)))
        config = _pairs(first.config)
        shards = int(config.get("shards") or 1)
        replies = [first]
        if shards > 1:
            calls = [Call(self._stats, *self._stats_call(target, shard, shards, now_ms)) for shard in range(1, shards)]
            replies += [self._stats.read(reply) for reply in self._guarded(self._fan_out, calls)]
        health, fence = _pairs(first.health), _pairs(first.fence)
        # Counters only: a field of another layout (a deploy during a sale) is left out.
        counters: Counter[str] = Counter()
        histogram: Counter[int] = Counter()
        for reply in replies:
            counters.update(
                {name: int(value) for name, value in _pairs(reply.stats).items() if value.lstrip("-").isdigit()}
            )
            histogram.update({int(b): int(n) for b, n in _pairs(reply.waits).items()})
        eta_errors = {int(name[10:]): n for name, n in counters.items() if name.startswith("eta_error:")}
        rates = [float(reply.rate) for reply in replies if reply.rate]
        ticks = [int(reply.last_tick_ms) for reply in replies if reply.last_tick_ms]
        purchases = [p for reply in replies for p in map(shop_health.Purchase.parse, reply.purchases) if p is not None]
        draw = _pairs(first.draw)
        if "placed" in draw:
            # The opening placed each sub-line's pre-queue on its sub-line: the line's are all of them.
            draw["placed"] = str(sum(int(_pairs(reply.draw).get("placed", 0)) for reply in replies))
        return QueueFigures(
            waiting=sum(reply.waiting for reply in replies),
            pre_queued=sum(reply.pre_queued for reply in replies),
            active=sum(reply.active for reply in replies),
            admitted=counters.get("admitted", 0),
            left=counters.get("left", 0),
            evicted=counters.get("evicted", 0),
            wait_ms=counters.get("wait_ms", 0),
            wait_histogram=dict(histogram),
            # Each sub-line measures its own admissions: the line's rate is their sum.
            measured_rate=sum(rates) if rates else None,
            config=TargetConfig.from_redis(config),
            draw=draw,
            commitment=config.get(DRAW_COMMITMENT),
            known=KNOWN_SINCE in config,
            sold_out_released=counters.get("sold_out_released", 0),
            orders=counters.get("orders", 0),
            not_invited=counters.get("not_invited", 0),
            passed_through=counters.get("passed_through", 0),
            allowed_batch=float(health["allowed"]) if "allowed" in health else None,
            purchases=sorted(purchases, key=lambda p: p.sent_ms, reverse=True),
            last_tick_ms=max(ticks) if ticks else None,
            restored=counters.get("restored", 0),
            fences=counters.get("fences", 0),
            lost_seqs=(int(fence["lost_from"]), int(fence["lost_to"])) if "lost_to" in fence else None,
            eta_samples=counters.get("eta_samples", 0),
            eta_inside=counters.get("eta_inside", 0),
            eta_errors=eta_errors,
        )

    def _stats_call(self, target: Target, shard: int, shards: int, now_ms: int) -> tuple[tuple, tuple]:
        """stats.lua's keys and arguments on sub-line `shard` of `shards`."""
        k = self.keys(target, shard, shards)
        return self._stats.order(
            waiting=k.waiting,
            mark=k.mark,
            stats=k.stats,
            waits=k.waits,
            prequeue=k.prequeue,
            active=k.active,
            config=k.config,
            draw=k.draw,
            health=k.health,
            purchases=k.purchases,
            tick=k.tick,
            pace=k.pace,
            fence=k.fence,
            now_ms=now_ms,
        )

    def line(self, target: Target) -> str | None:
        """The line's public state as the pump last wrote it (JSON text), or None: one GET. None for an unknown
        target and for one the pump has not ticked yet: `known` tells them apart."""
        return self._guarded(self.client.get, self.keys(target).line)

    def known(self, target: Target) -> bool:
        """Whether an operator opened the target (or a first enter did)."""
        return bool(self._guarded(self.client.hexists, self.keys(target).config, KNOWN_SINCE))

    def config(self, target: Target) -> tuple[TargetConfig, str] | None:
        """The target's own configuration (unset fields fall back to the global defaults) and its version; None if
        the target is unknown."""
        stored = self._guarded(self.client.hgetall, self.keys(target).config)
        return (TargetConfig.from_redis(stored), config_version(stored)) if KNOWN_SINCE in stored else None

    def shown(self, target: Target) -> tuple[TargetConfig, str | None] | None:
        """What the waiting-room page shows of the target: its own configuration, and the commitment to its next
        opening's seed (None: none); None if the target is unknown. The seed itself never leaves Redis here."""
        stored = self._guarded(self.client.hgetall, self.keys(target).config)
        return (TargetConfig.from_redis(stored), stored.get(DRAW_COMMITMENT)) if KNOWN_SINCE in stored else None

    def configure(
        self,
        target: Target,
        config: TargetConfig,
        now_ms: int,
        precondition: Precondition = UNCONDITIONAL,
        *,
        fresh_seed: tuple[str, str],
    ) -> tuple[str, str | None]:
        """Replace the target's own configuration, at once, if its version meets `precondition` (checked in the
        same step): the pump applies it from its next tick. Opens an unknown target, marked with the stored
        flag's version if it has none. A new opensAt with no seed committed commits `fresh_seed` (seed,
        commitment). Registers it with the pump, whose publisher sends the events this reports.
        Answers lua/configure.lua's outcome (WRITTEN, CHANGED, ALREADY_OPEN, UNKNOWN_TARGET) and the version
        stored after it (None: not open), or IN_USE (nothing written): the write changes the count of sub-lines
        while someone waits, is pre-queued or holds a live entry token.

        A sharded line (docs/sharding.md) is written sub-line by sub-line, sub-line 0 last: it makes the target
        known, and a write refused there for its precondition is refused before any sub-line is written (checked
        here first). Every sub-line gets the same fields, the line's one seed and pre-queue block; a sub-line a
        resize gives up keeps only `shards`, so a caller routing by the old count is sent to route again."""
        k = self.keys(target)
        settings = [item for field_value in config.to_redis().items() for item in field_value]
        stored = self._guarded(self.client.hgetall, k.config)
        before, shards = int(stored.get("shards") or 1), config.shard_count
        block = ""
        if max(before, shards) > 1:
            refused = _refusal(stored, precondition)
            if refused is not None:
                return refused
            if shards != before and self._in_use(target, before, shards, now_ms):
                return "IN_USE", config_version(stored) if KNOWN_SINCE in stored else None
            seed = _line_seed(stored, config, fresh_seed)
            if shards > 1 and seed is not None and config.opens_at_ms is not None:
                kept = seed is not fresh_seed and shards == before and stored.get(DRAW_BLOCK)
                block = kept or self._new_block(target, shards, config.opens_at_ms, now_ms)
            self._configure_sub_lines(target, settings, seed, block, before, shards, now_ms)
        keys, args = self._configure.order(
            config=k.config,
            events=k.events,
            stats=k.stats,
            now_ms=now_ms,
            expect=_expect(precondition),
            fresh_seed=fresh_seed[0],
            fresh_commitment=fresh_seed[1],
            line_seed=0,
            draw_block=block,
            **self.outbox,
        )
        outcome = self._configure.read(self._guarded(self._configure.run, keys, (*args, *settings)))
        if outcome.tag != "WRITTEN":
            return outcome.tag, getattr(outcome, "version", None)
        stored_flag = self.flag()
        if stored_flag is not None:
            # Opened after a flip, the target follows it at once (flag_sync marks the targets it finds).
            pipe = self.client.pipeline(transaction=False)
            for sub_line in self._sub_lines(target, shards):
                pipe.hsetnx(sub_line.config, "flag_version", stored_flag[0])
            self._guarded(pipe.execute)
        self._learnt(target, shards)
        if self.outbox["outbox_cap"]:
            self._register(target, OUTBOX_TTL_MS)
        self._mark_open(target, max(now_ms, config.opens_at_ms or 0), now_ms)
        return outcome.tag, outcome.version

    def _in_use(self, target: Target, before: int, shards: int, now_ms: int) -> bool:
        """Whether anyone waits (or is admitted and collecting), is pre-queued or holds a live entry token on any
        sub-line of a line of `before` or of `shards`: the line cannot change its count of sub-lines under them."""
        pipe = self.client.pipeline(transaction=False)
        for k in {k.base: k for k in self._sub_lines(target, before) + self._sub_lines(target, shards)}.values():
            pipe.zcard(k.waiting)
            pipe.zcard(k.prequeue)
            pipe.zcount(k.active, f"({now_ms}", "+inf")
        return any(self._guarded(pipe.execute))

    def _new_block(self, target: Target, shards: int, opens_at_ms: int, now_ms: int) -> str:
        """A pre-queue block of seqs for every sub-line, 'first last': above every seq a sub-line handed out and
        the clock, by BLOCK_MARGIN_US, up to the opening (lua/enter.lua draws each place in it)."""
        pipe = self.client.pipeline(transaction=False)
        for k in self._sub_lines(target, shards):
            pipe.get(k.seq)
        handed_out = max(int(seq or 0) for seq in self._guarded(pipe.execute))
        first = max(handed_out, now_ms * 1000) + BLOCK_MARGIN_US
        return f"{first} {max(opens_at_ms * 1000 - 1, first + BLOCK_MARGIN_US - 1)}"

    def _configure_sub_lines(
        self,
        target: Target,
        settings: list,
        seed: tuple[str, str] | None,
        block: str,
        before: int,
        shards: int,
        now_ms: int,
    ) -> None:
        """Write the configuration on the sub-lines past the first (quietly: sub-line 0 reports the change), and
        leave on each sub-line a resize gave up (tags of the old count that the new one does not name) only the new
        count."""
        calls = [
            self._configure.bind(
                settings,
                config=k.config,
                events=k.events,
                stats=k.stats,
                now_ms=now_ms,
                expect="",
                outbox_cap=0,
                outbox_ttl_ms=OUTBOX_TTL_MS,
                fresh_seed=seed[0] if seed else "",
                fresh_commitment=seed[1] if seed else "",
                line_seed=1,
                draw_block=block,
            )
            for k in self._sub_lines(target, shards)[1:]
        ]
        self._guarded(self._fan_out, calls)
        # A sub-line's tag depends on the count: every old sub-line the new count does not name is given up.
        kept = {k.config for k in self._sub_lines(target, shards)}
        given_up = {k.config for k in self._sub_lines(target, before)} - kept
        if given_up:
            pipe = self.client.pipeline(transaction=False)
            for config in given_up:
                pipe.delete(config)
                pipe.hset(config, "shards", shards)
            self._guarded(pipe.execute)

    def observe_purchase(
        self,
        target: Target,
        purchase: shop_health.Purchase,
        accepted: bool,
        sold_out: bool,
        token: EntryToken | None = None,
        status: int = 0,
    ) -> int:
        """Note a forwarded purchase's latency and outcome (the shop's `status`, 0 for no answer), and report it
        as an event when it used entry `token`; the shop's word that stock ran out marks the target sold out.
        0: unknown target (nothing written), 1: noted, 2: noted, and now sold out. Noted on sub-line 0 whichever
        sub-line the token was used on: the shop's health (originSlo, judged there) counts every purchase of the
        line, its throughput as much as its latency; a sold out holds for every sub-line."""
        k = self.keys(target)
        keys, args = self._observe_purchase.order(
            config=k.config,
            purchases=k.purchases,
            stats=k.stats,
            events=k.events,
            registered=k.registered,
            sent_ms=purchase.sent_ms,
            latency_ms=purchase.latency_ms,
            ok=int(purchase.ok),
            accepted=int(accepted),
            sold_out=int(sold_out),
            max_purchases=shop_health.MAX_PURCHASES,
            purchases_ttl_ms=shop_health.PURCHASES_TTL_MS,
            token_id=token.token_id if token else "",
            user_id=token.user_id if token else "",
            status=status,
            registration_refresh_ms=REGISTRATION_REFRESH_MS,
            **self.outbox,
        )
        noted = self._observe_purchase.read(self._guarded(self._observe_purchase.run, keys, args))
        if noted.register:
            self._register(target, OUTBOX_TTL_MS)
        if noted.noted == 2 and self.shard_count(target) > 1:
            # The sub-line that heard it reported TargetSoldOut; the others stop their users at their next call.
            pipe = self.client.pipeline(transaction=False)
            for other in self._sub_lines(target):
                pipe.hset(other.config, "sold_out", 1)
            self._guarded(pipe.execute)
        return int(noted.noted)

    def flag(self) -> tuple[str, dict] | None:
        """The flag configuration flag_sync stored last, with its version (None: none stored)."""
        stored = self._guarded(self.client.get, self.global_keys.flag)
        if stored is None:
            return None
        value = json.loads(stored)
        return value["version"], value["configuration"]

    def publish_flag(self, version: str, configuration: dict) -> int:
        """Store a flag configuration, then mark every known target's settings with its version (flag_sync), on
        every sub-line of a sharded line; answers how many targets were marked. The enter and status scripts compare
        the mark with the version their caller decided by: no request pays a round trip for it."""
        self.client.set(self.global_keys.flag, json.dumps({"version": version, "configuration": configuration}))
        scanned = self.client.scan_iter(match=self.global_keys.configs, count=1000)
        known = {key for key in scanned if self.global_keys.is_config(key)}
        registered = list(self.registered_targets())
        for target, shards in zip(registered, self._read_shard_counts(registered), strict=True):
            known |= {k.config for k in self._sub_lines(target, shards)}
        for config_key in known:
            self.client.hset(config_key, "flag_version", version)
        return sum(1 for key in known if self.global_keys.is_first_config(key))

    def pending_events(self, targets: Sequence[Target], count: int) -> dict[Target, tuple[list, int]]:
        """Each target's oldest `count` unpublished events, as (entry id, {field: value}), and how many events its
        outbox cap pushed out unpublished (not yet taken by `events_published`). One round trip, and one more to
        learn the targets' counts of sub-lines: each sub-line has its own outbox, whose entry ids carry `#<sub-line>`
        past the first (`events_published` takes them back); the events name the target."""
        shards = self._read_shard_counts(targets)
        pipe = self.client.pipeline(transaction=False)
        for target, n in zip(targets, shards, strict=True):
            for k in self._sub_lines(target, n):
                pipe.xrange(k.events, count=count)
                pipe.hget(k.stats, "events_dropped")
        replies = iter(pipe.execute())
        pending = {}
        for target, n in zip(targets, shards, strict=True):
            entries, dropped = [], 0
            for shard in range(n):
                entries += [(_sub_line_id(entry_id, shard), fields) for entry_id, fields in next(replies)]
                dropped += int(next(replies) or 0)
            if n > 1:
                entries = sorted(entries, key=lambda entry: _stream_order(entry[0]))[:count]
            pending[target] = (entries, dropped)
        return pending

    def events_published(self, published: Mapping[Target, Sequence[str]], dropped: Mapping[Target, int]) -> None:
        """Delete the events EventBridge accepted (the outbox keeps only what is unpublished), and take the
        dropped counts that were reported. One round trip; a sharded line takes one more, to learn its count of
        sub-lines (their keys' names depend on it), and its dropped counts another."""
        sharded = [target for target, ids in published.items() if any("#" in entry_id for entry_id in ids)]
        counts = dict(zip(sharded, self._read_shard_counts(sharded), strict=True))
        pipe = self.client.pipeline(transaction=False)
        for target, ids in published.items():
            by_shard: dict[int, list[str]] = {}
            for entry_id in ids:
                stream_id, _, sub_line = entry_id.partition("#")
                by_shard.setdefault(int(sub_line or 0), []).append(stream_id)
            sub_lines = self._sub_lines(target, counts.get(target, 1))
            for shard, stream_ids in by_shard.items():
                # A sub-line a resize gave up since its events were read no longer has an outbox anyone reads.
                if shard < len(sub_lines):
                    pipe.xdel(sub_lines[shard].events, *stream_ids)
        for target, n in dropped.items():
            for k, taken in self._dropped_by_sub_line(target, n):
                # A decrement, not a reset: drops counted meanwhile stay for the next report.
                pipe.hincrby(k.stats, "events_dropped", -taken)
                pipe.pexpire(k.stats, OUTBOX_TTL_MS, nx=True)
        pipe.execute()

    def _dropped_by_sub_line(self, target: Target, n: int) -> list[tuple[QueueKeys, int]]:
        """`n` reported dropped events of `target`, taken from the sub-lines that counted them."""
        if not n:
            return []
        sub_lines = self._sub_lines(target)
        if len(sub_lines) == 1:
            return [(sub_lines[0], n)]
        pipe = self.client.pipeline(transaction=False)
        for k in sub_lines:
            pipe.hget(k.stats, "events_dropped")
        taken = []
        for k, counted in zip(sub_lines, pipe.execute(), strict=True):
            share = min(n, int(counted or 0))
            if share > 0:
                taken.append((k, share))
                n -= share
        return taken

    def _read_shard_counts(self, targets: Sequence[Target]) -> list[int]:
        """The targets' counts of sub-lines, read from each sub-line 0's config in one round trip, and learnt."""
        if not targets:
            return []
        pipe = self.client.pipeline(transaction=False)
        for target in targets:
            pipe.hget(self.keys(target).config, "shards")
        return [self._learnt(target, n or 1) for target, n in zip(targets, pipe.execute(), strict=True)]

    def shard_count(self, target: Target) -> int:
        """How many sub-lines `target`'s line spans, as this container last learnt it (1 until a script says
        otherwise): requests route by it, and a script refuses a count that is not its sub-line's."""
        return self._shards.get(target, 1)

    def _learnt(self, target: Target, shards: str | int) -> int:
        """Remember `target`'s count of sub-lines, as a script or sub-line 0's config told it."""
        count = int(shards)
        self._shards.pop(target, None)
        self._shards[target] = count
        if len(self._shards) > MAX_SHARD_COUNTS:
            del self._shards[next(iter(self._shards))]
        return count

    def _relearnt(self, target: Target, told: str, shard: int) -> int:
        """Learn `target`'s count of sub-lines from sub-line `shard`'s refusal, which `told` it. Only sub-line 0
        surely holds the current count: a stale count reaches past it a tag of its own layout, which a resize gave
        up (it names the count of that resize, which a later one may have changed) or nothing ever wrote (it
        names 1), so such a refusal sends to sub-line 0's config."""
        return self._learnt(target, told) if shard == 0 else self._reread(target)

    def _reread(self, target: Target) -> int:
        """Learn `target`'s count of sub-lines from sub-line 0's config (absent: 1), for a script whose refusal
        does not carry it."""
        return self._learnt(target, self._guarded(self.client.hget, self.keys(target).config, "shards") or 1)

    def _sub_lines(self, target: Target, shards: int | None = None) -> list[QueueKeys]:
        """The keys of each of the line's sub-lines (of `shards` of them; by default as last learnt)."""
        count = shards or self.shard_count(target)
        return [self.keys(target, shard, count) for shard in range(count)]

    def _token_keys(self, token: EntryToken) -> QueueKeys:
        """The keys of the sub-line an entry token's user belongs to, where it was issued and used."""
        shards = self.shard_count(token.target)
        return self.keys(token.target, shard_of(token.user_id, shards), shards)

    def _fan_out(self, calls: list) -> list:
        """Script calls on several sub-lines in one round trip (a pipeline per node); the first error raised."""
        replies = run_pipelined(self.client, calls)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def _guarded(self, call: Callable[..., Any], *args: object) -> Any:
        """One client-facing Redis call through its slot's circuit breaker (a script's keys name the slot; any
        other call shares one breaker); a failing Redis is a Store* error (redis_connection.guarded)."""
        keys = args[0] if args and isinstance(args[0], tuple) else ()
        key = keys[0] if keys else None
        return guarded(self.client, self.breakers.of(key), key, call, *args)

    def breaker_of(self, target: Target) -> Breaker:
        """The circuit breaker `target`'s calls go through."""
        return self.breakers.of(self.keys(target).config)

    def _register(self, target: Target, idle_ttl_ms: int) -> None:
        # The registry lives in another slot, so enter.lua cannot write it: this second round trip happens
        # once per REGISTRATION_REFRESH_MS per target. The random score lets the pump drop an idle target
        # only if nobody registered it again in between. Like the queues, the registry expires unless used.
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.zadd(self.global_keys.targets, {str(target): random.getrandbits(52)})
            pipe.pexpire(self.global_keys.targets, idle_ttl_ms)
            pipe.execute()
        except REDIS_FAILURES:
            # The user is in line all the same; an enter after the registration lapses registers again.
            logger.warning("target registration failed", extra={"target": str(target)})

    def _mark_open(self, target: Target, opening_ms: int, now_ms: int) -> None:
        # Outside the targets' slots, like the registry. The key lives as long as its latest opening needs:
        # NX gives a new key its TTL, GT only ever lengthens it.
        ttl_ms = opening_ms - now_ms + OPEN_KEPT_MS
        pipe = self.client.pipeline(transaction=False)
        open_key = self.global_keys.open
        pipe.zadd(open_key, {str(target): opening_ms})
        pipe.zremrangebyscore(open_key, "-inf", now_ms - OPEN_KEPT_MS)
        pipe.pexpire(open_key, ttl_ms, nx=True)
        pipe.pexpire(open_key, ttl_ms, gt=True)
        self._guarded(pipe.execute)

    def pump_has_work(self, now_ms: int) -> bool:
        """Whether any target is registered (users in line or in a pre-queue, events to publish) or open: its
        opening (or configuration) within OPEN_LOOKAHEAD_MS ahead or OPEN_KEPT_MS behind `now_ms`."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.global_keys.targets)
        pipe.zcount(self.global_keys.open, now_ms - OPEN_KEPT_MS, now_ms + OPEN_LOOKAHEAD_MS)
        registered, opening = pipe.execute()
        return registered > 0 or opening > 0

    def pump_lock(self, lease_ms: int) -> Lock:
        """The one pump lock (redis-py's Lock: SET NX PX with an owner token; only the owner extends or releases)."""
        return self.client.lock(self.global_keys.pump_lock, timeout=lease_ms / 1000, blocking=False, thread_local=False)

    def registered_targets(self, idle_ttl_ms: int | None = None) -> dict[Target, int]:
        """Every target the pump visits, with the nonce of its registration (see `forget_targets`); with
        `idle_ttl_ms`, the registry's sliding TTL is refreshed in the same round trip."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zrange(self.global_keys.targets, 0, -1, withscores=True)
        if idle_ttl_ms is not None:
            pipe.pexpire(self.global_keys.targets, idle_ttl_ms)
        targets = {}
        for member, nonce in pipe.execute()[0]:
            type_, _, target_id = member.partition(":")
            try:
                targets[parse_target(type_, target_id)] = int(nonce)
            except QueueError:
                # Only `_register` writes the registry: anything else was put there by hand.
                logger.warning("registry member is not a target", extra={"member": member[:100]})
        return targets

    def targets(self) -> list[Target]:
        """The registered targets, in order, for operators (a client-facing call: through the breaker)."""
        return sorted(self._guarded(self.registered_targets))

    def admit_and_evict_all(
        self,
        targets: Sequence[Target],
        rules: PumpRules,
        seen: Mapping[Any, tuple[int, int]] | None = None,
    ) -> dict[Target, TargetTick | Exception]:
        """One pump tick for every target, evicting users who stopped polling, then admitting.

        Evicting first keeps this tick's admissions for users still waiting. A target whose scripts fail
        gets its error back instead of a result, so it cannot stop the others. `seen` holds, per sub-line
        (`sharding.sub_line`), the last tick (its start, ms) and mark the pump saw applied: a node holding less is
        fenced (admit.lua). One-line targets tick in one round trip for all of them, sharded lines in four
        (`_tick_sharded`). The sub-lines of each target's line are taken as its configuration said at its last
        tick; a target whose configuration says another count now is ticked again with that count.
        """
        seen = seen or {}
        results, recounted, evicted = self._tick(targets, rules, seen, self._shards)
        if recounted:
            again, changed, _ = self._tick(list(recounted), rules, seen, recounted)
            for target, result in again.items():
                # What the first look at the target evicted was evicted all the same.
                results[target] = (
                    dataclasses.replace(result, evicted=result.evicted + evicted.get(target, 0))
                    if isinstance(result, TargetTick)
                    else result
                )
            for target in changed:
                results[target] = QueueError(f"{target}'s line changed its sub-lines during the tick")
        for target, result in results.items():
            if isinstance(result, TargetTick):
                # As its configuration said at this tick: a one-line target's next tick never asks.
                self._learnt(target, result.shards)
        return results

    def _tick(
        self,
        targets: Sequence[Target],
        rules: PumpRules,
        seen: Mapping[Any, tuple[int, int]],
        shards: Mapping[Target, int],
    ) -> tuple[dict[Target, TargetTick | Exception], dict[Target, int], dict[Target, int]]:
        """The tick of `targets`, and those whose configuration says another count of sub-lines than `shards`,
        with that count (nothing admitted) and what was evicted meanwhile."""
        single = [target for target in targets if shards.get(target, 1) == 1]
        sharded = {target: shards[target] for target in targets if shards.get(target, 1) > 1}
        calls = [call for target in single for call in self._single_calls(target, rules, seen)]
        reads = {target: self._front_calls(target, count, rules) for target, count in sharded.items()}
        replies = run_pipelined(self.client, calls + [call for read in reads.values() for call in read])
        results: dict[Target, TargetTick | Exception] = {}
        recounted: dict[Target, int] = {}
        evicted: dict[Target, int] = {}
        own = replies[: len(calls)]
        for target, evicted_now, adjusted, admitted, lined in zip(
            single, own[0::4], own[1::4], own[2::4], own[3::4], strict=True
        ):
            error = next((r for r in (evicted_now, adjusted, admitted, lined) if isinstance(r, Exception)), None)
            if error is not None:
                results[target] = error
                continue
            evict, tick = self._evict.read(evicted_now), self._admit.read(admitted)
            if tick.shards != 1:
                recounted[target], evicted[target] = tick.shards, evict.evicted
                continue
            results[target] = TargetTick(
                applied_tick=tick.applied_tick or None,
                admitted=tick.admitted,
                mark=tick.mark,
                waiting=tick.waiting,
                evicted=evict.evicted,
                idle=evict.idle == 1,
                server_ms=tick.server_ms,
                needs_draw=tick.needs_draw == 1,
                tick_ms=tick.tick_ms,
                batch=tick.batch,
                max_waiting=tick.max_waiting or None,
                max_active=tick.max_active or None,
                paused=tick.paused == 1,
                sold_out=tick.sold_out == 1,
                per_tick=float(tick.per_tick),
                fenced=(tick.fenced_from, tick.fenced_to) if tick.fenced_to else None,
            )
        at = len(calls)
        looked: dict[Target, tuple[list[Any], list[Front], Plan | None]] = {}
        for target, read in reads.items():
            got, at = replies[at : at + len(read)], at + len(read)
            error = next((r for r in got if isinstance(r, Exception)), None)
            if error is not None:
                results[target] = error
                continue
            # Per sub-line: evict and front; sub-line 0's adjust_rate between them.
            evictions = [self._evict.read(got[0]), *(self._evict.read(r) for r in got[3::2])]
            fronts = [front_of(self._front.read(got[2])), *(front_of(self._front.read(r)) for r in got[4::2])]
            if fronts[0].shards != sharded[target]:
                recounted[target] = fronts[0].shards
                evicted[target] = sum(e.evicted for e in evictions)
                continue
            looked[target] = (evictions, fronts, Plan.recorded(self._front.read(got[2]).plan))
        results.update(self._tick_sharded(looked, rules, seen))
        return results, recounted, evicted

    def _single_calls(self, target: Target, rules: PumpRules, seen: Mapping[Any, tuple[int, int]]) -> list[Call]:
        """A one-line target's tick: evict, follow the shop's health, admit, look at the line."""
        k = self.keys(target)
        return [
            self._evict_call(k, rules),
            # Before admitting: this tick admits at the rate the shop's health allows (a no-op without originSlo).
            self._adjust_call(k, rules),
            self._admit_call(k, rules, seen.get(target, (0, 0))),
            # After admitting: the window and the public state start from the mark this tick moved.
            self._line_call(k, rules, publish=True),
        ]

    def _front_calls(self, target: Target, count: int, rules: PumpRules) -> list[Call]:
        """A sharded line's first look: every sub-line's eviction and front, sub-line 0's shop's health between."""
        calls = []
        for shard in range(count):
            k = self.keys(target, shard, count)
            calls.append(self._evict_call(k, rules))
            if shard == 0:
                # The shop's health is judged on sub-line 0: the purchases it sees are a sample of the line's.
                calls.append(self._adjust_call(k, rules))
            calls.append(
                self._front.bind(
                    waiting=k.waiting,
                    mark=k.mark,
                    tick=k.tick,
                    config=k.config,
                    active=k.active,
                    draw=k.draw,
                    health=k.health,
                    plan=k.plan,
                    catchup_ticks=rules.catchup_ticks,
                    default_tick_ms=rules.tick_ms,
                    default_batch=rules.batch,
                )
            )
        return calls

    def _tick_sharded(
        self,
        looked: Mapping[Target, tuple[list[Any], list[Front], Plan | None]],
        rules: PumpRules,
        seen: Mapping[Any, tuple[int, int]],
    ) -> dict[Target, TargetTick | Exception]:
        """The rest of the sharded lines' tick (docs/sharding.md), all lines in each round trip: record each line's
        plan on its sub-line 0 (or take the one recorded); apply it on every sub-line, the last plan first where a
        pump died before applying it there, and look at each sub-line's line; then write the merged line."""
        plans = {
            target: plan_of(fronts, recorded, rules.catchup_ticks) for target, (_, fronts, recorded) in looked.items()
        }
        results: dict[Target, TargetTick | Exception] = {}
        new = [target for target, plan in plans.items() if plan is not looked[target][2]]
        calls = [
            self._plan.bind(plan=self.keys(target).plan, **plans[target].args(), idle_ttl_ms=rules.idle_ttl_ms)
            for target in new
        ]
        for target, reply in zip(new, run_pipelined(self.client, calls), strict=True):
            if isinstance(reply, Exception):
                results[target] = reply
            else:
                # The plan in force: ours, or the one another pump recorded first.
                plans[target] = Plan.recorded(reply) or plans[target]
        self._copy_sold_out({target: looked[target][1] for target in plans if target not in results})

        calls = []
        layout: dict[Target, list[int]] = {}
        for target, plan in plans.items():
            if target in results:
                continue
            _, fronts, recorded = looked[target]
            layout[target] = []
            for shard, front in enumerate(fronts):
                k = self.keys(target, shard, len(fronts))
                saw = seen.get(sub_line(target, shard), (0, 0))
                applied = []
                if recorded is not None and front.last_tick_ms < recorded.tick_ms < plan.tick_ms:
                    # A pump recorded the last plan and stopped before this sub-line: it goes first.
                    applied.append(self._admit_call(k, rules, saw, len(fronts), recorded, shard))
                applied.append(self._admit_call(k, rules, saw, len(fronts), plan, shard))
                calls.extend([*applied, self._line_call(k, rules, publish=False)])
                layout[target].append(len(applied))
        replies = run_pipelined(self.client, calls)

        at = 0
        lines = {}
        for target, counts in layout.items():
            got = replies[at : at + sum(counts) + len(counts)]
            at += len(got)
            error = next((r for r in got if isinstance(r, Exception)), None)
            if error is not None:
                results[target] = error
                continue
            evictions, fronts, _ = looked[target]
            admits, states = [], []
            n = 0
            for count in counts:
                admits.append([self._admit.read(r) for r in got[n : n + count]])
                states.append(self._line.read(got[n + count]).state)
                n += count + 1
            if any(tick.shards != len(fronts) for ticks in admits for tick in ticks):
                results[target] = QueueError(f"{target}'s line changed its sub-lines during the tick")
                continue
            plan = plans[target]
            lines[target] = merged_line(states, plan.cutoff, fronts[0].batch * 1000 / fronts[0].tick_ms)
            results[target] = self._sharded_result(plan, evictions, fronts, admits)
        pipe = self.client.pipeline(transaction=False)
        for target, line in lines.items():
            pipe.set(self.keys(target).line, line, px=rules.idle_ttl_ms)
        for target, reply in zip(lines, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(reply, Exception):
                results[target] = reply
        return results

    @staticmethod
    def _sharded_result(plan: Plan, evictions: list[Any], fronts: list[Front], admits: list[list[Any]]) -> TargetTick:
        """What a sharded line's tick did, over all its sub-lines: totals, and each sub-line's tick and mark."""
        last = [ticks[-1] for ticks in admits]
        first = last[0]
        held = any(front.held for front in fronts)
        fenced = next(((t.fenced_from, t.fenced_to) for ticks in admits for t in ticks if t.fenced_to), None)
        return TargetTick(
            applied_tick=plan.tick_ms // first.tick_ms
            if any(t.applied_tick for ticks in admits for t in ticks)
            else None,
            admitted=sum(t.admitted for ticks in admits for t in ticks),
            mark=plan.cutoff,
            waiting=sum(t.waiting for t in last),
            evicted=sum(e.evicted for e in evictions),
            idle=all(e.idle == 1 for e in evictions),
            server_ms=fronts[0].server_ms,
            needs_draw=any(t.needs_draw == 1 for t in last) or any(front.opening for front in fronts),
            tick_ms=first.tick_ms,
            batch=first.batch,
            max_waiting=first.max_waiting or None,
            max_active=first.max_active or None,
            paused=any(front.held == PAUSED for front in fronts),
            sold_out=any(front.held == SOLD_OUT for front in fronts),
            per_tick=0.0 if held else fronts[0].per_tick,
            fenced=fenced,
            shards=len(fronts),
            # Each sub-line holds the plan's tick now (it applied it, or a later one), and its own mark.
            sub_lines=tuple(
                (max(front.last_tick_ms, plan.tick_ms), int(t.mark)) for front, t in zip(fronts, last, strict=True)
            ),
        )

    def _copy_sold_out(self, fronts: Mapping[Target, list[Front]]) -> None:
        """A purchase marks the buyer's sub-line sold out (observe_purchase.lua): the line's other sub-lines follow
        the same tick. A copy that fails is made again at the next tick."""
        pipe = self.client.pipeline(transaction=False)
        for target, sub_lines in fronts.items():
            if any(front.held == SOLD_OUT for front in sub_lines):
                for shard, front in enumerate(sub_lines):
                    if front.held != SOLD_OUT:
                        pipe.hset(self.keys(target, shard, len(sub_lines)).config, "sold_out", "1")
        if len(pipe):
            try:
                pipe.execute()
            except REDIS_FAILURES:
                logger.warning("could not copy sold out to every sub-line", exc_info=True)

    def _evict_call(self, k: QueueKeys, rules: PumpRules) -> Call:
        return self._evict.bind(
            waiting=k.waiting,
            heartbeat=k.heartbeat,
            registered=k.registered,
            stats=k.stats,
            prequeue=k.prequeue,
            events=k.events,
            ended=k.ended,
            window=k.window,
            heartbeat_timeout_ms=rules.heartbeat_timeout_ms,
            max_evict=rules.max_evict,
            **self.outbox,
        )

    def _adjust_call(self, k: QueueKeys, rules: PumpRules) -> Call:
        return self._adjust_rate.bind(
            config=k.config,
            health=k.health,
            purchases=k.purchases,
            default_tick_ms=rules.tick_ms,
            default_batch=rules.batch,
            health_ttl_ms=rules.idle_ttl_ms,
            **asdict(rules.following),
        )

    def _admit_call(
        self,
        k: QueueKeys,
        rules: PumpRules,
        saw: tuple[int, int],
        shards: int = 1,
        plan: Plan | None = None,
        shard: int = 0,
    ) -> Call:
        """admit.lua on one line, or on one sub-line with its share of `plan`."""
        share = plan.shares[shard] if plan is not None and shard < len(plan.shares) else 0
        return self._admit.bind(
            waiting=k.waiting,
            heartbeat=k.heartbeat,
            seq=k.seq,
            mark=k.mark,
            tick=k.tick,
            stats=k.stats,
            waits=k.waits,
            admissions=k.admissions,
            config=k.config,
            prequeue=k.prequeue,
            draw=k.draw,
            active=k.active,
            health=k.health,
            events=k.events,
            ended=k.ended,
            budget=k.budget,
            pace=k.pace,
            fence=k.fence,
            default_tick_ms=rules.tick_ms,
            default_batch=rules.batch,
            catchup_ticks=rules.catchup_ticks,
            idle_ttl_ms=rules.idle_ttl_ms,
            **self.outbox,
            seen_tick_ms=saw[0],
            seen_mark=saw[1],
            fence_margin_us=FENCE_MARGIN_US,
            fence_window_ms=rules.heartbeat_timeout_ms,
            shards=shards,
            share=-1 if plan is None else share,
            through=plan.throughs[shard] if plan is not None and share else 0,
            plan_tick_ms=0 if plan is None else plan.tick_ms,
        )

    def _line_call(self, k: QueueKeys, rules: PumpRules, publish: bool) -> Call:
        return self._line.bind(
            waiting=k.waiting,
            heartbeat=k.heartbeat,
            mark=k.mark,
            window=k.window,
            line=k.line,
            config=k.config,
            pace=k.pace,
            draw=k.draw,
            default_batch=rules.batch,
            default_tick_ms=rules.tick_ms,
            presence_window_s=rules.presence_window_s,
            read_cap_s=rules.line_read_cap_s,
            max_crossings=MAX_CROSSINGS,
            points=SHAPE_POINTS,
            idle_ttl_ms=rules.idle_ttl_ms,
            publish=1 if publish else 0,
        )

    def forget_targets(self, nonces: Mapping[Target, int]) -> list[Target]:
        """Drop idle targets from the registry, each only if it was not registered again since `nonces` was read."""
        calls = [
            self._forget_target.bind(targets=self.global_keys.targets, target=str(target), nonce=nonce)
            for target, nonce in nonces.items()
        ]
        return [target for target, gone in zip(nonces, run_pipelined(self.client, calls), strict=True) if gone == 1]


def config_version(stored: Mapping[str, str]) -> str:
    """The version of a stored configuration (the API's ETag): the SHA-1 of its operator's fields, all but those
    lua/configure.lua keeps across a write, as sorted 'field=value' lines (the script computes the same)."""
    lines = sorted(f"{name}={value}" for name, value in stored.items() if name not in _NOT_THE_OPERATORS)
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()


def _expect(precondition: Precondition) -> str:
    """lua/configure.lua's `expect` for a precondition."""
    if precondition.absent:
        return "new"
    if precondition.any_version:
        return "open"
    if precondition.given:
        return " ".join(("version", *precondition.etags))
    return ""


def _refusal(stored: Mapping[str, str], precondition: Precondition) -> tuple[str, str | None] | None:
    """What lua/configure.lua would answer instead of writing over `stored` under `precondition` (None: it
    writes): a sharded write checks it before it writes the sub-lines past the first."""
    known = KNOWN_SINCE in stored
    if precondition.absent:
        return ("ALREADY_OPEN", config_version(stored)) if known else None
    if precondition.any_version or precondition.given:
        if not known:
            return "UNKNOWN_TARGET", None
        if precondition.given and config_version(stored) not in precondition.etags:
            return "CHANGED", config_version(stored)
    return None


def _line_seed(stored: Mapping[str, str], config: TargetConfig, fresh_seed: tuple[str, str]) -> tuple[str, str] | None:
    """The seed (and commitment) sub-line 0 keeps or commits in this write (lua/configure.lua's rule): every
    sub-line takes it."""
    if DRAW_SEED in stored:
        return stored[DRAW_SEED], stored[DRAW_COMMITMENT]
    if config.opens_at_ms is not None and str(config.opens_at_ms) != stored.get("opens_at_ms"):
        return fresh_seed
    return None


def _sub_line_id(entry_id: str, shard: int) -> str:
    """An outbox entry's id as the publisher sees it: the stream's id, and `#<sub-line>` past the first."""
    return f"{entry_id}#{shard}" if shard else entry_id


def _stream_order(entry_id: str) -> tuple[int, int]:
    """An outbox entry's place in time: its stream id's milliseconds and counter."""
    ms, _, counter = entry_id.partition("#")[0].partition("-")
    return int(ms), int(counter)


def _resized(target: Target) -> StoreMoving:
    """A call refused for its count of sub-lines twice in a row: the line was resized again meanwhile (an operator's
    seconds-apart changes). Nobody is let in: the caller answers 503, and the client asks again."""
    return StoreMoving(f"{target}'s line changed its count of sub-lines while the call was routed")


def _pairs(flat: list) -> dict[str, str]:
    """A Redis flat field/value reply (HGETALL in a script) as a dict."""
    return dict(zip(flat[0::2], flat[1::2], strict=True))
