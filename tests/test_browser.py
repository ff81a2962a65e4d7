"""End to end in a real browser: the waiting-room page waits in line, is admitted and buys; no token, no purchase.

Debian's `chromium`, driven by Playwright (which downloads no browser here). Outside CI the tests skip where
chromium is not installed; in CI (.ci/run installs it) they must run. The pump is ticked by hand, so each step
happens when the test says. Screenshots land in build/browser/.
"""

import json
import os
import shutil
import time
import urllib.error
import urllib.request

import pytest

from chalicelib.pump import Pump
from chalicelib.store import QueueStore, TargetTick
from infra.local_stack import LocalStack
from tests.test_local_stack import ROOT, free_port

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium")
# The network is closed: without these, Chromium keeps trying to reach Google's services.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SHOTS = ROOT / "build" / "browser"
OTHERS = [101, 102, 103, 104]  # entered before the browser's user; they fill the line (VQ_MAX_WAITING 4)


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


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 720, "height": 640})
    yield context.new_page()
    context.close()


@pytest.fixture
def stack(env, tmp_path):
    """The local stack without its pump loop (the test ticks), the queue switched off for limited-drop:2 only."""
    flags = tmp_path / "flags.json"
    flags.write_text(json.dumps({"virtual_queue_enabled": {"default": True, "rules": {"off": {
        "when_match": False, "conditions": [{"action": "KEY_IN_VALUE", "key": "target", "value": ["limited-drop:2"]}],
    }}}}))
    # The `env` fixture has put this test's Redis and key prefix in os.environ.
    stack_env = {
        **os.environ, "VQ_FLAGS_FILE": str(flags), "VQ_TICK_MS": "1000", "VQ_BATCH_SIZE": "2",
        "VQ_MAX_WAITING": str(len(OTHERS)), "POWERTOOLS_METRICS_DISABLED": "true", "POWERTOOLS_LOG_LEVEL": "WARNING",
    }
    with open(tmp_path / "api.log", "wb") as api_log:
        with LocalStack(stack_env, api_port=free_port(), stock=5, pump_class=None, api_output=api_log) as running:
            yield running


def http(method, url, headers=None):
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as answer:
        return answer.status, answer.read()


def admit_next_batch(pump):
    """Run the next tick (a tick applies once: ticking again within the same one admits nobody)."""
    while True:
        report = pump.tick()
        if any(isinstance(r, TargetTick) and r.applied_tick for r in report.targets.values()):
            return
        time.sleep(0.05)


def test_page_waits_in_line_is_admitted_and_buys(stack, page, connect_redis):
    from playwright.sync_api import expect

    pump = Pump(QueueStore(connect_redis(), stack.settings.key_prefix), stack.settings)
    entries = f"{stack.api_url}/virtual-queues/limited-drop/1/entries"
    for user in OTHERS:
        assert http("POST", entries, {"X-User-Id": str(user)})[0] == 200
    SHOTS.mkdir(parents=True, exist_ok=True)

    page.goto(f"{stack.api_url}/waiting-room/limited-drop/1?user=7")
    expect(page.locator("body")).to_have_attribute("data-state", "full", timeout=10_000)
    expect(page.locator("#message")).to_contain_text("line is full")

    # Two of the others are let in: the page's retry (after Retry-After) gets a place behind the other two.
    admit_next_batch(pump)
    expect(page.locator("body")).to_have_attribute("data-state", "waiting", timeout=10_000)
    assert int(page.locator("#position").inner_text()) == 3
    assert page.locator("#ahead").inner_text() == "2"
    assert page.locator("#eta").inner_text().endswith(" s")
    page.screenshot(path=SHOTS / "waiting.png")

    # Taken out of line behind its back (as an eviction would): its next poll hears NOT_IN_QUEUE and it enters again.
    ticket_key = "vq-ticket:limited-drop:1:7"
    ticket = page.evaluate("key => localStorage.getItem(key)", ticket_key)
    assert http("DELETE", entries + "/me", {"X-User-Id": "7", "X-Queue-Ticket": ticket})[0] == 204
    page.wait_for_function("([key, old]) => ![null, old].includes(localStorage.getItem(key))",
                           arg=[ticket_key, ticket], timeout=10_000)
    expect(page.locator("body")).to_have_attribute("data-state", "waiting")

    admit_next_batch(pump)  # the other two
    admit_next_batch(pump)  # the browser's user
    expect(page.locator("body")).to_have_attribute("data-state", "admitted", timeout=10_000)
    expect(page.locator("#turn")).to_have_text("It's your turn!")
    page.screenshot(path=SHOTS / "admitted.png")

    page.locator("#buy").click()
    expect(page.locator("body")).to_have_attribute("data-state", "bought", timeout=10_000)
    expect(page.locator("#message")).to_have_text("Order #1 placed. Enjoy!")
    page.screenshot(path=SHOTS / "bought.png")
    assert [(o["item"], o["userId"]) for o in stack.shop.summary()["orders"]] == [("/limited-drops/1/orders", 7)]


def test_purchase_without_a_token_is_refused_in_the_browser(stack, page):
    page.goto(f"{stack.api_url}/waiting-room/limited-drop/3?user=8")
    answer = page.evaluate("""async () => {
        const response = await fetch("../../limited-drops/3/orders", {
            method: "POST", headers: {"X-User-Id": "8", "Content-Type": "application/json"}, body: "{}"});
        return {status: response.status, body: await response.json()};
    }""")
    assert answer["status"] == 403 and answer["body"]["code"] == "QUEUE_BYPASS_DENIED"
    assert stack.shop.summary()["requests"] == []


def test_page_goes_straight_to_buy_while_the_queue_is_off(stack, page):
    from playwright.sync_api import expect

    page.goto(f"{stack.api_url}/waiting-room/limited-drop/2?user=9")
    expect(page.locator("body")).to_have_attribute("data-state", "admitted", timeout=10_000)
    expect(page.locator("#turn")).to_have_text("No line right now: go straight in!")
    page.locator("#buy").click()
    expect(page.locator("body")).to_have_attribute("data-state", "bought", timeout=10_000)
    assert [o["userId"] for o in stack.shop.summary()["orders"]] == [9]
