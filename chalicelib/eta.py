"""The wait a user in line is told: `etaSeconds`, and a range meant to hold the wait they will have 4 times in 5.

`etaSeconds` is the users ahead over the measured admission rate: the wait if all of them stay. Some leave or are
evicted before their turn, and the line then reaches the user sooner. A user in line departs at some rate h a
second; of the `n` ahead, admitted at `r` a second, those still to come thin at h, so the line reaches the user
after ln(1 + h n / r) / h seconds (dn/dt = -r - h n), and the user hears of it at their next poll, half a
near-front poll later on average (NOTICE_S). The range is centred there, SPREAD of it either side, in whole
seconds rounded outwards.

h is measured from what the pump counts: the seqs the admitted mark has passed are the users whose turn came;
those of them not admitted (mark - admitted) left or were evicted before it, over waits of about the average wait
of those admitted. Until many turns have come, that says little (in a burst every newcomer is told before anyone's
turn), so the measure starts from a prior: h = (departed + PRIOR_PER_S * PRIOR_EXPOSURE_S) / (turns * average wait
+ PRIOR_EXPOSURE_S). SPREAD and the prior were tuned on the simulator (docs/waits.md), whose line moves exactly
at its rate: a real line's drift is wider. How often the range held, and how far `etaSeconds` was off, is
measured at every admission (stats' `etaAccuracy`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chalicelib.polling import NEAR_FRONT_MS

SPREAD = 0.0075  # the range's share of its centre either side
NOTICE_S = NEAR_FRONT_MS / 2000  # from the admission to the poll that tells of it, on average
PRIOR_PER_S = 0.0003  # departures per second of a user in line, before any are measured (1 in 6 over 10 minutes)
PRIOR_EXPOSURE_S = 6000.0  # ... weighing as much as 100 users' turns after a minute's wait each


@dataclass
class Departures:
    """What the pump and the polls count of a line: users admitted, the admitted mark (every seq up to it had their
    turn), and the users who collected their token with their total wait."""

    admitted: int = 0
    mark: int = 0
    waited: int = 0
    wait_ms: int = 0

    @classmethod
    def from_script(cls, counters: list) -> Departures:
        """From the scripts' `counters` reply: HMGET stats admitted, wait_count, wait_ms; then the mark."""
        admitted, waited, wait_ms, mark = (int(value or 0) for value in counters)
        return cls(admitted=admitted, mark=mark, waited=waited, wait_ms=wait_ms)

    def rate_per_s(self) -> float:
        """How often a user in line departs before their turn, per second of waiting: measured, from the prior."""
        departed = max(0, self.mark - self.admitted)
        exposure_s = self.mark * self.wait_ms / self.waited / 1000 if self.waited else 0.0
        return (departed + PRIOR_PER_S * PRIOR_EXPOSURE_S) / (exposure_s + PRIOR_EXPOSURE_S)


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
