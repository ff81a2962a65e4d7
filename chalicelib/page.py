"""The waiting-room web page: one HTML file with its script (static/waiting-room.html), filled in per target."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from chalicelib.targets import Target

# Beside this module, so the deployment package (which carries chalicelib/**) has it too.
TEMPLATE = Path(__file__).resolve().parent / "static" / "waiting-room.html"


@functools.cache
def _template() -> str:
    return TEMPLATE.read_text(encoding="utf-8")


def _relative(page_path: str, path: str) -> str:
    # Relative to the page, so the page also works below an API Gateway stage prefix such as /api.
    return "../" * (page_path.count("/") - 1) + path.lstrip("/")


def render(target: Target, page_path: str, entries_path: str, purchase_path: str) -> str:
    """The page for `target` served at `page_path`: it queues at `entries_path` and buys at `purchase_path`."""
    config = {
        "queueType": target.type,
        "targetId": str(target.id),
        "label": f"{target.type.replace('-', ' ').capitalize()} #{target.id}",
        "entries": _relative(page_path, entries_path),
        "purchase": _relative(page_path, purchase_path),
    }
    # Inside a <script> element: no "<" may appear, or a value could close it.
    return _template().replace("__CONFIG__", json.dumps(config).replace("<", "\\u003c"))
