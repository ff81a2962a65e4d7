"""A real HTTP cache in front of a local API, standing in for the CloudFront distribution (issue 39): Debian's nginx.

Like the distribution's behaviours, it caches only the cached routes (by default the line's public state,
`GET .../line`), keyed by the path alone: no header, cookie or query reaches the key, and the per-user headers
(PER_USER_HEADERS) are not even forwarded on those routes, so their answer is one for everyone. It caches what the
origin's `Cache-Control` allows: `public, max-age=1` for a second (nginx counts whole seconds: 1 to 2 s),
`no-store` never. One request at a time fills a missing or expired entry (`proxy_cache_lock`, and a background
update), the others wait for it or are answered the stale copy meanwhile; when the origin fails (an error, a
timeout, a 5xx) the stale copy answers (`proxy_cache_use_stale`) for as long as the cache keeps it, where CloudFront
would keep to the answer's `stale-if-error` seconds. Every other route passes straight through with all its headers
and its body, nothing cached.

Each request is logged with `$upstream_cache_status` and whether it reached the origin, so that a run can count
origin requests apart from the edge's (`EdgeCache.requests`).

Used by the local stack (`infra/local/stack.py --edge`), the simulator (`--edge`) and the tests (the `edge_cache`
fixture of tests/support/edge_cache.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# The line's public state (issue 39): the one cached route.
LINE_PATHS = r"^/virtual-queues/[^/]+/[^/]+/line$"
# A shopper's own headers: forwarded on every other route, never on a cached one (nor in its key).
PER_USER_HEADERS = ("Authorization", "X-User-Id", "X-Queue-Ticket", "X-Entry-Token", "Idempotency-Key")
# $upstream_cache_status of an answer the cache gave from its copy (UPDATING: a stale copy while another request
# fills it); "-" is an uncached route's.
FROM_THE_EDGE = ("HIT", "STALE", "UPDATING")
STARTUP_S = 10.0


def nginx_binary() -> str | None:
    """Debian's nginx lives in /usr/sbin, which a user's PATH may lack."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


@dataclass(frozen=True)
class Request:
    """One line of the cache's log."""

    at: float
    method: str
    path: str
    status: int
    cache_status: str  # $upstream_cache_status, "-" on an uncached route
    reached_origin: bool

    @property
    def from_edge(self) -> bool:
        return not self.reached_origin


class EdgeCache:
    """nginx on `port` (0: a free one) in front of `origin_url`, caching the routes `cached_paths` (a regex) matches.
    A context manager; `url` is where to send requests."""

    def __init__(self, origin_url: str, port: int = 0, cached_paths: str = LINE_PATHS) -> None:
        binary = nginx_binary()
        if binary is None:
            raise FileNotFoundError("nginx is not installed (apt-get install nginx)")
        self.binary, self.origin = binary, origin_url.removeprefix("http://").rstrip("/")
        self.port, self.cached_paths = port or _free_port(), cached_paths
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="vq-edge-"))
        self.log = self.dir / "access.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> EdgeCache:
        """Write the configuration, start nginx in the foreground and wait until it accepts connections."""
        conf = self.dir / "nginx.conf"
        conf.write_text(self.configuration())
        error_log = self.dir / "error.log"
        self.process = subprocess.Popen(
            [self.binary, "-p", str(self.dir), "-c", str(conf), "-e", str(error_log), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            self._wait_until_listening(error_log)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_listening(self, error_log: Path) -> None:
        assert self.process is not None
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nginx exited with {self.process.returncode}: {error_log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"nginx did not listen on {self.port} within {STARTUP_S:g} s")

    def stop(self) -> None:
        """Stop nginx (its whole process group: the master and its worker) and remove its files."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGQUIT)  # a graceful stop
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EdgeCache:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def requests(self, at_least: int = 0, timeout_s: float = 5.0) -> list[Request]:
        """Every request the cache has answered so far, from its log; waiting up to `timeout_s` for `at_least` of
        them (nginx logs a request just after its answer has left)."""
        deadline = time.monotonic() + timeout_s
        while True:
            lines = self.log.read_text().splitlines() if self.log.exists() else []
            if len(lines) >= at_least or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        rows = []
        for line in lines:
            at, method, uri, status, cache_status, upstream = line.split(" ")
            path = uri.partition("?")[0]
            rows.append(Request(float(at), method, path, int(status), cache_status, upstream != "-"))
        return rows

    def counts(self, at_least: int = 0) -> Counter[str]:
        """Requests by where they were answered, `origin` and `edge`, and by $upstream_cache_status (see `requests`
        for `at_least`)."""
        counted: Counter[str] = Counter()
        for request in self.requests(at_least):
            counted["edge" if request.from_edge else "origin"] += 1
            counted[request.cache_status] += 1
        return counted

    def configuration(self) -> str:
        """nginx.conf: one worker, everything under this cache's directory, the cached routes and the rest."""
        d = self.dir
        strip = "\n".join(f'            proxy_set_header {header} "";' for header in PER_USER_HEADERS)
        # Started by root, nginx would run its worker as nobody, who cannot write this cache's directory.
        user = "user root;" if os.geteuid() == 0 else ""
        return f"""
{user}
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    # A background update is a subrequest: logged too, it is the one that reached the origin.
    log_subrequest on;
    log_format edge '$msec $request_method $request_uri $status $upstream_cache_status '
                    '${{upstream_addr}}';
    access_log {d}/access.log edge;
    proxy_cache_path {d}/cache levels=1:2 keys_zone=edge:10m max_size=100m inactive=10m use_temp_path=off;
    upstream origin {{
        server {self.origin};
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{self.port};
        proxy_http_version 1.1;
        # The cached routes: by their path alone, as long as the origin's Cache-Control allows; one request fills
        # an entry, the rest wait for it or take the stale copy; the origin failing, the stale copy.
        location ~ {self.cached_paths} {{
            proxy_pass http://origin$uri;
            proxy_cache edge;
            proxy_cache_key $uri;
            proxy_cache_lock on;
            proxy_cache_lock_timeout 5s;
            proxy_cache_lock_age 5s;
            proxy_cache_background_update on;
            proxy_cache_use_stale error timeout updating http_500 http_502 http_503 http_504;
            proxy_pass_request_body off;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_set_header Content-Length "";
            proxy_set_header Cookie "";
{strip}
        }}
        # Every other route: straight through, every header and the body, nothing cached.
        location / {{
            proxy_pass http://origin;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
        }}
    }}
}}
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
