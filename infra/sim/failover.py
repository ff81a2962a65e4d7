"""A Redis failover mid-sale, measured: what a sale loses when ElastiCache promotes a replica that lagged.

The simulator's sale (infra/sim/simulate.py: its users, journeys and local stack) runs on a primary and replica
pair on loopback (tests/support/replication.py): the replica follows the primary `lag` seconds behind, and the API,
the crowd and the pump reach Redis through one address, as they reach the primary endpoint. At `--failover-at-s`
the primary dies with what the replication link held, the address answers nothing for `--down-s`, then the
replica is promoted there. Every user who bought comes back once afterwards, as a shopper reloading the page
does. The figures (places lost, seqs reused, users under two keys, consume markers lost, admissions against the
allowance) and what each counts: docs/failover.md.

    python infra/sim/scenarios.py failover                     # lags 0 (the outage alone), 0.25, 1, 3 s; 3 runs each
    python infra/sim/scenarios.py failover --lags 1 --runs 1   # one run; the simulator's knobs too (--users 1000)

Each run's figures go to <--out>/<lag>-<run>.json (--out: build/scenarios/failover/), the table beside that
folder (build/scenarios/failover.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
# Every call during the outage logs a warning, every pump tick an error: the figures count them instead.
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "CRITICAL")

from infra.sim import simulate  # noqa: E402  (first: it sets the app's environment before chalicelib loads)
from infra.sim.failover_figures import figures, table  # noqa: E402
from infra.sim.report import ENTRIES, PURCHASE  # noqa: E402
from tests.support.replication import ReplicatedPair  # noqa: E402

OUT = ROOT / "build" / "scenarios"
LAGS_S = (0.0, 0.25, 1.0, 3.0)  # 0: the outage alone
# The sale: 600 users over 20 s (30 a second) against 20 admissions a second, so a line builds, and enters,
# admissions and purchases all go on when the primary dies 12 s in. Everyone who keeps polling buys, and the shop
# never sells out: a sold-out line would answer SOLD_OUT to a user coming back, hiding what their ticket lost.
SALE = [
    "--users",
    "600",
    "--arrival-s",
    "20",
    "--batch",
    "10",
    "--tick-ms",
    "500",
    "--stock",
    "1000000",
    "--abandon",
    "0",
]
PROBE_EVERY_S = 0.05  # the harness's clock probe, written to the primary and read from the replica
BODY = b'{"quantity": 1}'  # a purchase, as the simulator sends it


@dataclass
class ReturningUser(simulate.User):
    """A simulated user who, after buying, comes back at `returns_s` (after the start) or at once if later."""

    returns_s: float = math.inf
    resent: str | None = None  # what the gate answered the purchase sent again with the token that bought
    came_back: str | None = None  # what their ticket's last poll answered on coming back
    bought_again: list = field(default_factory=list)  # answers to a purchase with a token of a new id


async def journey_through_failover(user, api, started: float, signer) -> None:
    """The simulator's journey; then, for a buyer, coming back once after the failover."""
    await simulate.journey(user, api, started, signer)
    if user.outcome != "bought":
        return
    await api.sleep(max(0.0, started + user.returns_s - time.time()))
    await come_back(user, api, signer)


async def come_back(user: ReturningUser, api, signer) -> None:
    """Send the purchase again with the token that bought; poll with the ticket until the queue answers for good;
    buy with a token whose id is new."""
    bought_with = user.tokens[-1][2]
    headers = {**simulate.user_headers(user), "X-Entry-Token": bought_with, "Content-Type": "application/json"}
    (resent,) = await api.clicks(1, "POST", PURCHASE, headers, BODY)
    user.resent = resent.code or str(resent.status)
    if not user.ticket:  # let in directly as a newcomer: no place to come back to
        user.came_back = "no ticket"
        return
    known = {signer.read_entry_token(text, time.time()).token_id for _, _, text in user.tokens}
    while True:
        answer = await api.call("status", "GET", ENTRIES + "/me", simulate.user_headers(user))
        if answer.status == 200 and answer.body["status"] in ("WAITING", "PRE_QUEUE"):
            await api.sleep(answer.body["pollAfterMs"] / 1000)
            continue
        if answer.status != 200:
            if answer.retry_after_s:
                await api.sleep(answer.retry_after_s)
                continue
            user.came_back = answer.code or str(answer.status)
            return
        user.came_back = answer.body["status"]
        if "entryToken" not in answer.body:
            return
        simulate.note_token(user, answer.body)
        token = signer.read_entry_token(answer.body["entryToken"], time.time())
        if token.token_id not in known:
            headers = {**headers, "X-Entry-Token": answer.body["entryToken"]}
            user.bought_again = [a.code or a.status for a in await api.clicks(1, "POST", PURCHASE, headers, BODY)]
        return


class Failover(threading.Thread):
    """Fails the pair over at `at` (epoch s): the primary dies, the address is dead `down_s`, the replica is
    promoted there. Notes when, how far behind the replica was (a clock probe the harness writes to the primary
    every 50 ms), and how many bytes of the replication stream the promoted replica never received."""

    def __init__(self, pair: ReplicatedPair, down_s: float, probe_key: str) -> None:
        super().__init__(name="failover", daemon=True)
        self.pair, self.down_s, self.probe_key = pair, down_s, probe_key
        self.at = math.inf
        self.killed_at = self.promoted_at = math.nan
        self.lag_seen_s = math.nan
        self.stream_lost_bytes = -1
        self.error: BaseException | None = None
        self._go = threading.Event()

    def schedule(self, at: float) -> None:
        self.at = at
        self._go.set()

    def run(self) -> None:
        try:
            self._go.wait()
            primary, replica = self.pair.primary_client(), self.pair.replica_client()
            while (now := time.time()) < self.at:
                primary.set(self.probe_key, repr(now))
                time.sleep(min(PROBE_EVERY_S, max(0.0, self.at - now)))
            sent = primary.info("replication")["master_repl_offset"]
            self.lag_seen_s = time.time() - float(replica.get(self.probe_key) or "nan")
            self.killed_at = time.time()
            self.pair.fail_over(outage_s=self.down_s)
            self.promoted_at = time.time()
            # The promoted node's old replication stream ends where it stopped receiving it. The primary took
            # writes between `sent` and its death too: this is a lower bound.
            self.stream_lost_bytes = max(0, sent - (replica.info("replication")["second_repl_offset"] - 1))
        except BaseException as err:  # noqa: BLE001 (the run reports it)
            self.error = err


def run_once(options: argparse.Namespace, lag_s: float, run: int) -> dict:
    """One sale with a failover at `lag_s`; its figures."""
    pair = ReplicatedPair()
    try:
        # Lagging only once in sync: the first sync's handshake would otherwise take a few lagged round trips.
        pair.link.delay_s = lag_s
        prefix = f"vqfail-{run}-{int(time.time())}"
        failover = Failover(pair, options.down_s, f"{prefix}:clock-probe")
        failover.start()
        users = [
            ReturningUser(**vars(u), returns_s=options.failover_at_s + options.down_s + options.cooldown_s + 1)
            for u in simulate.plan_users(options, random.Random(options.seed + run))
        ]
        sale = simulate.run_sale(
            options,
            users,
            env={
                "REDIS_URL": pair.url,
                "VQ_KEY_PREFIX": prefix,
                "VQ_BREAKER_COOLDOWN_MS": str(int(options.cooldown_s * 1000)),
            },
            journey=journey_through_failover,
            on_start=lambda started: failover.schedule(started + options.failover_at_s),
        )
        failover.join(timeout=30)
        if failover.error is not None:
            raise SystemExit(f"the failover failed: {failover.error!r}")
    finally:
        pair.close()
    return figures(sale, failover, lag_s)


def parse_options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=False)
    parser.add_argument("--lags", type=float, nargs="+", default=list(LAGS_S), help="replication lags to run (s)")
    parser.add_argument("--runs", type=int, default=3, help="runs per lag")
    parser.add_argument("--failover-at-s", type=float, default=12.0, help="when the primary dies, after the start")
    parser.add_argument("--down-s", type=float, default=3.0, help="how long the address answers nothing")
    parser.add_argument(
        "--cooldown-s", type=float, default=1.0, help="the breaker's cool-down (VQ_BREAKER_COOLDOWN_MS), as deployed"
    )
    own, rest = parser.parse_known_args(argv)
    if "--help" in rest or "-h" in rest:
        parser.print_help()
        print("\nand the simulator's knobs (its defaults here: " + " ".join(SALE) + "):")
    options = simulate.parse_options([*SALE, "--out", str(OUT / "failover"), *rest])
    return argparse.Namespace(**{**vars(options), **vars(own)})


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python infra/sim/scenarios.py failover " + " ".join(argv or sys.argv[2:])
    runs: dict[float, list[dict]] = {}
    for lag_s in options.lags:
        for run in range(options.runs):
            print(f"== failover, replica {lag_s:g} s behind, run {run + 1} of {options.runs}", flush=True)
            result = run_once(options, lag_s, run)
            (out / f"{lag_s:g}-{run + 1}.json").write_text(json.dumps(result, indent=1))
            runs.setdefault(lag_s, []).append(result)
    rows = table(runs)
    width = max(len(label) for label, _ in rows)
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    print(f"\nfailover mid-sale, {date}: {command.strip()}")
    print(
        f"  {options.users} users over {options.arrival_s:g} s, {options.batch} every {options.tick_ms} ms; the primary"
        f" dies {options.failover_at_s:g} s in, the address is dead {options.down_s:g} s; each cell: every run"
    )
    print(f"  {'replica lag (s)':<{width}}  " + " | ".join(f"{lag:g}" for lag in runs))
    for label, cells in rows:
        print(f"  {label:<{width}}  " + " | ".join(cells))
    # Beside the runs' folder: build/scenarios/failover.json by default.
    (out.parent / f"{out.name}.json").write_text(
        json.dumps({"date": date, "command": command.strip(), "rows": rows, "runs": runs}, indent=1)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
