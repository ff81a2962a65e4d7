"""Measurement: the Redis commands each client call's script issues inside the server, the basis of the ElastiCache
Serverless ECPU estimate (docs/deploy.md: ElastiCache Serverless).

Run: .venv/bin/python tests/perf/script_commands.py   (a Valkey of its own, or BENCH_REDIS_URL)
A line of 10,000 users in one target, then, in 3 alternating rounds of 200 calls each through the app (Chalice's
test client, as API Gateway calls it): enter (a newcomer; the same user again), status of a waiting user, leave,
status of an admitted user (it mints the entry token), a purchase (consume, then note the shop's answer), and one
pump tick (one target, a batch of 100). Around each set of calls: CONFIG RESETSTAT, then INFO commandstats; the
commands a script runs are counted there beside the EVALSHA that ran them. Prints, per call: the scripts, the
commands inside them (with the mix), and the server's whole CPU (INFO cpu: reading, parsing and replying too, less
what it spends idle meanwhile) against a 100-byte GET's, sent by redis-benchmark (-c 50, unpipelined). Server CPU
on a shared machine is noisy: the commands are the firmer figure.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.perf import benchlib  # noqa: E402

ROUNDS, CALLS, WAITING = 3, 200, 10_000
QUEUE = "/virtual-queues/limited-drop/7/entries"


def main() -> None:
    with benchlib.redis_url() as url:
        os.environ.update({**benchlib.BASE_ENV, "REDIS_URL": url, "VQ_KEY_PREFIX": benchlib.bench_prefix()})
        os.environ.update({"POWERTOOLS_METRICS_DISABLED": "true", "POWERTOOLS_LOG_LEVEL": "ERROR"})
        from tests.support.downstream import Origin

        shop = Origin()
        os.environ.update({"VQ_ORIGIN_LIMITED_DROP_URL": shop.url, "VQ_ORIGIN_TICKETING_URL": shop.url})
        measure(url)


def measure(url: str) -> None:
    from chalice.test import Client

    from app import app
    from chalicelib import runtime
    from chalicelib.pump import Pump

    server = benchlib.patient_client(url)
    rows: dict[str, list[tuple[float, float, float, str]]] = {}

    def cpu() -> float:
        info = server.info("cpu")
        return info["used_cpu_sys"] + info["used_cpu_user"]

    # What the server spends idle (its timers), taken off each set of calls for the seconds they took.
    before, started = cpu(), time.monotonic()
    time.sleep(2)
    idle_per_s = (cpu() - before) / (time.monotonic() - started)

    def record(label: str, calls: list) -> None:
        server.config_resetstat()
        before, started = cpu(), time.monotonic()
        for call in calls:
            call()
        spent_us = (cpu() - before - idle_per_s * (time.monotonic() - started)) / len(calls) * 1e6
        stats = {k.removeprefix("cmdstat_"): v for k, v in server.info("commandstats").items()}
        for meta in ("config|resetstat", "info", "config", "script|load"):
            stats.pop(meta, None)
        scripts = sum(v["calls"] for k, v in stats.items() if k in ("evalsha", "eval"))
        inner = {k: v["calls"] for k, v in stats.items() if k not in ("evalsha", "eval")}
        mix = " ".join(f"{k} {n / len(calls):g}" for k, n in sorted(inner.items()))
        rows.setdefault(label, []).append((scripts / len(calls), sum(inner.values()) / len(calls), spent_us, mix))

    with Client(app) as client:
        tickets: dict[int, str] = {}

        def enter(user: int):
            answer = client.http.post(QUEUE, headers={"X-User-Id": str(user)})
            tickets[user] = answer.json_body["queueTicket"]
            return answer

        def headers(user: int) -> dict:
            return {"X-User-Id": str(user), "X-Queue-Ticket": tickets[user]}

        def buy(user: int, token: str):
            sent = {"Content-Type": "application/json", "X-User-Id": str(user), "X-Entry-Token": token}
            return client.http.post("/limited-drops/7/orders", headers=sent, body="{}")

        for user in range(1, WAITING + 1):
            enter(user)
        newcomer = 100_000
        for rnd in range(ROUNDS):
            users = list(range(newcomer, newcomer + CALLS))
            newcomer += CALLS
            far = list(range(WAITING - CALLS * (rnd + 1), WAITING - CALLS * rnd))
            record("enter, a newcomer", [lambda u=u: enter(u) for u in users])
            record(
                "enter, the same user again",
                [lambda u=u: client.http.post(QUEUE, headers={"X-User-Id": str(u)}) for u in users],
            )
            record("status, waiting", [lambda u=u: client.http.get(QUEUE + "/me", headers=headers(u)) for u in far])
            record("leave", [lambda u=u: client.http.delete(QUEUE + "/me", headers=headers(u)) for u in users])
        pump = Pump(runtime.store(), runtime.settings())
        for _ in range(ROUNDS * 2):
            time.sleep(runtime.settings().tick_ms / 1000 + 0.05)
            record("pump tick, one target (100 admitted)", [pump.tick])
        for rnd in range(ROUNDS):
            admitted = list(range(1 + rnd * CALLS, 1 + (rnd + 1) * CALLS))
            record(
                "status, admitted (mints the token)",
                [lambda u=u: client.http.get(QUEUE + "/me", headers=headers(u)) for u in admitted],
            )
            tokens = {u: client.http.get(QUEUE + "/me", headers=headers(u)).json_body["entryToken"] for u in admitted}
            record("purchase (consume, note the answer)", [lambda u=u, t=tokens[u]: buy(u, t) for u in admitted])
    get_us = []
    port = str(urlparse(url).port)
    for _ in range(ROUNDS):
        server.set("bench:probe", "x" * 100)
        before = cpu()
        subprocess.run(
            ["redis-benchmark", "-p", port, "-n", "200000", "-c", "50", "-q", "-t", "get"],
            capture_output=True,
            check=True,
        )
        get_us.append((cpu() - before) / 200_000 * 1e6)
    get = statistics.median(get_us)
    rounds = f"{ROUNDS} rounds of {CALLS} calls (the pump: {ROUNDS * 2} ticks)"
    print(f"{benchlib.server_version(server)}; {WAITING:,} waiting; {rounds}")
    print(f"a GET of 100 bytes: server CPU {min(get_us):.1f}-{max(get_us):.1f} us a call (redis-benchmark -c 50)")
    print(f"{'call':38} {'scripts':>7} {'commands':>8} {'server CPU, us':>15} {'GETs':>5}  the commands")
    for label, found in rows.items():
        scripts, inner, spent = (statistics.median(x[i] for x in found) for i in range(3))
        mix = found[-1][3]
        low, high = min(x[2] for x in found), max(x[2] for x in found)
        print(f"{label:38} {scripts:7g} {inner:8g} {spent:6.0f} ({low:.0f}-{high:.0f}) {spent / get:5.0f}  {mix}")


if __name__ == "__main__":
    main()
