"""The shop's health as the queue sees it, and an admission rate that follows it.

The purchase gate notes every forwarded purchase: when it was sent, how long the shop took, and whether it
failed (a 5xx, or no answer). Each tick the pump sets, for a target with an `originSlo`, how many users it
admits per tick (lua/adjust_rate.lua, before admit.lua in the same round trip): while the recent purchases'
p95 latency or error share is over the objective it cuts the rate by a factor (the further over, the deeper,
within FollowRules' bounds), while they are within it adds back a fixed share of the configured rate per
second. The configured rate stays the ceiling, and the rate never falls to nothing, so there is always a
purchase to judge recovery by.

A shop that answers `X-Queue-Sold-Out: true` marks its target sold out (see target_config.py). The gate's
side, noting each purchase, is shop_watch.py.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass

# The latest purchases kept per target (the window's worth up to 200 a second), and for how long.
MAX_PURCHASES = 1000
PURCHASES_TTL_MS = 600_000


@dataclass(frozen=True)
class FollowRules:
    """How the pump follows a shop's health (the ARGV of adjust_rate.lua after the defaults and TTL, in order)."""

    window_ms: int = 5000  # purchases sent this recently are judged
    fewest: int = 5  # fewer purchases than this say nothing either way
    increase_per_s: float = 0.04  # share of the configured rate added back per healthy second
    hold_ms: int = 2000  # least time between two decreases, so a cut shows in the shop before the next
    deepest: float = 0.5  # a cut never takes more than half the rate at once...
    gentlest: float = 0.9  # ...nor less than a tenth
    floor: float = 0.05  # the lowest share of the configured rate
    throughput_kept: float = 0.9  # a cut keeps at least this share of what the shop completed (its throughput)
    headroom: float = 0.8  # the rate grows only while the shop is under this share of its objective

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
    """What operators see of the shop: p95 latency and error share of the purchases sent within the window."""
    recent = sorted(p.latency_ms for p in purchases if p.sent_ms > now_ms - window_ms)
    failed = sum(not p.ok for p in purchases if p.sent_ms > now_ms - window_ms)
    return {
        "purchases": len(recent),
        "p95Ms": recent[math.ceil(0.95 * len(recent)) - 1] if recent else None,
        "errorRate": round(failed / len(recent), 3) if recent else None,
    }
