"""Flash-sale simulator: N virtual users arrive in a burst at one line of the local stack, and buy.

Each user enters, then polls when the server says (`pollAfterMs`, and nothing else: the simulator paces
no one, as the waiting-room page paces no one) until admitted, then buys once. A share abandons while
waiting (half leave the line, half just stop polling and are evicted), and a share clicks Buy twice at once
(the gate must stop the second click before the shop). The stack (infra/local/stack.py) is started here
with a short tick and the API in several processes, and its pump records what every tick did.

The report (infra/sim/report.py) checks admissions per tick, the shop's rate, oversells, and
measures what the sale costs: requests per admitted user by kind, requests per second per 1,000 waiting
users, how soon users hear of their admission, the cost at list prices, each beside the same crowd polling
every 2.5 s. It is printed, and written with a plot to --out (build/simulation/report.json, plot.png).
Exit status 1 when a check fails.

    python infra/sim/simulate.py                  # `make simulate`; --help lists the knobs
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import heapq
import http.client
import itertools
import json
import multiprocessing
import os
import queue
import random
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# The pump runs in this process and the API inherits this environment: quiet and lean, before chalicelib
# creates its logger. (A log line per request or metric per tick would cost the API a good part of its speed.)
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")

from infra.local.api import LambdaProxy, app_environment, load_app  # noqa: E402

# The app's own settings (no Tracer, as deployed), here and in the crowd's processes, before chalicelib loads.
app_environment()

import redis  # noqa: E402
from tqdm import tqdm  # noqa: E402

from chalicelib.pump import Pump, TickReport  # noqa: E402
from chalicelib.tokens import TokenSigner  # noqa: E402
from infra.local.stack import LocalStack  # noqa: E402
from infra.sim.report import ENTRIES, KINDS, LINE, PURCHASE, analyse, eta_csv, plot, summary, target_tick  # noqa: E402

ARRIVALS_PER_S = 2500  # the default burst's rate, for a crowd of more than 5,000


def parse_options(argv: list[str] | None) -> argparse.Namespace:
    """The command line's knobs (`--help`)."""
    parser = argparse.ArgumentParser(description="Simulate a flash-sale crowd against the local stack.")
    parser.add_argument("--users", type=int, default=5000)
    parser.add_argument(
        "--arrival-s",
        type=float,
        help="the burst: arrivals spread over this long (default: 2 s, or 2,500 arrivals a second "
        "for a larger crowd: what this machine enters while it answers the polls of those in line)",
    )
    parser.add_argument(
        "--abandon",
        type=float,
        default=0.1,
        help="share of users who give up while waiting (half leave, half stop polling)",
    )
    parser.add_argument(
        "--double-click", type=float, default=0.05, help="share of buyers who send their purchase twice at once"
    )
    parser.add_argument("--batch", type=int, default=25, help="users admitted per tick")
    parser.add_argument("--tick-ms", type=int, default=500, help="length of a tick")
    parser.add_argument("--stock", type=int, default=3000, help="units the shop has")
    parser.add_argument(
        "--heartbeat-timeout-s",
        type=int,
        default=60,
        help="evict users silent this long (the server's poll advice follows it)",
    )
    parser.add_argument("--max-waiting", type=int, help="capacity of the line (default: the stack's)")
    parser.add_argument("--threads", type=int, default=16, help="most requests of each kind in flight at once")
    parser.add_argument(
        "--transport",
        choices=("inproc", "http"),
        help="inproc (default): the crowd's processes call the app as Lambda does (API Gateway's event, no "
        "HTTP server); http: every call goes to the local API over HTTP (purchases always do)",
    )
    parser.add_argument(
        "--edge",
        action="store_true",
        help="every call over HTTP through an HTTP cache in front of the local API, as the CloudFront "
        "distribution is deployed (infra/local/edge_cache.py; implies --transport http); the report counts the "
        "requests that reached the origin apart from those the cache answered",
    )
    parser.add_argument(
        "--crowd-processes",
        type=int,
        help="inproc: processes that run the crowd, each calling the app (default: one per core)",
    )
    parser.add_argument("--workers", type=int, help="the local API's processes (default: two per core)")
    # The shop and the sale's controls (infra/sim/scenarios.py runs the comparisons with them).
    parser.add_argument(
        "--shop-capacity",
        type=float,
        help="orders/s the demo shop handles; above it its latency climbs (default: unbounded)",
    )
    parser.add_argument(
        "--shop-workers",
        type=int,
        default=4,
        help="the shop's order handlers (with a capacity): fewer, a steeper latency curve near it",
    )
    parser.add_argument(
        "--shop-silent",
        action="store_true",
        help="the shop never says X-Queue-Sold-Out: the sale as it went before sold out closed the line",
    )
    parser.add_argument("--origin-slo-p95-ms", type=int, help="the target's originSlo p95Ms: the rate follows the shop")
    parser.add_argument("--origin-slo-error-rate", type=float, help="the target's originSlo errorRate")
    parser.add_argument(
        "--safety-net", action="store_true", help="the target's safetyNet: while nobody waits, enter admits at once"
    )
    parser.add_argument(
        "--arrivals",
        help="arrivals in phases, RATE:SECONDS,... (e.g. 5:60,500:30,5:60: a normal day with a surge); sets --users",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--key-prefix", help="Redis key prefix (default: a fresh one per run)")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "simulation")
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    options = parser.parse_args(argv)
    if options.edge and options.transport == "inproc":
        parser.error("--edge sends every call over HTTP through the cache: it takes --transport http")
    options.transport = options.transport or ("http" if options.edge else "inproc")
    options.phases = _phases(parser, options.arrivals)
    if options.phases:
        options.users = sum(round(rate * seconds) for rate, seconds in options.phases)
        options.arrival_s = sum(seconds for _, seconds in options.phases)
    if options.arrival_s is None:
        options.arrival_s = max(2.0, options.users / ARRIVALS_PER_S)
    return options


def _phases(parser: argparse.ArgumentParser, text: str | None) -> list[tuple[float, float]]:
    """--arrivals as (arrivals per second, seconds) phases."""
    if not text:
        return []
    try:
        phases = [(float(rate), float(seconds)) for rate, seconds in (part.split(":") for part in text.split(","))]
    except ValueError:
        parser.error("--arrivals takes RATE:SECONDS phases separated by commas, e.g. 5:60,500:30,5:60")
    if any(rate < 0 or seconds <= 0 for rate, seconds in phases):
        parser.error("--arrivals: rates must be at least 0 and phases longer than 0 s")
    return phases


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
    sent_at: float  # when the request left
    received_at: float  # when its answer was in

    @property
    def code(self) -> str | None:
        return self.body.get("code") if isinstance(self.body, dict) else None


class CallRecord:
    """What the crowd's calls met, by kind: when each was due (the load the crowd asked), when it was sent,
    its latency, how long it waited before it could be sent (the API's backlog here: users hear of their
    admission that much later); every API failure; and the CPU time the crowd's processes spent (calling the
    app in them, with `--transport inproc`)."""

    def __init__(self) -> None:
        # One list per kind made up front: threads only append (atomic), never insert a key.
        self.latencies: dict[str, list[float]] = {kind: [] for kind in KINDS}
        self.due: dict[str, list[float]] = {kind: [] for kind in KINDS}
        self.sent: dict[str, list[float]] = {kind: [] for kind in KINDS}
        self.backlog: dict[str, list[float]] = {kind: [] for kind in KINDS}
        self.failures: Counter[str] = Counter()
        self.cpu_s = 0.0
        self._lock = threading.Lock()

    def add(self, other: CallRecord) -> None:
        for mine, theirs in (
            (self.latencies, other.latencies),
            (self.due, other.due),
            (self.sent, other.sent),
            (self.backlog, other.backlog),
        ):
            for kind, values in theirs.items():
                mine[kind].extend(values)
        self.failures.update(other.failures)
        self.cpu_s += other.cpu_s

    def _fail(self, what: str) -> None:
        with self._lock:
            self.failures[what] += 1

    def __getstate__(self) -> dict:  # sent home from a worker process: without the lock
        return {name: value for name, value in vars(self).items() if name != "_lock"}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        self._lock = threading.Lock()


class Api(CallRecord):
    """The local API over HTTP (`--transport http`): calls from fixed pools of threads (the bound on requests
    in flight), each thread with its own kept-alive connection. When the crowd asks more than the local API
    answers, requests wait here for a thread: that wait is the backlog."""

    def __init__(self, url: str, threads: int) -> None:
        super().__init__()
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        # A pool per kind of call: polls do not queue behind a burst of arrivals (nor purchases behind polls,
        # as a Buy click in a browser does not), or admitted users would hear of it late and all at once.
        self.pools = {kind: ThreadPoolExecutor(threads, thread_name_prefix=kind) for kind in KINDS}
        self._local = threading.local()

    async def call(self, kind: str, method: str, path: str, headers: dict, body: bytes | None = None) -> Answer:
        return await asyncio.get_running_loop().run_in_executor(
            self.pools[kind], self._call, time.perf_counter(), kind, method, path, headers, body
        )

    async def clicks(self, n: int, method: str, path: str, headers: dict, body: bytes) -> list[Answer]:
        """The same purchase sent `n` times at once (a double click)."""
        return list(await asyncio.gather(*(self.call("purchase", method, path, headers, body) for _ in range(n))))

    async def sleep(self, seconds: float) -> float:
        """Sleep; the time it ended."""
        await asyncio.sleep(seconds)
        return time.time()

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
        self.due[kind].append(sent_at - (started - submitted))
        self.sent[kind].append(sent_at)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            connection.close()
            self._local.connection = None
            self._fail("no answer")
            return Answer(0, None, 1.0, sent_at, time.time())
        self.latencies[kind].append(time.perf_counter() - started)
        if response.status >= 500:
            self._fail(str(response.status))
        retry_after_s = float(response.getheader("Retry-After") or 0)
        return Answer(response.status, json.loads(data) if data else None, retry_after_s, sent_at, time.time())


class _Yield:
    """What a journey awaits in a worker process: handed to the worker's loop (InProcessApi.run), which
    sends the outcome back."""

    def __init__(self, *what: object) -> None:
        self.what = what

    def __await__(self):
        return (yield self)


class InProcessApi(CallRecord):
    """The app called as Lambda calls it (`--transport inproc`), in one of the simulator's worker processes.

    Deployed, API Gateway turns each request into a proxy event and Lambda calls the app with it; here
    infra/local/api.py's LambdaProxy does that in this process, without the HTTP server, which is not part of
    the deployed system. Each worker owns a share of the users; its loop wakes each journey when its next poll
    is due and answers the poll at once, one at a time (one container). When it falls behind, due polls and
    due arrivals take turns: a burst of arrivals does not hold up the polls of those in line (as the HTTP
    transport's pools per kind keep them apart), nor do the polls keep arrivals out of the line. Purchases go
    over HTTP to the local API (`http`), so that a double click is two requests at once.
    """

    # How the purchase threads hand their answers back to the loop. Not queue.SimpleQueue: on CPython 3.11 its
    # get(timeout=t), finding the queue empty but its lock free (a put was taken since), waits for ever if t has
    # run out by then, as the loop's wait until its next timer often has: one worker of a 100,000-user sale hung
    # so 176 s in, and its 45,000 users were evicted. Queue.get checks the time left.
    hand_back = queue.Queue

    def __init__(self, lambda_proxy: LambdaProxy, http: Api, threads: int) -> None:
        super().__init__()
        self.lambda_proxy = lambda_proxy
        self.http = http
        self._waiter = ThreadPoolExecutor(threads, thread_name_prefix="clicks")

    async def call(self, kind: str, method: str, path: str, headers: dict, body: bytes | None = None) -> Answer:
        return await _Yield("call", kind, method, path, headers, body)

    async def clicks(self, n: int, method: str, path: str, headers: dict, body: bytes) -> list[Answer]:
        return await _Yield("clicks", n, method, path, headers, body)

    async def sleep(self, seconds: float) -> float:
        """Sleep; the time it was due to end (this worker may have been busy past it)."""
        return await _Yield("sleep", seconds)

    def run(self, journeys: list[tuple[float, object]], progress) -> None:
        """Run the journeys (each with when it starts) until all have ended; `progress()` after each."""
        arrivals = [(at, n, journey) for n, (at, journey) in enumerate(journeys)]
        heapq.heapify(arrivals)
        timers: list[tuple[float, int, object, object]] = []  # (due, n, journey, what to send it)
        purchased = self.hand_back()  # (journey, answers) from the purchase threads
        order = itertools.count(len(journeys))
        arrival_turn = itertools.cycle((True, False))  # whose turn, when both a poll and an arrival are due
        running = len(journeys)
        while running:
            now = due = time.time()
            if not purchased.empty():
                journey, value = purchased.get()
            elif arrivals and arrivals[0][0] <= now and (not timers or timers[0][0] > now or next(arrival_turn)):
                due, _, journey = heapq.heappop(arrivals)
                value = None
            elif timers and timers[0][0] <= now:
                due, _, journey, value = heapq.heappop(timers)
            else:
                nearest = min(timers[0][0] if timers else now + 1, arrivals[0][0] if arrivals else now + 1)
                try:
                    journey, value = purchased.get(timeout=max(0.0, nearest - now))
                except queue.Empty:
                    continue
            # Step the journey until it sleeps, clicks Buy, or ends; its calls are answered on the way.
            while True:
                try:
                    step = journey.send(value).what
                except StopIteration:
                    running -= 1
                    progress()
                    break
                if step[0] == "sleep" and step[1] <= 0:
                    value = due  # due already (an arrival): on at once, still due when it was
                    continue
                if step[0] == "sleep":
                    wakes = time.time() + step[1]
                    heapq.heappush(timers, (wakes, next(order), journey, wakes))
                    break
                if step[0] == "clicks":
                    self._click(journey, purchased, *step[1:])
                    break
                value = self._answer(due, *step[1:])

    def record(self) -> CallRecord:
        """Everything this worker's calls met, purchases included (after the last journey)."""
        self._waiter.shutdown()
        self.http.close()
        record = CallRecord()
        record.add(self)
        record.add(self.http)
        return record

    def _answer(self, due: float, kind: str, method: str, path: str, headers: dict, body: bytes | None) -> Answer:
        started, sent_at = time.perf_counter(), time.time()
        self.backlog[kind].append(max(0.0, sent_at - due))
        self.due[kind].append(min(due, sent_at))
        self.sent[kind].append(sent_at)
        response = self.lambda_proxy(method, path, headers, body)
        self.latencies[kind].append(time.perf_counter() - started)
        status = response["statusCode"]
        if status >= 500:
            self._fail(str(status))
        retry_after_s = float(response["headers"].get("Retry-After") or 0)
        return Answer(
            status, json.loads(response["body"]) if response["body"] else None, retry_after_s, sent_at, time.time()
        )

    def _click(
        self, journey, purchased: queue.Queue, n: int, method: str, path: str, headers: dict, body: bytes
    ) -> None:
        submitted = time.perf_counter()
        calls = [
            self.http.pools["purchase"].submit(self.http._call, submitted, "purchase", method, path, headers, body)
            for _ in range(n)
        ]
        self._waiter.submit(lambda: purchased.put((journey, [call.result() for call in calls])))


@dataclass
class User:
    """One virtual user: the plan, then what happened."""

    id: int
    arrives_s: float  # after the start
    gives_up_s: float | None  # abandons after waiting this long; None: keeps polling until admitted
    leaves: bool  # abandons by leaving the line, else by no longer polling
    double_clicks: bool
    outcome: str = "not arrived"
    passed: bool = False  # the safety net admitted them as they entered (ADMITTED, queued false)
    ticket: str = ""
    seq: int | None = None  # their place's sequence number (from the ticket): the pump admits by it
    entered_at: float | None = None
    ahead: int | None = None  # aheadCount, etaSeconds and its range of the first entry answer
    eta_s: int | None = None
    eta_range_s: tuple[int, int] | None = None
    admitted_at: float | None = None  # when they saw ADMITTED
    stopped_waiting_at: float | None = None  # admitted, gave up, or refused
    poll_after_s: float | None = None  # the last poll interval the server gave
    last_poll_due_at: float | None = None  # when the last poll was due (it may then wait for the local API)
    finished_at: float | None = None  # when the journey ended (a purchase answered, sold out, gave up)
    full_retries: int = 0
    reentries: int = 0
    purchase_answers: list = field(default_factory=list)
    tickets: list[tuple[float, int]] = field(default_factory=list)  # every queue ticket they were given: when, seq
    tokens: list[tuple[float, str, str]] = field(default_factory=list)  # every entry token handed: when, status, text


def plan_users(options: argparse.Namespace, rng: random.Random) -> list[User]:
    """Who arrives when, who gives up after how long (within the time the line takes to drain), who double-clicks."""
    drain_s = options.users * options.tick_ms / 1000 / options.batch
    arrivals = _arrivals(options.phases, rng) if options.phases else None
    return [
        User(
            id=user_id,
            arrives_s=arrivals[user_id - 1] if arrivals else rng.uniform(0, options.arrival_s),
            gives_up_s=rng.uniform(1, max(2.0, drain_s)) if rng.random() < options.abandon else None,
            leaves=rng.random() < 0.5,
            double_clicks=rng.random() < options.double_click,
        )
        for user_id in range(1, options.users + 1)
    ]


def _arrivals(phases: list[tuple[float, float]], rng: random.Random) -> list[float]:
    """Arrival times (s after the start), each phase's spread at random over it, in order."""
    times, start = [], 0.0
    for rate, seconds in phases:
        times += sorted(rng.uniform(start, start + seconds) for _ in range(round(rate * seconds)))
        start += seconds
    return times


# What a user does, from `started` (the crowd's start) on; its calls go through the API it is given.
Journey = Callable[["User", "Api | InProcessApi", float, TokenSigner], Coroutine[Any, Any, None]]


async def journey(user: User, api: Api | InProcessApi, started: float, signer: TokenSigner) -> None:
    """Arrive, wait in line as long as the server says between polls (or give up), buy."""
    await api.sleep(max(0.0, started + user.arrives_s - time.time()))
    entry = await enter(user, api, signer)
    while entry is not None and entry["status"] in ("WAITING", "PRE_QUEUE"):
        delay = user.poll_after_s = entry["pollAfterMs"] / 1000
        # Far back, the client reads /line until it places itself within the presence window (docs/api.md).
        reading = "lineAfterMs" in entry
        while True:
            if user.gives_up_s is not None and time.time() + delay >= user.entered_at + user.gives_up_s:
                await api.sleep(max(0.0, user.entered_at + user.gives_up_s - time.time()))
                if user.leaves:
                    await api.call("leave", "DELETE", ENTRIES + "/me", user_headers(user))
                user.outcome = "left" if user.leaves else "stopped polling"
                user.stopped_waiting_at = time.time()
                return
            user.last_poll_due_at = await api.sleep(delay)
            if not reading:
                break
            line = await api.call("line", "GET", LINE, {})
            delay, reading = next_line_read(line.body if line.status == 200 else None, int(entry["seq"]))
        answer = await api.call("status", "GET", ENTRIES + "/me", user_headers(user))
        if answer.status == 200:
            entry = answer.body
        elif answer.code == "NOT_IN_QUEUE":  # evicted: a poll came too late
            user.reentries += 1
            entry = await enter(user, api, signer)
        elif answer.retry_after_s:
            await api.sleep(answer.retry_after_s)  # then poll again after the last advice
        else:
            user.outcome = f"status answered {answer.status} {answer.code}"
            user.stopped_waiting_at = time.time()
            return
    user.stopped_waiting_at = user.finished_at = time.time()
    if entry is not None and entry["status"] == "SOLD_OUT":
        user.outcome = "told sold out"
    elif entry is not None:
        user.admitted_at = user.stopped_waiting_at
        note_token(user, entry)
        await buy(user, entry["entryToken"], api)


def next_line_read(line: dict | None, seq: int) -> tuple[float, bool]:
    """docs/api.md's far-back client on one answer of /line: (seconds to wait, whether to read /line after them,
    else poll the place). It places itself from the shape, and polls once its ETA, moved on at the rate, reaches the
    presence window."""
    if line is None or line["state"] not in ("OPEN", "CLOSED", "PAUSED"):
        return 0.0, False
    if line["state"] == "PAUSED":
        return line["readCapS"] * (1 - 0.1 * random.random()), True
    rate = line["ratePerSec"]
    if rate <= 0:
        return 0.0, False
    points = [(int(s), ahead) for s, ahead in line["shape"]]
    ahead = float(line["waitingCount"])
    if seq <= int(line["mark"]) or not points or seq <= points[0][0]:
        ahead = 0.0
    else:
        for (s1, a1), (s2, a2) in itertools.pairwise(points):
            if seq <= s2:
                ahead = a1 + (a2 - a1) * (seq - s1) / (s2 - s1)
                break
    beyond_s = ahead / rate - line["presenceWindowS"]
    if beyond_s <= 0:
        return 0.0, False
    read_s = min(line["readCapS"], max(1.0, beyond_s / 2)) * (1 - 0.1 * random.random())
    return (read_s, True) if read_s < beyond_s else (beyond_s, False)


async def enter(user: User, api: Api | InProcessApi, signer: TokenSigner) -> dict | None:
    """Join the line, retrying after Retry-After while it is full; the entry, or None on a refusal."""
    while True:
        answer = await api.call("enter", "POST", ENTRIES, {"X-User-Id": str(user.id)})
        if answer.status == 200:
            if "queueTicket" in answer.body:
                user.ticket = answer.body["queueTicket"]
                user.seq = signer.read_ticket(user.ticket).seq
                user.tickets.append((answer.received_at, user.seq))
            if user.entered_at is None:
                user.entered_at = answer.sent_at
                user.passed = answer.body.get("queued") is False
                user.ahead, user.eta_s = answer.body.get("aheadCount"), answer.body.get("etaSeconds")
                if answer.body.get("etaLowSeconds") is not None:
                    user.eta_range_s = (answer.body["etaLowSeconds"], answer.body["etaHighSeconds"])
            return answer.body
        if not answer.retry_after_s:
            user.outcome = f"enter answered {answer.status} {answer.code}"
            return None
        user.full_retries += 1
        await api.sleep(answer.retry_after_s)


async def buy(user: User, token: str, api: Api | InProcessApi) -> None:
    """Send the purchase with the entry token (twice at once for a double-clicker); note what came back."""
    headers = {**user_headers(user), "X-Entry-Token": token, "Content-Type": "application/json"}
    answers = await api.clicks(2 if user.double_clicks else 1, "POST", PURCHASE, headers, b'{"quantity": 1}')
    user.purchase_answers = [answer.code or answer.status for answer in answers]
    user.finished_at = max(answer.received_at for answer in answers)
    outcomes = {201: "bought", "SOLD_OUT": "sold out", "ALREADY_ORDERED": "already ordered"}
    user.outcome = next((outcomes[a] for a in user.purchase_answers if a in outcomes), "purchase refused")


def note_token(user: User, entry: dict) -> None:
    """Note the entry token `entry` hands `user` (ADMITTED or DIRECT_ADMITTED)."""
    user.tokens.append((time.time(), entry["status"], entry["entryToken"]))


def user_headers(user: User) -> dict:
    return {"X-User-Id": str(user.id), "X-Queue-Ticket": user.ticket}


async def run_crowd(
    users: list[User],
    api: Api,
    pump: RecordingPump,
    signer: TokenSigner,
    options: argparse.Namespace,
    journey: Journey = journey,
    on_start: Callable[[float], None] | None = None,
) -> float:
    """Run every user's `journey`, with a progress bar, until the last one ends; returns the start time (also
    given to `on_start` as the crowd starts)."""
    started = time.time()
    if on_start is not None:
        on_start(started)
    with tqdm(total=len(users), unit="user", desc="journeys done", disable=not options.progress) as bar:

        async def one(user: User) -> None:
            await journey(user, api, started, signer)
            bar.update()

        async def figures() -> None:
            while True:
                last = target_tick(pump.ticks[-1][1]) if pump.ticks else None
                bar.set_postfix(
                    waiting=last.waiting if last else 0, bought=sum(u.outcome == "bought" for u in users), refresh=False
                )
                await asyncio.sleep(0.5)

        shown = asyncio.create_task(figures())
        await asyncio.gather(*(one(user) for user in users))
        shown.cancel()
    return started


def _worker(
    env: dict,
    users: list[User],
    journey: Journey,
    api_url: str,
    threads: int,
    keyring,
    ready,
    started,
    go,
    done,
    results,
) -> None:
    """One of the simulator's worker processes (`--transport inproc`): the app, and a share of the crowd."""
    os.environ.update(env)
    app, _ = load_app()
    api = InProcessApi(LambdaProxy(app), Api(api_url, threads), threads)
    signer = TokenSigner(keyring)
    ready.release()
    go.wait()
    journeys = [(started.value + user.arrives_s, journey(user, api, started.value, signer)) for user in users]

    def progress() -> None:
        with done.get_lock():
            done.value += 1

    # A share of the crowd lives here for the whole run: the collector need not walk its users and journeys
    # again and again (a twentieth of this process's CPU did in a 100,000-user sale).
    gc.freeze()
    cpu = time.process_time()
    api.run(journeys, progress)
    record = api.record()
    record.cpu_s = time.process_time() - cpu
    results.put((users, record))


def run_crowd_in_process(
    users: list[User],
    stack: LocalStack,
    options: argparse.Namespace,
    journey: Journey = journey,
    on_start: Callable[[float], None] | None = None,
) -> tuple[float, CallRecord]:
    """Run every user's `journey` in `--crowd-processes` processes, each calling the app itself for its share of
    the users, until the last one ends; the start time (also given to `on_start` as the crowd starts), the users as
    they ended, and what the calls met. `journey` must be importable by name (the processes are spawned)."""
    context = multiprocessing.get_context("spawn")  # not fork: this process runs the pump's thread
    # One per core: each request blocks on a Redis round trip, and more processes than cores only trade the CPU
    # among themselves, evicting each other's caches (100,000 users: 313 us per request with 2 here, 401 with 4).
    workers = options.crowd_processes or os.cpu_count() or 1
    ready, started, go = context.Semaphore(0), context.Value("d", 0.0), context.Event()
    done, results = context.Value("i", 0), context.Queue()
    processes = [
        context.Process(
            target=_worker,
            daemon=True,
            args=(
                stack.env,
                users[k::workers],
                journey,
                stack.api_url,
                options.threads,
                stack.settings.keyring,
                ready,
                started,
                go,
                done,
                results,
            ),
        )
        for k in range(workers)
    ]
    for process in processes:
        process.start()
    for _ in processes:  # every worker has loaded the app: the crowd starts now
        if not ready.acquire(timeout=60):
            raise SystemExit("a simulator worker did not start")
    started.value = time.time()
    if on_start is not None:
        on_start(started.value)
    go.set()
    record, ended = CallRecord(), []
    with tqdm(total=len(users), unit="user", desc="journeys done", disable=not options.progress) as bar:
        while len(ended) < workers:
            try:
                part, calls = results.get(timeout=0.5)
                ended.append(part)
                record.add(calls)
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in processes):
                    raise SystemExit("a simulator worker died") from None
            last = target_tick(stack.pump.ticks[-1][1]) if stack.pump.ticks else None
            bar.set_postfix(waiting=last.waiting if last else 0, refresh=False)
            bar.update(done.value - bar.n)
    for process in processes:
        process.join()
    users[:] = sorted((user for part in ended for user in part), key=lambda user: user.id)
    return started.value, record


def shop_options(options: argparse.Namespace) -> dict:
    # A shop with a capacity times its orders: in its own process, the crowd's threads cannot slow its clock.
    return {
        "says_sold_out": not options.shop_silent,
        "capacity_per_s": options.shop_capacity,
        "workers": options.shop_workers,
        "own_process": options.shop_capacity is not None,
    }


def target_stats(api_url: str) -> dict | None:
    """The target's stats (GET .../stats), as an operator reads them; None if they could not be read."""
    host, port = api_url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("GET", ENTRIES.removesuffix("/entries") + "/stats")
        answer = connection.getresponse()
        body = answer.read()
    except OSError:
        return None
    return json.loads(body) if answer.status == 200 else None


def configure_target(api_url: str, options: argparse.Namespace) -> None:
    """Give the line its originSlo and safety net, if asked (the stack's defaults are the batch and tick)."""
    slo = {
        name: value
        for name, value in (("p95Ms", options.origin_slo_p95_ms), ("errorRate", options.origin_slo_error_rate))
        if value is not None
    }
    config: dict = ({"originSlo": slo} if slo else {}) | ({"safetyNet": True} if options.safety_net else {})
    if not config:
        return
    host, port = api_url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request(
        "PUT",
        ENTRIES.removesuffix("/entries") + "/config",
        body=json.dumps(config),
        headers={"Content-Type": "application/json"},
    )
    answer = connection.getresponse()
    answer.read()
    if answer.status != 200:
        raise SystemExit(f"configuring the target answered {answer.status}")


def redis_cpu_s(url: str) -> float:
    """CPU seconds the Redis server has spent since it started."""
    with redis.Redis.from_url(url) as client:
        info = client.info("cpu")
    return info["used_cpu_user"] + info["used_cpu_sys"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Sale:
    """A sale run on the local stack, as `analyse` reads it: the users as they ended, what their calls met, the
    pump's record, the shop's summary, the settings, when the crowd started and finished, and CPU by whom."""

    users: list[User]
    api: CallRecord
    pump: RecordingPump
    shop: dict
    settings: Any
    started: float
    finished: float
    cpu_s: dict
    stats: dict | None = None  # the target's stats as the API answered them at the end
    edge: list | None = None  # with --edge: every request the cache answered (infra/local/edge_cache.Request)


def run_sale(
    options: argparse.Namespace,
    users: list[User],
    env: Mapping[str, str] | None = None,
    journey: Journey = journey,
    on_start: Callable[[float], None] | None = None,
) -> Sale:
    """Start the stack (on `env` over the options' settings: a REDIS_URL there is used, else an embedded Valkey),
    run every user's `journey` (`on_start` is given the crowd's start time), stop the stack."""
    env = {
        **os.environ,
        "VQ_KEY_PREFIX": options.key_prefix or f"vqsim-{uuid.uuid4().hex[:8]}",
        "VQ_BATCH_SIZE": str(options.batch),
        "VQ_TICK_MS": str(options.tick_ms),
        "VQ_HEARTBEAT_TIMEOUT_S": str(options.heartbeat_timeout_s),
        # The state-change events the pump publishes, counted by kind at the end.
        "VQ_EVENTS_FILE": str(options.out / "events.jsonl"),
        **(env or {}),
    }
    if options.max_waiting:
        env["VQ_MAX_WAITING"] = str(options.max_waiting)
    Path(env["VQ_EVENTS_FILE"]).unlink(missing_ok=True)
    # The pump in this process prints its metrics: to pump.log, beside the API's output.
    with (
        open(options.out / "api.log", "wb") as api_log,
        open(options.out / "pump.log", "w") as pump_log,
        contextlib.redirect_stdout(pump_log),
        LocalStack(
            env,
            api_port=free_port(),
            stock=options.stock,
            pump_class=RecordingPump,
            api_output=api_log,
            api_workers=options.workers,
            shop_options=shop_options(options),
            edge=options.edge,
        ) as stack,
    ):
        configure_target(stack.api_url, options)
        redis_cpu_at, own_cpu_at = redis_cpu_s(stack.env["REDIS_URL"]), time.process_time()
        api: CallRecord
        if options.transport == "inproc":
            started, api = run_crowd_in_process(users, stack, options, journey, on_start)
        else:
            api = Api(stack.edge_cache.url if stack.edge_cache else stack.api_url, options.threads)
            # The simulator reads the seq in each user's ticket, to know when the pump let them in.
            signer = TokenSigner(stack.settings.keyring)
            started = asyncio.run(run_crowd(users, api, stack.pump, signer, options, journey, on_start))
            api.close()
        finished = time.time()
        redis_cpu, own_cpu = redis_cpu_s(stack.env["REDIS_URL"]) - redis_cpu_at, time.process_time() - own_cpu_at
        # Over HTTP the app runs in the local API's processes (not counted), and the crowd in this one.
        cpu_s = (
            {"the app and the crowd": api.cpu_s, "Redis": redis_cpu, "the pump": own_cpu}
            if options.transport == "inproc"
            else {"the app (the local API)": None, "Redis": redis_cpu, "the pump and the crowd": own_cpu}
        )
        stats = target_stats(stack.api_url)
        answered = sum(len(values) for values in api.latencies.values())
        edge = stack.edge_cache.requests(at_least=answered) if stack.edge_cache else None
        return Sale(users, api, stack.pump, stack.shop.summary(), stack.settings, started, finished, cpu_s, stats, edge)


def main(argv: list[str] | None = None) -> int:
    """Start the stack, run the crowd, write and print the report; 0 if every check passed, else 1."""
    options = parse_options(argv)
    options.out.mkdir(parents=True, exist_ok=True)
    sale = run_sale(options, plan_users(options, random.Random(options.seed)))
    report = analyse(options, sale)
    # After the stack stopped: the pump's last round of publishing is in the file.
    events_file = options.out / "events.jsonl"
    report["events"] = (
        dict(
            sorted(
                collections.Counter(
                    json.loads(line)["detail-type"] for line in events_file.read_text().splitlines()
                ).items()
            )
        )
        if events_file.exists()
        else {}
    )
    (options.out / "report.json").write_text(json.dumps(report, indent=1))
    # Each admitted user's first estimate and wait, to tune the ETA's range on (docs/waits.md).
    (options.out / "eta.csv").write_text(eta_csv(sale.users))
    plot(report, options.out / "plot.png")
    print(summary(report, options.out), flush=True)
    print(
        f"events published ({events_file}): "
        + (", ".join(f"{kind} {n:,}" for kind, n in report["events"].items()) or "none"),
        flush=True,
    )
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
