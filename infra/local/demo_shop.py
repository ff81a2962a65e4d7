"""A small demo shop: the downstream behind the purchase routes when the waiting room runs locally.

It serves the purchase paths the gate forwards to. Each drop or event (one path, e.g.
`/limited-drops/1/orders`) has a limited stock, and a user orders at most once per drop or event:
`POST` answers 201 `{"orderId", ...}`, or 409 `{"code": "SOLD_OUT" | "ALREADY_ORDERED"}`, or 400 without
a valid `X-User-Id` (the gate sets it: the verified user). With `login` (`VQ_IDENTITY=jwt make run`), it is also
the shop's sign-in: `GET /login?return=URL&state=S` asks for a user name and sends the browser back to URL with a
JWT and the page's state S in the fragment (infra/local/dev_login.py). `GET /orders` lists the orders, the stock
left, and each purchase request's arrival time, user and idempotency key (what the simulator measures the shop's
load and double purchases by).

Like a real shop API it honours `Idempotency-Key` (the gate sends the entry token's id): the first outcome
under a key (an order, or a refusal for stock) is kept and answered again to every request with that key,
which never makes a second order; a key sent again for another item or user answers 422. A 400 keeps nothing. The
key is read as the IETF draft's structured-field String (`"..."`, what the gate sends by default) or bare (what it
sends with VQ_IDEMPOTENCY_KEY_FORMAT=bare), the two forms of one key naming the same key (`idempotency_key`).

When an item's stock runs out, the answer that sells the last unit, and every refusal for stock after it, carry
`X-Queue-Sold-Out: true` (`says_sold_out`): the waiting room then closes that line. With `capacity_per_s` the
shop works like a real one with `workers` order handlers: each order takes `workers / capacity_per_s` seconds
of a handler, and orders beyond that wait for one, so above its capacity its latency climbs without bound (the
simulator's shop that degrades past a capacity the queue is not told). `ShopProcess` runs it in a process of
its own, as `python infra/local/demo_shop.py`: under a simulated crowd, a shop sharing the crowd's process (and its
interpreter lock) would be slowed by the crowd, not by its orders.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from contextlib import nullcontext
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chalicelib.origin import NOT_TAKEN_HEADER, SOLD_OUT_HEADER  # noqa: E402
from chalicelib.targets import TARGET_TYPES  # noqa: E402

POSITIVE_ID = r"[1-9][0-9]{0,17}"
USER_ID = re.compile(r"[\x21-\x7e]{1,128}")  # as the waiting room's (chalicelib/targets.py)
# The draft's (draft-ietf-httpapi-idempotency-key-header) structured-field String (RFC 9651), and the bare form.
SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
BARE_KEY = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
STATE = re.compile(r"[A-Za-z0-9_-]{1,128}")  # the waiting-room page's sign-in state, handed back as it came
# Every target type's purchase path, as a real downstream would serve it.
ITEM_PATH = re.compile(
    "|".join(
        re.escape(kind.purchase_path).replace(re.escape("{" + kind.id_parameter + "}"), POSITIVE_ID)
        for kind in TARGET_TYPES.values()
    )
)


class DemoShop:
    """The shop's state and its HTTP server on 127.0.0.1 (`port` 0: any free port)."""

    def __init__(
        self,
        stock: int,
        port: int = 0,
        says_sold_out: bool = True,
        capacity_per_s: float | None = None,
        workers: int = 4,
        login: Callable[[str], str] | None = None,
    ) -> None:
        self.stock = stock
        self.login = login  # signs a JWT for a user name (dev_login.py), or None: no sign-in here
        self.says_sold_out = says_sold_out
        self.capacity_per_s = capacity_per_s
        self._handlers = threading.BoundedSemaphore(workers) if capacity_per_s else None
        self._service_s = workers / capacity_per_s if capacity_per_s else 0.0
        self._lock = threading.Lock()
        self._orders: list[dict] = []
        self._buyers: set[tuple[str, str]] = set()
        self._sold: dict[str, int] = {}
        self._refused: dict[str, int] = {"SOLD_OUT": 0, "ALREADY_ORDERED": 0}
        self._requests: list[dict] = []
        self._outcomes: dict[str, tuple[str, str, int, dict]] = {}  # Idempotency-Key -> item, user, status, body
        self.replayed = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="demo-shop", daemon=True)

    def start(self) -> DemoShop:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def order(self, item: str, user_id: str, key: str | None = None) -> tuple[int, dict]:
        """Take one unit of `item` for `user_id`: (201, the order) or (409, why not); under an idempotency `key`,
        the first outcome again (or 422 if the key was used for another item or user). With a capacity, first
        wait for a free handler and take its time."""
        arrived = time.time()
        with self._handlers or nullcontext():
            time.sleep(self._service_s)
            return self._order(item, user_id, key, arrived)

    def sold_out(self, item: str) -> bool:
        """Whether `item` has no stock left (what the shop tells the waiting room, if it `says_sold_out`)."""
        with self._lock:
            return self._sold.get(item, 0) >= self.stock

    def _order(self, item: str, user_id: str, key: str | None, arrived: float) -> tuple[int, dict]:
        with self._lock:
            self._requests.append({"at": arrived, "userId": user_id, "key": key, "done": time.time()})
            if key is not None and key in self._outcomes:
                first_item, first_user, status, body = self._outcomes[key]
                if (first_item, first_user) != (item, user_id):
                    return 422, {"code": "IDEMPOTENCY_KEY_REUSED", "detail": "this key was used for another order"}
                self.replayed += 1
                return status, body
            status, body = self._take(item, user_id)
            if key is not None:
                self._outcomes[key] = (item, user_id, status, body)
            return status, body

    def _take(self, item: str, user_id: str) -> tuple[int, dict]:
        """One unit of `item` for `user_id`, under the lock."""
        if (item, user_id) in self._buyers:
            return self._refuse("ALREADY_ORDERED", "this user has already ordered this item")
        sold = self._sold.get(item, 0)
        if sold >= self.stock:
            return self._refuse("SOLD_OUT", "sold out")
        self._sold[item] = sold + 1
        self._buyers.add((item, user_id))
        order = {
            "orderId": len(self._orders) + 1,
            "item": item,
            "userId": user_id,
            "left": self.stock - sold - 1,
            "at": time.time(),
        }
        self._orders.append(order)
        return 201, order

    def summary(self) -> dict:
        """Orders, stock left per item, refusals, and every purchase request (when, from whom)."""
        with self._lock:
            return {
                "stockPerItem": self.stock,
                "left": {item: self.stock - sold for item, sold in self._sold.items()},
                "orders": list(self._orders),
                "refused": dict(self._refused),
                "replayed": self.replayed,
                "requests": list(self._requests),
            }

    def _refuse(self, code: str, detail: str) -> tuple[int, dict]:
        self._refused[code] += 1
        return 409, {"code": code, "detail": detail}


def idempotency_key(header: str | None) -> str | None:
    """The key an `Idempotency-Key` header names: a structured-field String unquoted, or the bare form as it is
    (None without the header). ValueError for anything else: a shop reads the two forms of one key as one key."""
    if header is None:
        return None
    text = header.strip(" \t")
    string = SF_STRING.fullmatch(text)
    if string is not None:
        return re.sub(r"\\(.)", r"\1", string[1])
    if BARE_KEY.fullmatch(text):
        return text
    raise ValueError("Idempotency-Key must be a structured-field String (the draft's) or a bare token")


SIGN_IN = """<!doctype html><html lang="en"><meta charset="utf-8"><title>Sign in: demo shop</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<form method="get" action="/login" style="font: 1rem system-ui; max-width: 24rem; margin: 3rem auto">
<h1>Demo shop: sign in</h1><p>Any user name will do: the demo checks no password.</p>
<label>User name <input name="user" id="user" required pattern="[!-~]{1,128}" autocomplete="username"></label>
<input type="hidden" name="return" value="__RETURN__"> <input type="hidden" name="state" value="__STATE__">
<button type="submit">Sign in</button></form></html>
"""


def _handler(shop: DemoShop) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            user = self.headers.get("X-User-Id") or ""
            if not ITEM_PATH.fullmatch(self.path):
                self._answer(404, {"code": "NOT_FOUND", "detail": "no such item"})
            elif not USER_ID.fullmatch(user):
                self._answer(400, {"code": "INVALID_ARGUMENT", "detail": "X-User-Id must be a user id"})
            else:
                try:
                    key = idempotency_key(self.headers.get("Idempotency-Key"))
                except ValueError as err:  # nothing taken, nothing kept: the gate may give the token back
                    self._answer(400, {"code": "INVALID_ARGUMENT", "detail": str(err)}, {NOT_TAKEN_HEADER: "true"})
                    return
                status, body = shop.order(self.path, user, key)
                sold_out = shop.says_sold_out and shop.sold_out(self.path)
                self._answer(status, body, {SOLD_OUT_HEADER: "true"} if sold_out else {})

        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            if path == "/orders":
                self._answer(200, shop.summary())
            elif path == "/login" and shop.login is not None:
                self._sign_in(urllib.parse.parse_qs(query))
            elif path == "/favicon.ico":
                self.send_response(204)  # the sign-in page's browser asks: nothing to show, nothing to log
                self.end_headers()
            else:
                self._answer(404, {"code": "NOT_FOUND", "detail": "try GET /orders"})

        def _sign_in(self, query: dict[str, list[str]]) -> None:
            """The sign-in form; once a user name is given, back to the waiting room with a JWT in the fragment, and
            the state the page sent, which the page takes the JWT with (docs/identity.md: the page). Only back to
            this machine: the demo must not be an open redirect."""
            back, user = query.get("return", [""])[0], query.get("user", [""])[0]
            state = query.get("state", [""])[0]
            if not re.fullmatch(r"http://(127\.0\.0\.1|localhost)(:[0-9]+)?/[^#\s]*", back):
                self._answer(400, {"code": "INVALID_ARGUMENT", "detail": "return must be a page on this machine"})
            elif not STATE.fullmatch(state):
                self._answer(400, {"code": "INVALID_ARGUMENT", "detail": "state must be the page's, 1 to 128 URL-safe"})
            elif USER_ID.fullmatch(user) and shop.login is not None:
                self.send_response(303)
                self.send_header("Location", f"{back}#token={shop.login(user)}&state={state}")
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                page = SIGN_IN.replace("__RETURN__", html.escape(back, quote=True)).replace("__STATE__", state).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

        def _answer(self, status: int, body: dict, headers: dict | None = None) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per request would drown `make run`'s output

    return Handler


class ShopProcess:
    """A DemoShop in a process of its own, with the same `url`, `summary()` and `stop()`."""

    def __init__(self, stock: int, port: int, **options: object) -> None:
        self.url = f"http://127.0.0.1:{port}"
        arguments = ["--port", str(port), "--stock", str(stock)]
        if not options.get("says_sold_out", True):
            arguments.append("--silent")
        if options.get("capacity_per_s"):
            arguments += ["--capacity", str(options["capacity_per_s"]), "--workers", str(options.get("workers", 4))]
        self.process = subprocess.Popen([sys.executable, __file__, *arguments])

    def start(self) -> ShopProcess:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self.summary()
                return self
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"the demo shop did not answer at {self.url}")

    def summary(self) -> dict:
        with urllib.request.urlopen(self.url + "/orders", timeout=30) as answer:
            return json.load(answer)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def main(argv: list[str] | None = None) -> None:
    """Serve the demo shop until SIGTERM or Ctrl-C."""
    parser = argparse.ArgumentParser(description="The demo shop on 127.0.0.1.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--stock", type=int, required=True)
    parser.add_argument("--capacity", type=float, help="orders/s it handles (default: unbounded)")
    parser.add_argument("--workers", type=int, default=4, help="order handlers (with a capacity)")
    parser.add_argument("--silent", action="store_true", help="never say X-Queue-Sold-Out")
    args = parser.parse_args(argv)
    shop = DemoShop(
        args.stock, args.port, says_sold_out=not args.silent, capacity_per_s=args.capacity, workers=args.workers
    ).start()
    signal.signal(signal.SIGTERM, lambda *_: (shop.stop(), sys.exit(0)))
    try:
        signal.pause()
    except KeyboardInterrupt:
        shop.stop()


if __name__ == "__main__":
    main()
