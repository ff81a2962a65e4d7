"""The library's crowd against the simulator's own: does a crowd driven by `virtual-queue-client` (clients/js/, in
bounded Node worker threads) ask the origin more than the simulator's paced Python clients?

Rounds alternate between the two crowds (simulator, library, simulator, ...), each on a fresh local stack
(infra/local/stack.py, the pump ticking) with the same plan: the same users arriving at the same moments over the
burst, every one waiting until admitted and buying once (nobody abandons or double-clicks: the two crowds do the
same thing). The origin's own request log counts what each round asked of it. Prints each round, and each library
round's ratio to the simulator rounds beside it, with their mean and spread. Needs Node 20+ and `npm ci` in
clients/js/ (it builds the library with tsc).

    python infra/sim/client_crowd.py                  # 300 users over 3 s, batch 10 every 500 ms, 3 rounds each
    python infra/sim/client_crowd.py --users 1000 --rounds 4 --node-workers 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
# The pump runs in this process: quiet and without metric lines, before chalicelib creates its logger.
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")

from chalicelib.tokens import TokenSigner  # noqa: E402
from infra.local.stack import LocalStack, free_port  # noqa: E402
from infra.sim.report import ENTRIES, PURCHASE  # noqa: E402
from infra.sim.simulate import Api, User, journey  # noqa: E402

CLIENT = ROOT / "clients" / "js"
OUT = ROOT / "build" / "client-crowd"
# A request line of the local API's log that the crowd made: its entries and its purchases (not the operator's);
# and, apart, its reads of the line's public state (issue 39's /line, which the edge answers when deployed).
CROWD_REQUEST = re.compile(rf'"(?:POST|GET|DELETE) (?:{re.escape(ENTRIES)}(?:/me)?|{re.escape(PURCHASE)}) HTTP')
LINE_READ = re.compile(rf'"GET {re.escape(ENTRIES.removesuffix("/entries"))}/line HTTP')


def parse_options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Origin requests of the library's crowd against the simulator's.")
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--arrival-s", type=float, default=3.0, help="arrivals spread over this long")
    parser.add_argument("--batch", type=int, default=10, help="users admitted per tick")
    parser.add_argument("--tick-ms", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each crowd, alternating")
    parser.add_argument("--node-workers", type=int, default=2, help="the library crowd's worker threads")
    parser.add_argument("--threads", type=int, default=16, help="the simulator crowd's requests in flight at once")
    parser.add_argument("--seed", type=int, default=7)
    return parser.parse_args(argv)


def plan(options: argparse.Namespace) -> list[tuple[int, float]]:
    """(user id, arrival in s after the start) for everyone: the same for every round."""
    rng = random.Random(options.seed)
    return [(user_id, rng.uniform(0, options.arrival_s)) for user_id in range(1, options.users + 1)]


def simulator_crowd(users: list[tuple[int, float]], api_url: str, stack: LocalStack, threads: int) -> Counter[str]:
    """The simulator's journeys (infra/sim/simulate.py), over HTTP: enter, poll at pollAfterMs, buy once."""
    crowd = [User(i, arrives, None, False, False) for i, arrives in users]
    api = Api(api_url, threads)
    signer = TokenSigner(stack.settings.keyring)

    async def run() -> None:
        started = time.time()
        await asyncio.gather(*(journey(user, api, started, signer) for user in crowd))

    try:
        asyncio.run(run())
    finally:
        api.close()
    # The simulator's users enter again when evicted (the library's stop with NOT_IN_QUEUE): counted, not hidden.
    evicted = sum(user.reentries for user in crowd)
    return Counter(user.outcome for user in crowd) + Counter({"evicted, entered again": evicted})


def library_crowd(users: list[tuple[int, float]], api_url: str, workers: int) -> Counter[str]:
    """The same users through the library, in `workers` Node worker threads (clients/js/sim/crowd.mjs)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as plan_file:
        users_json = [{"id": i, "arrivesS": arrives} for i, arrives in users]
        json.dump({"api": api_url, "purchase": PURCHASE, "workers": workers, "users": users_json}, plan_file)
        plan_file.flush()
        done = subprocess.run(
            ["node", "sim/crowd.mjs", plan_file.name], cwd=CLIENT, capture_output=True, text=True, check=True
        )
    return Counter(json.loads(done.stdout.splitlines()[-1])["outcomes"])


def one_round(crowd: str, users: list[tuple[int, float]], options: argparse.Namespace, number: int) -> dict:
    """A fresh stack, one crowd through it; what the origin's log counted."""
    env = {
        **os.environ,
        "VQ_KEY_PREFIX": f"vqcrowd-{uuid.uuid4().hex[:8]}",
        "VQ_BATCH_SIZE": str(options.batch),
        "VQ_TICK_MS": str(options.tick_ms),
    }
    log_path = OUT / f"api-{number}-{crowd}.log"
    with open(log_path, "w") as log, LocalStack(env, api_port=free_port(), stock=len(users), api_output=log) as stack:
        started = time.monotonic()
        if crowd == "simulator":
            outcomes = simulator_crowd(users, stack.api_url, stack, options.threads)
        else:
            outcomes = library_crowd(users, stack.api_url, options.node_workers)
        took = time.monotonic() - started
    lines = log_path.read_text().splitlines()
    requests = sum(1 for line in lines if CROWD_REQUEST.search(line))
    line_reads = sum(1 for line in lines if LINE_READ.search(line))
    return {
        "crowd": crowd,
        "requests": requests,
        "lineReads": line_reads,
        "outcomes": dict(outcomes),
        "seconds": round(took, 1),
    }


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    subprocess.run(["npm", "run", "--silent", "build"], cwd=CLIENT, check=True)
    users = plan(options)
    rounds = []
    for number in range(2 * options.rounds):
        crowd = ("simulator", "library")[number % 2]
        rounds.append(one_round(crowd, users, options, number))
        r = rounds[-1]
        shown = f"{r['requests']:>6,} origin requests  {r['lineReads']:>5,} /line reads  {r['seconds']:>5} s"
        shown += f"  {r['outcomes']}"
        print(f"round {number + 1}: {r['crowd']:<9}  {shown}", flush=True)
    # Each library round against the mean of the simulator rounds on either side of it.
    ratios = []
    for i, r in enumerate(rounds):
        if r["crowd"] == "library":
            beside = [rounds[j]["requests"] for j in (i - 1, i + 1) if 0 <= j < len(rounds)]
            ratios.append(r["requests"] / statistics.mean(beside))
    spread = f"{min(ratios):.3f}-{max(ratios):.3f}"
    print(f"library / simulator origin requests: {statistics.mean(ratios):.3f} (rounds {spread}; target <= 1.05)")
    (OUT / "report.json").write_text(json.dumps({"rounds": rounds, "ratios": ratios}, indent=2))
    everyone_bought = all(r["outcomes"] == {"bought": options.users} for r in rounds)
    return 0 if everyone_bought and statistics.mean(ratios) <= 1.05 else 1


if __name__ == "__main__":
    sys.exit(main())
