"""Benchmark: what a sharded line's pump tick costs against a one-line target's (docs/sharding.md).

Run: .venv/bin/python tests/perf/bench_shards.py   (a Valkey of its own, or BENCH_REDIS_URL)
Measures one whole pump tick of one target of 100,000 waiting spread over N = 1, 2, 3 and 8 sub-lines (evict,
adjust_rate, admit and line.lua on one line; on N sub-lines the front reads, the plan, the shares and the merged
line): Redis time (INFO commandstats, every command: on one server, the sum of every sub-line's) and the pump's wall
time per tick (its round trips: one for a one-line target, four for a sharded one), over TICKS ticks per measure, in
at least 7 alternating rounds. Prints a table and writes build/bench_shards.json. No target: the figures say what a
sub-line costs.
"""

from __future__ import annotations

import contextlib
import io
import os
import platform
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import benchlib  # noqa: E402  (beside this file)

os.environ.update({**benchlib.BASE_ENV, "POWERTOOLS_METRICS_DISABLED": "1"})

from bench_pump import clean, command_usec, settings_for  # noqa: E402

from chalicelib import opening  # noqa: E402
from chalicelib.pump import Pump  # noqa: E402
from chalicelib.queue_keys import QueueKeys, shard_of  # noqa: E402
from chalicelib.store import QueueStore  # noqa: E402
from chalicelib.target_config import TargetConfig  # noqa: E402
from chalicelib.targets import Target  # noqa: E402

WAITING = benchlib.scaled(100_000, 2_000)
COUNTS = (1, 2, 3, 8)
TICKS = benchlib.scaled(50, 2)  # ticks per measure
BATCH, TICK_MS = 100, 2000


def main() -> None:
    with benchlib.redis_url() as url:
        client = benchlib.patient_client(url)
        version = benchlib.server_version(client)
        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        settings = settings_for(prefix, VQ_TICK_MS=TICK_MS, VQ_BATCH_SIZE=BATCH, VQ_MAX_WAITING=10_000_000)
        store = QueueStore(client, prefix)
        targets = {count: Target("limited-drop", count) for count in COUNTS}
        reach = int(settings.admissions_per_second * settings.presence_window_s)
        fronts = {count: load_sub_lines(store, targets[count], count, reach) for count in COUNTS}
        rules = Pump(store, settings).rules

        def rewind(count: int) -> None:
            # The same line before each tick: a fresh tick to apply (no plan recorded: the last tick was the one
            # before), every sub-line's mark before its first user and its window's edge where the last tick left it.
            seconds, micros = client.time()
            now = seconds * 1000 + micros // 1000
            if TICK_MS - now % TICK_MS < 200:
                # Clear of the tick's end: the tick measured is the one rewound for.
                time.sleep((TICK_MS - now % TICK_MS + 10) / 1000)
                now += TICK_MS - now % TICK_MS
            tick = now // TICK_MS * TICK_MS
            pipe = client.pipeline(transaction=False)
            pipe.delete(store.keys(targets[count]).plan)
            for shard, (first, edge) in enumerate(fronts[count]):
                k = QueueKeys(prefix, targets[count], shard, count)
                pipe.set(k.tick, tick - TICK_MS)
                pipe.set(k.mark, first - 1)
                pipe.set(k.window, edge)
            pipe.execute()

        def tick(count: int) -> tuple[float, float]:
            spent = wall = 0.0
            for _ in range(TICKS):
                rewind(count)
                before, started = command_usec(client), time.perf_counter()
                with contextlib.redirect_stdout(io.StringIO()):
                    result = store.admit_and_evict_all([targets[count]], rules)[targets[count]]
                wall += time.perf_counter() - started
                spent += command_usec(client) - before
                assert getattr(result, "admitted", None) == BATCH, result
            return spent / TICKS, wall * 1e6 / TICKS

        for count in COUNTS:
            tick(count)  # loads the scripts; the store learns the line's sub-lines
        values, loads = benchlib.alternating({count: (lambda count=count: tick(count)) for count in COUNTS})
        clean(client, prefix)

    redis = {count: benchlib.spread([v[0] for v in values[count]]) for count in COUNTS}
    wall = {count: benchlib.spread([v[1] for v in values[count]]) for count in COUNTS}
    ratio = {count: benchlib.ratios([v[0] for v in values[count]], [v[0] for v in values[1]]) for count in COUNTS[1:]}
    load = benchlib.loads(loads)
    print(f"\nsharded line benchmark  ({version}, Python {platform.python_version()})\n")
    print(f"one pump tick of one target of {WAITING:,} waiting, batch {BATCH}", end="")
    print(f"; load average {load['min']}-{load['max']}")
    for count in COUNTS:
        against = f"   {benchlib.shown(ratio[count])} the one line's" if count > 1 else ""
        print(
            f"  {count} sub-line{'s' if count > 1 else ' '}  Redis {benchlib.shown(redis[count], ' us', 0)}"
            f"   wall {benchlib.shown(wall[count], ' us', 0)}{against}"
        )
    out = benchlib.write_json(
        "bench_shards.json",
        {
            "server": version,
            "python": platform.python_version(),
            "waiting": WAITING,
            "batch": BATCH,
            "tick_redis_us": {str(count): redis[count] for count in COUNTS},
            "tick_wall_us": {str(count): wall[count] for count in COUNTS},
            "redis_x_one_line": {str(count): ratio[count] for count in COUNTS[1:]},
            "load_average": load,
        },
    )
    print(f"\nwrote {out.relative_to(ROOT)}")


def load_sub_lines(store: QueueStore, target: Target, count: int, reach: int) -> list[tuple[int, int]]:
    """WAITING users in line over `count` sub-lines, as enter.lua leaves them (user u's seq is the first plus u, on
    the sub-line shard_of gives), all polling inside the window; answers each sub-line's first seq and window edge."""
    config = TargetConfig(shards=count if count > 1 else None, batch=BATCH, tick_ms=TICK_MS)
    store.configure(target, config, int(time.time() * 1000), fresh_seed=opening.new_seed())
    client = store.client
    seconds, micros = client.time()
    first = seconds * 1_000_000 + micros
    placed: dict[int, list[tuple[str, int]]] = {shard: [] for shard in range(count)}
    for user in range(WAITING):
        placed[shard_of(str(user), count)].append((str(user), first + user))
    edges = []
    for shard, users in placed.items():
        k = QueueKeys(store.prefix, target, shard, count)
        for at in range(0, len(users), 10_000):
            chunk = users[at : at + 10_000]
            client.zadd(k.waiting, dict(chunk))
        # As in a sale: only the window's users are in the heartbeat set, and they poll (evict finds nobody).
        inside = users[: max(1, reach // count)]
        client.zadd(k.heartbeat, {user: 2**50 for user, _ in inside})
        client.set(k.seq, users[-1][1])
        edges.append((users[0][1], inside[-1][1]))
    return edges


if __name__ == "__main__":
    main()
