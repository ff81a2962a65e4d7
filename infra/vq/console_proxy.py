"""`vq console`: the operator console of a deployed stack, through a signing proxy on the operator's machine.

Deployed, the console and the routes it calls are IAM-protected, and a browser cannot sign with SigV4. The proxy
listens on 127.0.0.1 only, forwards the console's own requests (the page, the target list, stats and config) to
the API signed with the operator's credentials, and nothing else. Other pages the operator has open must not
use it: the address it prints carries a one-time key that the proxy trades, once, for a random session in a
SameSite=Strict cookie, and a request without that cookie, from another Origin, or for another Host (DNS
rebinding) is refused; so is the key a second time (a copied address, the browser's history).
Against `make run` (nothing to sign) it only opens the console's address.
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
import sys
import threading
import webbrowser
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlencode, urlsplit

from infra.vq.client import ApiError, OperatorApi

COOKIE = "vq_console"
# The console's requests: its page, the target list, and each target's stats and config.
_ALLOWED = {
    "GET": re.compile(r"/console|/virtual-queues(/[a-z][a-z-]*/[0-9]{1,18}/(stats|config))?"),
    "PATCH": re.compile(r"/virtual-queues/[a-z][a-z-]*/[0-9]{1,18}/config"),
    "PUT": re.compile(r"/virtual-queues/[a-z][a-z-]*/[0-9]{1,18}/config"),
}
_FORWARDED_REQUEST_HEADERS = ("Accept", "Content-Type", "If-Match", "If-None-Match")
_FORWARDED_ANSWER_HEADERS = (
    "Content-Type",
    "ETag",
    "Cache-Control",
    "Retry-After",
    "Vary",
    "Content-Security-Policy",
    "X-Content-Type-Options",
    "Referrer-Policy",
)
MAX_BODY_BYTES = 16_384


def serve_console(api: OperatorApi, port: int = 0, open_browser: bool = True, watched: Sequence[str] = ()) -> None:
    """Open the console: through a signing proxy on 127.0.0.1:`port` until Ctrl-C when `api` signs, else
    directly."""
    query = urlencode([("watch", name) for name in watched], safe="/")
    if not api.signs:
        address = f"{api.base}/console" + (f"?{query}" if query else "")
        print(f"The console (nothing to sign here): {address}", flush=True)
        if open_browser:
            webbrowser.open(address)
        return
    server = console_proxy(api, port)
    query = urlencode([("key", server.key), *[("watch", w) for w in watched]], safe="/")
    address = f"http://127.0.0.1:{server.server_address[1]}/console?{query}"
    print(f"The console of {api.base}, signed as you, at:\n  {address}\nCtrl-C stops the proxy.", flush=True)
    if open_browser:
        webbrowser.open(address)
    try:
        server.serve_forever()
    finally:
        server.server_close()


class ConsoleProxy(ThreadingHTTPServer):
    """The proxy's server: the API it signs for, and the key its first address carries."""

    daemon_threads = True

    def __init__(self, api: OperatorApi, port: int) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.api = api
        self.key = secrets.token_urlsafe(24)
        self.own_hosts = {f"127.0.0.1:{self.server_address[1]}", f"localhost:{self.server_address[1]}"}
        self._session: str | None = None  # the cookie's value, once the key was traded for it
        self._lock = threading.Lock()

    def trade(self, key: str) -> str | None:
        """A new session for the printed key, the first time only; None for any other key, or the key again."""
        with self._lock:
            if self._session is not None or not hmac.compare_digest(key.encode(), self.key.encode()):
                return None
            self._session = secrets.token_urlsafe(32)
            return self._session

    def admits(self, cookie: str) -> bool:
        """Whether `cookie` is the session the key was traded for."""
        session = self._session
        return session is not None and hmac.compare_digest(cookie.encode(), session.encode())


def console_proxy(api: OperatorApi, port: int = 0) -> ConsoleProxy:
    """A proxy bound to 127.0.0.1:`port` (0: a free port), not yet serving."""
    return ConsoleProxy(api, port)


class _Handler(BaseHTTPRequestHandler):
    server: ConsoleProxy

    def do_GET(self) -> None:
        self._forward()

    # Every method gets the same checks; only the console's are forwarded.
    do_PATCH = do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def log_message(self, format: str, *args: object) -> None:  # the base class's name for it
        status = args[1] if len(args) > 1 else ""
        print(f"vq console: {self.command} {self.path.split('?')[0]} {status}", file=sys.stderr)

    def _forward(self) -> None:
        parts = urlsplit(self.path)
        if self.headers.get("Host") not in self.server.own_hosts:
            return self._refuse(403, "this proxy answers only at the address vq console printed")
        origin = self.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc not in self.server.own_hosts:
            return self._refuse(403, "requests from other pages are refused")
        query = parse_qsl(parts.query)
        key = dict(query).get("key")
        if key is not None:
            # The printed address: trade its key for a session, and drop it from the address bar and history.
            session = self.server.trade(key)
            if session is None:
                return self._refuse(403, "this key was used already (or is not this proxy's): run vq console again")
            rest = urlencode([(k, v) for k, v in query if k != "key"], safe="/")
            self.send_response(303)
            self.send_header("Location", parts.path + (f"?{rest}" if rest else ""))
            self.send_header("Set-Cookie", f"{COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if not self.server.admits(self._cookie()):
            return self._refuse(403, "open the address vq console printed (it carries this proxy's key)")
        allowed = _ALLOWED.get(self.command)
        if allowed is None or not allowed.fullmatch(parts.path):
            return self._refuse(404, "the console's proxy forwards only the console's own requests")
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            return self._refuse(413, "the body is too large")
        body = self.rfile.read(length) if length else None
        headers = {name: self.headers[name] for name in _FORWARDED_REQUEST_HEADERS if self.headers.get(name)}
        try:
            status, answered, raw = self.server.api.send(self.command, self.server.api.base + self.path, headers, body)
        except ApiError as err:
            return self._refuse(502, err.detail)
        self.send_response(status)
        for name in _FORWARDED_ANSWER_HEADERS:
            value = next((v for k, v in answered.items() if k.lower() == name.lower()), None)
            if value is not None:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)
        return None

    def _cookie(self) -> str:
        for item in (self.headers.get("Cookie") or "").split(";"):
            name, _, value = item.strip().partition("=")
            if name == COOKIE:
                return value
        return ""

    def _refuse(self, status: int, detail: str) -> None:
        body = json.dumps({"code": "CONSOLE_PROXY", "detail": detail}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
