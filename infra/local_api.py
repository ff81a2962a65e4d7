"""The API on this machine: Chalice's local server (what `chalice local` runs), with three differences.

- The environment wins. `chalice local` copies `.chalice/config.json`'s environment_variables over the
  process environment, so a `VQ_TICK_MS=200` given to the local stack would reach its pump but not the API,
  and the two would disagree on the rate. Here the config only fills in what the environment leaves unset.
- Answers are not held back by Nagle's algorithm: Chalice writes the headers and the body separately, and on
  a kept-alive connection the delayed ACK then adds 40 ms to every answer (22 requests/s per connection).
- One request at a time goes through the app, as in one Lambda container. The server has a thread per
  connection, but Chalice keeps the request in hand on the app object (`app.current_request`): two at once
  read each other's headers, and a user could be answered with another user's place or entry token.

Usage: `python infra/local_api.py --port 8000` (the local stack starts it).
"""

from __future__ import annotations

import argparse
import os
import threading
from pathlib import Path

from chalice.cli.factory import CLIFactory
from chalice.deploy.validate import validate_routes
from chalice.local import ChaliceRequestHandler, LocalDevServer

ROOT = Path(__file__).resolve().parent.parent


class _Handler(ChaliceRequestHandler):
    disable_nagle_algorithm = True
    _one_at_a_time = threading.Lock()

    def _handle_alone(self) -> None:
        with self._one_at_a_time:
            self._generic_handle()

    # The base class binds these to `_generic_handle` itself, so overriding that alone would change nothing.
    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = do_OPTIONS = _handle_alone


def main(argv: list[str] | None = None) -> None:
    """Serve the app until the process is stopped."""
    parser = argparse.ArgumentParser(description="Serve the app locally; the environment wins over config.json.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--stage", default="dev")
    args = parser.parse_args(argv)

    # The factory writes the config's variables into the mapping it is given: a copy, so they cannot override.
    factory = CLIFactory(str(ROOT), environ=dict(os.environ))
    config = factory.create_config_obj(chalice_stage_name=args.stage)
    for name, value in config.environment_variables.items():
        os.environ.setdefault(name, value)
    app = config.chalice_app
    validate_routes(app.routes)
    LocalDevServer(app, config, args.host, args.port, handler_cls=_Handler).serve_forever()


if __name__ == "__main__":
    main()
