"""A real downstream shop for the purchase routes' tests, on 127.0.0.1, honouring Idempotency-Key as a real shop
API does: the first outcome under a key (read as the demo shop reads it, in either form) is kept and answered again
to every retry with that key."""

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from infra.local.demo_shop import idempotency_key


class Origin:
    """A real downstream on 127.0.0.1 that records each request and answers as told.

    `answers` holds what to answer next, in order, then 201 with a new order: `(status, body)`, or
    `(status, body, {"commit": True})` to take the order (kept under the key) but answer `status` all the same (a
    shop failing after its commit), or `(status, body, {"not_taken": True})` to answer `X-Queue-Not-Taken: true`;
    `{"delay_s": s}` delays that one answer, after the commit. A non-2xx answer without "commit" keeps nothing
    under the key. `delay_s` delays every answer, after the commit.
    """

    def __init__(self):
        self.requests = []
        self.answers = []
        self.answer_headers = {}  # sent with every answer
        self.orders = []  # every order taken: {"orderId", "key"}
        self.outcomes = {}  # Idempotency-Key -> (status, body) of the order taken under it
        self.delay_s = 0.0
        self.released = threading.Event()
        self.lock = threading.Lock()
        origin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, answer, headers, delay_s = origin.handle(self.path, dict(self.headers), body)
                origin.released.wait(origin.delay_s + delay_s)
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in {**headers, **origin.answer_headers}.items():
                    self.send_header(name, value)
                self.end_headers()
                # A broken pipe: the gate stopped waiting (its timeout); the order stands all the same
                with contextlib.suppress(BrokenPipeError):
                    self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def handle(self, path, headers, body):
        with self.lock:
            self.requests.append({"path": path, "headers": headers, "body": body})
            key = idempotency_key(headers.get("Idempotency-Key"))  # either form, as the demo shop reads it
            if key is not None and key in self.outcomes:
                return (*self.outcomes[key], {}, 0)
            status, answer, options = (self.answers.pop(0) + ({},))[:3] if self.answers else (201, None, {})
            if 200 <= status < 300 or options.get("commit"):
                order = {"orderId": len(self.orders) + 1}
                self.orders.append({**order, "key": key})
                if key is not None:
                    self.outcomes[key] = (201, order) if options.get("commit") else (status, answer or order)
                answer = order if answer is None else answer
            headers = {"X-Queue-Not-Taken": "true"} if options.get("not_taken") else {}
            return status, answer, headers, options.get("delay_s", 0)

    def orders_per_key(self):
        """How many orders each Idempotency-Key made."""
        counts = {}
        for order in self.orders:
            counts[order["key"]] = counts.get(order["key"], 0) + 1
        return counts

    def close(self):
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
