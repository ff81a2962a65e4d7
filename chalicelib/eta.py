"""The wait a user in line is told: `etaSeconds`, and a range meant to hold the wait they will have 9 times in 10.

`etaSeconds` is the users ahead over the measured admission rate: the wait if all of them stay. Some leave or are
evicted before their turn, and the line then reaches the user sooner. A user in line departs at some rate h a
second; of the `n` ahead, admitted at `r` a second, those still to come thin at h, so the line reaches the user
after ln(1 + h n / r) / h seconds (dn/dt = -r - h n). The turn then comes at a tick, a quarter tick later on
average, and the user hears of it at their next poll, half a near-front poll later: that is the range's centre.

Its width is what was measured to miss it (docs/waits.md): the tick the turn falls on (half a tick either side),
the poll that tells (half a near-front poll either side), and the line's own drift, SPREAD of the centre either
side (departures come unevenly, the rate wavers); in whole seconds, rounded outwards. So a wait near the front is
never promised to the second: with 2 s ticks, at least 1.5 s either side. A line measured slower than its
configured rate (the rate follows the shop's health, or has not run at full speed yet) may speed up again: the
range then reaches down to the wait at the configured rate.

h is measured from what the queue counts: the users who left (as lua/leave.lua counts them for this: after a tick
in line, before their turn, once per user in ten minutes, so one account looping enter and leave bends nothing) or
were evicted, over the time users spent waiting (the pump adds the users waiting times each tick's length). In a
burst every newcomer is told before much is measured, so the measure starts from a prior: h = (left + evicted +
PRIOR_PER_S * PRIOR_EXPOSURE_S) / (waiting time + PRIOR_EXPOSURE_S). How often the range held, and how far
`etaSeconds` was off, is measured at every admission (stats' `etaAccuracy`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chalicelib.polling import NEAR_FRONT_MS

SPREAD = 0.05  # the line's drift: the range's share of its centre either side, beside the tick and the poll
TICK_OFFSET = 0.25  # the turn comes this share of a tick after the line reaches the user, on average (measured)
TICK_SPREAD = 0.5  # ... within this share of a tick either side
NOTICE_S = NEAR_FRONT_MS / 2000  # the telling poll comes half a near-front poll after the turn, on average,
NOTICE_SPREAD_S = NEAR_FRONT_MS / 2000  # ... within this either side
PRIOR_PER_S = 0.00032  # departures per second of a user in line, before any are measured (1 in 6 over 10 minutes)
PRIOR_EXPOSURE_S = 600_000.0  # ... weighing as much as 1,000 users waiting ten minutes


@dataclass
class Departures:
    """What the queue counts of a line's departures: users who left (stats' `eta_left`), users evicted, and the
    time users spent waiting in it (user-milliseconds)."""

    left: int = 0
    evicted: int = 0
    waiting_user_ms: int = 0

    @classmethod
    def from_script(cls, counters: list) -> Departures:
        """From the scripts' `counters` reply: HMGET stats eta_left, evicted, waiting_user_ms."""
        left, evicted, waiting_user_ms = (int(value or 0) for value in counters)
        return cls(left, evicted, waiting_user_ms)

    def rate_per_s(self) -> float:
        """How often a user in line departs, per second of waiting: as measured, from the prior."""
        departed = self.left + self.evicted + PRIOR_PER_S * PRIOR_EXPOSURE_S
        return departed / (self.waiting_user_ms / 1000 + PRIOR_EXPOSURE_S)


@dataclass(frozen=True)
class Estimate:
    """What a user in line is told: `eta_s` (etaSeconds) and the range [low_s, high_s], whole seconds."""

    eta_s: int
    low_s: int
    high_s: int

    def holds(self, wait_s: float) -> bool:
        return self.low_s <= wait_s <= self.high_s


def estimate(ahead: int, rate: float, departures: Departures, tick_s: float, configured_rate: float) -> Estimate:
    """The estimate for `ahead` users ahead of a line admitting `rate` users a second (rate > 0, as measured) in
    ticks of `tick_s` seconds, configured for `configured_rate`. Centred at the measured rate; a line measured
    slower than configured (the rate follows the shop, or has not been measured at full speed yet) may go back
    to its configured rate, so the range reaches down to that wait too."""
    h = departures.rate_per_s()

    def expected_s(at_rate: float) -> float:
        return math.log1p(h * ahead / at_rate) / h + TICK_OFFSET * tick_s + NOTICE_S

    def half_s(centre_s: float) -> float:
        return TICK_SPREAD * tick_s + NOTICE_SPREAD_S + SPREAD * centre_s

    centre_s, fastest_s = expected_s(rate), expected_s(max(rate, configured_rate))
    return Estimate(
        eta_s=math.ceil(ahead / rate),
        low_s=math.floor(_whole(max(0.0, fastest_s - half_s(fastest_s)))),
        high_s=math.ceil(_whole(centre_s + half_s(centre_s))),
    )


def _whole(seconds: float) -> float:
    # 100 * 1.05 is 105.00000000000001 in floats: rounded first, it is not taken for 106 s.
    return round(seconds, 6)
