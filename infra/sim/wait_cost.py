"""What `WAIT 1 <timeout>` after the queue's writes would cost, and what it would buy (issue 29, item 6).

`WAIT numreplicas timeout` blocks the client until that many replicas have acknowledged every write the connection
made, or the timeout (ms) passes, and answers how many did. Redis does not block on WAIT inside a script, so it
would follow each script call in the same pipeline: still one round trip, longer by the replica's acknowledgement.
Advisory, the answer is ignored; enforced, a write no replica acknowledged in time is refused (the caller is not
told it happened, and the queue fails open or answers 503 as for any Redis failure).

Measured with the queue's own scripts (QueueStore, as the functions call them) on the primary and replica pair of
tests/support/replication.py: two Valkey servers on loopback, the replica behind a relay that can lag.

1. cost with the replica in sync: each of enter, consume and a pump tick (one target, a real admission each
   call), alone and with `WAIT 1 100` pipelined: latency p50 / p95 from one thread, calls/s from 8 threads, and
   the primary's CPU per call; in alternating rounds. Also with the relay holding the stream 1 ms, about a
   round trip between two availability zones.
2. cost with the replica behind: each lag against each timeout, the latency of an enter and the share of
   enters the replica acknowledged in time.
3. what it buys: enters offered at 100 a second from 32 threads while the replica is `lag` behind, then the primary
   dies and the replica is promoted; the entries callers were told of that the promoted node lacks, without
   WAIT, with WAIT advisory and with WAIT enforced.
4. the replica gone, as after a failover with one replica per shard: WAIT 1 on the promoted node.

    python infra/sim/scenarios.py wait                 # about 3 minutes; the table, and build/scenarios/wait.json
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing
import statistics
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chalicelib.config import Keyring  # noqa: E402
from chalicelib.redis_connection import Breakers, StoreUnavailable, connect  # noqa: E402
from chalicelib.store import Defaults, PumpRules, QueueStore  # noqa: E402
from chalicelib.targets import Target  # noqa: E402
from chalicelib.tokens import TokenSigner  # noqa: E402
from tests.support.replication import ReplicatedPair  # noqa: E402

OUT = ROOT / "build" / "scenarios"
TIMEOUT_MS = 100  # the WAIT of the cost rounds
THREADS = 8
LAGS_S = (0.25, 1.0, 3.0)
# The functions' client gives a command 0.5 s (chalicelib/redis_connection.py): a WAIT must end well within it, or
# the call fails as if Redis were down (and the queue fails open).
TIMEOUTS_MS = (10, 100, 250)
OFFERED_PER_S = 100  # enters offered while measuring what WAIT buys
WRITERS = 32
DROP_1 = Target("limited-drop", 1)
DEFAULTS = Defaults(max_waiting=10**7, batch=2, tick_ms=60_000, idle_ttl_ms=3_600_000, open_on_first_use=True)
RULES = PumpRules(
    tick_ms=60_000, batch=2, catchup_ticks=1, heartbeat_timeout_ms=3_600_000, max_evict=10, idle_ttl_ms=3_600_000
)
SIGNER = TokenSigner(Keyring({"wait": b"w" * 32}, "wait"))


class NotReplicated(redis.RedisError):
    """Enforced WAIT: the write happened on the primary, but no replica acknowledged it in time."""


class WaitingClient:
    """The functions' Redis client with `WAIT replicas timeout_ms` pipelined after every script call and every
    pipeline. Notes what each WAIT answered; `enforce` raises NotReplicated for a write no replica acknowledged
    (the store turns it into StoreUnavailable, as any Redis failure)."""

    def __init__(self, client: Any, replicas: int, timeout_ms: int, enforce: bool) -> None:
        self.client, self.replicas, self.timeout_ms, self.enforce = client, replicas, timeout_ms, enforce
        self.acknowledged: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if args[0] not in ("EVALSHA", "EVAL"):  # a script, by its SHA or (the server lacking it) its text
            return self.client.execute_command(*args, **options)
        pipe = self.pipeline()
        pipe.execute_command(*args, **options)
        return pipe.execute()[0]

    def pipeline(self, transaction: bool = False, shard_hint: Any = None) -> _WaitingPipeline:
        return _WaitingPipeline(self, self.client.pipeline(transaction=transaction, shard_hint=shard_hint))


class _WaitingPipeline:
    def __init__(self, owner: WaitingClient, pipe: Any) -> None:
        self.owner, self.pipe = owner, pipe

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pipe, name)

    def execute(self, raise_on_error: bool = True) -> list:
        self.pipe.execute_command("WAIT", self.owner.replicas, self.owner.timeout_ms)
        *replies, acknowledged = self.pipe.execute(raise_on_error=raise_on_error)
        self.owner.acknowledged.append(acknowledged)
        if self.owner.enforce and acknowledged < self.owner.replicas:
            raise NotReplicated(f"{acknowledged} of {self.owner.replicas} replicas in {self.owner.timeout_ms} ms")
        return replies


class Writes:
    """The three writes measured, on `store`, each call a fresh user, token or target (`ready` fills the targets
    the next `n` ticks admit from)."""

    def __init__(self, store: QueueStore, run: str) -> None:
        self.store, self.run = store, run
        self._numbers = itertools.count(1)
        self._targets: list[Target] = []

    def enter(self) -> None:
        now, target, user = time.time(), Target("limited-drop", 1), str(next(self._numbers))
        self.store.enter(target, user, int(now * 1000), SIGNER.grant_terms(target, user, now, 300), DEFAULTS)

    def consume(self) -> None:
        now = time.time()
        token = SIGNER.mint_entry_token(Target("limited-drop", 1), str(next(self._numbers)), now, 300)
        self.store.consume(token, f"{self.run}-{token.token_id}", int(now * 1000), open_on_first_use=True)

    def tick(self) -> None:
        # One target per tick, two users waiting in it: each call applies the target's first tick and admits both.
        self.store.admit_and_evict_all([self._targets.pop()], RULES)

    def ready(self, n: int) -> Writes:
        for _ in range(n):
            target, now = Target("ticketing-event", next(self._numbers)), time.time()
            for user in ("1", "2"):
                self.store.enter(target, user, int(now * 1000), SIGNER.grant_terms(target, user, now, 300), DEFAULTS)
            self._targets.append(target)
        return self


def store_of(url: str, wait_ms: int | None = None, enforce: bool = False, prefix: str = "") -> QueueStore:
    """A store as the functions make it (`connect`), with WAIT 1 `wait_ms` pipelined after its writes if given.
    Its breaker never opens: every call is measured, none skipped."""
    client = connect(url)
    if wait_ms is not None:
        client = WaitingClient(client, 1, wait_ms, enforce)
    return QueueStore(
        client, prefix or f"vqwait-{time.time_ns()}", Breakers(fail_max=10**9, reset_timeout=1, per_slot=False)
    )


def timed(call: Callable[[], None], n: int) -> list[float]:
    """`n` calls one after another; each one's seconds."""
    took = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        took.append(time.perf_counter() - started)
    return took


def throughput(calls: list[Callable[[], None]], n: int) -> float:
    """Calls per second from one thread per entry of `calls`, each making `n` calls."""
    threads = [threading.Thread(target=lambda c=c: [c() for _ in range(n)], daemon=True) for c in calls]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(calls) * n / (time.perf_counter() - started)


class PairProcess:
    """tests/support/replication.py's pair, run in a process of its own: the threads of its relays then take no
    share of this process's interpreter lock, and the latencies measured here are the client's and the servers'."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, theirs = context.Pipe()
        self._process = context.Process(target=_host_pair, args=(theirs,), daemon=True)
        self._process.start()
        theirs.close()  # so that a pair's process that died is an EOFError here, not a wait for ever
        self.url, self._primary_port = self._do("start")

    def lag(self, seconds: float) -> None:
        """Hold the replication stream `seconds` from now on."""
        self._do("lag", seconds)

    def fail_over(self) -> None:
        self._do("fail_over")

    def primary_cpu_s(self) -> float:
        info = redis.Redis(port=self._primary_port).info("cpu")
        return info["used_cpu_user"] + info["used_cpu_sys"]

    def close(self) -> None:
        self._do("close")
        self._process.join(timeout=10)

    def __enter__(self) -> PairProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _do(self, *command: object) -> Any:
        self._pipe.send(command)
        if not self._pipe.poll(60):
            raise RuntimeError(f"the pair's process did not answer {command[0]} within 60 s")
        ok, answer = self._pipe.recv()
        if not ok:
            raise RuntimeError(f"the pair's process failed at {command[0]}: {answer}")
        return answer


def _host_pair(pipe: Any) -> None:
    """The pair's process: the pair, and what PairProcess asks of it."""
    pair = None
    while True:
        command, *args = pipe.recv()
        try:
            if command == "start":
                pair = ReplicatedPair()
                answer: Any = (pair.url, pair.primary.port)
            elif command == "lag":
                pair.link.delay_s = args[0]
                answer = None
            elif command == "fail_over":
                answer = pair.fail_over()
            else:
                # The servers only: the relays' threads end with this process. (Closing a relay with a few
                # hundred connections open now and then hung for over a minute.)
                for server in (pair.primary, pair.replica) if pair else ():
                    server.stop()
                answer = None
        except Exception as err:  # noqa: BLE001 (sent back)
            pipe.send((False, repr(err)))
            return
        pipe.send((True, answer))
        if command == "close":
            return


def cost_in_sync(link_delay_s: float, rounds: int, calls: int) -> dict:
    """Part 1: each write alone and with WAIT, alternating rounds, on a pair whose link holds `link_delay_s`."""
    with PairProcess() as pair:
        pair.lag(link_delay_s)
        figures: dict[str, dict[str, dict[str, list[float]]]] = {}
        for op, _, variant in itertools.product(("enter", "consume", "tick"), range(rounds), ("alone", "WAIT")):
            wait_ms = TIMEOUT_MS if variant == "WAIT" else None
            one = figures.setdefault(op, {}).setdefault(variant, {"latency": [], "per_s": [], "cpu_us": []})
            writes = Writes(store_of(pair.url, wait_ms), op).ready(calls + 1 if op == "tick" else 0)
            getattr(writes, op)()  # the script is loaded, the connection made
            cpu_at = pair.primary_cpu_s()
            one["latency"] += timed(getattr(writes, op), calls)
            one["cpu_us"].append((pair.primary_cpu_s() - cpu_at) / calls * 1e6)
            n = calls // THREADS
            stores = [
                Writes(store_of(pair.url, wait_ms), f"{op}{i}").ready(n if op == "tick" else 0) for i in range(THREADS)
            ]
            one["per_s"].append(throughput([getattr(w, op) for w in stores], n))
        return {op: {variant: _summary(f) for variant, f in variants.items()} for op, variants in figures.items()}


def _summary(f: dict[str, list[float]]) -> dict:
    latency = sorted(f["latency"])
    return {
        "p50_us": round(statistics.median(latency) * 1e6),
        "p95_us": round(latency[int(0.95 * (len(latency) - 1))] * 1e6),
        "per_s": [round(x) for x in f["per_s"]],
        "cpu_us": [round(x, 1) for x in f["cpu_us"]],
    }


def cost_behind(lags_s: tuple[float, ...], timeouts_ms: tuple[int, ...], calls: int) -> dict:
    """Part 2: enters with WAIT while the replica is behind."""
    with PairProcess() as pair:
        figures = {}
        for lag_s in lags_s:
            pair.lag(lag_s)
            time.sleep(lag_s)  # the link runs at its new lag
            for timeout_ms in timeouts_ms:
                store = store_of(pair.url, timeout_ms)
                writes = Writes(store, f"behind-{lag_s}-{timeout_ms}")
                took = timed(writes.enter, calls)
                acked = store.client.acknowledged[-calls:]
                figures[f"{lag_s:g} s, WAIT 1 {timeout_ms}"] = {
                    "median_ms": round(statistics.median(took) * 1000),
                    "acknowledged": f"{sum(a >= 1 for a in acked)} of {calls}",
                }
        return figures


def what_it_buys(lag_s: float, wait_ms: int | None, enforce: bool, seconds: float) -> dict:
    """Part 3: enters offered at OFFERED_PER_S for `seconds` with the replica `lag_s` behind; then the failover.
    The entries callers were told of (the call answered, and under enforced WAIT a replica acknowledged it) that
    the promoted node lacks."""
    with PairProcess() as pair:
        pair.lag(lag_s)
        prefix = f"vqbuys-{time.time_ns()}"
        told: list[int] = []
        refused = [0]
        users = itertools.count(1)
        until = time.monotonic() + seconds

        def writer() -> None:
            store = store_of(pair.url, wait_ms, enforce, prefix)
            now = time.time()
            with contextlib.suppress(StoreUnavailable):  # the script loaded, the connection made
                store.enter(DROP_1, "0", int(now * 1000), SIGNER.grant_terms(DROP_1, "0", now, 300), DEFAULTS)
            due = time.monotonic()
            while (due := due + WRITERS / OFFERED_PER_S) < until:
                time.sleep(max(0.0, due - time.monotonic()))
                user, now = next(users), time.time()
                try:
                    store.enter(
                        DROP_1, str(user), int(now * 1000), SIGNER.grant_terms(DROP_1, str(user), now, 300), DEFAULTS
                    )
                    told.append(user)
                except StoreUnavailable:
                    refused[0] += 1

        threads = [threading.Thread(target=writer) for _ in range(WRITERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        pair.fail_over()
        promoted = QueueStore(connect(pair.url), prefix)
        waiting = promoted.keys(Target("limited-drop", 1)).waiting
        held = {int(member) for member in promoted.client.zrange(waiting, 0, -1)}
        after = None
        if wait_ms is not None:
            # Part 4: the replica is gone. What WAIT answers on the promoted node, alone in its shard.
            store = store_of(pair.url, wait_ms, enforce=False, prefix=prefix)
            took = timed(Writes(store, "alone").enter, 5)
            after = {
                "median_ms": round(statistics.median(took) * 1000),
                "acknowledged": f"{sum(a >= 1 for a in store.client.acknowledged[-5:])} of 5",
            }
        return {
            "offered": int(seconds * OFFERED_PER_S),
            "answered_per_s": round(len(told) / seconds, 1),
            "told": len(told),
            "refused": refused[0],
            "lost": len(set(told) - held),
            "replica_gone": after,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of part 1")
    parser.add_argument("--calls", type=int, default=400, help="calls per round of part 1")
    parser.add_argument("--lags", type=float, nargs="+", default=[0.1, 1.0], help="the replica's lags in part 3")
    options = parser.parse_args(argv)
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    command = "python infra/sim/scenarios.py wait " + " ".join(argv or [])
    report: dict[str, Any] = {"date": date, "command": command.strip()}
    print(f"WAIT 1 <timeout> after the queue's writes, {date}: {command.strip()}")

    for delay_s, name in ((0.0, "replica in sync, loopback"), (0.001, "replica 1 ms away")):
        print(f"\n1. cost, {name}: WAIT 1 {TIMEOUT_MS} pipelined; latency from one thread, calls/s from {THREADS}")
        figures = report.setdefault("in_sync", {})[name] = cost_in_sync(delay_s, options.rounds, options.calls)
        print(f"  {'write':<8} {'':<6} {'p50 us':>7} {'p95 us':>7}  {'calls/s per round':<22} primary CPU us/call")
        for op, variants in figures.items():
            for variant, f in variants.items():
                per_s = " ".join(map(str, f["per_s"]))
                cpu = " ".join(map(str, f["cpu_us"]))
                print(f"  {op:<8} {variant:<6} {f['p50_us']:>7} {f['p95_us']:>7}  {per_s:<22} {cpu}")

    print("\n2. cost, replica behind: an enter with WAIT 1 <timeout>, median of 5")
    report["behind"] = cost_behind(LAGS_S, TIMEOUTS_MS, 5)
    for name, f in report["behind"].items():
        print(f"  replica {name:<22} {f['median_ms']:>6} ms   acknowledged {f['acknowledged']}")

    print(
        f"\n3. what it buys: enters offered at {OFFERED_PER_S}/s from {WRITERS} threads for the lag + 2 s, then the"
        " primary dies;\n4. then the replica gone: WAIT 1 on the promoted node, alone in its shard"
    )
    variants = {
        "no WAIT": (None, False),
        f"WAIT 1 {TIMEOUT_MS}, advisory": (TIMEOUT_MS, False),
        f"WAIT 1 {TIMEOUT_MS}, enforced": (TIMEOUT_MS, True),
        f"WAIT 1 {TIMEOUTS_MS[-1]}, enforced": (TIMEOUTS_MS[-1], True),
    }
    report["buys"] = {}
    for lag_s in options.lags:
        for name, (wait_ms, enforce) in variants.items():
            f = report["buys"][f"{lag_s:g} s, {name}"] = what_it_buys(lag_s, wait_ms, enforce, lag_s + 2)
            gone = f["replica_gone"]
            print(
                f"  replica {lag_s:g} s behind, {name:<22} told {f['told']:>4} ({f['answered_per_s']:>5}/s)  "
                f"refused {f['refused']:>4}  told but lost {f['lost']:>4}"
                + (
                    f"  | replica gone: {gone['median_ms']} ms a call, acknowledged {gone['acknowledged']}"
                    if gone
                    else ""
                )
            )
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "wait.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
