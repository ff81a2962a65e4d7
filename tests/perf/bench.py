"""`make bench`: every benchmark in one run against one Redis of its own, one table, one JSON file, and the figures of
docs/benchmarks.md.

Run: .venv/bin/python tests/perf/bench.py   (REDIS_URL, if set, names a jemalloc server for the memory figure)
     .venv/bin/python tests/perf/bench.py --quick    every benchmark with tiny sizes and one round (about a minute,
                                                     `make test`): shows they all still run; figures mean nothing
     .venv/bin/python tests/perf/bench.py --render   docs/benchmarks.md's figures again from build/bench.json
Runs, one after another against an embedded Valkey of this run's own, each in a fresh interpreter:
  bench_scripts.py     round trips per call; server CPU per call against ZADD and against the naive pipeline,
                       and the server's instructions per call (callgrind, when valgrind is installed);
                       memory per waiting user (here, and on REDIS_URL's server: the machine's Redis 7, jemalloc)
  bench_request.py     handler CPU per request, by component, against a minimal Chalice route
  bench_pump.py        admissions under 8 concurrent pumps, slots under 30 % abandonment, a 100-target tick
  bench_authorizer.py  entry-token verifications against a bare HMAC-SHA256
  bench_cold_start.py  the real package's import, with and without bytecode, against its dependencies alone
  bench_line.py        /line's Redis commands; the pump's tick at 1,000,000 waiting against 10,000
  bench_events.py      the outbox: a call's server time with events on against off, publishing rate and delay,
                       outbox memory
  bench_arrivals.py    one target's enters over a 3-node cluster of its own as its line spans 1, 2, 3 sub-lines:
                       each node's share and server CPU per enter, the ceiling they give, the wall clock
  bench_shards.py      one pump tick of one target as its line spans 1, 2, 3, 8 sub-lines: Redis and wall time
Each also runs on its own and writes build/bench_<name>.json; this prints the summary table, writes
build/bench.json and puts the table in docs/benchmarks.md (between its markers), with the date and the command. A
quick run writes build/quick/ instead, and fails if the page's table has other sections than the benchmarks print.
Every comparison takes at least 7 alternating rounds, each with its load average; the table shows the median and
the range over the rounds, and gives a verdict only where the whole range is on one side of the target; a figure a
run could not measure says so ("not measured"), never "MISSED".
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

import benchlib  # beside this file

HERE = benchlib.ROOT / "tests" / "perf"
PAGE = benchlib.ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- figures: written by make bench from build/bench.json -->", "<!-- end of the figures -->"
BENCHES = ("scripts", "request", "pump", "authorizer", "cold_start", "events", "line", "arrivals", "shards")
STATUS_MOST_US = 25  # the design's bound on status.lua's server CPU per poll
NOT_MEASURED = "not measured"


def run(name: str, url: str, quick: bool) -> tuple[dict, float]:
    started = time.monotonic()
    print(f"  bench_{name}.py ...", end="", flush=True, file=sys.stderr)
    done = subprocess.run(
        [sys.executable, str(HERE / f"bench_{name}.py")],
        env={**os.environ, "BENCH_REDIS_URL": url, "BENCH_QUICK": "1" if quick else ""},
        capture_output=True,
        text=True,
    )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"\nbench_{name}.py failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    print(f" {seconds:.0f} s", file=sys.stderr)
    return json.loads((out_folder(quick) / f"bench_{name}.json").read_text()), seconds


def out_folder(quick: bool):
    return benchlib.BUILD / "quick" if quick else benchlib.BUILD


def rows(r: dict) -> list[tuple[str, str, str, str | None]]:
    """(measure, result, target, verdict) for the table; a verdict only where every round agrees on it."""
    found: list[tuple[str, str, str, str | None]] = []
    shown = benchlib.shown

    def add(measure, result="", target="", verdict=None):
        found.append((measure, result, target, verdict))

    def section(title, load=None):
        add(title + (f"  (load average {load['min']}-{load['max']})" if load else ""))

    scripts, request, pump, authorizer, cold, events, line, arrivals, shards = (r[name] for name in BENCHES)
    section("REDIS ROUND TRIPS PER CALL (client socket sends)")
    for name, sends in scripts["round_trips"].items():
        if name.startswith("naive"):
            add(f"  {name} (separate commands)", str(sends))
        elif name.startswith("pump"):
            # Per tick: keep the lock, read the registry, then one pipeline for every target's evict and admit.
            targets = 10 if "10 targets" in name else 1
            add(
                f"  {name} (lock, registry, 1 pipeline)",
                f"{sends} = {sends / targets:.1f} per target",
                "1 per target" if targets > 1 else "",
                ("ok" if sends / targets <= 1 else "MISSED") if targets > 1 else None,
            )
        elif "registers" in name:
            add(f"  {name}", str(sends), "2 (by design)", "ok" if sends == 2 else "MISSED")
        elif name.startswith("purchase"):
            # By design: the outcome is noted (shop health, the purchase's event) only once the shop has answered,
            # after the consume; a purchase the shop did not take restores its token in between.
            designed = 3 if "restore" in name else 2
            add(f"  {name}", str(sends), f"{designed} (by design)", "ok" if sends == designed else "MISSED")
        else:
            add(f"  {name}", str(sends), "1", "ok" if sends == 1 else "MISSED")

    calls = scripts["calls"]
    section(
        f"REDIS SERVER CPU PER CALL, pipelined (-P {scripts['pipeline']}): commandstats usec_per_call; process CPU",
        scripts["load_average"],
    )
    add("  ZADD key <random> member:<random> (baseline)", shown(calls["ZADD (baseline)"]["usec_per_call"], " us", 1))
    for name in ("enter", "status", "leave", "consume", "tick"):
        row = calls[name]
        add(f"  {name}{'' if name == 'tick' else '.lua'}: usec_per_call x ZADD", shown(row["x_zadd"], "x", 1))
    for name in ("status", "enter"):
        row, naive = calls[name], calls[f"naive {name}"]
        # The server process's CPU: usec_per_call of separate commands leaves out reading and parsing each of them
        # off the socket, which EVALSHA's figure pays once for all its commands. No verdict: the budget is judged on
        # the count, against the script's floor (below), which a shared machine's load does not move.
        add(f"  {name}.lua: server CPU per call x its naive pipeline", shown(row["x_naive"]))
        add("    the same by usec_per_call (execution only)", shown(row["x_naive_usec"]))
        # status.lua is also held to a time: the most one poll may cost a server core.
        most = STATUS_MOST_US if name == "status" else None
        add(
            f"    {name}.lua",
            shown(row["cpu_us_per_call"], " us", 1),
            f"<= {most} us" if most else "",
            benchlib.verdict(row["cpu_us_per_call"], most) if most else None,
        )
        add(
            f"    naive {name}: its {len(naive['commands'])} commands pipelined",
            shown(naive["cpu_us_per_call"], " us", 1),
        )
    for name in ("status", "enter", "ZADD (baseline)"):
        add(f"  {name}: pipelined calls/s per server core", shown(calls[name]["calls_per_second_per_core"], "", 0))
    counted = scripts.get("instructions")
    if not counted:
        add("  server instructions per call (callgrind)", f"{NOT_MEASURED}: needs valgrind")
    else:
        # Counted, not timed: the same in every run, so it shows what a script change costs on a busy machine.
        add(f"  server instructions per call (callgrind, {counted['server']}; user space only)")
        for name in ("status", "enter"):
            row, naive = counted["calls"][name], counted["calls"][f"naive {name}"]
            floor = counted["calls"][f"floor {name}"]
            add(
                f"    {name}.lua x its naive pipeline",
                f"{row['x_naive']:.2f}x ({row['instructions_per_call']:,} / {naive['instructions_per_call']:,})",
            )
            # The least a script running those very commands costs: below it no script can go.
            add(
                "      its floor (the same commands, from a script that does nothing else) x the naive pipeline",
                f"{floor['x_naive']:.2f}x ({floor['instructions_per_call']:,})",
            )
            target = counted["target_x_floor"][name]
            add(
                f"      {name}.lua x its floor",
                f"{row['x_floor']:.2f}x",
                f"<= {target:g}x",
                "ok" if row["x_floor"] <= target else "MISSED",
            )

    section("HANDLER CPU PER REQUEST, x a minimal Chalice route making the same script call", request["load_average"])
    for name, row in request["requests"].items():
        add(
            f"  {name}: handler x minimal route",
            shown(row["x_floor"]),
            "<= 1.5x" if name == "status" else "",
            row.get("verdict"),
        )
        add("    handler", shown(row["handler_cpu_us"], " us", 0))
        add("    minimal Chalice route", shown(row["floor_cpu_us"], " us", 0))
        for component, figure in row["components_us"].items():
            add(f"    {component}", shown(figure, " us", 1))
        add("    Redis wait (wall time)", shown(row["redis_wait_us"], " us", 1))
        if "hiredis_saves_us" in row:
            add("    hiredis saves (against pure-Python redis-py)", shown(row["hiredis_saves_us"], " us", 1))

    identity = request["identity"]
    section(
        f"STATUS POLL BY IDENTITY MODE: handler CPU, x header mode (RS256 JWT of {identity['size_bytes_jwt']} bytes)"
    )
    add("  header (X-User-Id)", shown(identity["handler_cpu_us"]["header"], " us", 0))
    add(
        "  jwt, verified tokens cached per container (deployed)",
        shown(identity["x_header"]["jwt"]),
        f"<= {identity['target_ratio']}x",
        identity["verdict"],
    )
    add("    handler", shown(identity["handler_cpu_us"]["jwt"], " us", 0))
    add("  jwt, verifying every poll (no cache)", shown(identity["x_header"]["jwt, no cache"]))
    add("    handler", shown(identity["handler_cpu_us"]["jwt, no cache"], " us", 0))

    section("MEMORY PER WAITING USER (100,000 in one target, MEMORY USAGE of its sorted sets)")
    for row in scripts["memory"]:
        deployed = row["allocator"].startswith("jemalloc")
        add(
            f"  {row['server']} ({row['allocator']}){', as deployed (ElastiCache)' if deployed else ''}",
            f"{row['bytes_per_user']:.0f} bytes",
            "<= 250 bytes" if deployed else "",
            ("ok" if row["bytes_per_user"] <= 250 else "MISSED") if deployed else None,
        )
    if not any(row["allocator"].startswith("jemalloc") for row in scripts["memory"]):
        add(
            "  a jemalloc server, as deployed",
            f"{NOT_MEASURED}: point REDIS_URL at one (the machine's Redis 7)",
            "<= 250 bytes",
            NOT_MEASURED,
        )

    section("PUMP")
    for mode in pump["concurrent_pumps"]:
        add(
            f"  8 concurrent pumps, {mode['mode']}: admissions per tick",
            f"{mode['admissions_per_tick']:.1f} = {mode['ratio_to_batch']:.3f}x batch",
            "1.000x batch",
            "ok" if abs(mode["ratio_to_batch"] - 1) < 0.005 else "MISSED",
        )
    abandon = pump["abandonment"]
    add(
        "  30 % abandonment: admissions to users still waiting",
        f"{abandon['this design']['share']:.1%}",
        "100 %",
        "ok" if abandon["this design"]["share"] == 1 else "MISSED",
    )
    add("  30 % abandonment, naive mark (mark += batch)", f"{abandon['naive mark']['share']:.1%}")
    tick = pump["tick_100_targets"]
    add(
        f"  one tick, {tick['targets']} targets x {tick['users_per_target']:,} waiting, one mass departure: Redis",
        shown(tick["redis_us"], " us", 0),
    )
    add("    the pump's CPU (gauges written)", shown(tick["client_cpu_us"], " us", 0))
    add("    the pump's wall time", shown(tick["client_wall_us"], " us", 0))
    opened = pump["opening"]
    tick_s = 1.0  # bench_pump.py's opening ticks every second
    add(
        f"  the opening of {opened['pre_queued']:,} pre-queued: first batch admitted after",
        f"{opened['first_batch_s']} s ({opened['ticks_to_first_batch']} ticks)",
        "within 1 tick",
        "ok" if opened["ticks_to_first_batch"] == 1 and opened["first_batch_s"] <= tick_s else "MISSED",
    )
    add(
        "    its longest Redis command (SLOWLOG)",
        f"{opened['longest_command_ms']} ms ({opened['longest_command']})",
        "<= 50 ms",
        "ok" if opened["longest_command_ms"] <= 50 else "MISSED",
    )
    add("    the pump's memory growth (ru_maxrss)", f"{opened['pump_rss_growth_mb']} MB")

    ratios, per_second = authorizer["ratio_to_bare_hmac"], authorizer["per_second"]
    section(
        f"AUTHORIZER (x bare HMAC-SHA256: {authorizer['baseline']}, {per_second['bare_hmac_sha256']:,}/s)",
        authorizer["load_average"],
    )
    # No target against the bare HMAC: the MAC is a fifth to a quarter of a verification; the rest is the strict
    # reading the token format asks for (bench_authorizer.py).
    add("  keyed HMAC (the MAC as the token module computes it)", shown(ratios["keyed_hmac"], "x", 3))
    add("  check_entry (the verification)", shown(ratios["check_entry"], "x", 3))
    add("  gate.authorize (ARN, headers, verification, policy)", shown(ratios["gate_authorize"], "x", 3))
    add("  purchase_authorizer handler", shown(ratios["authorizer_handler"], "x", 3))
    add(
        "    handler x gate.authorize (its body)",
        shown(authorizer["handler_x_authorize"], "x", 3),
        ">= 0.8x",
        benchlib.verdict(authorizer["handler_x_authorize"], least=authorizer["target_handler_x_authorize"]),
    )
    add("  gate.authorize in jwt mode, time x header mode (cached JWT)", shown(authorizer["jwt_time_x_header"]))
    add("    verifying the JWT every call", shown(authorizer["jwt_no_cache_time_x_header"]))

    section(
        f"COLD START of {cold['package']}, read-only, fresh `python -I`: CPU x its dependencies alone",
        cold["load_average"],
    )
    for variant, row in cold["runs"].items():
        # The verdict takes the one-interpreter ratio (bench_cold_start.py): the dependencies, then the app over them.
        add(
            f"  {variant}: app over its dependencies, one interpreter ({shown(row['own_ms'], ' ms', 0)} own)",
            shown(row["x_dependencies_one_interpreter"]),
            "<= 1.2x" if variant == "with bytecode" else "",
            row.get("verdict"),
        )
        add(
            f"    {shown(row['app_ms'], ' ms', 0)} alone x its dependencies alone, two interpreters",
            shown(row["x_dependencies"]),
        )
        add(f"    bytecode {row['bytecode']}; dependencies alone", shown(row["dependencies_ms"], " ms", 0))

    section("EVENTS: a call's server time (EVALSHA usec_per_call), events on x off", events["load_average"])
    for name, row in events["client_costs"].items():
        add(f"  {name}", shown(benchlib.ratios(row["on"], row["off"])))
        add("    off", shown(benchlib.spread(row["off"]), " us", 1))
        add("    on", shown(benchlib.spread(row["on"]), " us", 1))
        add(
            "    round trips per call, off -> on",
            f"{statistics.median(row['round_trips_off']):.2f} -> {statistics.median(row['round_trips_on']):.2f}",
        )
    for name, rate in events["publish_per_s"].items():
        add(f"  events published per second, to {name}", f"{rate:,.0f}")
    for kind, row in events["delays"].items():
        add(
            f"  change to publication, {kind} (pump ticking every 1 s)",
            f"p50 {row['p50_ms']:.0f} ms, p95 {row['p95_ms']:.0f} ms",
        )
    for server, used in events["memory_per_1000_events"].items():
        add(f"  outbox memory per 1,000 events, {server}", f"{used:,.0f} bytes")

    small, large = line["sizes"]
    section("EDGE LINE: /line's Redis commands; one pump tick's Redis time as the line grows", line["load_average"])
    for size, row in line["served"].items():
        sent = row["commands"]
        add(f"  /line with {int(size):,} waiting", " ".join(sent), "1 GET", "ok" if sent == ["GET"] else "MISSED")
    for size, figure in line["tick_us"].items():
        add(f"  tick with {int(size):,} waiting", shown(figure, " us", 0))
    add(
        f"  tick with {large:,} x with {small:,}",
        shown(line["tick_large_x_small"]),
        f"<= {line['most_x']}x",
        benchlib.verdict(line["tick_large_x_small"], line["most_x"]),
    )
    return found + arrivals_rows(arrivals) + shards_rows(shards)


def shards_rows(shards: dict) -> list[tuple[str, str, str, str | None]]:
    """bench_shards.py's section: one pump tick of one target as its line spans more sub-lines (no target: what a
    sub-line costs, each on its own node when deployed; here all on one server)."""
    shown = benchlib.shown
    load = shards["load_average"]
    found: list[tuple[str, str, str, str | None]] = [
        (
            f"SHARDED TICK: one pump tick of one target of {shards['waiting']:,} waiting, batch {shards['batch']}, "
            f"its sub-lines on one server  (load average {load['min']}-{load['max']})",
            "",
            "",
            None,
        )
    ]
    for count, redis_us in shards["tick_redis_us"].items():
        found.append((f"  {count} sub-line(s): Redis time per tick", shown(redis_us, " us", 0), "", None))
        found.append(("    the pump's wall time per tick", shown(shards["tick_wall_us"][count], " us", 0), "", None))
        if count in shards["redis_x_one_line"]:
            found.append(("    Redis time x one line", shown(shards["redis_x_one_line"][count]), "", None))
    return found


def arrivals_rows(arrivals: dict) -> list[tuple[str, str, str, str | None]]:
    """bench_arrivals.py's section: per shard count, what each node takes of one target's enters and at what server
    CPU, the ceiling that gives (1e6 / us per enter / the busiest node's share), and the wall clock here."""
    shown = benchlib.shown
    load = arrivals["load_average"]
    found: list[tuple[str, str, str, str | None]] = [
        (
            f"ONE TARGET ACROSS SHARDS: its enters on a {arrivals['nodes']}-node cluster, {arrivals['clients']} "
            f"clients x {arrivals['pipeline']} in flight  (load average {load['min']}-{load['max']})",
            "",
            "",
            None,
        )
    ]
    within = arrivals["share_within"]
    for shards, row in arrivals["shards"].items():
        shares = " / ".join(f"{node['share']['median']:.3f}" for node in row["nodes"].values())
        found += [
            (
                f"  {shards} sub-line(s) on {row['nodes_used']} node(s): each node's share of the enters",
                shares,
                "",
                None,
            ),
            (
                "    the farthest share from 1/N",
                shown(row["share_off_even"], "", 3),
                f"<= {within}",
                benchlib.verdict(row["share_off_even"], within),
            ),
            (
                "    server CPU per enter, the process's (user + sys)",
                shown(row["cpu_us_per_enter"], " us", 1),
                "",
                None,
            ),
            ("    server CPU per enter, commandstats usec", shown(row["usec_per_enter"], " us", 1), "", None),
            (
                "    ceiling, arrivals/s: 1e6 / CPU per enter / busiest share",
                shown(row["ceiling_cpu_per_s"], "", 0),
                "",
                None,
            ),
            ("      by commandstats usec", shown(row["ceiling_per_s"], "", 0), "", None),
            (
                "    wall clock here (2 cores for nodes and clients): enters/s",
                shown(row["enters_per_s"], "", 0),
                "",
                None,
            ),
        ]
    most = max(arrivals["shards"], key=int)
    # Judged by the process's CPU: commandstats' usec is timed by the clock, so it also counts a node's waits for a
    # core of this machine (bench_arrivals.py).
    found += [
        (
            f"  server CPU per enter, {most} sub-lines x 1",
            shown(arrivals["cost_x"]),
            f"<= {arrivals['most_cost_x']}x",
            benchlib.verdict(arrivals["cost_x"], arrivals["most_cost_x"]),
        ),
        ("    by commandstats usec", shown(arrivals["cost_x_usec"]), "", None),
        (
            f"  ceiling, {most} sub-lines x 1",
            shown(arrivals["ceiling_x"]),
            f">= {arrivals['least_ceiling_x']}x",
            benchlib.verdict(arrivals["ceiling_x"], least=arrivals["least_ceiling_x"]),
        ),
        ("    by commandstats usec", shown(arrivals["ceiling_x_usec"]), "", None),
    ]
    return found


def sections(table: list) -> list[str]:
    """The table's section titles, their leading capitals only (what follows holds figures)."""
    titles = [measure.strip() for measure, result, *_ in table if not result]
    return [re.match(r"[A-Z][A-Z ]*[A-Z]", title)[0] for title in titles if title[:2].isupper()]


def table_of(table: list) -> list[dict]:
    """The table's rows as build/bench.json keeps them."""
    return [{"measure": m.strip(), "result": res, "target": t, "verdict": v} for m, res, t, v in table]


def page_table(summary: dict) -> str:
    """docs/benchmarks.md's figures: when, how and where they were measured, and the table."""
    loads = [load for name in BENCHES for load in summary[name].get("load_average", {}).get("rounds", [])]
    lines = [
        f"Measured on {summary['date']} by `{summary['command']}`: {summary['server']} of the run's own, Python "
        f"{summary['python']}, {summary['cores']} cores, {sum(summary['seconds'].values()):.0f} s, load average "
        f"{min(loads)}-{max(loads)}. Median [range] over {benchlib.FULL_ROUNDS} or more alternating rounds.",
        "",
        "| measure | result | target | verdict |",
        "|---|---|---|---|",
    ]
    for row in summary["table"]:
        # Markdown would read `<random>` or `<= 1.5x` as the start of an HTML tag.
        measure, result, target = (row[k].replace("<", "&lt;") for k in ("measure", "result", "target"))
        if not result:
            lines.append(f"| **{measure}** | | | |")
        else:
            lines.append(f"| {measure} | {result} | {target} | {row['verdict'] or ''} |")
    return "\n".join(lines) + "\n"


def write_page(summary: dict) -> None:
    text = PAGE.read_text()
    head, tail = text[: text.index(BEGIN) + len(BEGIN)], text[text.index(END) :]
    PAGE.write_text(f"{head}\n{page_table(summary)}{tail}")


def check_page(table: list) -> None:
    """A quick run's sections against the page's: a benchmark added or dropped needs the page measured again."""
    text = PAGE.read_text()
    shown = re.findall(r"^\| \*\*(.+?)\*\* \|", text[text.index(BEGIN) : text.index(END)], re.M)
    if sections([(measure, "") for measure in shown]) != sections(table):
        sys.exit(
            f"docs/benchmarks.md shows the sections {sections([(m, '') for m in shown])}, the benchmarks print "
            f"{sections(table)}: run make bench (REDIS_URL=redis://127.0.0.1:6379/0 for the jemalloc figure)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description="Measure the performance targets (docs/benchmarks.md).")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round: only shows every benchmark runs")
    parser.add_argument("--render", action="store_true", help="write the page's figures from build/bench.json")
    args = parser.parse_args()
    if args.render:
        summary = json.loads((benchlib.BUILD / "bench.json").read_text())
        write_page({**summary, "table": table_of(rows(summary))})
        return
    if shutil.which("redis-benchmark") is None:
        sys.exit(
            "make bench needs redis-benchmark, which comes with the Redis command-line tools:\n"
            "  Debian/Ubuntu: sudo apt-get install -y redis-tools\n"
            "  macOS:         brew install redis"
        )
    started = time.monotonic()
    print(f"running the benchmarks ({'quick' if args.quick else 'a few minutes'}):", file=sys.stderr)
    with benchlib.redis_url() as url:
        from redis import Redis

        server = benchlib.server_version(Redis.from_url(url))
        results, seconds = {}, {}
        for name in BENCHES:
            results[name], seconds[name] = run(name, url, args.quick)

    table = rows(results)
    width = max(len(measure) for measure, result, *_ in table if result) + 2
    rounds = benchlib.QUICK_ROUNDS if args.quick else benchlib.FULL_ROUNDS
    print(
        f"\nvirtual-queue benchmarks{' (quick: the figures mean nothing)' if args.quick else ''}: {server} of this "
        f"run's own, Python {platform.python_version()}, {os.cpu_count()} cores, {time.monotonic() - started:.0f} s; "
        f"median [range] over {rounds} or more alternating rounds"
    )
    for measure, result, target, verdict in table:
        if not result:  # a section
            print(f"\n{measure}")
            continue
        print(f"{measure:<{width}}{result:<32}{target:<14}{verdict or ''}")
    command = "make bench" + (" (quick)" if args.quick else "")
    summary = {
        "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
        "command": (f"REDIS_URL={os.environ['REDIS_URL']} " if os.environ.get("REDIS_URL") else "") + command,
        "server": server,
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "seconds": seconds,
        "table": table_of(table),
        **results,
    }
    out = out_folder(args.quick) / "bench.json"
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\nwrote {out.relative_to(benchlib.ROOT)} (and bench_<name>.json per benchmark beside it)")
    if args.quick:
        check_page(table)
    else:
        write_page(summary)
        print(f"wrote the figures of {PAGE.relative_to(benchlib.ROOT)}")


if __name__ == "__main__":
    main()
