"""A real downstream shop for the purchase routes' tests, on 127.0.0.1."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Origin:
    """A real downstream on 127.0.0.1 that records each request and answers as told."""

    def __init__(self):
        self.requests = []
        self.answers = []  # (status, body) to give, in order; then 201
        self.delay_s = 0.0
        self.released = threading.Event()
        origin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                origin.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                origin.released.wait(origin.delay_s)
                status, answer = origin.answers.pop(0) if origin.answers else (201, {"orderId": len(origin.requests)})
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
