"""The shop's health as the queue sees it, and an admission rate that follows it.

The purchase gate notes every forwarded purchase: when it was sent, how long the shop took, and whether it
failed (a 5xx, or no answer). Each tick the pump sets, for a target with an `originSlo`, how many users it
admits per tick (lua/adjust_rate.lua, before admit.lua in the same round trip), AIMD-fashion from the purchases
the shop answered in the last few seconds:
- over the objective (p95 latency or error share), a cut to a share of what the shop completed (its throughput):
  the share that drains the backlog's excess delay within `drain_ms`, between FollowRules' bounds;
- comfortably within the objective (under `headroom` of it): at once back to the gentlest cut's share of the
  throughput the shop had when last over it (then saturated: its capacity as last seen), then a small fixed share
  of the configured rate added back at a time; between that and the objective, the rate holds;
- after any change, nothing changes again until enough purchases sent after it reached the shop (users admitted
  after it buy at their next poll) come back: earlier ones describe the earlier rate, and must neither cut it
  twice nor let it grow faster than the shop can show the effect.
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
    increase: float = 0.02  # share of the configured rate added back per healthy judgement
    reach_ms: int = NEAR_FRONT_MS  # a change reaches the shop with the users admitted after it, at their next poll
    deepest: float = 0.5  # a cut never keeps less than half the shop's throughput...
    gentlest: float = 0.9  # ...nor more than 90 % of it; healthy again, the rate comes back to this share at once
    floor: float = 0.05  # the lowest share of the configured rate
    headroom: float = 0.8  # the rate grows only while the shop is under this share of its objective
    # A cut drains the backlog's excess delay within this long: about when purchases sent after it come back.
    # Draining deep costs little, as healthy again the rate comes back to nine tenths of the capacity at once.
    drain_ms: int = 1000

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
    def parse(cls, text: str) -> "Purchase | None":
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
