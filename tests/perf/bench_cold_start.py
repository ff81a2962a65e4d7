"""Benchmark: cold start of the real package, against importing its dependencies alone.

Run: .venv/bin/python tests/perf/bench_cold_start.py   (first builds build/deployment.zip for x86_64, this machine)
The deployment zip is unpacked into a read-only directory, as Lambda's /var/task is (and -B, which root needs),
twice: with bytecode for every module (what the package ships, and whatever it lacks compiled here, said so)
and with every .pyc stripped. From each, in a fresh `python -I -S -B` (no environment, no site-packages: the
standard library and the package, as on Lambda; modules the Lambda runtime provides and the zip leaves out come
after it, from this virtualenv), measures in at least 7 alternating rounds, each with its load average:
  - `import app` with the environment a deployed function has (signing keys, Powertools settings, jwt mode with its
    provider's keys, which the app reads and checks at start);
  - the dependencies alone: every third-party module that importing the app loads, in the order it loads them
    (found by importing the app once), so the baseline follows the code;
  - both in one interpreter: the dependencies, then `import app` over them (the app's own modules alone).
Figures are the process's CPU time for the import (wall time in the JSON too).
Prints a table and writes build/bench_cold_start.json. Target: the app with bytecode at most 1.2x its dependencies,
judged on the one-interpreter figure, (dependencies + the app over them) / dependencies: both terms come from the
same process moments apart, so a change of load between two processes does not enter the ratio (on this shared
machine, the two-process ratio of a round ranged from 0.8x to 1.5x for the same code). It is the stricter of the
two: `import app` alone also loads the dependencies with the collector off (app.py), the baseline with it on.
"""

from __future__ import annotations

import importlib.util
import os
import py_compile
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

import benchlib  # beside this file

sys.path.insert(0, str(benchlib.ROOT))
from tests.support import jwts  # noqa: E402

TARGET_RATIO = 1.2
PACKAGE = benchlib.BUILD / "deployment.zip"
OWN = ("app", "chalicelib")
# What the timed interpreter runs: the package first on the path, the runtime's own modules after it.
PRELUDE = "import sys; sys.path[:0] = [{root!r}]; sys.path.append({runtime!r}); import time; "
TIMED = PRELUDE + (
    "started, cpu = time.perf_counter(), time.process_time(); {imports}; "
    "print(time.perf_counter() - started, time.process_time() - cpu)"
)
# The dependencies, then the app over them: CPU and wall seconds of each.
TIMED_OVER = PRELUDE + (
    "started, cpu = time.perf_counter(), time.process_time(); {imports}; "
    "deps = time.perf_counter() - started, time.process_time() - cpu; "
    "started, cpu = time.perf_counter(), time.process_time(); import app; "
    "print(*deps, time.perf_counter() - started, time.process_time() - cpu)"
)
# Third-party modules only: the standard library modules the app itself imports are the app's cost.
LOADED = PRELUDE + (
    "before = set(sys.modules); import app; "
    "print('\\n'.join(m for m, module in list(sys.modules.items()) if m not in before "
    "and (getattr(module, '__file__', None) or '').startswith(({root!r}, {runtime!r})) "
    "and m.split('.')[0] not in {own!r}))"
)


def environment() -> dict[str, str]:
    # As deployed: jwt mode, its provider's keys read and checked at start (inline here: no network in a timing).
    env = {**os.environ, **benchlib.BASE_ENV, **jwts.jwt_env()}
    env.pop("REDIS_URL", None)
    return env


def unpack(into: Path, bytecode: bool) -> str:
    """The package unpacked into `into`, read-only; how its bytecode came to be. A quick run skips the build: the
    app's own files alone, its dependencies then found in this virtualenv (RUNTIME)."""
    if benchlib.QUICK:
        into.mkdir(parents=True)
        shutil.copy(benchlib.ROOT / "app.py", into / "app.py")
        shutil.copytree(benchlib.ROOT / "chalicelib", into / "chalicelib")
        shutil.copytree(benchlib.ROOT / "vendor", into, symlinks=False, dirs_exist_ok=True)
    else:
        with zipfile.ZipFile(PACKAGE) as package:
            package.extractall(into)
    if not bytecode:
        for cache in list(into.rglob("__pycache__")):
            shutil.rmtree(cache)
        how = "stripped"
    else:
        # Bytecode for every module: what the package ships, and only what it lacks compiled here (unchecked, as
        # read-only bytecode is best shipped: no source check on import).
        modules = list(into.rglob("*.py"))
        lacking = [path for path in modules if not Path(importlib.util.cache_from_source(str(path))).exists()]
        unchecked = py_compile.PycInvalidationMode.UNCHECKED_HASH
        compiled = [path for path in lacking if py_compile.compile(str(path), quiet=2, invalidation_mode=unchecked)]
        how = "as shipped" if not compiled else f"compiled here for {len(compiled)} of {len(modules)} modules"
    for path in [into, *into.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    return how


def run(code: str) -> str:
    # -B as well: run as root, Python writes bytecode into a directory whatever its permissions say.
    return subprocess.run(
        [sys.executable, "-I", "-S", "-B", "-c", code], env=environment(), check=True, capture_output=True, text=True
    ).stdout


def seconds(root: Path, imports: str) -> tuple[float, float]:
    """Wall and CPU seconds `imports` takes in a fresh interpreter on the package at `root`."""
    wall, cpu = run(TIMED.format(root=str(root), runtime=RUNTIME, imports=imports)).split()[-2:]
    return float(wall), float(cpu)


def seconds_over(root: Path, dependencies: str) -> tuple[float, float, float, float]:
    """Wall and CPU seconds of the dependencies, then of `import app` over them, in one fresh interpreter."""
    deps_wall, deps_cpu, app_wall, app_cpu = run(
        TIMED_OVER.format(root=str(root), runtime=RUNTIME, imports=dependencies)
    ).split()[-4:]
    return float(deps_wall), float(deps_cpu), float(app_wall), float(app_cpu)


RUNTIME = sysconfig.get_paths()["purelib"]


def main() -> None:
    # The package of the code as it is now (10 to 45 s), never one left in build/ by an earlier build.
    if not benchlib.QUICK:
        subprocess.run(
            # Built for this machine (the deployed package's libraries are arm64's): the same code and bytecode.
            [sys.executable, "infra/package.py", "--architecture", "x86_64", str(benchlib.BUILD)],
            cwd=benchlib.ROOT,
            check=True,
            capture_output=True,
        )
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as tmp:
        roots, how = {}, {}
        for variant, bytecode in (("with bytecode", True), ("without bytecode", False)):
            roots[variant] = Path(tmp) / variant.replace(" ", "-")
            how[variant] = unpack(roots[variant], bytecode)
        root = roots["with bytecode"]
        loaded = run(LOADED.format(root=str(root), runtime=RUNTIME, own=OWN)).split()
        dependencies = "; ".join(f"import {name}" for name in loaded)
        measures = {}
        for variant, root in roots.items():
            measures[f"{variant}: app"] = lambda root=root: seconds(root, "import app")
            measures[f"{variant}: dependencies"] = lambda root=root: seconds(root, dependencies)
            measures[f"{variant}: app over its dependencies"] = lambda root=root: seconds_over(root, dependencies)
        for measure in [] if benchlib.QUICK else measures.values():  # warm-up: the page cache
            measure()
        values, loads = benchlib.alternating(measures)
        for path in [*roots.values(), *Path(tmp).rglob("*")]:  # writable again, so the directory can go
            path.chmod(path.stat().st_mode | stat.S_IWUSR)

    rows = {}
    for variant in roots:
        app, deps = values[f"{variant}: app"], values[f"{variant}: dependencies"]
        app_cpu, deps_cpu = [cpu for _, cpu in app], [cpu for _, cpu in deps]
        over = values[f"{variant}: app over its dependencies"]
        rows[variant] = {
            "own_ms": benchlib.spread([own * 1000 for _, _, _, own in over]),
            "x_dependencies_one_interpreter": benchlib.spread([(d + own) / d for _, d, _, own in over]),
            "bytecode": how[variant],
            "app_ms": benchlib.spread([c * 1000 for c in app_cpu]),
            "dependencies_ms": benchlib.spread([c * 1000 for c in deps_cpu]),
            "x_dependencies": benchlib.ratios(app_cpu, deps_cpu),
            "wall": {
                "app_ms": benchlib.spread([w * 1000 for w, _ in app]),
                "x_dependencies": benchlib.ratios([w for w, _ in app], [w for w, _ in deps]),
            },
        }
    rows["with bytecode"]["verdict"] = benchlib.verdict(
        rows["with bytecode"]["x_dependencies_one_interpreter"], TARGET_RATIO
    )
    print(
        f"\ncold start of {PACKAGE.relative_to(benchlib.ROOT)}, unpacked read-only, `python -I -S -B`: CPU time, "
        f"median [range] of {benchlib.ROUNDS} alternating rounds, load average {min(loads)}-{max(loads)}"
    )
    print(f"the dependencies: the {len(loaded)} third-party modules that importing the app loads\n")
    print(
        f"{'':<18}{'app':>22}{'dependencies':>22}{'x dependencies':>24}{'own modules':>20}"
        f"{'x, one interpreter':>24}   bytecode"
    )
    for variant, row in rows.items():
        app, deps = benchlib.shown(row["app_ms"], " ms", 0), benchlib.shown(row["dependencies_ms"], " ms", 0)
        print(
            f"{variant:<18}{app:>22}{deps:>22}{benchlib.shown(row['x_dependencies']):>24}"
            f"{benchlib.shown(row['own_ms'], ' ms', 0):>20}{benchlib.shown(row['x_dependencies_one_interpreter']):>24}"
            f"   {row['bytecode']}  {row.get('verdict', '')}"
        )
    out = benchlib.write_json(
        "bench_cold_start.json",
        {
            "package": "the source tree (quick)" if benchlib.QUICK else str(PACKAGE.relative_to(benchlib.ROOT)),
            "rounds": benchlib.ROUNDS,
            "target_ratio": TARGET_RATIO,
            "load_average": benchlib.loads(loads),
            "dependencies": loaded,
            "runs": rows,
        },
    )
    print(f"\nwrote {out.relative_to(benchlib.ROOT)}")


if __name__ == "__main__":
    main()
