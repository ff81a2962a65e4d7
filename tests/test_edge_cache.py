"""infra/local/edge_cache.py: nginx in front of an origin caches as the CloudFront distribution does (issue 39). A
burst on a cached route reaches the origin once, `no-store` every time, a failing origin is answered from the stale
copy, and a shopper's own headers pass on every other route but never reach a cached one."""

import json
import math
import subprocess
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from infra.local.edge_cache import PER_USER_HEADERS
from infra.local.stack import LocalStack, free_port
from tests.support.edge_cache import require_nginx

CACHED = r"^/(public|private)$"  # the origin's two cached routes; /mine is a per-user route
PUBLIC = "public, max-age=1, stale-while-revalidate=2, stale-if-error=30"


class Origin(ThreadingHTTPServer):
    """The test's own origin: /public answers `public, max-age=1`, /private `no-store`, /mine echoes what reached
    it; `failing` turns /public into a 503. It notes every request it saw."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[tuple[str, str, dict, bytes]] = []
        self.failing = False
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"

    def saw(self, path: str) -> list[tuple[str, str, dict, bytes]]:
        return [request for request in self.seen if request[1].split("?")[0] == path]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Origin

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self.answer()

    def do_POST(self) -> None:
        self.answer()

    def answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append((self.command, self.path, dict(self.headers), body))
        path = self.path.split("?")[0]
        status, cache_control = 200, "no-store"
        if path == "/public" and self.server.failing:
            status = 503
        elif path == "/public":
            time.sleep(0.05)  # long enough for a burst to pile up on the miss
            cache_control = PUBLIC
        answer = json.dumps({"answer": len(self.server.seen), "headers": dict(self.headers), "body": body.decode()})
        self.send_response(status)
        self.send_header("Cache-Control", cache_control)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer.encode())


@pytest.fixture
def origin():
    server = Origin()
    yield server
    server.shutdown()
    server.server_close()


def call(url: str, headers: dict | None = None, body: bytes | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers=headers or {}, data=body, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as answer:
        return answer.status, json.loads(answer.read())


def shopper(n: int) -> dict:
    return {header: f"{header.lower()}-{n}" for header in PER_USER_HEADERS}


def test_a_burst_on_a_cached_route_reaches_the_origin_once_and_the_shoppers_headers_never(edge_cache, origin):
    edge = edge_cache(origin.url, cached_paths=CACHED)
    started = time.monotonic()
    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(lambda n: call(f"{edge.url}/public?n={n}", shopper(n)), range(200)))
    took_s = time.monotonic() - started
    assert {status for status, _ in answers} == {200}
    # One answer for everyone: a second one only if the copy expired meanwhile (it lives 1 to 2 s).
    reached = origin.saw("/public")
    assert 1 <= len(reached) <= 1 + math.ceil(took_s)
    assert len({json.dumps(body) for _, body in answers}) <= len(reached)
    # Neither the query nor a shopper's header reaches the origin on a cached route: nothing it could vary on.
    assert all(path == "/public" for _, path, _, _ in reached)
    assert not {header.lower() for _, _, headers, _ in reached for header in headers} & {
        h.lower() for h in PER_USER_HEADERS
    }
    counts = edge.counts(at_least=200)
    assert counts["origin"] == len(reached) and counts["edge"] == 200 - len(reached)
    assert counts["HIT"] + counts["UPDATING"] == counts["edge"]


def test_a_no_store_answer_on_a_cached_route_reaches_the_origin_every_time(edge_cache, origin):
    edge = edge_cache(origin.url, cached_paths=CACHED)
    for _ in range(20):
        assert call(f"{edge.url}/private")[0] == 200
    assert len(origin.saw("/private")) == 20
    counts = edge.counts(at_least=20)
    assert counts["origin"] == 20 and counts["edge"] == 0


@pytest.mark.slow
def test_an_origin_answering_503_is_answered_from_the_stale_copy(edge_cache, origin):
    edge = edge_cache(origin.url, cached_paths=CACHED)
    status, fresh = call(f"{edge.url}/public")
    assert status == 200
    time.sleep(2.1)  # past max-age=1 (nginx counts it in whole seconds), within stale-if-error=30
    origin.failing = True
    answers = [call(f"{edge.url}/public") for _ in range(3)]
    assert answers == [(200, fresh)] * 3
    # It was asked (in the background, while the stale copy answered) and failed.
    deadline = time.monotonic() + 5
    while len(origin.saw("/public")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(origin.saw("/public")) >= 2
    assert {r.cache_status for r in edge.requests(at_least=5)[1:] if r.from_edge} <= {"STALE", "UPDATING"}


def test_every_other_route_passes_the_shoppers_headers_and_body_and_caches_nothing(edge_cache, origin):
    edge = edge_cache(origin.url, cached_paths=CACHED)
    for n in (1, 2):
        status, echoed = call(f"{edge.url}/mine", shopper(n), body=b'{"quantity": 1}')
        assert status == 200 and echoed["body"] == '{"quantity": 1}'
        assert {header: echoed["headers"].get(header) for header in PER_USER_HEADERS} == shopper(n)
    assert len(origin.saw("/mine")) == 2
    assert [(r.method, r.cache_status, r.reached_origin) for r in edge.requests(at_least=2)] == [
        ("POST", "-", True)
    ] * 2


def test_the_local_stack_serves_its_api_through_the_cache_with_edge(env):
    # `infra/local/stack.py --edge`: the shopper's calls pass through the cache to the API, each counted at the origin.
    # (The `env` fixture has put this test's Redis and key prefix in os.environ.)
    require_nginx()
    with LocalStack(api_port=free_port(), pump_class=None, api_output=subprocess.DEVNULL, edge=True) as stack:
        assert stack.edge_cache.url in stack.describe()
        entries = f"{stack.edge_cache.url}/virtual-queues/limited-drop/1/entries"
        status, entered = call(entries, {"X-User-Id": "7", "Content-Type": "application/json"}, body=b"{}")
        assert status == 200, entered
        me = {"X-User-Id": "7", "X-Queue-Ticket": entered["queueTicket"]}
        status, polled = call(entries + "/me", me)
        assert status == 200 and polled["position"] == 1
        assert stack.edge_cache.counts(at_least=2)["origin"] == 2
    assert stack.edge_cache is None
