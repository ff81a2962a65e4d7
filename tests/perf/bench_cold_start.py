"""Benchmark: cold start, the import of `app` in a fresh interpreter against the import of its dependencies alone.

Run: .venv/bin/python tests/perf/bench_cold_start.py   (no Redis needed: importing the app connects to nothing)
Measures, in fresh interpreters taking turns (medians of the rounds; one warm-up each, so bytecode is compiled):
  - `import app`, with the environment it needs (signing keys), timed inside the interpreter in CPU time (the
    process's own, so other work on a shared machine does not count; wall time is in the JSON too);
  - the dependencies alone: chalice, redis, aws_lambda_powertools (Logger, Metrics, Tracer, feature flags);
both with tracing off (POWERTOOLS_TRACE_DISABLED) and on, where the baseline also imports the X-Ray SDK that
Powertools' Tracer imports when it is built. Lists the modules the app adds that take longest (python -X importtime).
Prints a table and writes build/bench_cold_start.json. Target: the app at most 1.2x its dependencies.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

import benchlib  # beside this file

TARGET_RATIO = 1.2
ROUNDS = 5
DEPENDENCIES = ("import chalice, redis; from aws_lambda_powertools import Logger, Metrics, Tracer; "
                "from aws_lambda_powertools.utilities.feature_flags import FeatureFlags")
XRAY = "import aws_xray_sdk.core"
TIMED = ("import time; started, cpu = time.perf_counter(), time.process_time(); {}; "
         "print(time.perf_counter() - started, time.process_time() - cpu)")


def environment(tracing: bool) -> dict[str, str]:
    env = {**os.environ, **benchlib.BASE_ENV}
    env.pop("REDIS_URL", None)
    if tracing:
        env.pop("POWERTOOLS_TRACE_DISABLED", None)
    return env


def seconds(code: str, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds `code` takes in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", TIMED.format(code)], cwd=benchlib.ROOT, env=env,
                         check=True, capture_output=True, text=True).stdout
    wall, cpu = out.split()[-2:]
    return float(wall), float(cpu)


def heaviest_added(baseline: str, env: dict[str, str], count: int = 6) -> list[tuple[str, float]]:
    """The modules `import app` adds to `baseline`, by their own import time (ms), heaviest first."""
    code = f"{baseline}; import sys; print('--app--', file=sys.stderr, flush=True); import app"
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=benchlib.ROOT, env=env,
                         check=True, capture_output=True, text=True).stderr
    rows = []
    for line in err.split("--app--", 1)[1].splitlines():
        if line.startswith("import time:") and "|" in line:
            own, _, name = line[len("import time:"):].split("|")
            rows.append((name.strip(), int(own) / 1000))
    return sorted(rows, key=lambda row: -row[1])[:count]


def measure(tracing: bool) -> dict:
    env = environment(tracing)
    baseline = f"{DEPENDENCIES}; {XRAY}" if tracing else DEPENDENCIES
    seconds("import app", env), seconds(baseline, env)  # warm-up: compiles bytecode, fills the page cache
    app, deps = [], []
    for _ in range(ROUNDS):
        app.append(seconds("import app", env))
        deps.append(seconds(baseline, env))
    app_cpu, deps_cpu = [cpu for _, cpu in app], [cpu for _, cpu in deps]
    app_wall, deps_wall = [wall for wall, _ in app], [wall for wall, _ in deps]
    return {
        "tracing": tracing,
        "baseline": baseline,
        "app_ms": statistics.median(app_cpu) * 1000,
        "dependencies_ms": statistics.median(deps_cpu) * 1000,
        "ratio": benchlib.median_ratio(app_cpu, deps_cpu),
        "wall": {"app_ms": statistics.median(app_wall) * 1000, "dependencies_ms": statistics.median(deps_wall) * 1000,
                 "ratio": benchlib.median_ratio(app_wall, deps_wall)},
        "heaviest_added_ms": heaviest_added(baseline, env),
    }


def main() -> None:
    rows = [measure(tracing=False), measure(tracing=True)]
    print(f"\ncold start: import in a fresh interpreter, CPU time (medians of {ROUNDS} rounds)\n")
    print(f"{'':<14}{'app ms':>9}{'deps ms':>9}{'x deps':>8}{'wall x':>8}   heaviest modules the app adds (own ms)")
    for row in rows:
        heaviest = ", ".join(f"{name} {ms:.0f}" for name, ms in row["heaviest_added_ms"][:3])
        print(f"{'tracing ' + ('on' if row['tracing'] else 'off'):<14}{row['app_ms']:>9.0f}"
              f"{row['dependencies_ms']:>9.0f}{row['ratio']:>8.2f}{row['wall']['ratio']:>8.2f}   {heaviest}")
    out = benchlib.write_json("bench_cold_start.json", {"rounds": ROUNDS, "target_ratio": TARGET_RATIO, "runs": rows})
    print(f"\nwrote {out.relative_to(benchlib.ROOT)}")


if __name__ == "__main__":
    main()
