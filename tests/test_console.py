"""The operator console in Chromium, beside a shopper's waiting room: it lists the target with live charts, and
its controls steer the sale through the config API (rate, pause and resume, sold out) while the shopper's page
follows by polling alone. Fixtures and checks: tests/browser.py."""

import re

import pytest
from playwright.sync_api import expect

from tests.browser import http
from tests.browser import browser, shopper, stack, target_id  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow


def open_console(shopper, stack, target_id):
    console = shopper.page
    console.goto(f"{stack.url}/console?watch=limited-drop/{target_id}")
    card = console.locator(f"section.target[data-target='limited-drop/{target_id}']")
    expect(card).to_be_visible(timeout=10_000)
    return card


def test_console_charts_a_live_sale_and_sets_the_rate(shopper, stack, target_id):
    stack.configure(target_id, batch=1, tickMs=500, displayName="Air Runner 90")
    tickets = {user: stack.enter(target_id, user)["queueTicket"] for user in range(1, 7)}
    card = open_console(shopper, stack, target_id)
    expect(card.locator(".badges")).to_contain_text("Air Runner 90")
    expect(card.locator(".figures")).to_contain_text(re.compile(r"waiting\s*6"))
    for _ in range(3):
        stack.tick(target_id)
        for user, ticket in tickets.items():  # the admitted collect their tokens: their waits make the p95
            http("GET", stack.queue(target_id, "/entries/me"), {"X-User-Id": str(user), "X-Queue-Ticket": ticket})
        shopper.page.wait_for_timeout(700)
    # Every chart draws from the samples it keeps; admitted/s rose above zero.
    for chart in ("waiting", "admitted", "p95"):
        expect(card.locator(f"[data-chart={chart}] polyline").first).to_be_attached()
    expect(card.locator("[data-chart=admitted] figcaption span")).not_to_have_text(re.compile(r"now [–0]/s"), timeout=5_000)
    expect(card.locator(".figures")).to_contain_text(re.compile(r"configured\s*2/s"))
    shopper.shot("console", readme="desktop")

    card.locator("[data-field=batch]").fill("3")
    card.locator("[data-field=tickMs]").fill("1000")
    card.locator("[data-action=rate]").click()
    expect(card.locator(".result")).to_contain_text("Saved")
    status, body = http("GET", stack.queue(target_id, "/config"))
    # The control changed the rate and kept the rest of the target's own configuration.
    assert body["config"] == {"batch": 3, "tickMs": 1000, "displayName": "Air Runner 90"}
    expect(card.locator(".figures")).to_contain_text(re.compile(r"configured\s*3/s"))
