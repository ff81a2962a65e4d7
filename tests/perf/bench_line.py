"""Benchmark: what the edge line costs the target's Redis: serving /line, and the pump's tick as the line grows.

Run: .venv/bin/python tests/perf/bench_line.py   (a Valkey of its own, or BENCH_REDIS_URL)
Measures, in one run:
  - the Redis commands one /line answer sends (WaitingRoom.line, as the route calls it): one GET of what the pump
    wrote, whatever the line's length;
  - one whole pump tick of one target (evict, adjust_rate, admit, line.lua: the window moved by a batch, the
    shape's 100 points) with 10,000 and with 1,000,000 waiting: Redis time (INFO commandstats, every command), in
    at least 7 alternating rounds, and their ratio within each round.
Prints a table and writes build/bench_line.json. Targets: 1 GET per /line; the tick at 1,000,000 within 2x 10,000.
"""

from __future__ import annotations

import contextlib
import io
import os
import platform
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import benchlib  # noqa: E402  (beside this file)

os.environ.update({**benchlib.BASE_ENV, "POWERTOOLS_METRICS_DISABLED": "1"})

from bench_pump import clean, command_usec, load_line, settings_for  # noqa: E402

from chalicelib.pump import Pump  # noqa: E402
from chalicelib.queue import WaitingRoom  # noqa: E402
from chalicelib.store import QueueStore  # noqa: E402
from chalicelib.targets import Target  # noqa: E402
from chalicelib.tokens import TokenSigner  # noqa: E402

SMALL, LARGE = benchlib.scaled(10_000, 1_000), benchlib.scaled(1_000_000, 10_000)
TICKS = benchlib.scaled(50, 2)  # ticks per measure
MOST_X = 2.0  # the tick at LARGE waiting may cost at most this many times the tick at SMALL


def main() -> None:
    with benchlib.redis_url() as url:
        client = benchlib.patient_client(url)
        version = benchlib.server_version(client)
        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        settings = settings_for(prefix, VQ_TICK_MS=2000, VQ_BATCH_SIZE=100, VQ_MAX_WAITING=10_000_000)
        store = QueueStore(client, prefix)
        targets = {SMALL: Target("limited-drop", 1), LARGE: Target("limited-drop", 2)}
        firsts = {size: load_line(store, target, size, settings) for size, target in targets.items()}
        pump = Pump(store, settings)
        rules = pump.rules
        # The window holds the first rate x window places (6,000 at 50 a second and 120 s); each tick, a batch more.
        reach = int(settings.admissions_per_second * settings.presence_window_s)
        # As in a sale: only the window's users are in the heartbeat set (evict.lua drops the silent far back),
        # and they poll (never stale here, so evict finds nobody, as in a line whose users all poll).
        for size, target in targets.items():
            k = store.keys(target)
            client.delete(k.heartbeat)
            client.zadd(k.heartbeat, {str(u): 2**50 for u in range(1, min(reach, size) + 1)})

        def rewind(size: int) -> None:
            # The same line before each tick: a fresh tick to apply, the mark before the first user, the window's
            # edge where the last tick left it, so this one moves it by the batch it admits.
            k, first = store.keys(targets[size]), firsts[size]
            client.decr(k.tick, settings.tick_ms)
            client.set(k.mark, first - 1)
            client.set(k.window, first + min(reach, size) - 1)

        def tick(size: int) -> float:
            # Per tick, over TICKS of them: one tick's few milliseconds are within a loaded machine's noise.
            spent = 0
            for _ in range(TICKS):
                rewind(size)
                before = command_usec(client)
                with contextlib.redirect_stdout(io.StringIO()):
                    store.admit_and_evict_all([targets[size]], rules)
                spent += command_usec(client) - before
            return spent / TICKS

        for size in targets:
            tick(size)  # loads the scripts; the first tick of each line
        values, loads = benchlib.alternating({size: (lambda size=size: tick(size)) for size in targets})

        room = WaitingRoom(store, TokenSigner(settings.keyring), settings, None)  # type: ignore[arg-type]
        served = {}
        for size, target in targets.items():
            with benchlib.recorded(client) as commands:
                text = room.line(target)
            served[size] = {"commands": [c[0] for c in commands], "bytes": len(text)}
        clean(client, prefix)

    ratio = benchlib.ratios(values[LARGE], values[SMALL])
    print(f"\nedge line benchmark  ({version}, Python {platform.python_version()})\n")
    for size, row in served.items():
        print(f"/line with {size:>9,} waiting: Redis commands {row['commands']}, {row['bytes']:,} bytes")
    load = benchlib.loads(loads)
    print(f"\none pump tick of one target, Redis time (all commands), load average {load['min']}-{load['max']}")
    for size in targets:
        print(f"  {size:>9,} waiting   {benchlib.shown(benchlib.spread(values[size]), ' us', 0)}")
    verdict = benchlib.verdict(ratio, MOST_X)
    print(f"  {LARGE:,} x {SMALL:,}   {benchlib.shown(ratio)}   (target <= {MOST_X}x: {verdict})")
    out = benchlib.write_json(
        "bench_line.json",
        {
            "server": version,
            "python": platform.python_version(),
            "served": {str(size): row for size, row in served.items()},
            "tick_us": {str(size): benchlib.spread(values[size]) for size in targets},
            "tick_large_x_small": ratio,
            "sizes": [SMALL, LARGE],
            "most_x": MOST_X,
            "load_average": load,
        },
    )
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
