"""`make run`'s stack: starts on embedded defaults, answers, and leaves nothing behind on stop."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port):
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_local_stack_serves_the_queue_and_stops_cleanly():
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VQ_") and k != "REDIS_URL"}
    env["VQ_LOCAL_PORT"] = str(port)
    env["VQ_TICK_MS"] = "500"
    stack = subprocess.Popen([sys.executable, str(ROOT / "infra" / "local_stack.py")], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = stack.stdout.readline()
            lines.append(line)
            if "Ctrl-C stops everything" in line or stack.poll() is not None:
                break
        assert "virtual-queue is running" in "".join(lines), "".join(lines)
        redis_port = int("".join(lines).split("Redis  redis://127.0.0.1:")[1].split()[0])

        entries = f"http://127.0.0.1:{port}/virtual-queues/limited-drop/1/entries"
        request = urllib.request.Request(entries, method="POST", headers={"X-User-Id": "1"})
        with urllib.request.urlopen(request, timeout=5) as answer:
            entered = json.load(answer)
        assert entered["status"] == "WAITING"
        # The pump loop admits the user within a tick or two (VQ_TICK_MS 500 here).
        poll = urllib.request.Request(entries + "/me", headers={"X-User-Id": "1", "X-Queue-Ticket": entered["queueTicket"]})
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with urllib.request.urlopen(poll, timeout=5) as answer:
                polled = json.load(answer)
            if polled["status"] == "ADMITTED":
                break
            time.sleep(0.2)
        assert polled["status"] == "ADMITTED" and polled["entryToken"]
    finally:
        stack.send_signal(signal.SIGINT)
        stack.communicate(timeout=20)
    assert stack.returncode == 0
    assert not port_open(port), "the API is still listening"
    assert not port_open(redis_port), "the embedded Valkey is still running"
