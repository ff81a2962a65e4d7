"""The shop's health as the queue sees it, and the rules the admission rate follows it by (originSlo).

The purchase gate notes every forwarded purchase (shop_watch.py); each tick, lua/adjust_rate.lua sets the users per
tick a target with an originSlo admits from them. The controller, state by state, with every rule below:
docs/origin-slo.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chalicelib.polling import NEAR_FRONT_MS

# The latest purchases kept per target (the window's worth up to 300 a second), and for how long.
MAX_PURCHASES = 1000
PURCHASES_TTL_MS = 600_000


@dataclass(frozen=True)
class FollowRules:
    """How the pump follows a shop's health: adjust_rate.lua's ARGV of the same names (chalicelib/scripts.py)."""

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


@dataclass(frozen=True)
class Purchase:
    """One forwarded purchase, as the gate saw it."""

    sent_ms: int
    latency_ms: int
    ok: bool  # False: a 5xx or no answer

    @classmethod
    def parse(cls, text: str) -> Purchase | None:
        parts = text.split(":")
        if len(parts) != 3 or not all(part.isdigit() for part in parts):
            return None
        return cls(int(parts[0]), int(parts[1]), parts[2] == "1")


def health(purchases: list[Purchase], now_ms: int, window_ms: int = FollowRules.window_ms) -> dict:
    """What operators see of the shop (stats' `recentShop`): p95 latency and error share of the purchases it
    answered within the last `window_ms` (what the pump judges, but for the hold after a cut)."""
    recent = [p for p in purchases if p.sent_ms + p.latency_ms > now_ms - window_ms]
    latencies = sorted(p.latency_ms for p in recent)
    failed = sum(not p.ok for p in recent)
    return {
        "windowSeconds": window_ms / 1000,
        "purchases": len(recent),
        "p95Ms": latencies[math.ceil(0.95 * len(recent)) - 1] if recent else None,
        "errorRate": round(failed / len(recent), 3) if recent else None,
    }
