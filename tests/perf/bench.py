"""`make bench`: every benchmark in one run against one Redis of its own, one table, one JSON file.

Run: .venv/bin/python tests/perf/bench.py   (BENCH_REDIS_URL to use a given server; else an embedded Valkey)
Runs, one after another, each in a fresh interpreter (each sets up logging and metrics as it needs):
  bench_scripts.py     round trips per call, script throughput against plain ZADD, the naive design, memory per user
  bench_request.py     the project's own Python per request against the bare script call
  bench_pump.py        admissions under 8 concurrent pumps, slots under 30 % abandonment, Redis time of a tick
  bench_authorizer.py  entry-token verifications against a bare HMAC-SHA256
  bench_cold_start.py  importing the app against importing its dependencies
Each also runs on its own and writes build/bench_<name>.json; this prints the summary table and writes
build/bench.json. Every ratio is measured within one run, in turns, so that it means something on a shared
machine; the load average is printed with it.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time

import benchlib  # beside this file

HERE = benchlib.ROOT / "tests" / "perf"
BENCHES = ("scripts", "request", "pump", "authorizer", "cold_start")


def run(name: str, url: str) -> tuple[dict, float]:
    started = time.monotonic()
    print(f"  bench_{name}.py ...", end="", flush=True, file=sys.stderr)
    done = subprocess.run([sys.executable, str(HERE / f"bench_{name}.py")], env={**os.environ, "REDIS_URL": url},
                          capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"\nbench_{name}.py failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    print(f" {seconds:.0f} s", file=sys.stderr)
    return json.loads((benchlib.BUILD / f"bench_{name}.json").read_text()), seconds


def rows(r: dict) -> list[tuple[str, str, str, bool | None]]:
    """(measure, result, target, met) for the table; met is None where there is no target."""
    found: list[tuple[str, str, str, bool | None]] = []

    def add(measure, result, target="", met=None):
        found.append((measure, result, target, met))

    scripts, request, pump, authorizer, cold = (r[name] for name in BENCHES)
    add("REDIS ROUND TRIPS PER CALL (client socket sends)", "")
    for name, sends in scripts["round_trips"].items():
        if name.startswith("naive"):
            add(f"  {name} (separate commands)", str(sends))
        elif name.startswith("pump"):
            # Per tick: keep the lock, read the registry, then one pipeline for every target's evict and admit.
            targets = 10 if "10 targets" in name else 1
            add(f"  {name} (lock, registry, 1 pipeline)", f"{sends} = {sends / targets:.1f} per target",
                "1 per target" if targets > 1 else "", sends / targets <= 1 if targets > 1 else None)
        elif "registers" in name or "restore" in name:
            add(f"  {name}", str(sends), "2 (by design)", sends == 2)
        else:
            add(f"  {name}", str(sends), "1", sends == 1)

    tp = scripts["throughput"]
    add(f"SCRIPT THROUGHPUT, redis-benchmark -c {scripts['connections']}, random users: requests/s, x plain ZADD "
        f"(and x ZADD by server CPU per request)", "")
    add("  ZADD key <random> member:<random> (baseline)", f"{tp['ZADD (baseline)']['per_second']:,.0f}/s")
    for name in ("enter", "status", "leave", "consume"):
        row = tp[name]
        add(f"  {name}.lua (EVALSHA)", f"{row['per_second']:,.0f}/s  {row['x_zadd']:.2f}x  ({row['x_zadd_by_cpu']:.2f}x)",
            ">= 0.5x", row["x_zadd"] >= 0.5)
    for name in ("naive status: waiting", "naive status: admitted by this call"):
        row = tp[name]
        add(f"  {name} ({row['commands']} commands, not pipelined)",
            f"{row['per_second']:,.0f}/s  {row['x_zadd']:.2f}x  ({row['x_zadd_by_cpu']:.2f}x)")
    gain = tp["status"]["per_second"] / tp["naive status: waiting"]["per_second"]
    add("  status.lua against the naive waiting poll", f"{gain:.1f}x the polls/s")

    add("OWN PYTHON PER REQUEST: Lambda handler on an API Gateway event minus the bare script call, "
        "x the bare call (and the same in CPU time)", "")
    for name, row in request["requests"].items():
        add(f"  {name}", f"{row['own_python_us']:.0f} us / {row['bare_us']:.0f} us = {row['own_x_bare']:.2f}x  "
            f"({row['cpu']['own_x_bare']:.2f}x)", "<= 0.5x", row["own_x_bare"] <= 0.5)

    memory = scripts["memory"]
    add("MEMORY", "")
    add(f"  per waiting user, {memory['users']:,} in one target (used_memory delta)",
        f"{memory['bytes_per_user']:.0f} bytes", "<= 250 bytes", memory["bytes_per_user"] <= 250)

    add("PUMP", "")
    for mode in pump["concurrent_pumps"]:
        add(f"  8 concurrent pumps, {mode['mode']}: admissions per tick",
            f"{mode['admissions_per_tick']:.1f} = {mode['ratio_to_batch']:.3f}x batch", "1.000x batch",
            abs(mode["ratio_to_batch"] - 1) < 0.005)
    abandon = pump["abandonment"]
    add("  30 % abandonment: admissions to users still waiting", f"{abandon['this design']['share']:.1%}", "100 %",
        abandon["this design"]["share"] == 1)
    add("  30 % abandonment, naive mark (mark += batch)", f"{abandon['naive mark']['share']:.1%}")
    timing = pump["redis_time"][0]
    add(f"  Redis time of one tick, {timing['users_waiting']:,} waiting (evict + admit)",
        f"{timing['tick_us_total']:.0f} us")

    ratios, per_second = authorizer["ratio_to_bare_hmac"], authorizer["per_second"]
    add(f"AUTHORIZER (x bare HMAC-SHA256: {authorizer['baseline']}, {per_second['bare_hmac_sha256']:,}/s)", "")
    add("  check_entry (the verification)", f"{per_second['check_entry']:,}/s  {ratios['check_entry']:.2f}x",
        ">= 0.5x", ratios["check_entry"] >= 0.5)
    add("  gate.authorize (ARN, headers, verification, policy)",
        f"{per_second['gate_authorize']:,}/s  {ratios['gate_authorize']:.2f}x")
    add("  purchase_authorizer handler (with Powertools)",
        f"{per_second['authorizer_handler']:,}/s  {ratios['authorizer_handler']:.2f}x", ">= 0.5x",
        ratios["authorizer_handler"] >= 0.5)

    add("COLD START: import in a fresh interpreter, CPU time (and wall time)", "")
    for row in cold["runs"]:
        add(f"  import app, tracing {'on' if row['tracing'] else 'off'}, x its dependencies",
            f"{row['app_ms']:.0f} ms / {row['dependencies_ms']:.0f} ms = {row['ratio']:.2f}x  "
            f"({row['wall']['ratio']:.2f}x)", "<= 1.2x",
            row["ratio"] <= 1.2)
    return found


def main() -> None:
    if shutil.which("redis-benchmark") is None:
        sys.exit("make bench needs redis-benchmark, which comes with the Redis command-line tools:\n"
                 "  Debian/Ubuntu: sudo apt-get install -y redis-tools\n"
                 "  macOS:         brew install redis")
    os.environ.pop("REDIS_URL", None)  # a server of the benchmark's own, unless BENCH_REDIS_URL names one
    if os.environ.get("BENCH_REDIS_URL"):
        os.environ["REDIS_URL"] = os.environ["BENCH_REDIS_URL"]
    started = time.monotonic()
    print("running the benchmarks (a few minutes):", file=sys.stderr)
    with benchlib.redis_url() as url:
        from redis import Redis

        server = benchlib.server_version(Redis.from_url(url))
        load_before = os.getloadavg()
        results, seconds = {}, {}
        for name in BENCHES:
            results[name], seconds[name] = run(name, url)
    load = [round(max(a, b), 2) for a, b in zip(load_before, os.getloadavg())]

    table = rows(results)
    width = max(len(measure) for measure, result, *_ in table if result) + 2
    print(f"\nvirtual-queue benchmarks: {server}, Python {platform.python_version()}, {os.cpu_count()} cores, "
          f"load average {load[0]} (1 min), {time.monotonic() - started:.0f} s")
    for measure, result, target, met in table:
        if not result:  # a section
            print(f"\n{measure}")
            continue
        verdict = "" if met is None else ("ok" if met else "MISSED")
        print(f"{measure:<{width}}{result:<42}{target:<16}{verdict}")
    out = benchlib.write_json("bench.json", {
        "server": server, "python": platform.python_version(), "cores": os.cpu_count(), "load_average": load,
        "seconds": seconds,
        "table": [{"measure": m.strip(), "result": res, "target": t, "met": met} for m, res, t, met in table],
        **results,
    })
    print(f"\nwrote {out.relative_to(benchlib.ROOT)} (and build/bench_<name>.json per benchmark)")


if __name__ == "__main__":
    main()
