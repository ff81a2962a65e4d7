"""The API on this machine: Chalice's local server (what `chalice local` runs), with five differences.

- The environment wins. `chalice local` copies `.chalice/config.json`'s environment_variables over the
  process environment, so a `VQ_TICK_MS=200` given to the local stack would reach its pump but not the API,
  and the two would disagree on the rate. Here the config only fills in what the environment leaves unset.
- Answers are not held back by Nagle's algorithm: Chalice writes the headers and the body separately, and on
  a kept-alive connection the delayed ACK then adds 40 ms to every answer (22 requests/s per connection).
- One request at a time goes through the app, as in one Lambda container. The server has a thread per
  connection, but Chalice keeps the request in hand on the app object (`app.current_request`): two at once
  read each other's headers, and a user could be answered with another user's place or entry token.
- Several worker processes (`--workers`, default two per core) serve one listening socket, as several
  Lambda containers serve one API: one process answers a few hundred requests a second, a crowd asks more.
- The listen backlog holds 1,024 connections, not 5: a burst of new connections past the backlog waits in
  TCP retries of a second and more, and the queue would seem slow when its server only refused to listen.

Usage: `python infra/local/api.py --port 8000 [--workers N]` (the local stack starts it). SIGTERM or SIGINT
stops every worker; if one dies the others are stopped too, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import sys
import threading
from pathlib import Path

from chalice import Chalice
from chalice.cli.factory import CLIFactory
from chalice.config import Config
from chalice.deploy.validate import validate_routes
from chalice.local import (
    ChaliceRequestHandler,
    LambdaContext,
    LocalDevServer,
    MatchResult,
    RouteMatcher,
    ThreadedHTTPServer,
)

ROOT = Path(__file__).resolve().parents[2]


class _Handler(ChaliceRequestHandler):
    disable_nagle_algorithm = True
    _one_at_a_time = threading.Lock()

    def _handle_alone(self) -> None:
        with self._one_at_a_time:
            self._generic_handle()

    # The base class binds these to `_generic_handle` itself, so overriding that alone would change nothing.
    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = do_OPTIONS = _handle_alone

    def __getattr__(self, name: str):
        # Any other method (TRACE, QUERY, ...) goes to the app too, which refuses it with 405 METHOD_NOT_ALLOWED
        # and `Allow`, as any method a route does not take, where http.server would answer an HTML 501.
        if name.startswith("do_"):
            return self._handle_alone
        raise AttributeError(name)


class _Server(ThreadedHTTPServer):
    request_queue_size = 1024  # the listen backlog (socketserver's default is 5)


def main(argv: list[str] | None = None) -> int:
    """Serve the app until the process is stopped (0), or until a worker dies (1)."""
    parser = argparse.ArgumentParser(description="Serve the app locally; the environment wins over config.json.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--stage", default="dev")
    parser.add_argument(
        "--workers",
        type=int,
        default=2 * (os.cpu_count() or 1),
        help="processes serving the socket (a worker waits on Redis part of the time)",
    )
    args = parser.parse_args(argv)
    app, config = load_app(args.stage)
    # Bound and listening before the fork, so every worker accepts from the one socket. Nothing has connected
    # to Redis yet: each worker makes its own clients on its first request.
    server = LocalDevServer(app, config, args.host, args.port, handler_cls=_Handler, server_cls=_Server)
    workers = [_fork(server) for _ in range(args.workers)]
    print(f"Serving on http://{args.host}:{args.port} with {len(workers)} workers", flush=True)
    return _supervise(workers)


def load_app(stage: str = "dev") -> tuple[Chalice, Config]:
    """The app and its stage's configuration, as `chalice local` loads them, but the environment wins."""
    config = app_environment(stage)
    validate_routes(config.chalice_app.routes)
    return config.chalice_app, config


def app_environment(stage: str = "dev") -> Config:
    """The stage's configuration, with its environment variables set in this process where the environment
    leaves them unset. Before anything imports chalicelib: some settings are read once, at import (the
    Tracer's switch), and a process that imports chalicelib first would run the app otherwise than deployed."""
    # The factory writes the config's variables into the mapping it is given: a copy, so they cannot override.
    factory = CLIFactory(str(ROOT), environ=dict(os.environ))
    config = factory.create_config_obj(chalice_stage_name=stage)
    for name, value in config.environment_variables.items():
        os.environ.setdefault(name, value)
    return config


class LambdaProxy:
    """The app called as Lambda calls it behind API Gateway's REST proxy integration, in this process: the event
    API Gateway makes of a request (route, path parameters, a request id), and one warm container's context.

    Chalice's LocalGateway makes the same event for `chalice local`, but also matches the route, draws a UUID and
    builds a Lambda context afresh on every request: a tenth of a simulated client's CPU, spent on nothing
    deployed. Routes are matched once per path here. Not for routes with an authorizer (API Gateway would run it
    first), nor for binary bodies.
    """

    def __init__(self, app: Chalice) -> None:
        self._app = app
        self._matcher = RouteMatcher(list(app.routes))
        self._routes: dict[str, MatchResult] = {}
        self._context = LambdaContext(app.app_name, memory_size=1024)
        self._request_ids = (f"local-{os.getpid()}-{n}" for n in itertools.count())

    def __call__(self, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> dict:
        """The app's answer (a proxy integration response); ValueError if no route has `path`."""
        route = self._routes.get(path)
        if route is None:
            route = self._routes[path] = self._matcher.match_route(path)
        return self._app(
            {
                "resource": route.route,
                "path": path,
                "httpMethod": method,
                "headers": headers,
                "multiValueQueryStringParameters": route.query_params or None,
                "pathParameters": route.captured,
                "stageVariables": None,
                "body": None if body is None else body.decode(),
                "isBase64Encoded": False,
                "requestContext": {
                    "resourcePath": route.route,
                    "httpMethod": method,
                    "path": path,
                    "requestId": next(self._request_ids),
                    "identity": {"sourceIp": "127.0.0.1"},
                },
            },
            self._context,
        )


def _fork(server: LocalDevServer) -> int:
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C at a terminal reaches the workers too
        try:
            server.server.serve_forever()
        finally:
            os._exit(1)
    return pid


def _supervise(workers: list[int]) -> int:
    """Wait for a stop signal or a dead worker; then stop the rest."""
    stopping = False

    def stop(signum, frame):
        nonlocal stopping
        stopping = True
        raise SystemExit

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        pid, _ = os.wait()
        workers.remove(pid)
        print(f"local API worker {pid} died; stopping", file=sys.stderr, flush=True)
    except SystemExit:
        pass
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    for pid in workers:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return 0 if stopping else 1


if __name__ == "__main__":
    sys.exit(main())
