"""The web pages: the waiting room shoppers see (static/waiting-room.html with its script waiting-room.js, in
Korean or English, on the client library's bundle, static/virtual-queue.min.js) and the operator console
(static/console.html with its script console.js). Each is served as one HTML document with its script inline,
filled in per request, with a Content-Security-Policy that lets exactly that script run, and the same-origin
scripts it names (docs/pages.md: security headers)."""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from chalicelib.targets import TARGET_TYPES, Target

# Beside this module, so the deployment package (which carries chalicelib/**) has them too.
STATIC = Path(__file__).resolve().parent / "static"
SERVICE_WORKER_PATH = "/waiting-room/service-worker.js"  # its folder is its scope: every waiting-room page
# The client library (clients/js/, `npm run bundle`; tests keep this copy equal to a fresh build), beside the
# service worker so the edge caches it as it caches the page and the worker keeps it for a reload offline.
LIBRARY_PATH = "/waiting-room/virtual-queue.min.js"
LANGUAGES = ("en", "ko")
DEFAULT_LANGUAGE = "en"  # for a browser that names neither: a visitor from abroad reads English more likely
# `{{name}}`: text, HTML-escaped; `__NAME__`: trusted text put in as it is (a script data block's JSON, a script).
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}|__([A-Z]+)__")
_LANGUAGE_RANGE = re.compile(
    r"\s*([A-Za-z]{1,8}|\*)(?:-[A-Za-z0-9]{1,8})*\s*(?:;\s*q\s*=\s*([01](?:\.[0-9]{0,3})?))?\s*"
)
# What the pages may load besides their own inline scripts: their own origin's scripts they name ('self', added
# only to a page that names one: a same-origin answer of another type never runs, `nosniff`), the product's
# picture (any https host an operator names) and the inline icon, calls to their own origin, the service worker.
# Styles stay inline ('unsafe-inline'): they run no code, and every text the pages show is escaped. No framing
# (clickjacking), no <base>, no forms.
_POLICY = (
    "default-src 'none'; script-src {scripts}; style-src 'unsafe-inline'; img-src https: data:; "
    "connect-src 'self'; worker-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# A <script> of another type is a data block: the browser never runs it, so the policy need not allow it.
_SCRIPT_TYPES = {"", "text/javascript", "application/javascript", "module"}
# A <script src> the pages may name: a path on their own origin (no scheme, no host, no `//`), never a CDN's.
_SAME_ORIGIN = re.compile(r"(?!//)[\w./-]+")


@dataclass(frozen=True)
class Page:
    """A page to serve: its HTML and the Content-Security-Policy that lets exactly its own scripts run."""

    html: str
    content_security_policy: str


class Template:
    """A page template, split once at its placeholders. Filling it is one pass over those parts, so no value is
    ever searched for placeholders: a displayName of `__CONFIG__` or `{{title}}` shows as that text."""

    def __init__(self, name: str, includes: Mapping[str, str]) -> None:
        """`name` in static/; `includes` names the static file each `__NAME__` in it stands for (its script)."""
        pieces = _PLACEHOLDER.split(_static(name))
        # pieces: text, then per placeholder its two groups (one is None) and the text after it.
        self._texts = pieces[::3]
        self._slots: list[tuple[bool, str]] = [
            (True, text) if text is not None else (False, raw)
            for text, raw in zip(pieces[1::3], pieces[2::3], strict=True)
        ]
        for i, (_, slot) in reversed(list(enumerate(self._slots))):
            if slot in includes:  # a file of ours: part of the text around it, never filled per request
                self._texts[i : i + 2] = [self._texts[i] + _static(includes[slot]) + self._texts[i + 1]]
                del self._slots[i]
        finder = _scripts(name, "\0".join(self._texts))
        if any("\0" in script for script in finder.scripts + finder.sources):
            raise ValueError(f"{name}: a placeholder inside a script would change the script the policy allows")
        allowed = [_hash(script) for script in finder.scripts] + (["'self'"] if finder.sources else [])
        self.content_security_policy = _POLICY.format(scripts=" ".join(allowed) or "'none'")

    def fill(self, text: Mapping[str, str], trusted: Mapping[str, str]) -> Page:
        """The page with each `{{name}}` replaced by `text[name]` HTML-escaped, and each `__NAME__` by
        `trusted[NAME]` as it is."""
        out = [self._texts[0]]
        for (escaped, slot), after in zip(self._slots, self._texts[1:], strict=True):
            out += (html.escape(text[slot]) if escaped else trusted[slot], after)
        return Page("".join(out), self.content_security_policy)


class _ScriptFinder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.scripts: list[str] = []
        self.sources: list[str] = []  # the scripts it loads, each a path on this origin
        self.problems: list[str] = []
        self._open: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        self.problems += [f"<{tag} {a}>: an inline handler" for a in named if a.startswith("on")]
        if tag == "script" and (named.get("type") or "").lower() in _SCRIPT_TYPES:
            source = named.get("src")
            if source is not None:
                if not _SAME_ORIGIN.fullmatch(source):
                    self.problems.append(f"<script src={source}>: only this origin's scripts are allowed")
                self.sources.append(source)
            self._open = [] if source is None else None  # a loaded script: its body (none) never runs

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._open.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._open is not None:
            self.scripts.append("".join(self._open))
            self._open = None


def _hash(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"


def _scripts(name: str, document: str) -> _ScriptFinder:
    """The scripts `document` runs: the text of each inline one, exactly as the browser hashes it, and the path
    of each it loads."""
    finder = _ScriptFinder()
    finder.feed(document)
    finder.close()
    if finder.problems:
        raise ValueError(f"{name}: the pages' CSP would block " + "; ".join(finder.problems))
    return finder


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
    purchase_path: str,
    identity: Mapping[str, str | None],
) -> Page:
    """The waiting room of `target` served at `page_path` in `lang`: it queues at the queue's routes (through the
    client library) and buys at `purchase_path`; `display` holds the target's displayName and imageUrl when an
    operator set them (and the commitment to its next opening draw's seed, once drawn), `identity` how the page
    names its shopper (identity.page_identity)."""
    texts = messages()[lang]
    kind = TARGET_TYPES[target.type].labels[lang]
    name = display.get("displayName") or texts["fallbackName"].format(type=kind, id=target.id)
    values = {**texts, "lang": lang, "name": name}
    config = {
        "queueType": target.type,
        "targetId": str(target.id),
        "lang": lang,
        "imageUrl": display.get("imageUrl"),
        "openingCommitment": display.get("openingCommitment"),
        # The library's baseUrl (the stage's root: it names the queue's routes below it) and where to buy there.
        "base": _relative(page_path, "/"),
        "purchasePath": purchase_path,
        "serviceWorker": _relative(page_path, SERVICE_WORKER_PATH),
        "identity": dict(identity),
        "messages": texts,
    }
    return _template("waiting-room.html", script="waiting-room.js").fill(values, {"CONFIG": _script_json(config)})


def library() -> str:
    """The client library's bundle the waiting room runs on (clients/js/, `npm run bundle`)."""
    return _static("virtual-queue.min.js")


def service_worker() -> str:
    """The script that keeps the last copy of each page for a reload while the server cannot answer."""
    return _static("service-worker.js")


def console(page_path: str, queues_path: str) -> Page:
    """The operator console served at `page_path`; it reads and steers the targets under `queues_path`."""
    config = {"queues": _relative(page_path, queues_path), "types": list(TARGET_TYPES)}
    return _template("console.html", "console.js").fill({}, {"CONFIG": _script_json(config)})


@functools.cache
def _template(name: str, script: str | None = None) -> Template:
    """static/`name`, with static/`script` in place of its `__SCRIPT__`."""
    return Template(name, {"SCRIPT": script} if script else {})
