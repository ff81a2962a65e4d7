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

Each run's figures go to <--out>/<lag>-<run>.json (build/scenarios/failover/), the table to
build/scenarios/failover.json.
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
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
# Every call during the outage logs a warning, every pump tick an error: the figures count them instead.
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "CRITICAL")

from infra.sim import simulate  # noqa: E402  (first: it sets the app's environment before chalicelib loads)
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
SETTLE_S = 5.0  # the window of admissions ends this long after the pump's first tick on the promoted node
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


def figures(sale, failover: Failover, lag_s: float) -> dict:
    """What the failover cost the sale; docs/failover.md says what each figure counts."""
    users, shop, settings, started = sale.users, sale.shop, sale.settings, sale.started
    killed = failover.killed_at
    signer = simulate.TokenSigner(settings.keyring)
    token_id = {text: signer.read_entry_token(text, at).token_id for u in users for at, _, text in u.tokens}
    rate_per_s = settings.batch_size * 1000 / settings.tick_ms

    seq_tickets = Counter(seq for u in users for _, seq in u.tickets)
    # Per user: how many token ids they were handed, and whether one was a direct admission (fail-open).
    token_ids = [
        (len({token_id[text] for _, _, text in u.tokens}), any(s == "DIRECT_ADMITTED" for _, s, _ in u.tokens))
        for u in users
    ]
    keys_at_shop: dict[int, set] = {}
    for request in shop["requests"]:
        keys_at_shop.setdefault(request["userId"], set()).add(request["key"])
    requests_per_key = Counter(request["key"] for request in shop["requests"])
    direct_ids: dict[str, bool] = {}  # token id -> whether it was ever handed out directly (fail-open)
    for u in users:
        for _, status, text in u.tokens:
            direct_ids[token_id[text]] = direct_ids.get(token_id[text], False) or status == "DIRECT_ADMITTED"
    orders_per_user = Counter(order["userId"] for order in shop["orders"])

    # Tokens by when each id was first handed, and whether its user held a ticket then.
    handed: dict[str, tuple[float, str, bool]] = {}
    for u in users:
        for at, status, text in u.tokens:
            had_ticket = bool(u.tickets) and u.tickets[0][0] < at
            handed.setdefault(token_id[text], (at, status, had_ticket))
    first_tick_after = min((at for at, _ in sale.pump.ticks if at > failover.promoted_at), default=math.inf)
    window = (killed, first_tick_after + SETTLE_S)
    in_window = [h for h in handed.values() if window[0] <= h[0] < window[1]]
    window_s = window[1] - window[0]
    per_second = Counter(int(at - started) for at, _, _ in handed.values())

    def first_token_at(u) -> float:
        return min((at for at, _, _ in u.tokens), default=math.inf)

    waiting_at_kill = [u for u in users if u.tickets and u.tickets[0][0] < killed < first_token_at(u)]
    let_in_directly = [
        u for u in waiting_at_kill if any(status == "DIRECT_ADMITTED" and at < window[1] for at, status, _ in u.tokens)
    ]
    direct = sorted(at for at, status, _ in handed.values() if status == "DIRECT_ADMITTED")
    behind_s = lag_s if math.isnan(failover.lag_seen_s) else failover.lag_seen_s
    return {
        "lag_s": lag_s,
        "replica_behind_at_kill_s": round(failover.lag_seen_s, 3),
        "stream_lost_bytes": failover.stream_lost_bytes,
        "killed_at_s": round(killed - started, 2),
        "promoted_at_s": round(failover.promoted_at - started, 2),
        "users": len(users),
        "bought": sum(u.outcome == "bought" for u in users),
        # Places the replica cannot have had: acknowledged within its lag before the kill.
        "places_in_lost_writes": sum(1 for u in users for at, _ in u.tickets if killed - behind_s <= at < killed),
        "places_lost": sum(u.reentries > 0 or u.came_back == "NOT_IN_QUEUE" for u in users),
        "seqs_on_two_tickets": sum(n > 1 for n in seq_tickets.values()),
        "two_token_ids_after_fail_open": sum(ids > 1 and direct for ids, direct in token_ids),
        "two_token_ids_queued_twice": sum(ids > 1 and not direct for ids, direct in token_ids),
        "users_at_shop_under_two_keys": sum(len(keys) > 1 for keys in keys_at_shop.values()),
        "second_orders": sum(n - 1 for n in orders_per_user.values()),
        # A key the shop got twice: the token bought, and the gate let it buy again.
        "consume_markers_lost": sum(n > 1 and not direct_ids[k] for k, n in requests_per_key.items()),
        "outage_uses_not_written_back": sum(n > 1 and direct_ids[k] for k, n in requests_per_key.items()),
        "resent_purchases": dict(Counter(u.resent for u in users if u.resent is not None)),
        "window_s": round(window_s, 2),
        "allowed_in_window": math.floor(rate_per_s * window_s) + settings.batch_size,
        "let_in_queued": sum(status == "ADMITTED" for _, status, _ in in_window),
        "let_in_directly_ticket_holders": sum(status == "DIRECT_ADMITTED" and had for _, status, had in in_window),
        "let_in_directly_newcomers": sum(status == "DIRECT_ADMITTED" and not had for _, status, had in in_window),
        "waiting_at_kill": len(waiting_at_kill),
        "waiting_at_kill_let_in_directly": len(let_in_directly),
        "fail_open_s": round(direct[-1] - direct[0], 2) if direct else 0.0,
        "peak_tokens_in_a_second": max(per_second.values(), default=0),
        "rate_per_s": rate_per_s,
    }


# The table: a label, and the figure of one run it shows (a name, or a function of the run's figures).
ROWS = [
    ("replica behind at the kill (s, measured)", "replica_behind_at_kill_s"),
    ("replication stream lost (bytes, at least)", "stream_lost_bytes"),
    ("places acknowledged within that lag", "places_in_lost_writes"),
    ("places lost (told NOT_IN_QUEUE)", "places_lost"),
    ("seqs on two tickets", "seqs_on_two_tickets"),
    ("users handed two token ids: after fail-open", "two_token_ids_after_fail_open"),
    ("  queued, admitted again", "two_token_ids_queued_twice"),
    ("users at the shop under two keys", "users_at_shop_under_two_keys"),
    ("  second orders (the demo shop: one per user)", "second_orders"),
    ("consume markers lost (a key bought twice)", "consume_markers_lost"),
    ("  outage uses not written back (bought twice)", "outage_uses_not_written_back"),
    ("window from the kill (s)", "window_s"),
    ("  allowed in it (rate x window + batch)", "allowed_in_window"),
    (
        "  let in, all",
        lambda f: f["let_in_queued"] + f["let_in_directly_ticket_holders"] + f["let_in_directly_newcomers"],
    ),
    ("  let in: queued", "let_in_queued"),
    ("  let in: directly, ticket holders", "let_in_directly_ticket_holders"),
    ("  let in: directly, newcomers", "let_in_directly_newcomers"),
    ("waiting at the kill", "waiting_at_kill"),
    ("  of them let in directly (%)", lambda f: _share(f["waiting_at_kill_let_in_directly"], f["waiting_at_kill"])),
    ("fail-open lasted (s)", "fail_open_s"),
    ("peak tokens in a second (rate/s)", lambda f: f"{f['peak_tokens_in_a_second']} ({f['rate_per_s']:g})"),
]


def _share(part: int, whole: int) -> int | None:
    return round(100 * part / whole) if whole else None


def table(runs: dict[float, list[dict]]) -> list[tuple[str, list[str]]]:
    """One row per figure, one cell per lag: every run's value, in run order."""

    def cell(figure, run: dict) -> str:
        return str(run[figure] if isinstance(figure, str) else figure(run))

    return [
        (label, [" / ".join(cell(figure, f) for f in figures) for figures in runs.values()]) for label, figure in ROWS
    ]


def parse_options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=False)
    parser.add_argument("--lags", type=float, nargs="+", default=list(LAGS_S), help="replication lags to run (s)")
    parser.add_argument("--runs", type=int, default=3, help="runs per lag")
    parser.add_argument("--failover-at-s", type=float, default=12.0, help="when the primary dies, after the start")
    parser.add_argument("--down-s", type=float, default=3.0, help="how long the address answers nothing")
    parser.add_argument(
        "--cooldown-s", type=float, default=5.0, help="the breaker's cool-down (VQ_BREAKER_COOLDOWN_MS), as deployed"
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
    (OUT / "failover.json").write_text(
        json.dumps({"date": date, "command": command.strip(), "rows": rows, "runs": runs}, indent=1)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
