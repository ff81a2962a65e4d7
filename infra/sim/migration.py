"""A slot migration mid-sale, measured: who gets past the line while a busy target's slot moves to another node.

Four Lambda containers (each a waiting room and purchase gate over a cluster client and circuit breakers of its
own, serving one call at a time) serve two targets while virtual users enter, poll, leave and buy, and a pump
ticks (tests/support/load.py): the migrated target, whose slot moves from one node of a 3-node Valkey cluster to
another, and an untouched target on the third node. The classic migration (`CLUSTER SETSLOT ... MIGRATING` and
`IMPORTING`, then `MIGRATE` in batches, as online resharding does) keeps the slot moving for `--seconds`;
`--atomic` moves it with Valkey 9's `CLUSTER MIGRATESLOTS` instead. Counted per target over the calls begun while
the slot moved: newcomers let in directly (`DIRECT_ADMITTED`: the queue failed open), answers 503, and over the
whole run the places lost (a ticket holder told NOT_IN_QUEUE) and users given a second token id.

    python infra/sim/scenarios.py migration                 # classic, 5 s, 3 rounds
    python infra/sim/scenarios.py migration --atomic --rounds 1

The table goes to build/scenarios/migration.json (or migration-atomic.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "CRITICAL")  # every refused call logs: the figures count them instead
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "1")
os.environ.setdefault("VQ_TOKEN_KEYS", json.dumps({"k1": "migration-scenario-k1-0123456789abcdefghij"}))
os.environ.setdefault("VQ_TOKEN_ACTIVE_KID", "k1")

from redis.crc import key_slot  # noqa: E402

from chalicelib import runtime  # noqa: E402
from chalicelib.pump import Pump  # noqa: E402
from chalicelib.redis_connection import connect  # noqa: E402
from chalicelib.store import QueueStore  # noqa: E402
from chalicelib.targets import TARGET_TYPES, Target  # noqa: E402
from tests.support.downstream import Origin  # noqa: E402
from tests.support.load import Call, Load, between, containers  # noqa: E402
from tests.support.redis_servers import ValkeyCluster  # noqa: E402

OUT = ROOT / "build" / "scenarios"
SETTLE_S = 1.5  # load before the migration, and after it


def targets_on(cluster: ValkeyCluster, store: QueueStore) -> tuple[Target, Target, int]:
    """A target on the first node (the one to migrate), one on the third (untouched), and the second's port."""
    candidates = [Target("limited-drop", n) for n in range(1, 200)]
    by_node: dict[int, Target] = {}
    for target in candidates:
        by_node.setdefault(cluster.owner(slot_of(store, target)), target)
    first, second, third = cluster.ports
    return by_node[first], by_node[third], second


def slot_of(store: QueueStore, target: Target) -> int:
    return key_slot(store.keys(target).waiting.encode())


def run_once(options: argparse.Namespace, round_: int) -> dict:
    """One sale through one migration; its figures."""
    cluster, origin = ValkeyCluster(), Origin()
    try:
        prefix = f"vqmigrate-{round_}-{time.time_ns()}"
        os.environ.update(
            REDIS_URL=cluster.url,
            VQ_REDIS_CLUSTER="true",
            VQ_KEY_PREFIX=prefix,
            VQ_TICK_MS="100",
            VQ_BATCH_SIZE="3",
            VQ_TARGETS_OPEN_ON_FIRST_USE="true",
            **{kind.origin_variable: origin.url for kind in TARGET_TYPES.values()},
        )
        served_by = containers(options.threads)  # a container per worker: one call at a time
        pump = Pump(QueueStore(connect(cluster.url, cluster=True), prefix), runtime.settings())  # of its own too
        migrated, untouched, destination = targets_on(cluster, runtime.store())
        load = Load(served_by, pump, (migrated, untouched), options.threads)
        with load:
            time.sleep(SETTLE_S)
            began = time.monotonic()
            slot = slot_of(runtime.store(), migrated)
            if options.atomic:
                cluster.migrate_atomic(slot, destination)
            else:
                cluster.migrate_classic(slot, destination, spread_s=options.seconds)
            ended = time.monotonic()
            time.sleep(SETTLE_S)
        if load.run.failures:
            raise SystemExit(f"the load failed: {load.run.failures[0]!r}")
        assert cluster.owner(slot) == destination
        return figures(load.run.calls, {"migrated": migrated, "untouched": untouched}, began, ended)
    finally:
        origin.close()
        cluster.stop()
        runtime.reset()


def figures(calls: list[Call], targets: dict[str, Target], began: float, ended: float) -> dict:
    """Per target: the enters begun while the slot moved, by answer; the 503s then; over the run, the places
    lost and the users who were given two token ids."""
    during = between(calls, began, ended)
    result: dict = {"migration_s": round(ended - began, 2), "calls": len(calls)}
    for name, target in targets.items():
        mine = [c for c in calls if c.target == target]
        tokens: dict[int, set] = defaultdict(set)
        for c in mine:
            if c.token_id and c.answer in ("ADMITTED", "DIRECT_ADMITTED"):
                tokens[c.user].add(c.token_id)
        result[name] = {
            "entered_while_moving": dict(Counter(c.answer for c in during if c.target == target and c.op == "enter")),
            "direct_admitted_while_moving": sum(
                1 for c in during if c.target == target and c.answer == "DIRECT_ADMITTED"
            ),
            "answered_503_while_moving": sum(1 for c in during if c.target == target and c.status == 503),
            "places_lost": sum(1 for c in mine if c.op == "status" and c.answer == "NOT_IN_QUEUE"),
            "second_token_ids": sum(1 for ids in tokens.values() if len(ids) > 1),
            "errors_500": sum(1 for c in mine if c.error),
            "slowest_call_s": round(max((c.took for c in mine), default=0.0), 2),
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="how long the classic migration keeps the slot moving"
    )
    parser.add_argument("--atomic", action="store_true", help="Valkey 9's CLUSTER MIGRATESLOTS instead")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4, help="virtual users' threads, each a container of its own")
    options = parser.parse_args(argv)
    command = "python infra/sim/scenarios.py migration " + " ".join(argv if argv is not None else sys.argv[2:])
    rounds = []
    for round_ in range(options.rounds):
        print(f"== migration round {round_ + 1} of {options.rounds}", flush=True)
        rounds.append(run_once(options, round_))
        print(json.dumps(rounds[-1]), flush=True)
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    print(f"\nslot migration mid-sale, {date}: {command.strip()}")
    for name in ("migrated", "untouched"):
        for figure in ("direct_admitted_while_moving", "answered_503_while_moving", "places_lost", "second_token_ids"):
            print(
                f"  {name + ' target, ' + figure.replace('_', ' '):<58} "
                + " | ".join(str(r[name][figure]) for r in rounds)
            )
    print(f"  {'migration took (s)':<58} " + " | ".join(str(r["migration_s"]) for r in rounds))
    OUT.mkdir(parents=True, exist_ok=True)
    name = "migration-atomic" if options.atomic else "migration"
    (OUT / f"{name}.json").write_text(
        json.dumps({"date": date, "command": command.strip(), "rounds": rounds}, indent=1)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
