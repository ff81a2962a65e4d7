"""`make test`'s steps, every one of them, and a summary at the end (docs/testing.md).

As a script (`python tests/support/steps.py --make make test-main test-faults ...`): runs each step, a make
target, whatever the earlier ones did, so a failure in one never hides another; then prints a line per step
(passed or FAILED, its counts, its time) and one line of what was skipped and why, and exits 1 if any step
failed. `make test PYTEST_ARGS=...` reaches every step (make passes its command-line variables on).

As a pytest plugin (tests/conftest.py loads it): when STEP_REPORT names a file, the session writes there what
the summary needs: its exit status, its counts, and the reason of each skip.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "build" / "test-steps"
STEP_REPORT = "VQ_STEP_REPORT"  # the environment variable naming a step's report file
NOTHING_SELECTED = 5  # pytest's exit status when a -k or -m left a step nothing to run

# --- the pytest plugin: one report per session ---

_outcomes: collections.Counter[str] = collections.Counter()
_skips: collections.Counter[str] = collections.Counter()


def pytest_runtest_logreport(report):
    if report.skipped:
        if report.when == "setup" or report.when == "call":
            _outcomes["skipped"] += 1
            _skips[_skip_reason(report)] += 1
    elif report.failed:
        _outcomes["failed" if report.when == "call" else "error"] += 1
    elif report.when == "call":
        _outcomes["passed"] += 1


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get(STEP_REPORT)
    if not path:
        return
    Path(path).write_text(json.dumps({"exitstatus": int(exitstatus), "outcomes": _outcomes, "skips": _skips}))


def _skip_reason(report) -> str:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason.removeprefix("Skipped: ")


# --- the runner ---


@dataclass
class Step:
    name: str
    status: int
    seconds: float
    outcomes: dict[str, int] = field(default_factory=dict)
    skips: dict[str, int] = field(default_factory=dict)
    selected: bool = True  # False: PYTEST_ARGS left the step nothing to run

    @property
    def failed(self) -> bool:
        return self.status != 0

    def line(self, width: int) -> str:
        verdict = "FAILED" if self.failed else "passed"
        counts = ", ".join(f"{n:,} {what}" for what, n in sorted(self.outcomes.items()) if n)
        if not counts:
            counts = f"exit status {self.status}" if self.failed else "done" if self.selected else "nothing selected"
        return f"  {self.name:<{width}}  {verdict}  {counts:<44}  {_duration(self.seconds)}"


def run(make: str, names: list[str], reports: Path = REPORTS) -> list[Step]:
    """Run every step (`make NAME`) in turn, its report in `reports`; Ctrl-C ends the run in the step it stops."""
    shutil.rmtree(reports, ignore_errors=True)
    reports.mkdir(parents=True)
    steps = []
    for name in names:
        report = reports / f"{name}.json"
        started = time.monotonic()
        print(f"\n=== make {name}", flush=True)
        try:
            status = subprocess.call([make, "--no-print-directory", name], env={**os.environ, STEP_REPORT: str(report)})
        except KeyboardInterrupt:
            steps.append(Step(name, 130, time.monotonic() - started))
            break
        found = json.loads(report.read_text()) if report.exists() else {}
        took = time.monotonic() - started
        selected = found.get("exitstatus") != NOTHING_SELECTED
        steps.append(Step(name, status, took, found.get("outcomes", {}), found.get("skips", {}), selected))
    return steps


def summary(steps: list[Step], planned: int) -> str:
    """A line per step, one line of what was skipped and why, and the totals."""
    total = sum(step.seconds for step in steps)
    failed = [step.name for step in steps if step.failed]
    ran = "every step ran" if len(steps) == planned else f"{len(steps)} of {planned} steps ran (interrupted)"
    verdict = f"FAILED: {', '.join(failed)}" if failed else "all passed"
    width = max(len(step.name) for step in steps)
    lines = [f"\nmake test: {ran}, {verdict} ({_duration(total)})", *(step.line(width) for step in steps)]
    skips: collections.Counter[str] = collections.Counter()
    for step in steps:
        skips.update(step.skips)
    if skips:
        reasons = "; ".join(f"{n} × {reason}" for reason, n in skips.most_common())
        lines.append(f"skipped {sum(skips.values()):,}: {reasons}")
    else:
        lines.append("skipped nothing")
    # The plain closing line a reader of the log (or CI) looks for.
    counts = collections.Counter[str]()
    for step in steps:
        counts.update(step.outcomes)
    failed = counts["failed"] + counts["error"]
    lines.append(f"total: {counts['passed']} passed, {failed} failed, {counts['skipped']} skipped")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run make test's steps, all of them, and summarise.")
    parser.add_argument("--make", default="make", help="the make to run each step with")
    parser.add_argument("--reports", type=Path, default=REPORTS, help="where the steps' reports go")
    parser.add_argument("steps", nargs="+", help="make targets, in order")
    args = parser.parse_args(argv)
    steps = run(args.make, args.steps, args.reports)
    print(summary(steps, len(args.steps)), flush=True)
    return 1 if any(step.failed for step in steps) or len(steps) < len(args.steps) else 0


if __name__ == "__main__":
    sys.exit(main())
