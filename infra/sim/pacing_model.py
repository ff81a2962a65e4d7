"""What the server's poll pacing asks of AWS for a crowd too large to simulate on this machine.

The simulator (infra/sim/simulate.py) runs the real stack, and measures; but 100,000 users waiting at a 60 s
heartbeat poll about 6,000 times a second, several times what a 2-core machine serves. This replays the same
sale with the pacing rule alone (chalicelib/polling.py, the very functions the API answers with) and the
line moving exactly at its rate: no HTTP, no Redis, no abandonment, no latency. It counts what every user
would send, beside the same crowd polling every 2.5 s, and prices both (infra/sim/sale_cost.py).

    python infra/sim/pacing_model.py --users 100000 --heartbeat-timeout-s 60
"""

from __future__ import annotations

import argparse
import bisect
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chalicelib import polling  # noqa: E402
from infra.sim.sale_cost import SaleLoad, sale_cost  # noqa: E402

FIXED_POLL_S = 2.5
WINDOW_S = 10
HANDLER_S = 0.015  # a request's billed Lambda duration, as measured locally (docs/capacity.md)


def model(users: int, rate: float, tick_s: float, arrival_s: float, heartbeat_s: int, seed: int = 7) -> dict:
    """Every user's polls under the pacing rule; the figures the simulator reports, for this crowd."""
    rng = random.Random(seed)
    batch = rate * tick_s
    arrivals = sorted(rng.uniform(0, arrival_s) for _ in range(users))  # seq follows arrival

    def mark(t: float) -> float:
        """Users admitted by time t: a batch a tick, never more than have arrived."""
        return min(bisect.bisect_right(arrivals, t), batch * math.floor(t / tick_s))

    polls_at: list[float] = []
    notice, waits = [], []
    for seq, arrived in enumerate(arrivals, start=1):
        admitted = tick_s * math.ceil(seq / batch)  # the tick whose mark reaches this seq
        admitted = max(admitted, tick_s * math.ceil(arrived / tick_s))
        t, newcomer = arrived, True
        while t < admitted:
            ahead = max(0.0, seq - 1 - mark(t))
            t += polling.waiting_poll_after_ms(ahead / rate, heartbeat_s, rng.random, newcomer) / 1000
            polls_at.append(t)
            newcomer = False
        notice.append(t - admitted)
        waits.append(t - arrived)
    duration = max(waits[i] + arrivals[i] for i in range(users))
    seconds = int(duration) + 1
    per_second = [0] * seconds
    for t in polls_at:
        per_second[min(seconds - 1, int(t))] += 1
    fixed = [0] * seconds
    fixed_polls = 0
    for arrived, waited in zip(arrivals, waits, strict=True):
        n = math.ceil(waited / FIXED_POLL_S)
        fixed_polls += n
        for k in range(1, n + 1):
            fixed[min(seconds - 1, int(arrived + k * FIXED_POLL_S))] += 1
    waiting = [bisect.bisect_right(arrivals, s) - mark(s) for s in range(seconds)]
    longest = max(waiting)
    windows = [
        range(s, s + WINDOW_S)
        for s in range(math.ceil(arrival_s) + 1, seconds - WINDOW_S)
        if min(waiting[s : s + WINDOW_S]) >= 0.1 * longest
    ]

    def per_1000(series):
        values = [1000 * sum(series[s] for s in w) / sum(waiting[s] for s in w) for w in windows]
        return round(sum(values) / len(values), 1), round(max(values), 1)

    paced_requests = len(polls_at) + 2 * users  # an enter and a purchase each
    fixed_requests = fixed_polls + 2 * users
    notice.sort()

    def cost(requests: int) -> float:
        return sale_cost(SaleLoad(requests, users, requests * HANDLER_S, duration))["total"]

    return {
        "users": users,
        "rate": rate,
        "heartbeat_s": heartbeat_s,
        "duration_s": round(duration),
        "mean_wait_s": round(sum(waits) / users, 1),
        "requests_per_admitted_user": round(paced_requests / users, 1),
        "fixed_requests_per_admitted_user": round(fixed_requests / users, 1),
        "share_of_fixed": round(paced_requests / fixed_requests, 3),
        "per_1000_waiting_mean_peak": per_1000(per_second),
        "fixed_per_1000_waiting_mean_peak": per_1000(fixed),
        "peak_requests_per_s": max(per_second),
        "notice_p50_p95_s": (round(notice[users // 2], 2), round(notice[int(users * 0.95)], 2)),
        "cost_usd": cost(paced_requests),
        "fixed_cost_usd": cost(fixed_requests),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=50.0, help="admissions per second")
    parser.add_argument("--tick-s", type=float, default=0.5)
    parser.add_argument("--arrival-s", type=float, default=2.0)
    parser.add_argument("--heartbeat-timeout-s", type=int, default=60)
    args = parser.parse_args(argv)
    figures = model(args.users, args.rate, args.tick_s, args.arrival_s, args.heartbeat_timeout_s)
    for name, value in figures.items():
        print(f"{name:36s} {value}")


if __name__ == "__main__":
    main()
