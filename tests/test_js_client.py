"""`make test-js`'s runner (tests/support/js_client.py): without Node it skips saying why, in CI it fails; its step
report carries node's counts and skip reasons. (The client's own tests run in that step, with node --test.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.js_client import build, counts, node_missing

ROOT = Path(__file__).resolve().parent.parent


def run_without_node(tmp_path, **env):
    report = tmp_path / "report.json"
    bare = {k: v for k, v in os.environ.items() if k != "CI"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "support" / "js_client.py")],
        env={**bare, "PATH": str(tmp_path), "VQ_STEP_REPORT": str(report), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout, json.loads(report.read_text())


def test_without_node_the_step_skips_in_one_line_saying_why(tmp_path):
    status, printed, report = run_without_node(tmp_path)
    assert status == 0
    assert printed == "test-js: skipped: Node 20+ and npm are not installed (apt-get install nodejs npm)\n"
    assert report == {
        "exitstatus": 0,
        "outcomes": {"skipped": 1},
        "skips": {"Node 20+ and npm are not installed (apt-get install nodejs npm)": 1},
    }


def test_without_node_the_step_fails_in_ci(tmp_path):
    status, printed, report = run_without_node(tmp_path, CI="true")
    assert status == 1
    assert printed.startswith("test-js: FAILED: Node 20+ and npm are not installed")
    assert report["exitstatus"] == 1 and report["outcomes"] == {"failed": 1}


def test_the_report_counts_what_node_s_tap_summary_says_and_each_skip_s_reason():
    tap = "\n".join(
        [
            "ok 1 - pacing",
            "ok 2 - the /line reading # SKIP the stack has no /line route",
            "not ok 3 - leave",
            "# tests 3",
            "# pass 1",
            "# fail 1",
            "# cancelled 0",
            "# skipped 1",
        ]
    )
    outcomes, skips = counts(tap)
    assert dict(outcomes) == {"passed": 1, "failed": 1, "skipped": 1, "error": 0}
    assert dict(skips) == {"the stack has no /line route": 1}


@pytest.mark.slow
def test_the_client_crowd_runs_both_crowds_through_the_origin_and_counts_each_round():
    """infra/sim/client_crowd.py with a tiny crowd: every user of both crowds buys, and the origin's log counts at
    least an enter, a poll and a purchase per user in each round. (The ratio itself is a figure it prints.)"""
    missing = node_missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)
    build()
    done = subprocess.run(
        [sys.executable, str(ROOT / "infra" / "sim" / "client_crowd.py"), "--users", "30", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "library / simulator origin requests:" in done.stdout, done.stdout + done.stderr
    report = json.loads((ROOT / "build" / "client-crowd" / "report.json").read_text())
    assert [r["crowd"] for r in report["rounds"]] == ["simulator", "library"]
    for r in report["rounds"]:
        assert r["outcomes"] == {"bought": 30}
        assert r["requests"] >= 3 * 30
    assert len(report["ratios"]) == 1
