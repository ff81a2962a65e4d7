"""A sharded line's tick (docs/sharding.md): the plan that admits one tick's users across the sub-lines in seq order,
and the one public state of the line merged from the sub-lines' own. Pure: the store reads and writes Redis."""

from __future__ import annotations

import bisect
import heapq
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chalicelib.targets import Target

# Points of the line's shape in /line, a sub-line's and the merged one: one every 1 % of the waiting, so a client
# places itself within 1 %.
SHAPE_POINTS = 100
# The states a sub-line's line may be in, the one that speaks for the whole line first: a hold or an opening on
# any sub-line holds the whole line.
_STATES = ("SOLD_OUT", "PAUSED", "PRE_QUEUE", "OPENING", "CLOSED", "OPEN")
# front.lua's `held`.
PAUSED, SOLD_OUT = 1, 2


@dataclass(frozen=True)
class Front:
    """One sub-line as front.lua read it."""

    server_ms: int
    last_tick_ms: int  # 0: it never applied a tick
    mark: int
    waiting: int  # not yet admitted
    collecting: int  # admitted, not yet collecting their token
    active: int  # live tokens
    held: int  # 0, PAUSED or SOLD_OUT
    opening: bool  # still moving its pre-queue into the line
    shards: int
    tick_ms: int
    batch: int
    max_active: int | None
    per_tick: float  # what the shop's health allows (sub-line 0's speaks for the line)
    seqs: tuple[int, ...]  # the first seqs waiting above the mark


def front_of(reply: Any) -> Front:
    """front.lua's reply, read by name (scripts.Script.read)."""
    return Front(
        server_ms=int(reply.server_ms),
        last_tick_ms=int(reply.last_tick_ms),
        mark=int(reply.mark),
        waiting=int(reply.waiting),
        collecting=int(reply.collecting),
        active=int(reply.active),
        held=int(reply.held),
        opening=reply.opening == 1,
        shards=int(reply.shards),
        tick_ms=int(reply.tick_ms),
        batch=int(reply.batch),
        max_active=int(reply.max_active) or None,
        per_tick=float(reply.per_tick),
        seqs=tuple(int(seq) for seq in reply.seqs[1::2]),
    )


@dataclass(frozen=True)
class Plan:
    """One tick of a sharded line: per sub-line, how many users to admit (`shares`), none with a seq above
    `throughs`; `cutoff`, the highest seq any plan admitted (the line's mark), and `carry`, the fraction of a user
    a tick below the batch leaves to the next (as admit.lua keeps in `pace`)."""

    tick_ms: int  # the tick's start (ms)
    cutoff: int
    carry: float
    shares: tuple[int, ...]
    throughs: tuple[int, ...]

    @classmethod
    def recorded(cls, flat: Sequence[str]) -> Plan | None:
        """The plan plan.lua recorded (its hash, field, value, ...), or None."""
        if not flat:
            return None
        fields = dict(zip(flat[0::2], flat[1::2], strict=True))
        return cls(
            tick_ms=int(fields["tick_ms"]),
            cutoff=int(fields["cutoff"]),
            carry=float(fields["carry"]),
            shares=tuple(int(n) for n in fields["shares"].split(",")),
            throughs=tuple(int(n) for n in fields["throughs"].split(",")),
        )

    def args(self) -> dict[str, str]:
        """plan.lua's arguments recording this plan."""
        return {
            "tick_ms": str(self.tick_ms),
            "cutoff": str(self.cutoff),
            "carry": repr(self.carry),
            "shares": ",".join(map(str, self.shares)),
            "throughs": ",".join(map(str, self.throughs)),
        }

    def owed(self, shard: int, front: Front) -> int:
        """Users this plan still admits on a sub-line that has not applied it: its share's first seqs waiting."""
        if shard >= len(self.shares) or front.last_tick_ms >= self.tick_ms:
            return 0
        return sum(1 for seq in front.seqs[: self.shares[shard]] if seq <= self.throughs[shard])


def plan_of(fronts: Sequence[Front], recorded: Plan | None, catchup_ticks: int) -> Plan:
    """The plan of the tick sub-line 0's clock is in: the one recorded if it is for this tick or a later one (a
    pump that overlaps another applies the plan the other recorded), else a new one.

    A new plan admits what admit.lua would admit on one line: the batch (the shop's health allowing) for every tick
    since the last plan, up to `catchup_ticks`, within maxActive over all sub-lines, nobody while any sub-line is
    paused, sold out or still opening; the smallest seqs across the sub-lines (a k-way merge of their fronts),
    after the users the last plan still admits on sub-lines that have not applied it (the store applies it first).
    """
    first = fronts[0]
    tick = first.server_ms // first.tick_ms * first.tick_ms
    if recorded is not None and recorded.tick_ms >= tick:
        return recorded
    owed = [recorded.owed(shard, front) if recorded else 0 for shard, front in enumerate(fronts)]
    last = recorded.tick_ms if recorded else first.last_tick_ms
    covered = max(1, min((tick - last) // first.tick_ms, catchup_ticks)) if last else 1
    carried = recorded.carry if recorded else 0.0
    held = any(front.held or front.opening for front in fronts)
    allowance = 0.0 if held else first.per_tick * covered + (carried if first.per_tick < first.batch else 0.0)
    if first.max_active is not None:
        taken = sum(front.collecting + front.active for front in fronts) + sum(owed)
        allowance = min(allowance, max(0, first.max_active - taken))
    picked = _merge(
        [(front.seqs[n:], front.waiting > len(front.seqs)) for front, n in zip(fronts, owed, strict=True)],
        math.floor(allowance),
    )
    shares, throughs = [0] * len(fronts), [0] * len(fronts)
    for seq, shard in picked:
        shares[shard] += 1
        throughs[shard] = seq
    waiting = sum(front.waiting for front in fronts) - sum(owed)
    if held:
        carry = carried
    elif first.per_tick < first.batch and len(picked) < waiting:
        carry = allowance - len(picked)
    else:
        carry = 0.0
    marks = [recorded.cutoff] if recorded else [front.mark for front in fronts]
    return Plan(
        tick_ms=tick,
        cutoff=max(*marks, *(seq for seq, _ in picked), 0),
        carry=carry,
        shares=tuple(shares),
        throughs=tuple(throughs),
    )


def _merge(fronts: Sequence[tuple[Sequence[int], bool]], count: int) -> list[tuple[int, int]]:
    """The `count` smallest seqs of the sorted `fronts` (each with whether more waits beyond what was read), as (seq,
    sub-line), in seq order. Stops early at a front read to its end with more waiting behind it: its next seq is
    unknown, and any seq taken after it could pass it."""
    heap = [(seqs[0], shard, 0) for shard, (seqs, _) in enumerate(fronts) if seqs]
    heapq.heapify(heap)
    picked: list[tuple[int, int]] = []
    while heap and len(picked) < count:
        seq, shard, at = heapq.heappop(heap)
        picked.append((seq, shard))
        seqs, more = fronts[shard]
        if at + 1 < len(seqs):
            heapq.heappush(heap, (seqs[at + 1], shard, at + 1))
        elif more:
            break
    return picked


def merged_line(states: Sequence[str], cutoff: int, configured_rate: float) -> str:
    """The line's public state (the /line answer but its serverTimeMs, as line.lua writes it) from every sub-line's
    own: the state that holds the line, the plan's cutoff as the mark, rates and counts summed (the rate at most the
    configured one: a sub-line nobody waited in for a minute reports the whole line's rate), and a shape of about
    SHAPE_POINTS points whose `ahead` sums, over the sub-lines, the users ahead of that seq there (interpolated
    between a sub-line's own points, each off by less than its step: the sum by less than 1 % of the line)."""
    parsed = [json.loads(state) for state in states]
    first = parsed[0]
    state = next(name for name in _STATES if any(p["state"] == name for p in parsed))
    waiting = sum(p["waitingCount"] for p in parsed)
    rate = min(sum(p["ratePerSec"] for p in parsed), configured_rate)
    shapes = [[(int(seq), ahead) for seq, ahead in p["shape"]] for p in parsed]
    counts = [p["waitingCount"] for p in parsed]
    seqs = sorted({seq for shape in shapes for seq, _ in shape})
    points = [
        (seq, round(sum(_ahead(shape, count, seq) for shape, count in zip(shapes, counts, strict=True))))
        for seq in seqs
    ]
    step = max(1, math.ceil(len(points) / SHAPE_POINTS))
    shown = points[::step]
    if points and shown[-1] != points[-1]:
        shown.append(points[-1])
    shape = ",".join(f'["{seq}",{ahead}]' for seq, ahead in shown)
    return (
        f'{{"asOfMs":{first["asOfMs"]},"state":"{state}","mark":"{cutoff}","ratePerSec":{rate:.3f},'
        f'"waitingCount":{waiting},"presenceWindowS":{first["presenceWindowS"]},"readCapS":{first["readCapS"]},'
        f'"shape":[{shape}]}}'
    )


def _ahead(shape: Sequence[tuple[int, int]], waiting: int, seq: int) -> float:
    """Users of one sub-line waiting with a seq below `seq`, from its shape: exact at its points, interpolated
    between them."""
    if not shape or seq <= shape[0][0]:
        return 0.0
    if seq > shape[-1][0]:
        return float(waiting)
    k = bisect.bisect_left(shape, (seq,)) - 1  # shape[k] < seq <= shape[k + 1]
    (low, below), (high, at) = shape[k], shape[k + 1]
    if seq == high:
        return float(at)
    return below + 1 + (at - below - 1) * (seq - low) / (high - low)


def sub_line(target: Target, shard: int) -> Target | tuple[Target, int]:
    """What the pump keeps a sub-line's `seen` under: the target itself for sub-line 0 (a one-line target's, as
    always), (target, shard) for the others."""
    return (target, shard) if shard else target


def target_of(key: Target | tuple[Target, int]) -> Target:
    """The target of a sub-line's key in the pump's `seen` (`sub_line`)."""
    return key[0] if isinstance(key, tuple) else key
