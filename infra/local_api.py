"""The API on this machine: Chalice's local server (what `chalice local` runs), with two differences.

- The environment wins. `chalice local` copies `.chalice/config.json`'s environment_variables over the
  process environment, so a `VQ_TICK_MS=200` given to the local stack would reach its pump but not the API,
  and the two would disagree on the rate. Here the config only fills in what the environment leaves unset.
- Answers are not held back by Nagle's algorithm: Chalice writes the headers and the body separately, and on
  a kept-alive connection the delayed ACK then adds 40 ms to every answer (22 requests/s per connection).

Usage: `python infra/local_api.py --port 8000` (the local stack starts it).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from chalice.cli.factory import CLIFactory
from chalice.deploy.validate import validate_routes
from chalice.local import ChaliceRequestHandler, LocalDevServer

ROOT = Path(__file__).resolve().parent.parent


class _Handler(ChaliceRequestHandler):
    disable_nagle_algorithm = True


def main(argv: list[str] | None = None) -> None:
    """Serve the app until the process is stopped."""
    parser = argparse.ArgumentParser(description="Serve the Chalice app locally, the environment winning over config.json.")
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
