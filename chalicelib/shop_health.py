"""The shop's health as the queue sees it, and an admission rate that follows it.

The purchase gate notes every forwarded purchase: when it was sent, how long the shop took, and whether it
failed (a 5xx, or no answer). Each tick the pump sets, for a target with an `originSlo`, how many users it
admits per tick (lua/adjust_rate.lua, before admit.lua in the same round trip), AIMD-fashion from the purchases
the shop answered in the last few seconds:
- a sale opens at `opening` of the configured rate: the shop's capacity is unknown until it shows it, and
  purchases come back to say so only after users admitted at too high a rate have filled its backlog;
- past `headroom` of the objective (p95 latency or error share), a cut to a share of what the shop completed (its
  throughput while it was behind: since the first purchase that waited past the headroom was sent, over at least
  `reach_ms` (before that it did all it was sent, which says nothing of what it can do), or over the window if
  that says more (a stall of a second says nothing of its pace either)): the share that drains the backlog's
  excess delay over the headroom within `drain_ms`, between FollowRules' bounds. A shop's p95 stays flat until it
  nears its capacity and then climbs for as long as a change takes to reach it, so the headroom is the leading
  edge: cutting at the objective is too late;
- the throughput at a cut is the shop's capacity as last seen, and the rate then grows as TCP CUBIC's window
  does around it: healthy again (under the headroom), at once back to the plateau (`gentlest` of that
  capacity), then by a `probe` per judgement up to it. Past it a backlog grows at the excess for as long as the
  rate stays there, and shows in the p95 only once it is there: so the rate holds at the capacity until `hold_ms`
  after the last cut (sooner if the p95 stays under half the headroom: a shop that far from its capacity was seen
  in a dip), then grows by a probe per `reach_ms` + `window_ms` (each judged on a whole window sent at the one
  before) until `band` past it, and beyond (or before any capacity was seen) by `increase` times the share of the
  headroom the p95 leaves free (at least the probe): the p95 climbs as the shop nears its capacity, so the steps
  shrink before the rate reaches it. At or under the plateau and within the objective, a p95 past the headroom
  holds the rate (there it is the shop's own pace, not a backlog);
- after any change, nothing changes again until enough purchases sent after it reached the shop (users admitted
  after it buy at their next poll) come back; what is judged then is every purchase answered within the window
  that was sent after the last cut reached the shop. Earlier ones describe a backlog already cut for, and must
  not cut the rate twice; slow ones sent before an increase show a shop already behind, and judging only those
  sent after it would judge the first to come back: its fastest.
The configured rate stays the ceiling, and the rate never falls to nothing, so there is always a purchase to
judge recovery by.

A shop that answers `X-Queue-Sold-Out: true` marks its target sold out (see target_config.py). The gate's
side, noting each purchase, is shop_watch.py.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass

from chalicelib.polling import NEAR_FRONT_MS

# The latest purchases kept per target (the window's worth up to 300 a second), and for how long.
MAX_PURCHASES = 1000
PURCHASES_TTL_MS = 600_000


@dataclass(frozen=True)
class FollowRules:
    """How the pump follows a shop's health (the ARGV of adjust_rate.lua after the defaults and TTL, in order)."""

    window_ms: int = 3000  # purchases the shop answered this recently are judged
    fewest: int = 20  # a p95 of fewer purchases says little: a change waits for this many sent after it
    increase: float = 0.05  # share of the configured rate added per judgement, away from the capacity and idle
    reach_ms: int = NEAR_FRONT_MS  # a change reaches the shop with the users admitted after it, at their next poll
    deepest: float = 0.5  # a cut never keeps less than half the shop's throughput...
    gentlest: float = 0.95  # ...nor more than 95 % of it; healthy again, the rate comes back to this share at once
    floor: float = 0.05  # the lowest share of the configured rate
    headroom: float = 0.8  # past this share of its objective the rate is cut (and under it, grows)
    # A cut drains the backlog's excess delay within this long: about when purchases sent after it come back.
    # Draining deep costs little, as healthy again the rate comes back to the plateau at once.
    drain_ms: int = 1000
    opening: float = 0.5  # a sale opens at this share of the configured rate
    # Share of the configured rate added per healthy judgement from the plateau until `band` past the capacity:
    # above it a backlog grows at the excess, so the excess must stay small while the p95 takes time to show it.
    probe: float = 0.01
    band: float = 0.1  # so far past the capacity last seen, the shop has shown it handles more: the rate grows on
    # The rate goes past the capacity last seen only this long after the last cut: a backlog grows there, and in
    # a sale of a few minutes each probe past it costs a window near the objective.
    hold_ms: int = 60_000

    def to_redis(self) -> tuple:
        return astuple(self)


@dataclass(frozen=True)
class Purchase:
    """One forwarded purchase, as the gate saw it."""

    sent_ms: int
    latency_ms: int
    ok: bool  # False: a 5xx or no answer

    def to_redis(self) -> tuple[int, int, int]:
        return self.sent_ms, self.latency_ms, int(self.ok)

    @classmethod
    def parse(cls, text: str) -> Purchase | None:
        parts = text.split(":")
        if len(parts) != 3 or not all(part.isdigit() for part in parts):
            return None
        return cls(int(parts[0]), int(parts[1]), parts[2] == "1")


def health(purchases: list[Purchase], now_ms: int, window_ms: int = FollowRules.window_ms) -> dict:
    """What operators see of the shop: p95 latency and error share of the purchases it answered within the window
    (what the pump judges, but for the hold after a cut)."""
    recent = [p for p in purchases if p.sent_ms + p.latency_ms > now_ms - window_ms]
    latencies = sorted(p.latency_ms for p in recent)
    failed = sum(not p.ok for p in recent)
    return {
        "purchases": len(recent),
        "p95Ms": latencies[math.ceil(0.95 * len(recent)) - 1] if recent else None,
        "errorRate": round(failed / len(recent), 3) if recent else None,
    }
