"""When a waiting client polls next (`pollAfterMs`): the server paces the crowd.

Polls are the waiting room's cost and its load on the account's quotas, so the server, which knows the line,
decides how often each client asks:
- Far from the front, rarely: the poll comes after half the remaining wait (the ETA), so the gaps shrink as
  the turn nears; but never more than a third of the heartbeat timeout apart, so that a client that obeys
  and loses one poll is still not evicted.
- Near the front, every second or so: a user hears of their admission within about a second of it.
- Beyond the presence window, no heartbeat is needed: the client reads /line (or polls, if it ignores /line) after
  half of the wait left until the window, at most the read cap apart (`line_after_ms`).
- In the pre-queue: wake just after the opening, spread over a few seconds, so that the whole pre-queue
  does not ask in the same 100 ms; until then as rarely as the waiting far from the front.
Every advice is cut by up to a tenth at random (and never lengthened), so polls drift apart while no
advice goes past its bound; a newcomer's first advice by up to three quarters, so that a crowd arriving in
one burst spreads over the whole gap at once instead of coming back as one wave a gap later. (The cut is
what the spread costs: every poll comes that much sooner than the bound allows. The newcomers' spread does
the spreading; a tenth keeps them drifting apart, at 5 % more polls where a quarter cost 14 %.)
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

NEAR_FRONT_MS = 1000  # the shortest advice: how soon after admission a user near the front hears of it
SHARE_OF_ETA = 0.5  # poll again after this share of the remaining wait
JITTER = 0.1  # each advice is shortened by up to this share, at random
NEWCOMER_JITTER = 0.75  # ... and a newcomer's first one by up to this share
PRE_QUEUE_SPREAD_MS = 5000  # the pre-queue's first polls after the opening spread over this long
DRAW_DELAY_MS = 500  # the pre-queue wakes no sooner than this after the opening, when the draw has placed it
LATENCY_ALLOWANCE_MS = 1000  # a poll's own time on the way, and the pump's tick, beside two advised gaps

Random = Callable[[], float]


def longest_interval_ms(heartbeat_timeout_s: int) -> int:
    """The longest advice this heartbeat timeout allows: a third of it, but never under the near-front poll."""
    return max(NEAR_FRONT_MS, heartbeat_timeout_s * 1000 // 3)


def heartbeat_problem(heartbeat_timeout_s: int) -> str | None:
    """Why this heartbeat timeout would evict a client that obeys every advice and loses one poll, or None.

    Such a client is silent for two of the longest advised gaps, plus a poll's latency.
    """
    silent_ms = 2 * longest_interval_ms(heartbeat_timeout_s) + LATENCY_ALLOWANCE_MS
    if silent_ms > heartbeat_timeout_s * 1000:
        return (
            f"a heartbeat timeout of {heartbeat_timeout_s} s would evict clients that follow pollAfterMs: "
            f"one lost poll leaves them silent for up to {silent_ms / 1000:g} s "
            f"(at least {math.ceil((2 * NEAR_FRONT_MS + LATENCY_ALLOWANCE_MS) / 1000)} s is needed)"
        )
    return None


def waiting_poll_after_ms(
    eta_s: float | None,
    heartbeat_timeout_s: int,
    rand: Random = random.random,
    newcomer: bool = False,
) -> int:
    """The advice for a user in line whose turn is `eta_s` away (None: unknown, e.g. while paused);
    `newcomer`: the answer that gave them their place."""
    longest = longest_interval_ms(heartbeat_timeout_s)
    base = longest if eta_s is None else min(longest, max(NEAR_FRONT_MS, eta_s * 1000 * SHARE_OF_ETA))
    return _jittered(base, rand, NEWCOMER_JITTER if newcomer else JITTER)


def line_after_ms(
    eta_s: float, presence_window_s: int, read_cap_s: int, rand: Random = random.random, newcomer: bool = False
) -> int | None:
    """For a user whose turn is `eta_s` away: when to read /line next, or None inside the presence window (poll)."""
    if eta_s <= presence_window_s:
        return None
    base = min(read_cap_s * 1000, max(NEAR_FRONT_MS, (eta_s - presence_window_s) * 1000 * SHARE_OF_ETA))
    return _jittered(base, rand, NEWCOMER_JITTER if newcomer else JITTER)


def pre_queue_poll_after_ms(opens_in_ms: int | None, heartbeat_timeout_s: int, rand: Random = random.random) -> int:
    """The advice for a user in the pre-queue of a line that opens in `opens_in_ms` (None: no opening set).

    The opening draw starts their heartbeat, so their first poll after it comes within a longest gap too.
    """
    longest = longest_interval_ms(heartbeat_timeout_s)
    if opens_in_ms is None or opens_in_ms > longest:
        return _jittered(longest, rand, JITTER)
    # The pump draws at its first tick after the opening; the last of them wakes within a longest gap of it.
    spread = min(PRE_QUEUE_SPREAD_MS, longest - DRAW_DELAY_MS)
    return max(0, opens_in_ms) + DRAW_DELAY_MS + int(rand() * spread)


def _jittered(base_ms: float, rand: Random, jitter: float) -> int:
    return int(base_ms * (1 - jitter * rand()))
