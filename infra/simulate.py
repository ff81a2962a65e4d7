"""Flash-sale simulator: N virtual users arrive in a burst at one line of the local stack, and buy.

Each user enters, polls until admitted (a little before its ETA each time, with jitter, as a mobile client
that trusts the ETA would, within the heartbeat timeout), then buys once. A share
abandons while waiting (half leave the line, half just stop polling and are evicted), and a share clicks
Buy twice at once (the gate must stop the second click before the shop). The stack (infra/local_stack.py)
is started here with a short tick, and its pump records what every tick did.

The report: admissions per tick against the batch; requests reaching the shop per one-second window
against the target rate; the ETA error (etaSeconds on entry against the wait until the poll that saw
ADMITTED); p50/p95 latency of enter, status and purchase; oversells. It is printed, and written with a
plot of queue length and admission rate over time to --out (build/simulation/report.json, plot.png).
Exit status 1 when a check fails.

    python infra/simulate.py                  # `make simulate`; --help lists the knobs
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import math
import os
import random
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The pump runs in this process and the API inherits this environment: quiet and lean, before chalicelib
# creates its logger. (A log line per request or metric per tick would cost the API a good part of its speed.)
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")

from tqdm import tqdm  # noqa: E402

from chalicelib.gate import purchase_path  # noqa: E402
from chalicelib.pump import Pump, TickReport  # noqa: E402
from chalicelib.store import TargetTick  # noqa: E402
from chalicelib.targets import Target  # noqa: E402
from infra.local_stack import LocalStack  # noqa: E402

TARGET = Target("limited-drop", 1)
ENTRIES = f"/virtual-queues/{TARGET.type}/{TARGET.id}/entries"
PURCHASE = purchase_path(TARGET)
KINDS = ("enter", "status", "leave", "purchase")  # of API call


def parse_options(argv: list[str] | None) -> argparse.Namespace:
    """The command line's knobs (`--help`)."""
    parser = argparse.ArgumentParser(description="Simulate a flash-sale crowd against the local stack.")
    parser.add_argument("--users", type=int, default=5000)
    parser.add_argument("--arrival-s", type=float, default=2.0, help="the burst: arrivals spread over this long")
    parser.add_argument("--abandon", type=float, default=0.1,
                        help="share of users who give up while waiting (half leave, half stop polling)")
    parser.add_argument("--double-click", type=float, default=0.05,
                        help="share of buyers who send their purchase twice at once")
    # 50 admissions a second: with the crowd's polls, enters and purchases, about as much as one local API
    # process (a few hundred requests a second on this machine) answers without a backlog. A backlog would
    # tell admitted users late and all at once, which measures that server, not the queue.
    parser.add_argument("--batch", type=int, default=25, help="users admitted per tick")
    parser.add_argument("--tick-ms", type=int, default=500, help="length of a tick")
    parser.add_argument("--stock", type=int, default=3000, help="units the shop has")
    parser.add_argument("--heartbeat-timeout-s", type=int, default=120,
                        help="evict users silent this long (keep it above the slowest poll gap under load)")
    parser.add_argument("--max-waiting", type=int, help="capacity of the line (default: the stack's)")
    parser.add_argument("--threads", type=int, default=16, help="most requests of each kind in flight at once")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--key-prefix", help="Redis key prefix (default: a fresh one per run)")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "simulation")
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    return parser.parse_args(argv)


class RecordingPump(Pump):
    """The admission pump, noting when each tick ran and what it did."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ticks: list[tuple[float, TickReport]] = []

    def tick(self) -> TickReport:
        report = super().tick()
        self.ticks.append((time.time(), report))
        return report


@dataclass(frozen=True)
class Answer:
    status: int  # 0: no answer (the connection failed)
    body: dict | None
    retry_after_s: float
    sent_at: float  # when the request left (the API answered it right after)

    @property
    def code(self) -> str | None:
        return self.body.get("code") if isinstance(self.body, dict) else None


class Api:
    """Calls to the API from fixed pools of threads (the bound on requests in flight), each thread with its
    own kept-alive connection. Notes each call's latency, and how long it waited for a free thread, by kind;
    and every failure of the API.

    When the crowd asks more than the local API can answer (one process: some hundreds of requests a second,
    fewer than 5,000 users polling every 2-3 s ask), requests wait here for a thread: that wait is the API's
    backlog, and users hear of their admission that much later.
    """

    def __init__(self, url: str, threads: int) -> None:
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        # A pool per kind of call: polls do not queue behind a burst of arrivals (nor purchases behind polls,
        # as a Buy click in a browser does not), or admitted users would hear of it late and all at once.
        self.pools = {kind: ThreadPoolExecutor(threads, thread_name_prefix=kind) for kind in KINDS}
        # One list per kind made up front: the pool's threads only append (atomic), never insert a key.
        self.latencies: dict[str, list[float]] = {kind: [] for kind in KINDS}
        self.backlog: dict[str, list[float]] = {kind: [] for kind in KINDS}
        self.failures: Counter[str] = Counter()
        self._local = threading.local()
        self._lock = threading.Lock()

    async def call(self, kind: str, method: str, path: str, headers: dict, body: bytes | None = None) -> Answer:
        return await asyncio.get_running_loop().run_in_executor(
            self.pools[kind], self._call, time.perf_counter(), kind, method, path, headers, body)

    def close(self) -> None:
        for pool in self.pools.values():
            pool.shutdown()

    def _call(self, submitted: float, kind: str, method: str, path: str, headers: dict, body: bytes | None) -> Answer:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
        started = time.perf_counter()
        sent_at = time.time()
        self.backlog[kind].append(started - submitted)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            connection.close()
            self._local.connection = None
            self._fail("no answer")
            return Answer(0, None, 1.0, sent_at)
        self.latencies[kind].append(time.perf_counter() - started)
        if response.status >= 500:
            self._fail(str(response.status))
        retry_after_s = float(response.getheader("Retry-After") or 0)
        return Answer(response.status, json.loads(data) if data else None, retry_after_s, sent_at)

    def _fail(self, what: str) -> None:
        with self._lock:
            self.failures[what] += 1


@dataclass
class User:
    """One virtual user: the plan, then what happened."""

    id: int
    arrives_s: float  # after the start
    gives_up_s: float | None  # abandons after waiting this long; None: keeps polling until admitted
    leaves: bool  # abandons by leaving the line, else by no longer polling
    double_clicks: bool
    outcome: str = "not arrived"
    ticket: str = ""
    entered_at: float | None = None
    ahead: int | None = None  # aheadCount and etaSeconds of the first entry answer
    eta_s: int | None = None
    admitted_at: float | None = None
    full_retries: int = 0
    reentries: int = 0
    purchase_answers: list = field(default_factory=list)


def plan_users(options: argparse.Namespace, rng: random.Random) -> list[User]:
    """Who arrives when, who gives up after how long (within the time the line takes to drain), who double-clicks."""
    drain_s = options.users * options.tick_ms / 1000 / options.batch
    return [
        User(
            id=user_id,
            arrives_s=rng.uniform(0, options.arrival_s),
            gives_up_s=rng.uniform(1, max(2.0, drain_s)) if rng.random() < options.abandon else None,
            leaves=rng.random() < 0.5,
            double_clicks=rng.random() < options.double_click,
        )
        for user_id in range(1, options.users + 1)
    ]


async def journey(user: User, api: Api, started: float, rng: random.Random, heartbeat_timeout_s: float) -> None:
    """Arrive, wait in line (or give up), buy."""
    await asyncio.sleep(max(0.0, started + user.arrives_s - time.time()))
    entry = await enter(user, api, rng)
    while entry is not None and entry["status"] == "WAITING":
        if user.gives_up_s is not None and time.time() - user.entered_at >= user.gives_up_s:
            if user.leaves:
                await api.call("leave", "DELETE", ENTRIES + "/me", user_headers(user))
            user.outcome = "left" if user.leaves else "stopped polling"
            return
        await asyncio.sleep(poll_delay_s(entry, heartbeat_timeout_s, rng))
        answer = await api.call("status", "GET", ENTRIES + "/me", user_headers(user))
        if answer.status == 200:
            entry = answer.body
        elif answer.code == "NOT_IN_QUEUE":  # evicted: a poll came too late
            user.reentries += 1
            entry = await enter(user, api, rng)
        elif answer.retry_after_s:
            await asyncio.sleep(answer.retry_after_s)
        else:
            user.outcome = f"status answered {answer.status} {answer.code}"
            return
    if entry is not None:
        user.admitted_at = time.time()
        await buy(user, entry["entryToken"], api)


def poll_delay_s(entry: dict, heartbeat_timeout_s: float, rng: random.Random) -> float:
    """How long a user waits before the next poll: a little less than their ETA (at least a second, never
    as long as a third of the heartbeat timeout), with jitter. The line moves at a steady, measured rate, so
    a client that trusts the ETA asks little and closes in on its turn, and users hear of it about when the
    pump admitted them. (5,000 users polling every 2-3 s would ask far more than one local API process
    answers, and its backlog would tell admitted users late and all at once.)"""
    return min(heartbeat_timeout_s / 3, max(1.0, 0.8 * (entry.get("etaSeconds") or 0))) * rng.uniform(1.0, 1.25)


async def enter(user: User, api: Api, rng: random.Random) -> dict | None:
    """Join the line, retrying after Retry-After while it is full; the entry, or None on a refusal."""
    while True:
        answer = await api.call("enter", "POST", ENTRIES, {"X-User-Id": str(user.id)})
        if answer.status == 200:
            user.ticket = answer.body.get("queueTicket", user.ticket)
            if user.entered_at is None:
                user.entered_at = answer.sent_at
                user.ahead, user.eta_s = answer.body.get("aheadCount"), answer.body.get("etaSeconds")
            return answer.body
        if not answer.retry_after_s:
            user.outcome = f"enter answered {answer.status} {answer.code}"
            return None
        user.full_retries += 1
        await asyncio.sleep(answer.retry_after_s + rng.uniform(0, 0.5))


async def buy(user: User, token: str, api: Api) -> None:
    """Send the purchase with the entry token (twice at once for a double-clicker); note what came back."""
    headers = {**user_headers(user), "X-Entry-Token": token, "Content-Type": "application/json"}
    clicks = 2 if user.double_clicks else 1
    answers = await asyncio.gather(*(
        api.call("purchase", "POST", PURCHASE, headers, b'{"quantity": 1}') for _ in range(clicks)))
    user.purchase_answers = [answer.code or answer.status for answer in answers]
    outcomes = {201: "bought", "SOLD_OUT": "sold out", "ALREADY_ORDERED": "already ordered"}
    user.outcome = next((outcomes[a] for a in user.purchase_answers if a in outcomes), "purchase refused")


def user_headers(user: User) -> dict:
    return {"X-User-Id": str(user.id), "X-Queue-Ticket": user.ticket}


async def run_crowd(users: list[User], api: Api, pump: RecordingPump, options: argparse.Namespace) -> float:
    """Run every user's journey, with a progress bar, until the last one ends; returns the start time."""
    started = time.time()
    rng = random.Random(options.seed)
    with tqdm(total=len(users), unit="user", desc="journeys done", disable=not options.progress) as bar:

        async def one(user: User) -> None:
            await journey(user, api, started, rng, options.heartbeat_timeout_s)
            bar.update()

        async def figures() -> None:
            while True:
                last = _target_tick(pump.ticks[-1][1]) if pump.ticks else None
                bar.set_postfix(waiting=last.waiting if last else 0,
                                bought=sum(u.outcome == "bought" for u in users), refresh=False)
                await asyncio.sleep(0.5)

        shown = asyncio.create_task(figures())
        await asyncio.gather(*(one(user) for user in users))
        shown.cancel()
    return started


def _target_tick(report: TickReport) -> TargetTick | None:
    result = report.targets.get(TARGET)
    return result if isinstance(result, TargetTick) else None


def percentile(values: list[float], share: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def analyse(options, users, api, pump, shop, settings, started, finished) -> dict:
    """The report: figures, series for the plot, and the checks with their verdicts."""
    batch, tick_ms = settings.batch_size, settings.tick_ms

    # Admissions per tick, from the pump's own record. A tick after which users still waited had to admit
    # a full batch for every tick it covered (a late pump makes up for missed ticks, up to the catch-up cap).
    ticks, previous = [], None
    for at, report in pump.ticks:
        result = _target_tick(report)
        if result is None or result.applied_tick is None:
            continue
        covered = 1 if previous is None else min(result.applied_tick - previous, settings.catchup_ticks)
        previous = result.applied_tick
        ticks.append({"t": round(at - started, 3), "server_s": result.server_ms / 1000, "covered": covered,
                      "admitted": result.admitted, "waiting": result.waiting, "evicted": result.evicted})
    busy = [t for t in ticks if t["waiting"] > 0]
    over_batch = [t for t in ticks if t["admitted"] > batch * t["covered"]]
    short_batch = [t for t in busy if t["admitted"] < batch * t["covered"]]

    # Requests reaching the shop per one-second window. Ticks start every tick_ms, so a window holds the
    # admissions of 1000/tick_ms ticks, and can catch the edge of one more: the allowance.
    duration = finished - started
    rate = batch * 1000 / tick_ms
    allowed = batch * (math.ceil(1000 / tick_ms) + 1)
    per_second = Counter(int(r["at"] - started) for r in shop["requests"])
    shop_series = [per_second.get(second, 0) for second in range(int(duration) + 1)]
    admitted_per_second = Counter()
    for t in ticks:
        admitted_per_second[int(t["t"])] += t["admitted"]

    promised = [u for u in users if u.eta_s is not None and u.admitted_at is not None]
    eta_errors = [admitted - u.entered_at - u.eta_s for u in promised
                  if (admitted := _admitted_at(u, ticks)) is not None]
    eta_errors_seen = [u.admitted_at - u.entered_at - u.eta_s for u in promised]
    orders_per_item = Counter(order["item"] for order in shop["orders"])
    orders_per_buyer = Counter((order["item"], order["userId"]) for order in shop["orders"])
    requests_per_user = Counter(request["userId"] for request in shop["requests"])
    oversold = sum(max(0, n - options.stock) for n in orders_per_item.values())
    second_orders = sum(n - 1 for n in orders_per_buyer.values())
    tokens_used_twice = sum(n - 1 for n in requests_per_user.values())
    keepers = [u for u in users if u.gives_up_s is None]
    answered = sum(len(values) for values in api.latencies.values())
    outcomes = Counter(u.outcome for u in users)

    checks = {
        "admissions per tick never above the batch": not over_batch,
        "a full batch every tick while users waited": not short_batch,
        "shop never above the target rate": max(shop_series, default=0) <= allowed,
        "no oversells": oversold == 0 and second_orders == 0,
        "no entry token reached the shop twice": tokens_used_twice == 0,
        "every user who kept polling was admitted": all(u.admitted_at is not None for u in keepers),
        "the API never failed": not api.failures,
    }
    return {
        "parameters": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(options).items()},
                       "target": str(TARGET), "batch": batch, "tick_ms": tick_ms},
        "duration_s": round(duration, 2),
        "users": {"total": len(users), "kept_polling": len(keepers),
                  "admitted": sum(u.admitted_at is not None for u in users),
                  "outcomes": dict(outcomes), "queue_full_retries": sum(u.full_retries for u in users),
                  "reentries": sum(u.reentries for u in users)},
        "admissions": {"target_per_tick": batch, "ticks": len(ticks), "ticks_with_users_waiting": len(busy),
                       "admitted_per_busy_tick": _spread([t["admitted"] / t["covered"] for t in busy]),
                       "catch_up_ticks": sum(t["covered"] > 1 for t in ticks),
                       "evicted": sum(t["evicted"] for t in ticks), "series": ticks},
        "shop": {"target_per_s": rate, "allowed_per_window": allowed, "max_per_window": max(shop_series, default=0),
                 "windows_over_allowed": sum(n > allowed for n in shop_series), "requests": len(shop["requests"]),
                 "orders": len(shop["orders"]), "refused": shop["refused"], "per_second": shop_series,
                 "admitted_per_second": [admitted_per_second.get(s, 0) for s in range(int(duration) + 1)]},
        "eta_error_s": {"meaning": "when the pump admitted the user minus when etaSeconds (on entry) said",
                        **_spread(eta_errors)},
        "eta_error_seen_s": {"meaning": "when the user saw ADMITTED minus when etaSeconds said: adds the poll "
                                        "interval and the local API's backlog", **_spread(eta_errors_seen)},
        "latency_ms": {kind: {"n": len(values), "p50": _round(percentile(values, 0.5), 1000),
                              "p95": _round(percentile(values, 0.95), 1000)}
                       for kind, values in api.latencies.items() if values},
        "api": {"requests": answered, "per_s": round(answered / duration, 1),
                "backlog_s": {"meaning": "how long requests waited for a free connection in the simulator",
                              **_spread([wait for waits in api.backlog.values() for wait in waits])}},
        "oversells": {"units_over_stock": oversold, "second_orders": second_orders,
                      "tokens_used_twice": tokens_used_twice,
                      "double_clicks": sum(len(u.purchase_answers) > 1 for u in users)},
        "api_failures": dict(api.failures),
        "checks": checks,
        "ok": all(checks.values()),
    }


def _admitted_at(user: User, ticks: list[dict]) -> float | None:
    """When the pump let `user` in: the tick whose admissions since their entry reached their place in line.

    Users who left ahead of them hold no place, so this errs late by their share of the line; that is all.
    """
    admitted, before = 0, None
    for tick in ticks:
        if before is None and tick["server_s"] >= user.entered_at:
            before = admitted
        admitted += tick["admitted"]
        if before is not None and admitted - before > user.ahead:
            return tick["server_s"]
    return None


def _round(value: float | None, scale: float = 1) -> float | None:
    return None if value is None else round(value * scale, 3)


def _spread(values: list[float]) -> dict:
    return {"n": len(values), "min": _round(min(values, default=None)), "p5": _round(percentile(values, 0.05)),
            "p50": _round(percentile(values, 0.5)), "p95": _round(percentile(values, 0.95)),
            "max": _round(max(values, default=None))}


def plot(report: dict, path: Path) -> None:
    """Queue length, and admissions and shop requests per second, over time against the target rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ticks, shop = report["admissions"]["series"], report["shop"]
    seconds = range(len(shop["per_second"]))
    figure, (line, rates) = plt.subplots(2, 1, sharex=True, figsize=(10, 7), height_ratios=[2, 3])
    line.plot([t["t"] for t in ticks], [t["waiting"] for t in ticks], color="tab:blue")
    line.set_ylabel("users waiting")
    line.set_title(f"{report['users']['total']} users, {report['parameters']['batch']} admitted every "
                   f"{report['parameters']['tick_ms']} ms, stock {report['parameters']['stock']}")
    line.grid(alpha=0.3)
    rates.bar([s + 0.5 for s in seconds], shop["per_second"], width=0.9, color="tab:orange", alpha=0.6,
              label="requests reaching the shop")
    rates.step([s + 1 for s in seconds], shop["admitted_per_second"], where="pre", color="tab:green",
               label="admitted by the pump")
    rates.axhline(shop["target_per_s"], color="black", linestyle="--", label=f"target {shop['target_per_s']:g}/s")
    rates.axhline(shop["allowed_per_window"], color="tab:red", linestyle=":",
                  label=f"allowed in a 1-s window ({shop['allowed_per_window']})")
    rates.set_xlabel("seconds since the first arrival")
    rates.set_ylabel("per second")
    rates.legend(loc="upper right")
    rates.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def summary(report: dict, out: Path) -> str:
    u, a, s, o = report["users"], report["admissions"], report["shop"], report["oversells"]
    e, seen = report["eta_error_s"], report["eta_error_seen_s"]
    latency = "; ".join(f"{kind} p50 {v['p50']} ms p95 {v['p95']} ms" for kind, v in report["latency_ms"].items())
    outcomes = ", ".join(f"{n} {what}" for what, n in sorted(u["outcomes"].items(), key=lambda item: -item[1]))
    failed = [name for name, ok in report["checks"].items() if not ok]
    return "\n".join([
        f"{u['total']} users against {report['parameters']['target']}: {a['target_per_tick']} admitted every "
        f"{report['parameters']['tick_ms']} ms ({s['target_per_s']:g}/s), run took {report['duration_s']} s",
        f"  users       {u['admitted']} admitted ({u['kept_polling']} kept polling); {outcomes}; "
        f"{u['queue_full_retries']} queue-full retries, {u['reentries']} re-entries, {a['evicted']} evicted",
        f"  admissions  {a['ticks_with_users_waiting']} ticks with users waiting admitted "
        f"{a['admitted_per_busy_tick']['min']}-{a['admitted_per_busy_tick']['max']} per tick (target "
        f"{a['target_per_tick']}); {a['catch_up_ticks']} catch-up ticks",
        f"  shop        at most {s['max_per_window']} requests in a 1-s window (target {s['target_per_s']:g}/s, "
        f"allowed {s['allowed_per_window']} with tick alignment); {s['requests']} requests, {s['orders']} orders",
        f"  ETA error   admitted - promised: p5 {e['p5']} s, p50 {e['p50']} s, p95 {e['p95']} s (n={e['n']}); "
        f"as seen by the users (polls, API backlog): p50 {seen['p50']} s, p95 {seen['p95']} s",
        f"  latency     {latency}",
        f"  API         answered {report['api']['requests']} requests ({report['api']['per_s']}/s); they waited "
        f"p50 {report['api']['backlog_s']['p50']} s, p95 {report['api']['backlog_s']['p95']} s for a connection",
        f"  oversells   {o['units_over_stock'] + o['second_orders']}; entry tokens used twice {o['tokens_used_twice']} "
        f"({o['double_clicks']} double clicks)",
        f"  API errors  {report['api_failures'] or 0}",
        "  checks      " + ("all passed" if not failed else "FAILED: " + "; ".join(failed)),
        f"  written     {out / 'report.json'}, {out / 'plot.png'}",
    ])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    """Start the stack, run the crowd, write and print the report; 0 if every check passed, else 1."""
    options = parse_options(argv)
    options.out.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "VQ_KEY_PREFIX": options.key_prefix or f"vqsim-{uuid.uuid4().hex[:8]}",
        "VQ_BATCH_SIZE": str(options.batch),
        "VQ_TICK_MS": str(options.tick_ms),
        "VQ_HEARTBEAT_TIMEOUT_S": str(options.heartbeat_timeout_s),
    }
    if options.max_waiting:
        env["VQ_MAX_WAITING"] = str(options.max_waiting)
    users = plan_users(options, random.Random(options.seed))
    # The pump in this process prints its metrics: to pump.log, beside the API's output.
    with open(options.out / "api.log", "wb") as api_log, open(options.out / "pump.log", "w") as pump_log, \
            contextlib.redirect_stdout(pump_log), LocalStack(
                env, api_port=free_port(), stock=options.stock, pump_class=RecordingPump, api_output=api_log,
            ) as stack:
        api = Api(stack.api_url, options.threads)
        started = asyncio.run(run_crowd(users, api, stack.pump, options))
        finished = time.time()
        api.close()
        report = analyse(options, users, api, stack.pump, stack.shop.summary(), stack.settings, started, finished)
    (options.out / "report.json").write_text(json.dumps(report, indent=1))
    plot(report, options.out / "plot.png")
    print(summary(report, options.out), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
