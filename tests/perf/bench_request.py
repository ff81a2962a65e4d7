"""Benchmark: time spent in the project's own Python per API request, against the bare script call it makes.

Run: .venv/bin/python tests/perf/bench_request.py   (REDIS_URL, else an embedded Valkey started for the run)
Measures, in one process, interleaved (each round times every measure once; medians of the rounds):
  - the bare call: the EVALSHA the request makes, recorded from it and replayed through the same redis-py client;
  - the Lambda handler `app(event, context)` on an API Gateway (REST, proxy) event: Chalice's dispatch, the
    Powertools middleware, ticket check, token minting, the feature flag, the script call, the JSON answer;
  - the same handler with one JSON log line (Powertools Logger) and one EMF metric flush added per request,
    the budget the architecture sets for a request that logs and counts.
Own Python = handler - bare call, as a ratio to the bare call (wall time); the same in this process's CPU time,
which other work on a shared machine barely changes, is reported beside it. Logs and EMF go to a file, as on
Lambda to stdout.
Prints a table and writes build/bench_request.json. Target: own Python at most 0.5x the bare call.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import uuid

import benchlib  # beside this file

sys.path.insert(0, str(benchlib.ROOT))

TARGET_RATIO = 0.5
SENTINEL = 900_000_000_001  # the new user whose enter is recorded, replaced by a fresh one per bare call
ROUNDS = 15
PER_ROUND = 200


def api_event(method: str, resource: str, params: dict[str, str], headers: dict[str, str]) -> dict:
    """An API Gateway REST proxy event, as Lambda hands it to the function."""
    path = resource.format(**params)
    return {
        "resource": resource, "path": path, "httpMethod": method,
        "headers": headers, "multiValueHeaders": {name: [value] for name, value in headers.items()},
        "queryStringParameters": None, "multiValueQueryStringParameters": None,
        "pathParameters": params, "stageVariables": None, "body": None, "isBase64Encoded": False,
        "requestContext": {
            "resourcePath": resource, "httpMethod": method, "path": f"/api{path}", "stage": "api",
            "requestId": str(uuid.uuid4()), "accountId": "123456789012", "apiId": "a1b2c3d4e5",
            "identity": {"sourceIp": "203.0.113.7", "userAgent": "Mozilla/5.0"},
            "protocol": "HTTP/1.1", "requestTimeEpoch": int(time.time() * 1000),
        },
    }


def headers(user: int, ticket: str | None = None) -> dict[str, str]:
    found = {
        "Accept": "application/json", "Host": "api.example.com", "User-Agent": "Mozilla/5.0",
        "X-Amzn-Trace-Id": "Root=1-00000000-000000000000000000000000", "X-Forwarded-For": "203.0.113.7",
        "X-Forwarded-Port": "443", "X-Forwarded-Proto": "https", "X-User-Id": str(user),
    }
    if ticket:
        found["X-Queue-Ticket"] = ticket
    return found


def main() -> None:
    # Logs and metrics are on and written as on Lambda (stdout), here to a file; the table goes to the terminal.
    out = sys.stdout
    sink = tempfile.TemporaryFile("w+")
    sys.stdout = sink
    with benchlib.redis_url() as url:
        os.environ.update({**benchlib.BASE_ENV, "REDIS_URL": url, "VQ_KEY_PREFIX": benchlib.bench_prefix(),
                           "POWERTOOLS_LOG_LEVEL": "INFO"})
        from app import app, ENTRIES
        from chalicelib import runtime
        from chalicelib.observability import count, logger

        observe = [False]

        @app.middleware("http")
        def log_and_count(event, get_response):
            # The request's own log line and metric, switched on for one of the measures only.
            response = get_response(event)
            if observe[0]:
                logger.info("request answered", extra={"status": response.status_code})
                count("RequestsAnswered", "limited-drop:1")
            return response

        client = runtime.store().client
        context = benchlib.LambdaContext()
        target = {"queue_type": "limited-drop", "target_id": "1"}
        me = ENTRIES + "/me"

        def call(event, expected: str) -> None:
            answer = app(event, context)
            assert expected in answer["body"], answer

        # User 2 waits in line and no pump runs, so every poll takes the waiting path (the common one).
        app(api_event("POST", ENTRIES, target, headers(1)), context)
        first = app(api_event("POST", ENTRIES, target, headers(2)), context)
        ticket = json.loads(first["body"])["queueTicket"]
        status_event = api_event("GET", me, target, headers(2, ticket))
        with benchlib.recorded(client) as commands:
            call(status_event, '"WAITING"')
        status_call = commands[-1]
        with benchlib.recorded(client) as commands:
            call(api_event("POST", ENTRIES, target, headers(SENTINEL)), '"WAITING"')
        enter_call = [str(arg) for arg in commands[-1]]

        users = iter(range(1_000, 10**9))

        def enter_bare():
            user = str(next(users))
            client.execute_command(*[arg.replace(str(SENTINEL), user) for arg in enter_call])

        def observed(run):
            def measure():
                observe[0] = True
                try:
                    run()
                finally:
                    observe[0] = False
            return measure

        status = lambda: call(status_event, '"WAITING"')  # noqa: E731
        enter = lambda: call(api_event("POST", ENTRIES, target, headers(next(users))), '"WAITING"')  # noqa: E731
        calls = {
            "status: bare script call": lambda: client.execute_command(*status_call),
            "status: handler": status,
            "status: handler + log line + EMF": observed(status),
            "enter: bare script call": enter_bare,
            "enter: handler": enter,
            "enter: handler + log line + EMF": observed(enter),
        }
        for run in calls.values():  # warm every path once
            run()
        wall, cpu = benchlib.interleaved(calls, ROUNDS, PER_ROUND)
    sys.stdout = out
    sink.seek(0)
    lines = sink.read().splitlines()
    assert any('"RequestsAnswered"' in line for line in lines) and any('"request answered"' in line for line in lines)

    rows = {}
    for operation in ("status", "enter"):
        bare, bare_cpu = wall[f"{operation}: bare script call"], cpu[f"{operation}: bare script call"]
        for variant in ("handler", "handler + log line + EMF"):
            total, total_cpu = wall[f"{operation}: {variant}"], cpu[f"{operation}: {variant}"]
            own = [t - b for t, b in zip(total, bare)]
            own_cpu = [t - b for t, b in zip(total_cpu, bare_cpu)]
            rows[f"{operation}: {variant}"] = {
                "bare_us": statistics.median(bare) * 1e6,
                "handler_us": statistics.median(total) * 1e6,
                "own_python_us": statistics.median(own) * 1e6,
                "own_x_bare": benchlib.median_ratio(own, bare),
                "cpu": {"bare_us": statistics.median(bare_cpu) * 1e6, "handler_us": statistics.median(total_cpu) * 1e6,
                        "own_python_us": statistics.median(own_cpu) * 1e6,
                        "own_x_bare": benchlib.median_ratio(own_cpu, bare_cpu)},
            }
    print(f"\nown Python per request (medians of {ROUNDS} interleaved rounds of {PER_ROUND}; wall time, then CPU)\n")
    print(f"{'request':<36}{'bare us':>9}{'handler':>9}{'own':>7}{'x bare':>8}   {'CPU: bare':>9}{'own':>7}{'x bare':>8}")
    for name, row in rows.items():
        c = row["cpu"]
        print(f"{name:<36}{row['bare_us']:>9.0f}{row['handler_us']:>9.0f}{row['own_python_us']:>7.0f}"
              f"{row['own_x_bare']:>8.2f}   {c['bare_us']:>9.0f}{c['own_python_us']:>7.0f}{c['own_x_bare']:>8.2f}")
    written = benchlib.write_json("bench_request.json", {"rounds": ROUNDS, "per_round": PER_ROUND,
                                                        "target_ratio": TARGET_RATIO, "requests": rows})
    print(f"\nwrote {written.relative_to(benchlib.ROOT)}")


if __name__ == "__main__":
    main()
