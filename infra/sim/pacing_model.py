"""What a sale asks of the origin and of the edge, for crowds too large to run here: the pacing model.

The simulator (infra/sim/simulate.py) runs the real stack and measures, up to what two cores serve. This replays a
whole sale with the clients' pacing rules alone, the line moving exactly at its rate (no HTTP, no Redis, no
abandonment, no latency), for either protocol (docs/capacity.md):

- `origin`, today's: every waiting client polls its own status at the origin (API Gateway, Lambda, the target's
  Redis core) when the server's `pollAfterMs` says (chalicelib/polling.py's rule on its constants, for many
  clients at once: `advice_s`, which tests/test_pacing_model.py checks against it).
- `edge`, issue 39's: a client further than the presence window from its turn reads only the line's public state
  (`GET .../line`) from the edge, after a share of its remaining wait, at most `line_cap_s` apart and never past the
  moment its ETA reaches the window; from then on it polls its status at the origin as today. The edge answers
  `/line` from its cache; a miss reaches the origin at most once a max-age per edge location.

It counts requests by kind and by second, at the origin and at the edge, and from them the origin's requests/s,
the edge's, the target's Redis CPU, the concurrent Lambdas, how soon users hear of their turn and of a sold out,
and the sale's cost at list prices (infra/sim/sale_cost.py).

How it counts 10,000,000 users in about a minute. Every user is walked event by event, all users of a chunk at once
(numpy), except where a client's gap is its cap, far from the front: there every client asks at the same jittered
interval, a renewal process whose events need no walking. After AGGREGATE_AFTER such events walked (so that the
waves of a burst's first polls are walked, not smoothed), a user's further capped events are counted, their
expected number spread evenly over the time they span, and the walk resumes at the first event past that span (a
stationary residual gap after its end, or the switch to the origin). `--exact` walks every event;
tests/test_pacing_model.py shows the two agree on a smaller crowd.

    python infra/sim/pacing_model.py --users 1000000                      # today's protocol beside the edge line
    python infra/sim/pacing_model.py --sizes 10000 100000 1000000 10000000
    python infra/sim/pacing_model.py --users 1000000 --caps 20 30 60 120 300
    python infra/sim/pacing_model.py --sizes 1000000 10000000 --shards 10 100   # one target's sub-lines (issue 40)

`--shards` gives, for each crowd arriving over each of those many seconds, the sub-lines its one target needs
(docs/sharding.md: the arrivals a second over the enters one Redis core serves at SHARD_HEADROOM) and what each
sub-line's node then does: its enters a second, its waiting users' memory and its share of the edge line's polls.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from redis.crc import key_slot

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chalicelib import polling  # noqa: E402
from chalicelib.queue_keys import QueueKeys  # noqa: E402
from chalicelib.target_config import MAX_SHARDS  # noqa: E402
from chalicelib.targets import Target  # noqa: E402
from infra.sim.sale_cost import (  # noqa: E402
    CLOUDFRONT_HTTPS_PER_10K,
    CLOUDFRONT_OUT_PER_GB,
    Deployment,
    SaleLoad,
    sale_cost,
)

FIXED_POLL_S = 2.5  # what the waiting-room page did before the server paced it: the comparison
HANDLER_S = 0.015  # a request's billed Lambda duration, as measured locally (docs/capacity.md)
# The origin's arrivals by default: as fast as the stage lets enters in (ArrivalThrottleRate, infra/edge.yaml), so
# that crowds of every size meet the same arrival rate and their peaks compare what waiting costs.
ARRIVALS_PER_S = 1500

# The target's Redis core, server CPU per call as the functions send them (one call a round trip, unpipelined):
# status.lua and enter.lua as measured on main for issue 39 (2026-12: "status.lua ~47 us a poll as Lambda sends
# it", enter ~50 us); a GET of the value the pump wrote (the /line route's one read) 2-3 us, the same measurement.
STATUS_US = 47
ENTER_US = 50
GET_US = 3
# A purchase is two script calls on the target's keys (consume, then its outcome), not measured as sent: taken at
# status.lua's cost each.
PURCHASE_US = 2 * STATUS_US
# A tick of one target (admit and evict): docs/benchmarks.md, one tick over 100 targets x 1,000 waiting, 8.7 ms.
TICK_US = 87
# The edge line's shape, written by the pump once a tick: about 100 rank lookups of O(log N). An estimate until
# `make bench` measures the route (issue 39).
SHAPE_US = 200

# Sharding one target (docs/sharding.md): each sub-line on a node of its own, one Redis core serves that sub-line's
# share of the enters and polls. A burst needs as many sub-lines as its arrivals a second over the enters
# a second one core serves busy at most SHARD_HEADROOM of the time (the rest for the polls, the tick and a node's
# own work); tests/perf/bench_arrivals.py measured that each of N nodes takes 1/N of a target's enters at the cost
# of one: the ceiling grows with N. What a waiting user holds on their sub-line's node: 136 bytes in `waiting`,
# and as much again in `heartbeat` while in it (docs/benchmarks.md: jemalloc, 36-character ids).
SHARD_HEADROOM = 0.6
WAITING_BYTES = (136, 272)
CLUSTER_SLOTS = 16384
SALE_TARGET = Target("limited-drop", 1)  # whose sub-lines' slots a plan places, unless told another

# The edge (issue 39): `/line` is cached `max-age=1`; each edge location that serves the crowd asks the origin at
# most once a max-age (stale-while-revalidate answers meanwhile). An assumption: the crowd reaches this many.
EDGE_LOCATIONS = 50
LINE_MAX_AGE_S = 1.0
# Bytes of an answer to a shopper, headers included (estimates; the gateway's and CloudFront's headers are about
# 400 bytes): a status answer, an enter (with its queue ticket), a purchase, and /line (about 100 (seq, rank)
# points in JSON, uncompressed: compression would about halve it).
ANSWER_BYTES = {"enter": 1000, "status": 600, "purchase": 600, "line": 2500}

# Walking: capped events walked before the rest of a capped stretch is counted; and the shortest stretch (in gaps)
# worth counting rather than walking.
AGGREGATE_AFTER = 6
AGGREGATE_MIN_GAPS = 5
CHUNK = 500_000  # users walked at once
EDGE, ORIGIN = 0, 1  # where a client's next request goes


@dataclass(frozen=True)
class Sale:
    """A sale's crowd and line: `users` arriving evenly over `arrival_s`, `rate` admitted a second in ticks."""

    users: int
    rate: float = 50.0
    tick_s: float = 0.5
    arrival_s: float | None = None  # None: ARRIVALS_PER_S, at least 2 s
    heartbeat_s: int = 60

    @property
    def batch(self) -> int:
        return round(self.rate * self.tick_s)

    @property
    def arrivals_s(self) -> float:
        return self.arrival_s if self.arrival_s is not None else max(2.0, self.users / ARRIVALS_PER_S)


@dataclass(frozen=True)
class Protocol:
    """How waiting clients ask: `edge` False is today's (every poll at the origin)."""

    edge: bool
    window_s: float = 120.0  # VQ_PRESENCE_WINDOW_S: inside it, a client polls the origin
    line_cap_s: float = 300.0  # VQ_LINE_READ_CAP_S: the longest gap between two reads of /line

    @property
    def name(self) -> str:
        return f"edge line, cap {self.line_cap_s:g} s" if self.edge else "origin polls (today)"


TODAY = Protocol(edge=False)
EDGE_LINE = Protocol(edge=True)


class Series:
    """Requests a second, by kind, over the sale; `add` takes events, `spread` evenly spread counts."""

    KINDS = ("enter", "status", "purchase", "line")

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds
        self.by_kind = {kind: np.zeros(seconds) for kind in self.KINDS}
        self.walked = 0  # events walked (the others were counted)

    def add(self, kind: str, times: np.ndarray) -> None:
        second = np.clip(times, 0, self.seconds - 1).astype(np.int64)
        self.by_kind[kind] += np.bincount(second, minlength=self.seconds)

    def spread(self, kind: str, starts: np.ndarray, ends: np.ndarray, counts: np.ndarray) -> None:
        """`counts` events spread evenly over [starts, ends): whole seconds through a running sum, the part
        seconds at either end directly."""
        density = counts / np.maximum(ends - starts, 1e-9)
        first, last = starts.astype(np.int64), ends.astype(np.int64)
        same = first == last
        series = self.by_kind[kind]
        series += np.bincount(first[same], weights=counts[same], minlength=self.seconds)
        f, la, d = first[~same], last[~same], density[~same]
        series += np.bincount(f, weights=d * (f + 1 - starts[~same]), minlength=self.seconds)
        series += np.bincount(la, weights=d * (ends[~same] - la), minlength=self.seconds)
        running = np.bincount(f + 1, weights=d, minlength=self.seconds + 1)
        running -= np.bincount(la, weights=d, minlength=self.seconds + 1)
        series += np.cumsum(running)[: self.seconds]


def advice_s(eta_s: np.ndarray, longest_ms: float, rand: np.ndarray, newcomer: bool) -> np.ndarray:
    """chalicelib/polling.py's `waiting_poll_after_ms`, for many clients at once (in seconds): a share of the ETA,
    between the near-front poll and `longest_ms`, cut at random by up to a tenth (a newcomer's by up to 3/4)."""
    base = np.minimum(longest_ms, np.maximum(polling.NEAR_FRONT_MS, eta_s * 1000 * polling.SHARE_OF_ETA))
    jitter = polling.NEWCOMER_JITTER if newcomer else polling.JITTER
    return np.floor(base * (1 - jitter * rand)) / 1000


class Walk:
    """The users of one chunk walked through the sale; what they asked goes into `series`."""

    def __init__(self, sale: Sale, protocol: Protocol, series: Series, rng: np.random.Generator, exact: bool):
        self.sale, self.protocol, self.series, self.rng, self.exact = sale, protocol, series, rng, exact
        self.longest_ms = {ORIGIN: polling.longest_interval_ms(sale.heartbeat_s), EDGE: protocol.line_cap_s * 1000}
        # A capped client's gap: uniform between (1 - JITTER) and 1 of the cap. Its mean, and the renewal
        # function's offset (events in a stretch of length L after one: L / mean + offset).
        self.mean_gap = {layer: ms / 1000 * (1 - polling.JITTER / 2) for layer, ms in self.longest_ms.items()}
        second_moment = 1 - polling.JITTER + polling.JITTER**2 / 3
        self.renewal_offset = second_moment / (2 * (1 - polling.JITTER / 2) ** 2) - 1

    def eta_s(self, seq: np.ndarray, t: np.ndarray) -> np.ndarray:
        """The server's ETA: the users ahead (by seq, the mark moving a batch a tick) over the rate."""
        s = self.sale
        mark = np.minimum(s.users, s.batch * np.floor(t / s.tick_s))
        return np.maximum(0, seq - 1 - mark) / s.rate

    def when_eta_within(self, seq: np.ndarray, eta_s: float) -> np.ndarray:
        """The tick at which each user's ETA is at most `eta_s`."""
        s = self.sale
        return s.tick_s * np.ceil(np.maximum(0, seq - 1 - eta_s * s.rate) / s.batch)

    def run(self, seq: np.ndarray, sold_out_at: float) -> dict:
        """Walk users `seq` from their enter to their purchase. Per user: the notice (s from the tick that admitted
        them to the poll that told them), the wait (arrival to that poll), how long after `sold_out_at` they would
        have heard of a sold out (NaN: not in line then), and whether they were far back then (past the window)."""
        s, p, rng = self.sale, self.protocol, self.rng
        n = len(seq)
        arrived = (seq - 1 + rng.random(n)) / s.users * s.arrivals_s
        admitted = s.tick_s * np.ceil(seq / s.batch)
        self.series.add("enter", arrived)
        self.switch_at = self.when_eta_within(seq, p.window_s) if p.edge else np.full(n, np.inf)
        eta = self.eta_s(seq, arrived)
        first = np.where(p.edge & (eta > p.window_s), EDGE, ORIGIN)
        self.t, self.layer = self.next_event(arrived, eta, first, self.switch_at, newcomer=True)
        self.sold_out_delay, self.sold_out_at = np.full(n, np.nan), sold_out_at
        self.note_sold_out(np.arange(n), arrived)
        notice, capped_walked = np.zeros(n), np.zeros(n, dtype=np.int64)
        live = np.arange(n)  # users still waiting, by index
        while len(live):
            self.series.walked += len(live)
            t, layer = self.t[live], self.layer[live]
            self.series.add("line", t[layer == EDGE])
            self.series.add("status", t[layer == ORIGIN])
            told = (layer == ORIGIN) & (t >= admitted[live])
            notice[live[told]] = t[told] - admitted[live[told]]
            self.series.add("purchase", t[told])
            live = live[~told]
            t, layer = self.t[live], self.layer[live]
            eta = self.eta_s(seq[live], t)
            longest_ms = np.where(layer == EDGE, self.longest_ms[EDGE], self.longest_ms[ORIGIN])
            capped_walked[live] = np.where(eta * polling.SHARE_OF_ETA * 1000 >= longest_ms, capped_walked[live] + 1, 0)
            counted = np.zeros(len(live), dtype=bool)
            if not self.exact:
                counted = self.count_capped(live, seq[live], t, layer, capped_walked[live] >= AGGREGATE_AFTER)
            walk = live[~counted]
            before = self.t[walk]
            self.t[walk], self.layer[walk] = self.next_event(
                before, eta[~counted], self.layer[walk], self.switch_at[walk], newcomer=False
            )
            self.note_sold_out(walk, before)
        in_line = (arrived <= sold_out_at) & (sold_out_at < admitted + notice)
        far = in_line & (self.eta_s(seq, np.full(n, sold_out_at)) > p.window_s)
        return {
            "notice": notice,
            "waits": admitted + notice - arrived,
            "sold_out_delay": np.where(in_line, self.sold_out_delay, np.nan),
            "far": far,
        }

    def next_event(self, t, eta, layer, switch_at, newcomer: bool):
        """When each client asks next, and where: the advice of its layer; a read of /line that would come at or
        after the moment its ETA reaches the window becomes, at that moment, its first poll at the origin."""
        rand = self.rng.random(len(t))
        gap = np.where(
            layer == EDGE,
            advice_s(eta, self.longest_ms[EDGE], rand, newcomer),
            advice_s(eta, self.longest_ms[ORIGIN], rand, newcomer),
        )
        nt = t + gap
        switch = (layer == EDGE) & (nt >= switch_at)
        return np.where(switch, switch_at, nt), np.where(switch, ORIGIN, layer)

    def count_capped(self, live, seq, t, layer, walked_enough) -> np.ndarray:
        """Count, not walk, the rest of each long capped stretch (see the module's docstring): spread its events,
        move its users to the first event past it. Which of `live` were counted."""
        counted = np.zeros(len(live), dtype=bool)
        for where in (EDGE, ORIGIN):
            cap_s = self.longest_ms[where] / 1000
            end = self.when_eta_within(seq, cap_s / polling.SHARE_OF_ETA)
            if where == EDGE:  # a read never comes after the switch
                end = np.minimum(end, self.switch_at[live])
            pick = (layer == where) & walked_enough & (end - t >= AGGREGATE_MIN_GAPS * cap_s)
            if not pick.any():
                continue
            users, start, end = live[pick], t[pick], end[pick]
            counts = np.maximum(0, (end - start) / self.mean_gap[where] + self.renewal_offset)
            # The first of them comes at least a shortest gap after the last event walked.
            kind = "line" if where == EDGE else "status"
            self.series.spread(kind, start + (1 - polling.JITTER) * cap_s, end, counts)
            switches = (where == EDGE) & (end >= self.switch_at[users])
            resume = np.where(switches, end, end + self.residual_s(cap_s, len(users)))
            # A sold out inside the stretch is heard a stationary residual gap later (or at its end).
            at = self.sold_out_at
            inside = (start < at) & (at <= resume)
            heard = np.minimum(self.residual_s(cap_s, int(inside.sum())), resume[inside] - at)
            self.sold_out_delay[users[inside]] = heard + (self.edge_staleness() if where == EDGE else 0)
            self.t[users], self.layer[users] = resume, np.where(switches, ORIGIN, where)
            counted |= pick
        return counted

    def residual_s(self, cap_s: float, n: int) -> np.ndarray:
        """Time from a moment to the next event of a capped client observed at random (a uniform share of a gap)."""
        return self.rng.random(n) * cap_s * (1 - polling.JITTER * self.rng.random(n))

    def edge_staleness(self) -> float:
        """How old a /line answer can be: the pump writes it once a tick, the edge keeps it a max-age."""
        return self.sale.tick_s + LINE_MAX_AGE_S

    def note_sold_out(self, users, before) -> None:
        """For `users` whose last request came (at `before`) before the sold out and whose next (self.t) at or
        after it: how long after it they hear of it (a /line answer up to edge_staleness old)."""
        at, after = self.sold_out_at, self.t[users]
        straddle = (before < at) & (at <= after)
        stale = np.where(self.layer[users][straddle] == EDGE, self.edge_staleness(), 0.0)
        self.sold_out_delay[users[straddle]] = after[straddle] - at + stale


def model(
    sale: Sale, protocol: Protocol, exact: bool = False, seed: int = 7, deployment: Deployment | None = None
) -> dict:
    """The whole sale under `protocol`: its figures (see `summary`), priced on `deployment`. A sold out is heard of
    as if it came halfway through the line's drain."""
    if sale.users / sale.arrivals_s < sale.rate:
        raise ValueError("the model needs arrivals at least as fast as the admission rate")
    rng = np.random.default_rng(seed)
    last_admission = sale.tick_s * math.ceil(sale.users / sale.batch)
    series = Series(int(last_admission) + 120)
    sold_out_at = last_admission / 2
    parts = []
    for first in range(1, sale.users + 1, CHUNK):
        seq = np.arange(first, min(sale.users + 1, first + CHUNK), dtype=np.float64)
        parts.append(Walk(sale, protocol, series, rng, exact).run(seq, sold_out_at))
    per_user = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
    return summary(sale, protocol, series, per_user, deployment or Deployment())


def summary(sale: Sale, protocol: Protocol, series: Series, per_user: dict, deployment: Deployment) -> dict:
    """Origin and edge requests (totals, per admitted user, per second: peak and mean), the target's Redis CPU, the
    concurrent Lambdas, how soon users heard of their turn and of a sold out, and the sale's cost."""
    total = sum(series.by_kind.values())
    seconds = int(np.nonzero(total > 1e-6)[0][-1]) + 1  # (the running sums leave dust)
    kind = {name: values[:seconds] for name, values in series.by_kind.items()}
    misses = EDGE_LOCATIONS * (1 - np.exp(-kind["line"] / EDGE_LOCATIONS))
    in_line = kind["status"] + kind["purchase"] + misses
    origin = kind["enter"] + in_line
    redis_us = (
        kind["enter"] * ENTER_US
        + kind["status"] * STATUS_US
        + kind["purchase"] * PURCHASE_US
        + misses * GET_US
        + (TICK_US + (SHAPE_US if protocol.edge else 0)) / sale.tick_s
    )
    users, waits = sale.users, per_user["waits"]
    fixed = np.ceil(waits / FIXED_POLL_S).sum() + 2 * users
    by_kind = {
        "enter": kind["enter"].sum(),
        "status": kind["status"].sum(),
        "line": misses.sum(),
        "purchase": kind["purchase"].sum(),
    }
    origin_requests = origin.sum()
    edge_hits = kind["line"].sum() - misses.sum()
    bytes_out = sum(kind[name].sum() * ANSWER_BYTES[name] for name in kind)
    cost = sale_cost(
        SaleLoad(
            api_requests=round(origin_requests),
            authorizer_calls=users,
            handler_seconds=float(origin_requests * HANDLER_S),
            duration_s=seconds,
            users=users,
            behind_edge=protocol.edge,
            edge_requests=round(edge_hits),
            bytes_out=float(bytes_out),
        ),
        deployment,
    )
    delay, far = per_user["sold_out_delay"], per_user["far"]
    heard = {"far back": delay[far], "inside the window": delay[~far & ~np.isnan(delay)]}
    return {
        "protocol": protocol.name,
        "users": users,
        "rate": sale.rate,
        "arrival_s": round(sale.arrivals_s, 1),
        "duration_s": seconds,
        "mean_wait_s": round(float(waits.mean()), 1),
        "origin_requests": round(origin_requests),
        "origin_by_kind": {name: round(n) for name, n in by_kind.items()},
        "origin_per_admitted_user": round(origin_requests / users, 2),
        "share_of_fixed_poll": round(float(origin_requests / fixed), 4),
        "origin_peak_per_s": round(float(origin.max())),
        "origin_mean_per_s": round(float(origin_requests / seconds)),
        "origin_peak_per_s_in_line": round(float(in_line.max())),
        "edge_requests": round(float(kind["line"].sum())),
        "edge_peak_per_s": round(float(kind["line"].max())),
        "edge_mean_per_s": round(float(kind["line"].sum() / seconds)),
        "redis_core_peak_share": round(float(redis_us.max()) / 1e6, 3),
        "redis_core_mean_share": round(float(redis_us.mean()) / 1e6, 4),
        "lambdas_peak": math.ceil(float(origin.max()) * HANDLER_S),
        "lambdas_mean": round(float(origin_requests / seconds) * HANDLER_S, 1),
        "notice_p50_p95_s": tuple(round(float(x), 2) for x in np.percentile(per_user["notice"], [50, 95])),
        "sold_out_heard_p50_p95_max_s": {
            where: tuple(round(float(x), 1) for x in np.percentile(d, [50, 95, 100])) if len(d) else None
            for where, d in heard.items()
        },
        "cost_usd": cost,
        "events_walked": series.walked,
    }


def shards_for(arrivals_per_s: float, enter_us: float = ENTER_US, headroom: float = SHARD_HEADROOM) -> int:
    """The sub-lines a target needs for `arrivals_per_s` enters a second: each one's core busy with enters at most
    `headroom` of the time."""
    return max(1, math.ceil(arrivals_per_s * enter_us / 1e6 / headroom))


def shard_plan(
    users: int,
    arrival_s: float,
    in_line_peak_per_s: float | None = None,
    enter_us: float = ENTER_US,
    headroom: float = SHARD_HEADROOM,
    target: Target = SALE_TARGET,
) -> dict:
    """A target's line for `users` arriving evenly over `arrival_s`, sharded: the sub-lines its arrivals need, and
    what each sub-line's node does at the burst's peak (the users spread evenly over the sub-lines: `shard_of`),
    each sub-line on a node of its own: its enters a second and the share of its core they take, the memory its
    waiting users hold, and its share of the line's peak origin requests after entering (`in_line_peak_per_s`, the
    model's polls, purchases and /line misses: None when not modelled). And where the slots are split evenly over
    as many nodes, as a new cluster's are, the most of `target`'s sub-lines one node holds, and its core entering."""
    arrivals = users / arrival_s
    shards = shards_for(arrivals, enter_us, headroom)
    waiting = users / shards
    busiest = busiest_node(target, shards, shards)
    return {
        "users": users,
        "arrival_s": arrival_s,
        "arrivals_per_s": round(arrivals),
        "shards": shards,
        "within_max_shards": shards <= MAX_SHARDS,
        "node_enters_per_s": round(arrivals / shards),
        "node_core_share_entering": round(arrivals / shards * enter_us / 1e6, 3),
        "node_memory_mb": tuple(round(waiting * size / 1e6, 1) for size in WAITING_BYTES),
        "node_in_line_peak_per_s": None if in_line_peak_per_s is None else round(in_line_peak_per_s / shards),
        "even_slots_busiest_node": busiest,
        "even_slots_busiest_core_entering": round(arrivals * busiest / shards * enter_us / 1e6, 3),
    }


def busiest_node(target: Target, shards: int, nodes: int) -> int:
    """The most of `target`'s `shards` sub-lines one node holds on a cluster of `nodes` primaries with the slots
    split evenly between them, as a new cluster's are: each sub-line lies where its hash tag's slot falls, in a
    window of its own of the slot space (chalicelib/queue_keys.py `sub_line_tag`): 1 when `nodes` is `shards` or
    a multiple of it, about the even share when fewer."""
    held = [0] * nodes
    for shard in range(shards):
        held[key_slot(QueueKeys("", target, shard, shards).waiting.encode()) * nodes // CLUSTER_SLOTS] += 1
    return max(held)


def shard_table(plans: list[dict], enter_us: float = ENTER_US, headroom: float = SHARD_HEADROOM) -> str:
    """A sale a row: its arrivals, the sub-lines they need, and one sub-line's node at the burst's peak."""
    header = [
        "users",
        "arriving over",
        "arrivals/s",
        f"shards (enter {enter_us:g} us, core at most {headroom:.0%})",
        "per node: enters/s",
        "its core entering",
        "memory (136-272 B a user)",
        "polls, purchases, /line misses a second at peak",
        "slots split evenly: the busiest node's sub-lines (its core entering)",
    ]
    rows = [
        [
            f"{p['users']:,}",
            f"{p['arrival_s']:g} s",
            f"{p['arrivals_per_s']:,}",
            f"{p['shards']}" + ("" if p["within_max_shards"] else f" (over the {MAX_SHARDS} a target may span)"),
            f"{p['node_enters_per_s']:,}",
            f"{p['node_core_share_entering']:.0%}",
            f"{p['node_memory_mb'][0]:,.0f}-{p['node_memory_mb'][1]:,.0f} MB",
            "-" if p["node_in_line_peak_per_s"] is None else f"{p['node_in_line_peak_per_s']:,}",
            f"{p['even_slots_busiest_node']} ({p['even_slots_busiest_core_entering']:.0%})",
        ]
        for p in plans
    ]
    return _table(header, rows)


def _heard(f: dict, where: str) -> str:
    figures = f["sold_out_heard_p50_p95_max_s"][where]
    return "-" if figures is None else " / ".join(f"{x:g}" for x in figures[1:]) + " s"


# What a sale's figures are shown as: a row each in the two-protocol comparison, a column each in the tables.
FIGURES = {
    "users": lambda f: f"{f['users']:,}",
    "protocol": lambda f: f["protocol"],
    "duration, mean wait": lambda f: f"{f['duration_s']:,} s, {f['mean_wait_s']:,.0f} s",
    "origin requests per admitted user (share of a 2.5 s poll)": lambda f: (
        f"{f['origin_per_admitted_user']:,.2f} ({f['share_of_fixed_poll']:.4f})"
    ),
    "origin req/s: peak (without enters), mean": lambda f: (
        f"{f['origin_peak_per_s']:,} ({f['origin_peak_per_s_in_line']:,}), {f['origin_mean_per_s']:,}"
    ),
    "edge req/s: peak, mean": lambda f: f"{f['edge_peak_per_s']:,}, {f['edge_mean_per_s']:,}",
    "target's Redis core: peak, mean": lambda f: f"{f['redis_core_peak_share']:.1%}, {f['redis_core_mean_share']:.1%}",
    "Lambdas: peak, mean": lambda f: f"{f['lambdas_peak']:,}, {f['lambdas_mean']:,}",
    "notice p50 / p95": lambda f: " / ".join(f"{x:g}" for x in f["notice_p50_p95_s"]) + " s",
    "sold out heard, far back: p95 / max": lambda f: _heard(f, "far back"),
    "cost (CloudFront and data out)": lambda f: (
        f"${f['cost_usd']['total']:,.2f} (${f['cost_usd']['cloudfront_requests'] + f['cost_usd']['data_out']:,.2f})"
    ),
}


def comparison(figures: list[dict]) -> str:
    """The sales side by side, a figure a row."""
    rows = [[name, *(show(f) for f in figures)] for name, show in FIGURES.items() if name != "users"]
    return _table(["", *(f"{f['users']:,} users" for f in figures)], rows[1:], header_row=rows[0][1:])


def size_table(figures: list[dict]) -> str:
    """A sale a row."""
    return _table(list(FIGURES), [[show(f) for show in FIGURES.values()] for f in figures])


def cap_table(figures: list[dict]) -> str:
    """The cap on the gap between /line reads: what it costs against how late a far-back shopper hears of a sold
    out (or a pause)."""
    per_read = CLOUDFRONT_HTTPS_PER_10K / 1e4 + ANSWER_BYTES["line"] / 1e9 * CLOUDFRONT_OUT_PER_GB
    rows = [
        [
            f"{f['cap_s']:g} s",
            f"{f['edge_requests']:,}",
            f"${f['edge_requests'] * per_read:,.2f}",
            f"${f['cost_usd']['cloudfront_requests'] + f['cost_usd']['data_out']:,.2f}",
            f"${f['cost_usd']['total']:,.2f}",
            _heard(f, "far back"),
        ]
        for f in figures
    ]
    header = [
        "cap",
        "reads of /line",
        "the reads at the edge",
        "CloudFront and data out, all requests",
        "the sale",
        "sold out heard far back: p95 / max",
    ]
    return _table(header, rows)


def _table(header: list[str], rows: list[list[str]], header_row: list[str] | None = None) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    if header_row:
        lines.append("| protocol | " + " | ".join(header_row) + " |")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--sizes", type=int, nargs="+", help="a table of these crowds, both protocols")
    parser.add_argument("--caps", type=float, nargs="+", help="a table of these caps on the gap between /line reads")
    parser.add_argument("--rate", type=float, default=50.0, help="admissions per second")
    parser.add_argument("--tick-s", type=float, default=0.5)
    parser.add_argument("--arrival-s", type=float, help=f"arrivals spread over this long (default: {ARRIVALS_PER_S}/s)")
    parser.add_argument("--heartbeat-timeout-s", type=int, default=60)
    parser.add_argument("--window-s", type=float, default=120.0, help="VQ_PRESENCE_WINDOW_S")
    parser.add_argument("--line-cap-s", type=float, default=300.0, help="VQ_LINE_READ_CAP_S")
    parser.add_argument("--exact", action="store_true", help="walk every event (slow beyond a few 100,000 users)")
    parser.add_argument("--seed", type=int, default=7, help="the clients' jitter")
    parser.add_argument("--waf-at-edge", action="store_true", help="price the web ACL on the distribution")
    parser.add_argument("--json", type=Path, help="also write every figure here (the cost by item among them)")
    parser.add_argument(
        "--shards",
        type=float,
        nargs="+",
        metavar="ARRIVAL_S",
        help="a table of the sub-lines one target needs for each crowd (--sizes, or --users) arriving over each of "
        "these many seconds, with the edge line's polls per node",
    )
    parser.add_argument("--enter-us", type=float, default=ENTER_US, help="enter.lua's server CPU (us) per enter")
    parser.add_argument(
        "--headroom", type=float, default=SHARD_HEADROOM, help="the most of a node's core the enters may take"
    )
    parser.add_argument(
        "--target",
        type=lambda text: Target(text.split(":")[0], int(text.split(":")[1])),
        default=SALE_TARGET,
        help=f"TYPE:ID, the target whose sub-lines' slots --shards places on evenly split nodes ({SALE_TARGET})",
    )
    args = parser.parse_args(argv)
    edge = Protocol(edge=True, window_s=args.window_s, line_cap_s=args.line_cap_s)

    def run(users: int, protocol: Protocol) -> dict:
        sale = Sale(users, args.rate, args.tick_s, args.arrival_s, args.heartbeat_timeout_s)
        deployment = Deployment(waf_at_edge=args.waf_at_edge)
        return model(sale, protocol, args.exact, args.seed, deployment) | {"cap_s": protocol.line_cap_s}

    command = "python infra/sim/pacing_model.py " + " ".join(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    print(f"The pacing model, {datetime.now(UTC):%Y-%m-%d}: {command.strip()}")
    print(f"{args.rate:g} admitted a second, heartbeat {args.heartbeat_timeout_s} s, window {args.window_s:g} s")
    if args.shards:
        figures = []
        for users in args.sizes or [args.users]:
            for arrival_s in args.shards:
                sale = Sale(users, args.rate, args.tick_s, arrival_s, args.heartbeat_timeout_s)
                f = model(sale, edge, args.exact, args.seed)
                peak = f["origin_peak_per_s_in_line"]
                plan = shard_plan(users, arrival_s, peak, args.enter_us, args.headroom, args.target)
                figures.append(f | {"shard_plan": plan})
        print(shard_table([f["shard_plan"] for f in figures], args.enter_us, args.headroom))
    elif args.caps:
        figures = [run(args.users, replace(edge, line_cap_s=cap)) for cap in args.caps]
        print(cap_table(figures))
    elif args.sizes:
        figures = [run(users, protocol) for users in args.sizes for protocol in (TODAY, edge)]
        print(size_table(figures))
    else:
        figures = [run(args.users, protocol) for protocol in (TODAY, edge)]
        print(comparison(figures))
    print(f"({time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": command.strip(), "figures": figures}, indent=1))


if __name__ == "__main__":
    main()
