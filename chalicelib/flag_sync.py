"""The switch's fast route: every deployment of the flag's AppConfig profile reaches the queue's store in seconds.

AppConfig Data will not be polled faster than every 15 s per session, so a flip would take that long (60 s
unset) to reach running containers by polling alone. An AppConfig extension (infra/appconfig.yaml) invokes
`flag_sync` instead:
- at PRE_START_DEPLOYMENT, whose event carries the configuration being deployed (base64 `Content`). PRE_*
  action points run synchronously and an error would stop the deployment, so this never raises: a kill switch
  must flip even with Redis down (the containers then learn it by polling).
- at ON_DEPLOYMENT_ROLLED_BACK, which carries no content: the configuration deployed again is read from
  AppConfig itself, by a session of its own.
The configuration and its version go into the queue's store (QueueStore.publish_flag); from there the enter
and status scripts hand the version to the next caller of every marked target (flags.py).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from chalicelib.flags import flag_version
from chalicelib.observability import logger
from chalicelib.store import QueueStore


def configuration_of(event: dict, deployed: Callable[[], dict]) -> dict:
    """The flag configuration an extension event is about: its `Content`, or else the one `deployed` reads."""
    content = event.get("Content")
    if content:
        value = json.loads(base64.b64decode(content))
        if not isinstance(value, dict):
            raise ValueError("the flag configuration is not a JSON object")
        return value
    return deployed()


def sync(event: Any, store: Callable[[], QueueStore], deployed: Callable[[], dict]) -> dict:
    """Publish the configuration of an AppConfig extension event into the queue's store. Never raises; answers
    what it did (an extension's answer without `Content` leaves the deployment's content as it is)."""
    kind = event.get("Type") if isinstance(event, dict) else None
    try:
        configuration = configuration_of(event, deployed)
        version = flag_version(configuration)
        marked = store().publish_flag(version, configuration)
    except Exception as err:  # a broken store or configuration must not block the deployment
        logger.exception("flag configuration not published", extra={"event": kind, "error": type(err).__name__})
        return {"published": False}
    logger.info("flag configuration published", extra={"event": kind, "version": version, "targets": marked})
    return {"published": True, "version": version, "targets": marked}
