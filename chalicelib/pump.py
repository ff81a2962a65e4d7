"""The admission pump: every tick, admits the next batch of each target's line and evicts users who stopped polling.

Correctness rests on Redis, not on this loop: a tick is numbered by Redis server time and admit.lua applies
each tick at most once, so duplicate, overlapping or frozen pumps never admit more than the rate. The pump
lock only keeps the work to one pump at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit
from redis.exceptions import LockNotOwnedError

from chalicelib.answers import TargetTick
from chalicelib.config import Settings
from chalicelib.events import Publisher, PublisherLoop
from chalicelib.observability import NAMESPACE, SERVICE, count, logger
from chalicelib.redis_connection import MOVING, REDIS_FAILURES, is_cluster
from chalicelib.sharding import sub_line, target_of
from chalicelib.store import PumpRules, QueueStore
from chalicelib.targets import Target

# Stop this long before the Lambda deadline, so the last tick and the lock release finish in time.
STOP_BEFORE_DEADLINE_MS = 3000
# EventBridge starts the next invocation a minute after this one. With reserved concurrency 1 an overlap is
# throttled and retried with a growing backoff, which would leave ever longer gaps: hand over before then.
RUN_WINDOW_MS = 58_000
# Wake a little after a tick boundary, so the tick has surely begun on the Redis clock too.
TICK_GUARD_MS = 10


@dataclass(frozen=True)
class TickReport:
    """What one tick did: nothing without the lock, else each target's result (or its error)."""

    held_lock: bool
    targets: dict[Target, TargetTick | Exception]
    errors: int


@dataclass(frozen=True)
class PumpRun:
    """Totals of one pump invocation."""

    ticks: int
    admitted: int
    evicted: int
    errors: int

    def to_body(self) -> dict[str, int]:
        return {"ticks": self.ticks, "admitted": self.admitted, "evicted": self.evicted, "errors": self.errors}


def ticks_requested(event: object) -> int | None:
    """`{"ticks": N}` asks for exactly N ticks; any other event (the EventBridge schedule) runs until the deadline."""
    if not isinstance(event, dict) or "ticks" not in event:
        return None
    ticks = event["ticks"]
    if not isinstance(ticks, int) or isinstance(ticks, bool) or ticks < 1:
        raise ValueError("ticks must be a positive integer")
    return ticks


class Pump:
    """Ticks every `settings.tick_ms`, doing each tick's work for all registered targets while holding the pump lock."""

    def __init__(
        self,
        store: QueueStore,
        settings: Settings,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        publisher: Publisher | None = None,
        seen: dict[Any, tuple[int, int]] | None = None,
    ) -> None:
        self.store = store
        # Per sub-line (sharding.sub_line: the target itself for a one-line target), the last tick (its start, ms)
        # and mark this pump saw applied: a node holding less lost writes to a failover, and the next tick fences it
        # (admit.lua). Kept across invocations of a warm container (app.py).
        self.seen = {} if seen is None else seen
        # State-change events go out beside the ticks, while this pump holds the lock (chalicelib/events.py).
        self.events = (
            None
            if publisher is None
            else PublisherLoop(
                publisher,
                lambda: list(self.store.registered_targets()),
                lambda: self.holding,
            )
        )
        self.clock = clock
        self.sleep = sleep
        self.tick_ms = settings.tick_ms
        self.lease_ms = settings.pump_lease_ticks * settings.tick_ms
        self.rules = PumpRules(
            tick_ms=settings.tick_ms,
            batch=settings.batch_size,
            catchup_ticks=settings.catchup_ticks,
            heartbeat_timeout_ms=settings.heartbeat_timeout_s * 1000,
            max_evict=settings.max_evict_per_tick,
            idle_ttl_ms=settings.queue_idle_ttl_s * 1000,
            presence_window_s=settings.presence_window_s,
            line_read_cap_s=settings.line_read_cap_s,
        )
        self.lock = store.pump_lock(self.lease_ms)
        self.holding = False
        # Redis time minus local time, learnt from each tick, to wake right after the next Redis tick begins.
        self._server_offset_ms = 0.0
        self._wake_every_ms = self.tick_ms
        self.max_waiting = settings.max_waiting

    def run(
        self, ticks: int | None = None, remaining_ms: Callable[[], float] | None = None, until_idle: bool = False
    ) -> PumpRun:
        """Run exactly `ticks` ticks; or, without `ticks`, until shortly before the deadline `remaining_ms()`
        reports (or the run window ends), or forever without a deadline (the local loop). With `until_idle`
        (the scheduled runs) and no `ticks`, return at once while no target is registered or open, and stop
        after a tick that found none (docs/deploy.md: the pump while nothing is on sale). Never raises for
        Redis trouble; releases the lock at the end."""
        until_idle = until_idle and ticks is None
        if until_idle and not self._has_work():
            return PumpRun(ticks=0, admitted=0, evicted=0, errors=0)
        started = self.clock()
        done = admitted = evicted = errors = 0
        if self.events is not None:
            self.events.start()
        try:
            while True:
                report = self.tick()
                if self.events is not None:
                    self.events.nudge()
                done += 1
                errors += report.errors
                for result in report.targets.values():
                    if isinstance(result, TargetTick):
                        admitted += result.admitted
                        evicted += result.evicted
                if ticks is not None and done >= ticks:
                    break
                if until_idle and report.held_lock and not report.targets and not self._has_work():
                    break
                delay_ms = self._ms_to_next_tick()
                if (
                    ticks is None
                    and remaining_ms is not None
                    and (
                        remaining_ms() - delay_ms < STOP_BEFORE_DEADLINE_MS
                        or (self.clock() - started) * 1000 + delay_ms > RUN_WINDOW_MS
                    )
                ):
                    break
                self.sleep(delay_ms / 1000)
        finally:
            if self.events is not None:
                self.events.stop(timeout_s=STOP_BEFORE_DEADLINE_MS / 2000)
            self._release()
        return PumpRun(ticks=done, admitted=admitted, evicted=evicted, errors=errors)

    def tick(self) -> TickReport:
        """One tick: take or keep the lock, then evict and admit for every registered target, pipelined.

        A failing target is logged and counted and the others go on; so does any failure of the tick as a whole.
        """
        try:
            if not self._hold_lock():
                return TickReport(held_lock=False, targets={}, errors=0)
            nonces = self._targets()
            results = self.store.admit_and_evict_all(list(nonces), self.rules, self.seen)
        except Exception:
            # Never crash: a dead Redis or a bug costs this tick, and the next tick tries again.
            logger.exception("pump tick failed")
            count("PumpErrors")
            return TickReport(held_lock=self.holding, targets={}, errors=1)

        errors = 0
        idle = {}
        for target, result in results.items():
            if isinstance(result, Exception):
                errors += 1
                if isinstance(result, MOVING):
                    # A resharding or a failover, not a fault: the target ticks again once its slot has settled.
                    logger.warning("the target's slot is moving", extra={"target": str(target), "error": repr(result)})
                    count("RedisSlotMoving")
                else:
                    logger.error("pump failed on a target", extra={"target": str(target), "error": repr(result)})
                    count("PumpErrors")
                continue
            self._server_offset_ms = result.server_ms - self.clock() * 1000
            self._remember(target, result)
            self._emit_gauges(target, result)
            nonce = nonces[target]
            if result.idle and nonce is not None:
                idle[target] = nonce
        # The admission rate owed to the targets with users still waiting, per tick (also when 0: a heartbeat).
        # The alarm on a stalled pump compares the admissions made against it. A max-active cap or an opening
        # still moving its pre-queue into the line may hold a target back on purpose: those owe nothing that can be
        # told apart from a stall.
        # A paused or sold-out target owes nothing, one following its shop's health (originSlo) what that allows.
        rates = [
            r.per_tick * 1000 / r.tick_ms
            for r in results.values()
            if isinstance(r, TargetTick) and r.waiting > 0 and r.max_active is None and not r.needs_draw
        ]
        count("TargetRatePerSec", value=sum(rates), unit=MetricUnit.CountPerSecond)
        # Wake for the shortest tick any target is configured with (idempotent ticks make extra visits free).
        self._wake_every_ms = min([self.tick_ms, *(r.tick_ms for r in results.values() if isinstance(r, TargetTick))])
        if idle:
            try:
                forgotten = self.store.forget_targets(idle)
                for target in forgotten:
                    # Its keys expire once idle: a new line there starts afresh, and is no failover to fence.
                    for key in [key for key in self.seen if target_of(key) == target]:
                        del self.seen[key]
                logger.info("forgot idle targets", extra={"targets": [str(t) for t in forgotten]})
            except REDIS_FAILURES:
                # Harmless: the target is visited again next tick and forgotten then.
                logger.exception("could not forget idle targets")
                count("PumpErrors")
                errors += 1
        return TickReport(held_lock=True, targets=results, errors=errors)

    def _remember(self, target: Target, result: TargetTick) -> None:
        """Note what the node holds after this tick; report a failover the tick fenced."""
        if result.fenced is not None:
            lost_from, lost_to = result.fenced
            count("FailoverFenced", target)
            logger.warning(
                "failover fenced: the node had lost writes; seqs in the range may have been lost",
                extra={"target": str(target), "lost_seqs_from": lost_from, "lost_seqs_to": lost_to},
            )
        # Whatever this call did, the node now holds this tick (admit.lua applies it or found it applied); each
        # sub-line of a sharded line its own mark, and the plan's tick.
        tick = result.server_ms // result.tick_ms * result.tick_ms
        for shard, (held_tick, mark) in enumerate(result.sub_lines or ((tick, result.mark),)):
            seen_tick, seen_mark = self.seen.get(sub_line(target, shard), (0, 0))
            self.seen[sub_line(target, shard)] = (max(seen_tick, held_tick), max(seen_mark, mark))

    def _targets(self) -> Mapping[Target, int | None]:
        """The registered targets, with their registrations' nonces. While the registry's node cannot be reached (a
        cluster node failing over), the targets this pump ticked lately, with no nonce: none is forgotten then."""
        try:
            return self.store.registered_targets(self.rules.idle_ttl_ms)
        except REDIS_FAILURES:
            if not self.seen or not is_cluster(self.store.client):
                raise
            logger.warning("the target registry cannot be read; ticking the targets seen before")
            return dict.fromkeys(target_of(key) for key in self.seen)

    def _has_work(self) -> bool:
        try:
            return self.store.pump_has_work(int(self.clock() * 1000))
        except REDIS_FAILURES:
            # Unknown is not idle: tick, and let the tick count the failure.
            return True

    def _hold_lock(self) -> bool:
        if self.holding:
            try:
                return self.lock.extend(self.lease_ms / 1000, replace_ttl=True)
            except LockNotOwnedError:
                # The lease ran out while this pump was frozen, and another pump may hold the lock now.
                logger.warning("pump lock lapsed")
                self.holding = False
            except REDIS_FAILURES:
                # The lock's node cannot be reached (a cluster node failing over): go on ticking the targets on the
                # other nodes. Another pump that takes the lock meanwhile costs work, never an admission: a tick
                # applies once. A single Redis that cannot be reached has nothing to tick.
                if not is_cluster(self.store.client):
                    raise
                logger.warning("pump lock unreachable; ticking on", exc_info=True)
                return True
        self.holding = self.lock.acquire(blocking=False)
        return self.holding

    def _release(self) -> None:
        if not self.holding:
            return
        self.holding = False
        try:
            self.lock.release()
        except REDIS_FAILURES:
            # Lapsed or unreachable: the lease ends it anyway.
            logger.warning("could not release the pump lock", exc_info=True)

    def _ms_to_next_tick(self) -> float:
        server_now = self.clock() * 1000 + self._server_offset_ms
        return self._wake_every_ms - server_now % self._wake_every_ms + TICK_GUARD_MS

    def _emit_gauges(self, target: Target, result: TargetTick) -> None:
        # One EMF line with this target's gauges, its configuration beside its live figures. A fresh, unshared
        # set: the shared Metrics cannot carry a per-target dimension, and concurrent pumps (threads in tests)
        # must not mix theirs.
        gauges = EphemeralMetrics(namespace=NAMESPACE, service=SERVICE)
        gauges.add_dimension(name="target", value=str(target))
        gauges.add_dimensions(service=SERVICE)  # also filed for the whole service: what the alarms watch
        capacity = result.max_waiting or self.max_waiting
        gauges.add_metric(name="QueueLength", unit=MetricUnit.Count, value=result.waiting)
        gauges.add_metric(name="QueueFullPercent", unit=MetricUnit.Percent, value=100 * result.waiting / capacity)
        gauges.add_metric(name="Admitted", unit=MetricUnit.Count, value=result.admitted)
        gauges.add_metric(name="Evicted", unit=MetricUnit.Count, value=result.evicted)
        gauges.add_metric(
            name="ConfiguredRatePerSec", unit=MetricUnit.CountPerSecond, value=result.batch * 1000 / result.tick_ms
        )
        # What the pump admits at now: 0 paused or sold out, less than configured while the shop misses its originSlo.
        gauges.add_metric(
            name="EffectiveRatePerSec", unit=MetricUnit.CountPerSecond, value=result.per_tick * 1000 / result.tick_ms
        )
        gauges.add_metric(name="Capacity", unit=MetricUnit.Count, value=capacity)
        if result.max_active is not None:
            gauges.add_metric(name="MaxActive", unit=MetricUnit.Count, value=result.max_active)
        gauges.flush_metrics()
