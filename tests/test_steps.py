"""`make test`'s runner (tests/support/steps.py): every step runs whatever an earlier one did, and the summary
names each step's outcome and every skip's reason."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A stand-in for make: each step writes the report a pytest session would, and exits as the step says.
FAKE_MAKE = """#!/bin/sh
case "$2" in
  first) echo '{"exitstatus": 1, "outcomes": {"passed": 3, "failed": 1}, "skips": {}}' > "$VQ_STEP_REPORT"; exit 1;;
  second) echo '{"exitstatus": 0, "outcomes": {"passed": 2, "skipped": 3},
    "skips": {"chromium is not installed": 2, "no Python 3.13 here": 1}}' > "$VQ_STEP_REPORT";;
  third) echo '{"exitstatus": 5, "outcomes": {}, "skips": {}}' > "$VQ_STEP_REPORT";;
  fourth) exit 2;;
esac
"""


def run_steps(tmp_path, *steps):
    make = tmp_path / "make"
    make.write_text(FAKE_MAKE)
    make.chmod(0o755)
    command = [sys.executable, str(ROOT / "tests" / "support" / "steps.py"), "--make", str(make)]
    done = subprocess.run(
        [*command, "--reports", str(tmp_path / "reports"), *steps], capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stdout


def test_a_failed_step_hides_no_other_and_the_summary_says_each_step_and_every_skip(tmp_path):
    status, printed = run_steps(tmp_path, "first", "second", "third", "fourth")
    assert status == 1
    summary = printed[printed.index("make test:") :].splitlines()
    assert summary[0].startswith("make test: every step ran, FAILED: first, fourth (")
    assert [line.split()[:2] for line in summary[1:5]] == [
        ["first", "FAILED"],
        ["second", "passed"],
        ["third", "passed"],
        ["fourth", "FAILED"],
    ]
    assert "1 failed, 3 passed" in summary[1] and "nothing selected" in summary[3] and "exit status 2" in summary[4]
    assert summary[5] == "skipped 3: 2 × chromium is not installed; 1 × no Python 3.13 here"
    assert summary[6] == "total: 5 passed, 1 failed, 3 skipped"


def test_when_every_step_passes_the_exit_status_is_0(tmp_path):
    status, printed = run_steps(tmp_path, "second", "third")
    assert status == 0 and "make test: every step ran, all passed" in printed
