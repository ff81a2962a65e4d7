"""Benchmark: the state-change events (the outbox in Redis and its publisher).

Run: .venv/bin/python tests/perf/bench_events.py (a Valkey of its own, or BENCH_REDIS_URL; REDIS_URL adds memory there)
Measures, in one run:
  - what a client call costs with events on against off: round trips (commands and pipelines the client sends),
    and server time per call (EVALSHA usec_per_call, INFO commandstats) of leave, a purchase noted (observe_purchase),
    a token restored, and one pump tick admitting 100 (evict, rate, admit), in 7 alternating rounds;
  - events per second the publisher drains from the outbox, to a sink that accepts everything (the queue's own
    cost: read, shape, delete) and to moto's EventBridge (PutEvents in this process);
  - the delay from a change (the event's Redis time) to its publication, p50 and p95, while the pump ticks every
    second admitting 100 and users leave at about 100/s: admissions and departures apart;
  - the outbox's memory per 1,000 events (MEMORY USAGE of a stream of 10,000 UserAdmitted events).
Prints a table and writes build/bench_events.json.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time

import benchlib  # beside this file

sys.path.insert(0, str(benchlib.ROOT))
os.environ.update(
    {
        **benchlib.BASE_ENV,
        "POWERTOOLS_LOG_LEVEL": "CRITICAL",
        "POWERTOOLS_METRICS_DISABLED": "true",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
    }
)

from chalicelib.config import load_settings  # noqa: E402
from chalicelib.events import EventBridgeSink, Publisher  # noqa: E402
from chalicelib.pump import Pump  # noqa: E402
from chalicelib.shop_health import Purchase  # noqa: E402
from chalicelib.store import Defaults, PumpRules, QueueStore  # noqa: E402
from chalicelib.targets import Target  # noqa: E402
from chalicelib.tokens import EntryToken, GrantTerms  # noqa: E402

DROP = Target("limited-drop", 1)
DEFAULTS = Defaults(max_waiting=10_000_000, batch=100, tick_ms=1000, idle_ttl_ms=600_000, open_on_first_use=True)
CAP = 1_000_000


class Accepting:
    """A sink that takes every event, noting when each arrived against its Redis time."""

    def __init__(self) -> None:
        self.delays: dict[str, list[float]] = {}
        self.count = 0

    def put(self, events):
        now_ms = time.time() * 1000
        for event in events:
            self.delays.setdefault(event.detail_type, []).append(now_ms - event.time_ms)
        self.count += len(events)
        return [True] * len(events)


def fill(store: QueueStore, users: int, start: int = 1) -> dict[int, int]:
    """Users `start`... in line through enter.lua: their seqs (their tickets' entry numbers) by user."""
    now = int(time.time() * 1000)
    terms = GrantTerms(int(time.time()) + 300, "0" * 64)
    return {user: store.enter(DROP, str(user), now, terms, DEFAULTS).seq for user in range(start, start + users)}


def admit_all(store: QueueStore, batch: int) -> None:
    rules = PumpRules(
        tick_ms=1, batch=batch, catchup_ticks=1, heartbeat_timeout_ms=600_000, max_evict=1000, idle_ttl_ms=600_000
    )
    time.sleep(0.002)
    store.admit_and_evict_all([DROP], rules)


def evalsha_usec(client) -> tuple[int, int]:
    row = client.info("commandstats").get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    return int(row["calls"]), int(row["usec"])


def counted_sends(client):
    """Count the commands and pipelines `client` sends (each one round trip)."""
    sends = [0]
    original_command, original_pipeline = client.execute_command, client.pipeline

    def command(*args, **options):
        sends[0] += 1
        return original_command(*args, **options)

    def pipeline(*args, **options):
        pipe = original_pipeline(*args, **options)
        execute = pipe.execute

        def counted(*a, **k):
            sends[0] += 1
            return execute(*a, **k)

        pipe.execute = counted
        return pipe

    client.execute_command, client.pipeline = command, pipeline
    return sends


def client_costs(url: str, loads: list[float], calls: int = benchlib.scaled(1000, 50)) -> dict:
    """Server usec per call and round trips per call, events off against on, 7 alternating rounds (their load
    average into `loads`)."""
    results: dict[str, dict[str, list[float]]] = {}
    for round_ in range(benchlib.ROUNDS * 2):
        mode = ("off", "on")[round_ % 2]
        if mode == "off":
            loads.append(benchlib.load_average())
        client_round(url, mode, calls, results)
    return results


def client_round(url: str, mode: str, calls: int, results: dict[str, dict[str, list[float]]]) -> None:
    """One round of client_costs with events `mode` ("off" or "on"): its figures are appended to `results`."""
    client = benchlib.patient_client(url)
    prefix = benchlib.bench_prefix()
    store = QueueStore(client, prefix, outbox_cap=CAP if mode == "on" else 0)
    seqs = fill(store, calls)
    sends = counted_sends(client)

    def measure(name, work):
        client.config_resetstat()
        before = sends[0]
        work()
        sent = sends[0] - before
        n, usec = evalsha_usec(client)
        row = results.setdefault(name, {"off": [], "on": [], "round_trips_off": [], "round_trips_on": []})
        row[mode].append(usec / n)
        row[f"round_trips_{mode}"].append(sent / calls_of[name])

    now = int(time.time() * 1000)
    expires = int(time.time()) + 300
    tokens = [EntryToken("x", DROP, user, expires, f"tok{user}") for user in range(1, calls + 1)]
    calls_of = {"leave": calls // 2, "purchase noted": calls, "token restored": calls, "tick admitting 100": 5}
    measure("leave", lambda: [store.leave(DROP, str(u), seqs[u], now, 600_000, 2000) for u in range(1, calls // 2 + 1)])
    for t in tokens:
        store.consume(t, f"c{t.user_id}", now)
    measure(
        "purchase noted",
        lambda: [store.observe_purchase(DROP, Purchase(now, 50, True), True, False, t, 201) for t in tokens],
    )
    measure("token restored", lambda: [store.restore(t, f"c{t.user_id}") for t in tokens])
    measure("tick admitting 100", lambda: [admit_all(store, 100) for _ in range(5)])
    benchlib.delete_prefix(client, prefix)


def publish_rate(url: str, events: int = benchlib.scaled(20_000, 500)) -> dict:
    """Events per second one publisher drains: to an accepting sink, and to moto's EventBridge."""
    import boto3
    from moto import mock_aws

    out = {}
    for name in ("accepting sink", "moto EventBridge"):
        client = benchlib.patient_client(url)
        prefix = benchlib.bench_prefix()
        store = QueueStore(client, prefix, outbox_cap=CAP)
        fill(store, events)
        admit_all(store, events)
        with mock_aws():
            if name == "accepting sink":
                sink = Accepting()
            else:
                boto3.client("events").create_event_bus(Name="bench")
                sink = EventBridgeSink(boto3.client("events"), "bench")
            publisher = Publisher(store, sink)
            started = time.perf_counter()
            published = 0
            while (drained := publisher.drain([DROP])).published:
                published += drained.published
            out[name] = published / (time.perf_counter() - started)
            publisher.close()
        benchlib.delete_prefix(client, prefix)
    return out


def delays(url: str, seconds: int = benchlib.scaled(12, 2)) -> dict:
    """Change-to-publication delay (ms) while the pump ticks every second and users leave at about 100/s."""
    client = benchlib.patient_client(url)
    prefix = benchlib.bench_prefix()
    store = QueueStore(client, prefix, outbox_cap=CAP)
    seqs = fill(store, benchlib.scaled(5_000, 300))
    settings = load_settings(
        {
            **os.environ,
            "VQ_KEY_PREFIX": prefix,
            "VQ_TICK_MS": "1000",
            "VQ_BATCH_SIZE": "100",
            "VQ_HEARTBEAT_TIMEOUT_S": "600",
            "REDIS_URL": url,
        }
    )
    sink = Accepting()
    pump = Pump(store, settings, publisher=Publisher(store, sink))
    stop = threading.Event()

    def leaving():
        user = len(seqs)
        while not stop.is_set() and user > 0:
            store.leave(DROP, str(user), seqs[user], int(time.time() * 1000), 600_000, 2000)
            user -= 1
            time.sleep(0.01)

    leaver = threading.Thread(target=leaving)
    leaver.start()
    pump.run(ticks=seconds)
    stop.set()
    leaver.join()
    benchlib.delete_prefix(client, prefix)
    out = {}
    for kind, values in sink.delays.items():
        values.sort()
        out[kind] = {
            "events": len(values),
            "p50_ms": statistics.median(values),
            "p95_ms": values[int(0.95 * (len(values) - 1))],
        }
    return out


def memory_per_1000(url: str, events: int = benchlib.scaled(10_000, 500)) -> float:
    client = benchlib.patient_client(url)
    prefix = benchlib.bench_prefix()
    store = QueueStore(client, prefix, outbox_cap=CAP)
    fill(store, events)
    admit_all(store, events)
    used = client.memory_usage(store.keys(DROP).events, samples=0)
    benchlib.delete_prefix(client, prefix)
    return used * 1000 / events


def main() -> None:
    report: dict = {}
    with benchlib.redis_url() as url:
        report["server"] = benchlib.server_version(benchlib.patient_client(url))
        loads: list[float] = []
        report["client_costs"] = client_costs(url, loads)
        report["load_average"] = benchlib.loads(loads)
        report["publish_per_s"] = publish_rate(url)
        report["delays"] = delays(url)
        report["memory_per_1000_events"] = {report["server"]: memory_per_1000(url)}
    if os.environ.get("REDIS_URL"):
        jemalloc = benchlib.patient_client(os.environ["REDIS_URL"])
        report["memory_per_1000_events"][benchlib.server_version(jemalloc) + " (REDIS_URL)"] = memory_per_1000(
            os.environ["REDIS_URL"]
        )
    benchlib.write_json("bench_events.json", report)

    print(f"\nClient call cost, events off -> on ({report['server']}; median and range of {benchlib.ROUNDS} rounds)")
    print(f"  {'call':<20}{'server us/call off':>22}{'on':>22}{'round trips off':>17}{'on':>6}")
    for name, row in report["client_costs"].items():

        def span(values):
            return f"{statistics.median(values):6.1f} [{min(values):.1f}-{max(values):.1f}]"

        print(
            f"  {name:<20}{span(row['off']):>22}{span(row['on']):>22}"
            f"{statistics.median(row['round_trips_off']):>17.2f}{statistics.median(row['round_trips_on']):>6.2f}"
        )
    print("\nEvents published per second (one publisher)")
    for name, rate in report["publish_per_s"].items():
        print(f"  {name:<20}{rate:>10,.0f}")
    print("\nChange to publication (ms), pump ticking every 1 s, ~100 departures/s")
    for kind, row in report["delays"].items():
        print(f"  {kind:<20}{row['events']:>7} events   p50 {row['p50_ms']:7.0f}   p95 {row['p95_ms']:7.0f}")
    print("\nOutbox memory per 1,000 events")
    for server, used in report["memory_per_1000_events"].items():
        print(f"  {server:<30}{used:>10,.0f} bytes")


if __name__ == "__main__":
    main()
