"""What the browser suites share (tests/test_browser.py, tests/test_console.py): Chromium through Playwright, the
local stack they drive, the two sizes and languages every view is tried at, and the checks every page passes.

Debian's `chromium`, driven by Playwright (which downloads no browser here). Outside CI the suites skip where
chromium is not installed; in CI (.ci/run installs it) they must run. One local stack serves a whole module, its
pump ticked by hand, so each step happens when the test says; tests keep apart by target id.

Every page fails its test on a console error, an uncaught exception or a Content-Security-Policy violation, except
the API's own refusals (a 4xx with a JSON code, which Chromium logs as "Failed to load resource" although the page
handles them) and the connection failures a test announces while it holds the API down. Each view is checked
for readable contrast and saved under build/browser/; `make screenshots` also refreshes the images of README.md
and docs/pages.md.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chalicelib.answers import TargetTick
from chalicelib.pump import Pump
from chalicelib.redis_connection import connect
from chalicelib.store import QueueStore
from chalicelib.targets import Target
from infra.local.stack import LocalStack, free_port, wait_until_up

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium")
# The network is closed: without these, Chromium keeps trying to reach Google's services.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = ROOT / "build" / "browser"
README_SHOTS = ROOT / "tests" / "screenshots"
MESSAGES = json.loads((ROOT / "chalicelib" / "static" / "messages.json").read_text())
# Every view at both sizes; the phone speaks Korean (the shoppers' language), the desktop English.
SIZES = {
    "desktop": {"viewport": {"width": 1280, "height": 800}, "locale": "en-US"},
    "phone": {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True, "locale": "ko-KR"},
}
# The targets whose queue the flag switches off (DIRECT_ADMITTED); other tests take ids from NEXT_ID.
QUEUE_OFF = (2, 3)
NEXT_ID = itertools.count(100)
# The API's routes: answers from these are the contract (a 4xx the page handles), not a broken page.
API_PATH = re.compile(r"/(virtual-queues|limited-drops|events)/")


def http(method, url, headers=None, body=None):
    """(status, parsed JSON or raw bytes) of one request."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url,
        method=method,
        data=data,
        headers={**({"Content-Type": "application/json"} if data else {}), **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            status, raw = answer.status, answer.read()
    except urllib.error.HTTPError as answer:
        status, raw = answer.status, answer.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def iso_in(seconds):
    """An ISO-8601 UTC time `seconds` from now."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds))


@dataclass
class Stack:
    """The running local stack, its pump, and the test-side ways to steer it."""

    local: LocalStack
    pump: Pump
    api_log: Path

    @property
    def url(self):
        return self.local.api_url

    def queue(self, target_id, what=""):
        return f"{self.url}/virtual-queues/limited-drop/{target_id}{what}"

    def configure(self, target_id, **config):
        status, body = http("PUT", self.queue(target_id, "/config"), body=config)
        assert status == 200, body
        return body

    def enter(self, target_id, user_id):
        status, body = http("POST", self.queue(target_id, "/entries"), {"X-User-Id": str(user_id)})
        assert status == 200, body
        return body

    def tick(self, target_id, timeout_s=15):
        """Run the target's next tick (a tick applies once: ticking again within the same one does nothing)."""
        target = Target("limited-drop", target_id)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.pump.tick().targets.get(target)
            if isinstance(result, TargetTick) and result.applied_tick is not None:
                return result
            time.sleep(0.05)
        raise AssertionError(f"no tick applied to {target} within {timeout_s} s")

    def hang_api(self):
        os.killpg(self.local.api.pid, signal.SIGSTOP)

    def resume_api(self):
        os.killpg(self.local.api.pid, signal.SIGCONT)

    def stop_api(self):
        os.killpg(self.local.api.pid, signal.SIGTERM)
        self.local.api.wait(timeout=10)

    def start_api(self):
        """The same API again, on the same port (as after a deployment or a crash)."""
        old = self.local.api
        with open(self.api_log, "ab") as log:
            self.local.api = subprocess.Popen(
                old.args, cwd=ROOT, env=self.local.env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT
            )
        wait_until_up(self.url + "/virtual-queues/limited-drop/1/entries/me", self.local.api)


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: .ci/run installs it, and CI must run the browser tests")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def stack(redis_url, tmp_path_factory):
    """The local stack for one module, under a key prefix of its own, without its pump loop (tests tick)."""
    with running_stack(redis_url, tmp_path_factory.mktemp("stack")) as running:
        yield running


@pytest.fixture(scope="module")
def jwt_stack(redis_url, tmp_path_factory):
    """The same in jwt mode: shoppers sign in at the demo shop, whose throwaway provider signs their JWTs
    (infra/local/dev_login.py; `jwt_stack.local.login` signs more)."""
    with running_stack(redis_url, tmp_path_factory.mktemp("stack"), VQ_IDENTITY="jwt") as running:
        yield running


@contextlib.contextmanager
def running_stack(redis_url, folder, **more_env):
    flags = folder / "flags.json"
    flags.write_text(
        json.dumps(
            {
                "virtual_queue_enabled": {
                    "default": True,
                    "rules": {
                        "off": {
                            "when_match": False,
                            "conditions": [
                                {
                                    "action": "KEY_IN_VALUE",
                                    "key": "target",
                                    "value": [f"limited-drop:{i}" for i in QUEUE_OFF],
                                }
                            ],
                        }
                    },
                }
            }
        )
    )
    prefix = f"{os.environ['VQ_KEY_PREFIX']}-browser-{uuid.uuid4().hex[:6]}"
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "VQ_KEY_PREFIX": prefix,
        "VQ_FLAGS_FILE": str(flags),
        "VQ_TICK_MS": "1000",
        "VQ_BATCH_SIZE": "1",
        "POWERTOOLS_METRICS_DISABLED": "true",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
        **more_env,
    }
    api_log = folder / "api.log"
    client = connect(redis_url)
    try:
        with (
            open(api_log, "wb") as log,
            LocalStack(env, api_port=free_port(), stock=20, pump_class=None, api_output=log) as local,
        ):
            yield Stack(local, Pump(QueueStore(client, prefix), local.settings), api_log)
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)


@pytest.fixture
def target_id():
    return next(NEXT_ID)


@dataclass
class Shopper:
    """One browser tab at one size and language, and what it reported."""

    page: object
    size: str
    lang: str
    errors: list = field(default_factory=list)
    tolerated: list = field(default_factory=list)  # patterns of connection failures a test announced

    @property
    def t(self):
        return MESSAGES[self.lang]

    def expect_view(self, view, timeout_s=20):
        from playwright.sync_api import expect

        expect(self.page.locator("body")).to_have_attribute("data-view", view, timeout=timeout_s * 1000)

    def heading(self):
        return self.page.locator("section:not([hidden]) h2").inner_text().strip()

    def shot(self, name, readme=None, page=None):
        """Check the view's contrast, save a screenshot under build/browser/ of `page` (default: the shopper's);
        at size `readme`, the README's copy too when VQ_README_SHOTS is set (`make screenshots`)."""
        page = page or self.page
        assert readable(page) == [], f"text below WCAG AA contrast in view {name}"
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}-{self.size}.png"
        page.screenshot(path=path)
        if readme == self.size and os.environ.get("VQ_README_SHOTS"):
            save_small(path, README_SHOTS / f"{name}-{self.size}.png")


def readable(page):
    """Visible text whose contrast with its background is under WCAG AA (4.5:1, 3:1 for large text)."""
    return page.evaluate("""() => {
        const channels = (c) => c.match(/[\\d.]+/g).map(Number);
        const luminance = (c) => {
            const [r, g, b] = channels(c).slice(0, 3).map((v) => {
                v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
            return 0.2126 * r + 0.7152 * g + 0.0722 * b;
        };
        const background = (el) => {
            for (; el; el = el.parentElement) {
                const c = channels(getComputedStyle(el).backgroundColor);
                if (c.length < 4 || c[3] > 0.5) return getComputedStyle(el).backgroundColor;
            }
            return "rgb(255, 255, 255)";
        };
        const low = [];
        for (const el of document.querySelectorAll("body *")) {
            if (!el.getClientRects().length || el.closest(".sr-only")) continue;
            if (![...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
            const style = getComputedStyle(el);
            const [a, b] = [luminance(style.color), luminance(background(el))];
            const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
            const size = parseFloat(style.fontSize);
            const large = size >= 24 || (size >= 18.6 && Number(style.fontWeight) >= 700);
            if (ratio < (large ? 3 : 4.5)) {
                low.push(`${el.tagName} "${el.textContent.trim().slice(0, 40)}" ${ratio.toFixed(2)}`);
            }
        }
        return low;
    }""")


# Before any script of the page's own (Playwright's init scripts run outside the page's policy).
CSP_VIOLATIONS_LOGGED = """document.addEventListener("securitypolicyviolation", (event) => console.error(
    `CSP violation: ${event.violatedDirective} blocked ${event.blockedURI || "an inline script"}`));"""


def save_small(source, target):
    """A README copy of a screenshot: the page's background cropped away, at most 640 px wide, 64 colours."""
    from PIL import Image, ImageChops

    image = Image.open(source).convert("RGB")
    background = Image.new("RGB", image.size, image.getpixel((0, image.height - 1)))
    box = ImageChops.difference(image, background).getbbox()
    if box:
        image = image.crop(
            (max(box[0] - 16, 0), max(box[1] - 16, 0), min(box[2] + 16, image.width), min(box[3] + 16, image.height))
        )
    if image.width > 640:
        image = image.resize((640, round(image.height * 640 / image.width)), Image.LANCZOS)
    target.parent.mkdir(parents=True, exist_ok=True)
    image.quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(target, optimize=True)


@pytest.fixture(params=list(SIZES))
def shopper(request, browser):
    """A fresh browser context (own storage) at desktop or phone size; fails the test on a console error."""
    options = SIZES[request.param]
    context = browser.new_context(**options)
    page = context.new_page()
    found = Shopper(page, request.param, options["locale"][:2])

    def on_console(message):
        if message.type != "error":
            return
        url = (message.location or {}).get("url", "")
        refusal = re.search(r"status of 4\d\d", message.text) and API_PATH.search(url)
        announced = API_PATH.search(url) and any(re.search(p, message.text) for p in found.tolerated)
        if not (refusal or announced):
            found.errors.append(f"{message.text} ({url})")

    # Every page of the context (a test may open the console beside the waiting room).
    context.on("console", on_console)
    # A Content-Security-Policy violation fails the test too, reported by the page itself whatever Chromium logs.
    context.add_init_script(CSP_VIOLATIONS_LOGGED)
    context.on("weberror", lambda error: found.errors.append(f"uncaught: {error.error}"))
    yield found
    context.close()
    assert found.errors == [], "the page logged errors"
