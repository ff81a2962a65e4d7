"""The wait a user in line is told: `etaSeconds`, and a range meant to hold the wait they will have 4 times in 5.

`etaSeconds` is the users ahead over the measured admission rate: the wait if all of them stay. Some leave or are
evicted before their turn, and the line then reaches the user sooner. A user in line departs at some rate h a
second; of the `n` ahead, admitted at `r` a second, those still to come thin at h, so the line reaches the user
after ln(1 + h n / r) / h seconds (dn/dt = -r - h n), plus NOTICE_S: the turn comes at the tick after that, and
the user hears of it at their next poll, half a near-front poll later on average. The range is centred there,
SPREAD of it either side, in whole seconds rounded outwards.

h is measured from what the queue counts: the users who left or were evicted, over the time users spent waiting
(the pump adds the users waiting times each tick's length). In a burst every newcomer is told before much is
measured, so the measure starts from a prior: h = (left + evicted + PRIOR_PER_S * PRIOR_EXPOSURE_S) /
(waiting time + PRIOR_EXPOSURE_S). SPREAD and the prior were tuned on the simulator (docs/waits.md), whose line
moves exactly at its rate: a real line's drift is wider. How often the range held, and how far `etaSeconds` was
off, is measured at every admission (stats' `etaAccuracy`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chalicelib.polling import NEAR_FRONT_MS

SPREAD = 0.01  # the range's share of its centre either side
# From the moment the line would reach the user to the poll that tells them: the tick it falls on (a quarter
# second, half a short tick) and half a near-front poll.
NOTICE_S = 0.25 + NEAR_FRONT_MS / 2000
PRIOR_PER_S = 0.00032  # departures per second of a user in line, before any are measured (1 in 6 over 10 minutes)
PRIOR_EXPOSURE_S = 600_000.0  # ... weighing as much as 1,000 users waiting ten minutes


@dataclass
class Departures:
    """What the queue counts of a line's departures: users who left, users evicted, and the time users spent
    waiting in it (user-milliseconds)."""

    left: int = 0
    evicted: int = 0
    waiting_user_ms: int = 0

    @classmethod
    def from_script(cls, counters: list) -> Departures:
        """From the scripts' `counters` reply: HMGET stats left, evicted, waiting_user_ms."""
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


def estimate(ahead: int, rate: float, departures: Departures) -> Estimate:
    """The estimate for `ahead` users ahead of a line admitting `rate` users a second (rate > 0)."""
    all_stay_s = ahead / rate
    h = departures.rate_per_s()
    expected_s = math.log1p(h * all_stay_s) / h + NOTICE_S
    return Estimate(
        eta_s=math.ceil(all_stay_s),
        low_s=math.floor(_whole(expected_s * (1 - SPREAD))),
        high_s=math.ceil(_whole(expected_s * (1 + SPREAD))),
    )


def _whole(seconds: float) -> float:
    # 100 * 1.01 is 101.00000000000001 in floats: rounded first, it is not taken for 102 s.
    return round(seconds, 6)
