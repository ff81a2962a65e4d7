"""The web pages: the waiting room shoppers see (static/waiting-room.html with its script waiting-room.js, in
Korean or English) and the operator console (static/console.html). Each is served as one HTML document with
its script inline, filled in per request."""

from __future__ import annotations

import functools
import html
import json
import re
from pathlib import Path

from chalicelib.targets import TARGET_TYPES, Target

# Beside this module, so the deployment package (which carries chalicelib/**) has them too.
STATIC = Path(__file__).resolve().parent / "static"
SERVICE_WORKER_PATH = "/waiting-room/service-worker.js"  # its folder is its scope: every waiting-room page
LANGUAGES = ("en", "ko")
DEFAULT_LANGUAGE = "en"  # for a browser that names neither: a visitor from abroad reads English more likely
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
_LANGUAGE_RANGE = re.compile(
    r"\s*([A-Za-z]{1,8}|\*)(?:-[A-Za-z0-9]{1,8})*\s*(?:;\s*q\s*=\s*([01](?:\.[0-9]{0,3})?))?\s*"
)


@functools.cache
def _static(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")


@functools.cache
def messages() -> dict[str, dict[str, str]]:
    """The page's texts per language (static/messages.json)."""
    return json.loads(_static("messages.json"))


def language(accept_language: str | None, asked: str | None = None) -> str:
    """The page's language: `asked` (the page's own ?lang= switch) if supported, else the one of LANGUAGES
    that Accept-Language ranks highest (ties: the earlier), else DEFAULT_LANGUAGE."""
    if asked in LANGUAGES:
        return asked
    best, best_q = DEFAULT_LANGUAGE, 0.0
    for item in (accept_language or "")[:1000].split(",")[:50]:
        match = _LANGUAGE_RANGE.fullmatch(item)
        if not match:
            continue
        primary, q = match[1].lower(), float(match[2]) if match[2] else 1.0
        if primary in LANGUAGES and q > best_q:
            best, best_q = primary, q
    return best


def _relative(page_path: str, path: str) -> str:
    # Relative to the page, so the page also works below an API Gateway stage prefix such as /api.
    return "../" * (page_path.count("/") - 1) + path.lstrip("/")


def _script_json(value: object) -> str:
    # Inside a <script> element: no "<" may appear, or a value could close it.
    return json.dumps(value, ensure_ascii=False).replace("<", "\\u003c")


def render(
    target: Target,
    lang: str,
    display: dict[str, str],
    page_path: str,
    entries_path: str,
    purchase_path: str,
) -> str:
    """The waiting room of `target` served at `page_path` in `lang`: it queues at `entries_path` and buys at
    `purchase_path`; `display` holds the target's displayName and imageUrl when an operator set them."""
    texts = messages()[lang]
    kind = TARGET_TYPES[target.type].labels[lang]
    name = display.get("displayName") or texts["fallbackName"].format(type=kind, id=target.id)
    values = {**texts, "lang": lang, "name": name}
    config = {
        "queueType": target.type,
        "targetId": str(target.id),
        "lang": lang,
        "imageUrl": display.get("imageUrl"),
        "entries": _relative(page_path, entries_path),
        "purchase": _relative(page_path, purchase_path),
        "serviceWorker": _relative(page_path, SERVICE_WORKER_PATH),
        "messages": texts,
    }
    page = _PLACEHOLDER.sub(lambda m: html.escape(values[m[1]]), _static("waiting-room.html"))
    return page.replace("__SCRIPT__", _static("waiting-room.js")).replace("__CONFIG__", _script_json(config))


def service_worker() -> str:
    """The script that keeps the last copy of each page for a reload while the server cannot answer."""
    return _static("service-worker.js")


def console(page_path: str, queues_path: str) -> str:
    """The operator console served at `page_path`; it reads and steers the targets under `queues_path`."""
    config = {"queues": _relative(page_path, queues_path), "types": list(TARGET_TYPES)}
    return _static("console.html").replace("__CONFIG__", _script_json(config))
