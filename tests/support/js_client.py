"""`make test-js`: the JavaScript client's tests (clients/js/), against the real local stack.

Installs the client's toolchain from its lockfile (`npm ci`, once per lockfile), compiles it with `tsc`, starts
the local stack (infra/local/stack.py, its pump ticking every 500 ms) on a Valkey of its own that the tests may
kill and restart, and runs `node --test` over clients/js/test/: the unit tests (fake clock, scripted server) and
the integration tests, which find the stack at VQ_API_URL and the Valkey's switch at VQ_JS_CONTROL_URL
(`POST /redis/kill`, `POST /redis/restart`). Writes `make test`'s step report (tests/support/steps.py) with
node's counts and the reasons of its skips.

Without Node (or npm) it says so in one line and skips; with CI set (.ci/run, which installs Debian's `nodejs npm`)
it fails instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
CLIENT = ROOT / "clients" / "js"
LOG = ROOT / "build" / "test-js" / "api.log"
NO_NODE = "Node 20+ and npm are not installed (apt-get install nodejs npm)"
# The stack the integration tests meet: a tick of 500 ms, so a turn, a Retry-After (one tick, at least 1 s) and
# the pacing near the front all come within seconds; a heartbeat of 5 s (polls at most 1.6 s apart) and, where the
# stack has issue 39's /line, a presence window of 10 s (at least twice the heartbeat), so a place 15 s back is far.
STACK_ENV = {
    "VQ_TICK_MS": "500",
    "VQ_HEARTBEAT_TIMEOUT_S": "5",
    "VQ_PRESENCE_WINDOW_S": "10",
    "POWERTOOLS_METRICS_DISABLED": "true",
    "POWERTOOLS_LOG_LEVEL": "WARNING",
}


def node_missing() -> str | None:
    """Why the client cannot be tested here, or None."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        return NO_NODE
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    major = re.match(r"v(\d+)", version)
    if not major or int(major[1]) < 20:
        return f"Node {version or '?'} is older than 20 (apt-get install nodejs npm)"
    return None


def build() -> None:
    """The toolchain from the lockfile (again only when the lockfile changed), then `tsc` and the page's bundle."""
    installed = CLIENT / "node_modules" / ".package-lock.json"
    lock = CLIENT / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=CLIENT, check=True)
    subprocess.run(["npm", "run", "--silent", "build"], cwd=CLIENT, check=True)
    subprocess.run(["npm", "run", "--silent", "bundle"], cwd=CLIENT, check=True)


class RedisSwitch:
    """A loopback HTTP endpoint through which the node tests kill and restart the stack's Valkey."""

    def __init__(self, redis) -> None:
        switch = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                action = {"/redis/kill": redis.kill, "/redis/restart": redis.restart}.get(self.path)
                if action is None:
                    self.send_response(404)
                else:
                    with switch.lock:
                        action()
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def run_node(env: dict[str, str]) -> tuple[int, str]:
    """`node --test` over the client's tests, one file at a time (the outage test stops the shared Valkey)."""
    tests = sorted(str(path.relative_to(CLIENT)) for path in (CLIENT / "test").glob("*.test.mjs"))
    command = ["node", "--test", "--test-concurrency=1", "--test-reporter=tap", *tests]
    done = subprocess.run(command, cwd=CLIENT, env=env, capture_output=True, text=True)
    print(done.stdout, done.stderr, sep="", end="", flush=True)
    return done.returncode, done.stdout


def counts(tap: str) -> tuple[Counter[str], Counter[str]]:
    """The outcomes and skip reasons of node's TAP output (its closing lines, and each `# SKIP reason`)."""
    outcomes: Counter[str] = Counter()
    for name, key in (("pass", "passed"), ("fail", "failed"), ("skipped", "skipped"), ("cancelled", "error")):
        found = re.search(rf"^# {name} (\d+)$", tap, re.M)
        outcomes[key] = int(found[1]) if found else 0
    skips = Counter(match[1].strip() for match in re.finditer(r"^\s*ok \d+ .*# SKIP (.*)$", tap, re.M))
    return outcomes, skips


def report(status: int, outcomes: Counter[str], skips: Counter[str]) -> None:
    path = os.environ.get("VQ_STEP_REPORT")
    if path:
        Path(path).write_text(json.dumps({"exitstatus": status, "outcomes": outcomes, "skips": skips}))


def main() -> int:
    missing = node_missing()
    if missing:
        if os.environ.get("CI"):
            print(f"test-js: FAILED: {missing}", flush=True)
            report(1, Counter(failed=1), Counter())
            return 1
        print(f"test-js: skipped: {missing}", flush=True)
        report(0, Counter(skipped=1), Counter({missing: 1}))
        return 0
    build()
    # The pump runs in this process: its settings and log lines (the outage test's ones too) before chalicelib loads.
    os.environ.update(STACK_ENV)
    from chalicelib.observability import logger
    from infra.local.stack import LocalStack, free_port
    from tests.support.redis_servers import OwnRedis

    LOG.parent.mkdir(parents=True, exist_ok=True)
    redis = OwnRedis()
    switch = RedisSwitch(redis)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VQ_") or k in STACK_ENV}
    env["REDIS_URL"] = redis.url
    try:
        with open(LOG, "w", buffering=1) as log, LocalStack(env, api_port=free_port(), api_output=log) as stack:
            logger.registered_handler.setStream(log)
            node_env = {**os.environ, "VQ_API_URL": stack.api_url, "VQ_JS_CONTROL_URL": switch.url}
            status, tap = run_node(node_env)
    finally:
        switch.close()
        redis.close()
    outcomes, skips = counts(tap)
    report(status, outcomes, skips)
    return status


if __name__ == "__main__":
    sys.exit(main())
