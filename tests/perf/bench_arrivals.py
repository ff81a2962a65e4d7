"""Benchmark: how many arrivals a second one target takes as its line spans 1, 2 and 3 sub-lines (docs/sharding.md)
over a 3-node Valkey cluster.

Run: .venv/bin/python tests/perf/bench_arrivals.py   (a 3-node cluster of its own, whatever BENCH_REDIS_URL says:
     the figures are per node)
Each measure opens one target whose line spans N sub-lines (its configuration written on every sub-line), then
CLIENTS client processes, each with PIPELINE enters in flight as that many concurrent Lambdas would have, put
ENTERS new users in line: each user's enter.lua call goes to their sub-line (`shard_of`), built as the store builds
it (`enter_call`). It reads, per node:
  - the enters it served (calls of EVALSHA in INFO commandstats): its share, which should be 1/N on N nodes;
  - the server's CPU per enter: commandstats' usec per call (the scripts' execution), and the process's CPU
    (INFO cpu, user + sys: also reading, parsing and answering the calls);
and the wall clock's enters per second. The measures alternate over at least 7 rounds (median and range).

This machine has 2 cores for the 3 nodes and the clients, so the wall clock cannot show the cluster scaling: it
shows what the clients' Python manages here. What scales is the busiest node's load: a node saturates when its one
core is busy, so the target's ceiling is min over the nodes used of (1e6 / its usec per enter) / (its share of the
enters), which is (1e6 / usec per enter) x N when each of N nodes takes 1/N at the same cost per enter.
Prints a table and writes build/bench_arrivals.json. Targets: every node used takes 1/N of the enters (within
10 %), the cost per enter at 3 shards within 1.25x of 1 shard's, the ceiling at 3 shards at least 2.5x 1 shard's,
both judged by the process's CPU (commandstats' usec, timed by the clock, also counts a node's waits for a core
of this shared machine; it is shown beside them).
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import benchlib  # noqa: E402  (beside this file)

os.environ.update({**benchlib.BASE_ENV, "POWERTOOLS_METRICS_DISABLED": "1"})

from redis import RedisCluster  # noqa: E402

from chalicelib import opening  # noqa: E402
from chalicelib.queue_keys import QueueKeys  # noqa: E402
from chalicelib.redis_connection import _ScriptKeys  # noqa: E402
from chalicelib.scripts import Call, run_pipelined  # noqa: E402
from chalicelib.store import Defaults, QueueStore  # noqa: E402
from chalicelib.target_config import TargetConfig  # noqa: E402
from chalicelib.targets import Target  # noqa: E402
from chalicelib.tokens import GrantTerms  # noqa: E402
from tests.support.redis_servers import ValkeyCluster  # noqa: E402

NODES = 3
SHARD_COUNTS = (1, 2, 3)
CLIENTS = benchlib.scaled(3, 2)  # client processes
PIPELINE = benchlib.scaled(50, 10)  # enters in flight per client process
ENTERS = benchlib.scaled(60_000, 600)  # new users per measure, over all the clients
DEFAULTS = Defaults(max_waiting=10_000_000, batch=100, tick_ms=1000, idle_ttl_ms=3_600_000)
ID_PREFIX = "9b2f6c1e-4a7d-4c3b-8e5f-"  # 36-character ids, as bench_scripts.py's
SHARE_WITHIN = 0.10  # each node used takes 1/N of the enters, within this share of 1/N
MOST_COST_X = 1.25  # enter's server CPU at 3 shards, at most this many times 1 shard's
LEAST_CEILING_X = 2.5  # the ceiling at 3 shards, at least this many times 1 shard's


def enter_call(store: QueueStore, target: Target, shards: int, user_id: str, now_ms: int, terms: GrantTerms) -> Call:
    """`user_id`'s enter into `target`'s line of `shards` sub-lines, as `QueueStore.enter` sends it. The registry
    write a sub-line's first enter asks for (`register`) is left out: once a minute, and not on a sub-line."""
    return store.enter_call(target, shards, user_id, now_ms, terms, DEFAULTS)


def open_line(store: QueueStore, target: Target, shards: int, now_ms: int) -> None:
    """Open the target over `shards` sub-lines as an operator does (every sub-line's configuration)."""
    store.configure(target, TargetConfig(shards=shards), now_ms, fresh_seed=opening.new_seed())


def spread_target(cluster: ValkeyCluster, client: RedisCluster) -> Target:
    """The first limited drop whose NODES sub-lines lie on NODES different nodes: the figures here are those of a
    line spread over every node it spans. Sub-line tags are chosen a window of the slot space each
    (chalicelib/queue_keys.py), so on slots split evenly it is the first, unless its sub-line 0's slot lies on a
    window's edge."""
    for target_id in range(1, 10_000):
        target = Target("limited-drop", target_id)
        slots = [client.keyslot(QueueKeys("p", target, shard, NODES).waiting) for shard in range(NODES)]
        if len({cluster.owner(slot) for slot in slots}) == NODES:
            return target
    raise RuntimeError("no target's sub-lines spread over every node")


def cluster_client(url: str) -> RedisCluster:
    """A cluster client that reads a script call's keys from the call, as the app's does (redis-py's own would ask a
    node `COMMAND GETKEYS` for every script: a command per enter more on that node), with timeouts a loaded machine
    cannot trip (benchlib.patient_client)."""
    client = RedisCluster.from_url(url, decode_responses=True, socket_timeout=30)
    client.commands_parser = _ScriptKeys(client.commands_parser)
    return client


# One client process: its cluster client, made once per process.
_worker: dict = {}


def _start_worker(url: str) -> None:
    _worker["client"] = cluster_client(url)


def _enters(task: tuple) -> tuple[float, dict]:
    """One client's share of a measure: `count` new users entering, PIPELINE at a time, from `start_at` (a clock
    every client reads, so that they start together). When it finished, and its replies' tags."""
    prefix, target, shards, client_number, count, start_at = task
    store = QueueStore(_worker["client"], prefix)
    tags: dict[str, int] = {}
    time.sleep(max(0.0, start_at - time.time()))
    for first in range(0, count, PIPELINE):
        now_ms = int(time.time() * 1000)
        terms = GrantTerms(now_ms // 1000 + 300, "0" * 64)
        users = (f"{ID_PREFIX}{client_number:02d}{n:010d}" for n in range(first, min(count, first + PIPELINE)))
        for reply in run_pipelined(store.client, [enter_call(store, target, shards, u, now_ms, terms) for u in users]):
            tag = reply[0] if isinstance(reply, list) else f"error: {reply}"
            tags[tag] = tags.get(tag, 0) + 1
    return time.time(), tags


def node_counters(cluster: ValkeyCluster) -> dict[int, dict]:
    """Per node: EVALSHA's calls and usec (INFO commandstats), and the process's CPU in us (INFO cpu)."""
    counters = {}
    for port in cluster.ports:
        admin = cluster.admin(port)
        evalsha = admin.info("commandstats").get("cmdstat_evalsha", {"calls": 0, "usec": 0})
        cpu = admin.info("cpu")
        used_us = (cpu["used_cpu_user"] + cpu["used_cpu_sys"]) * 1e6
        counters[port] = {"calls": evalsha["calls"], "usec": evalsha["usec"], "cpu_us": used_us}
    return counters


def measure(cluster: ValkeyCluster, client: RedisCluster, pool, target: Target, shards: int) -> dict:
    """One measure of `shards` sub-lines: wall-clock enters a second, and per node its share and CPU per enter."""
    prefix = benchlib.bench_prefix()
    store = QueueStore(client, prefix)
    open_line(store, target, shards, int(time.time() * 1000))
    before = node_counters(cluster)
    share = ENTERS // CLIENTS
    start_at = time.time() + 0.2
    done = pool.map(_enters, [(prefix, target, shards, n, share, start_at) for n in range(CLIENTS)])
    after = node_counters(cluster)
    tags: dict[str, int] = {}
    for _, counted in done:
        for tag, n in counted.items():
            tags[tag] = tags.get(tag, 0) + n
    if tags != {"WAITING": share * CLIENTS}:
        raise RuntimeError(f"every enter should put a new user in line; enter.lua answered {tags}")
    nodes = {}
    for port in cluster.ports:
        calls = after[port]["calls"] - before[port]["calls"]
        if calls:
            nodes[port] = {
                "enters": calls,
                "share": calls / (share * CLIENTS),
                "usec_per_enter": (after[port]["usec"] - before[port]["usec"]) / calls,
                "cpu_us_per_enter": (after[port]["cpu_us"] - before[port]["cpu_us"]) / calls,
            }
    for port in cluster.ports:
        benchlib.delete_prefix(cluster.admin(port), prefix)
    return {
        "enters_per_s": share * CLIENTS / (max(finished for finished, _ in done) - start_at),
        "nodes": nodes,
        "usec_per_enter": sum(n["usec_per_enter"] * n["share"] for n in nodes.values()),
        "cpu_us_per_enter": sum(n["cpu_us_per_enter"] * n["share"] for n in nodes.values()),
        # The busiest node saturates first: its core's enters a second over its share of the target's.
        "ceiling_per_s": min(1e6 / n["usec_per_enter"] / n["share"] for n in nodes.values()),
        "ceiling_cpu_per_s": min(1e6 / n["cpu_us_per_enter"] / n["share"] for n in nodes.values()),
    }


def summary(rounds: list[dict]) -> dict:
    """One shard count's rounds: the spread of each figure, and per node of its share and costs."""
    figures = ("enters_per_s", "usec_per_enter", "cpu_us_per_enter", "ceiling_per_s", "ceiling_cpu_per_s")
    result = {name: benchlib.spread([r[name] for r in rounds]) for name in figures}
    ports = sorted({port for r in rounds for port in r["nodes"]})
    result["nodes"] = {
        str(port): {
            name: benchlib.spread([r["nodes"][port][name] for r in rounds])
            for name in ("share", "usec_per_enter", "cpu_us_per_enter")
        }
        for port in ports
    }
    # Every round's shares, on every node used, against 1/N.
    shares = [n["share"] for r in rounds for n in r["nodes"].values()]
    result["nodes_used"] = len(ports)
    result["share_off_even"] = benchlib.spread([abs(s * len(ports) - 1) for s in shares])
    return result


def main() -> None:
    cluster = ValkeyCluster(nodes=NODES)
    try:
        client = cluster_client(cluster.url)
        version = benchlib.server_version(cluster.admin(cluster.ports[0]))
        target = spread_target(cluster, client)
        # The scripts on every node before any measure, so that none pays a NOSCRIPT and the script's text.
        store = QueueStore(client, "load")
        for port in cluster.ports:
            for script in (store._enter, store._configure):
                cluster.admin(port).script_load(script.script)
        context = multiprocessing.get_context("spawn")
        with context.Pool(CLIENTS, initializer=_start_worker, initargs=(cluster.url,)) as pool:
            measure(cluster, client, pool, target, max(SHARD_COUNTS))  # the clients' first calls
            values, loads = benchlib.alternating(
                {
                    shards: (lambda shards=shards: measure(cluster, client, pool, target, shards))
                    for shards in SHARD_COUNTS
                }
            )
    finally:
        cluster.stop()

    by_shards = {shards: summary(values[shards]) for shards in SHARD_COUNTS}
    least, most = min(SHARD_COUNTS), max(SHARD_COUNTS)

    def ratio(figure: str):
        return benchlib.ratios([r[figure] for r in values[most]], [r[figure] for r in values[least]])

    # Judged by the process's CPU: commandstats' usec is timed by the clock, so it also counts the time a node
    # waits for one of this machine's 2 cores in the middle of a script, which moves it 2x from round to round.
    cost_x, ceiling_x = ratio("cpu_us_per_enter"), ratio("ceiling_cpu_per_s")
    cost_x_usec, ceiling_x_usec = ratio("usec_per_enter"), ratio("ceiling_per_s")
    load = benchlib.loads(loads)
    shown = benchlib.shown
    print(
        f"\none target's arrivals over a {NODES}-node cluster ({version}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores, load average {load['min']}-{load['max']}): {CLIENTS} clients x {PIPELINE} in "
        f"flight, {ENTERS:,} new users a measure, median [range] over {benchlib.ROUNDS} rounds\n"
    )
    for shards, row in by_shards.items():
        print(f"{shards} sub-line(s), on {row['nodes_used']} node(s)")
        print(f"  wall clock: enters/s (this machine's 2 cores)   {shown(row['enters_per_s'], '', 0)}")
        print(f"  server CPU per enter, commandstats (usec)       {shown(row['usec_per_enter'], ' us', 1)}")
        print(f"  server CPU per enter, process (user + sys)      {shown(row['cpu_us_per_enter'], ' us', 1)}")
        for port, node in row["nodes"].items():
            print(
                f"    node {port}: share {shown(node['share'], '', 3)}, "
                f"{shown(node['usec_per_enter'], ' us', 1)} (process {shown(node['cpu_us_per_enter'], ' us', 1)})"
            )
        print(f"  ceiling, arrivals/s (by commandstats)          {shown(row['ceiling_per_s'], '', 0)}")
        print(f"  ceiling, arrivals/s (by process CPU)           {shown(row['ceiling_cpu_per_s'], '', 0)}")
    share_verdict = benchlib.verdict(
        benchlib.spread([r["share_off_even"]["max"] for r in by_shards.values()]), SHARE_WITHIN
    )
    cost_verdict = benchlib.verdict(cost_x, MOST_COST_X)
    ceiling_verdict = benchlib.verdict(ceiling_x, least=LEAST_CEILING_X)
    print(f"\nevery node used takes 1/N of the enters, within {SHARE_WITHIN:.0%}: {share_verdict}")
    print(f"server CPU per enter (process), {most} sub-lines x 1: {shown(cost_x)}", end="")
    print(f" (target <= {MOST_COST_X}x: {cost_verdict}); by commandstats {shown(cost_x_usec)}")
    print(f"ceiling (process), {most} sub-lines x 1: {shown(ceiling_x)}", end="")
    print(f" (target >= {LEAST_CEILING_X}x: {ceiling_verdict}); by commandstats {shown(ceiling_x_usec)}")
    out = benchlib.write_json(
        "bench_arrivals.json",
        {
            "server": version,
            "python": platform.python_version(),
            "nodes": NODES,
            "clients": CLIENTS,
            "pipeline": PIPELINE,
            "enters": ENTERS,
            "shards": {str(shards): row for shards, row in by_shards.items()},
            "share_within": SHARE_WITHIN,
            "share_verdict": share_verdict,
            "cost_x": cost_x,
            "cost_x_usec": cost_x_usec,
            "most_cost_x": MOST_COST_X,
            "ceiling_x": ceiling_x,
            "ceiling_x_usec": ceiling_x_usec,
            "least_ceiling_x": LEAST_CEILING_X,
            "load_average": load,
        },
    )
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
