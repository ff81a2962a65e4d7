"""The operator console in Chromium, beside a shopper's waiting room: it lists the targets (those with people in
line first, then by id as a number) with their state and live charts on time axes, filters them, and its
controls steer the sale through PATCH .../config (rate in people per second, pause and resume, sold out),
from the keyboard too, while the shopper's page follows by polling alone. Fixtures and checks:
tests/support/browser.py."""

import re

import pytest
from playwright.sync_api import expect

from tests.support.browser import http

pytestmark = pytest.mark.slow


def open_console(shopper, stack, target_id):
    console = shopper.page
    console.goto(f"{stack.url}/console?watch=limited-drop/{target_id}")
    card = console.locator(f"section.target[data-target='limited-drop/{target_id}']")
    expect(card).to_be_visible(timeout=10_000)
    return card


def test_console_charts_a_live_sale_and_sets_the_rate(shopper, stack, target_id):
    stack.configure(target_id, batch=1, tickMs=500, displayName="Air Runner 90")
    waiting = {user: stack.enter(target_id, user)["queueTicket"] for user in range(1, 13)}
    card = open_console(shopper, stack, target_id)
    expect(card.locator(".badges")).to_contain_text("Air Runner 90")
    expect(card.locator(".figures")).to_contain_text(re.compile(r"waiting\s*12"))
    # A short sale: the pump admits, the admitted collect their tokens (their waits make the p95) and buy.
    for _ in range(6):
        stack.tick(target_id)
        for user, ticket in list(waiting.items()):
            _, entry = http(
                "GET", stack.queue(target_id, "/entries/me"), {"X-User-Id": str(user), "X-Queue-Ticket": ticket}
            )
            if entry.get("status") == "ADMITTED":
                del waiting[user]
                status, _ = http(
                    "POST",
                    f"{stack.url}/limited-drops/{target_id}/orders",
                    {"X-User-Id": str(user), "X-Entry-Token": entry["entryToken"]},
                    body={"quantity": 1},
                )
                assert status == 201
        shopper.page.wait_for_timeout(500)
    # Every chart draws from the samples it keeps; admitted/s rose above zero, and the shop took orders.
    for chart in ("waiting", "admitted", "orders", "p95"):
        expect(card.locator(f"[data-chart={chart}] polyline").first).to_be_attached()
    expect(card.locator("[data-chart=admitted] figcaption span")).not_to_have_text(
        re.compile(r"now [–0]/s"), timeout=5_000
    )
    stats = http("GET", stack.queue(target_id, "/stats"))[1]
    assert stats["ordersCount"] == 12 - len(waiting) > 0
    # How the first estimates held, as stats measured them at each admission.
    accuracy = stats["etaAccuracy"]
    assert accuracy["samples"] == 12 - len(waiting)
    held = rf"ETA range held\s*{round(100 * accuracy['insideRangeShare'])} % of {accuracy['samples']}, ±"
    expect(card.locator(".figures")).to_contain_text(re.compile(held))
    expect(card.locator(".figures")).to_contain_text(re.compile(r"configured\s*2/s"))
    shopper.shot("console", readme="desktop")

    # Charts on time axes, with units.
    expect(card.locator("[data-chart=waiting] .unit")).to_have_text("people")
    expect(card.locator("[data-chart=admitted] .unit")).to_have_text("people/s")
    expect(card.locator("[data-chart=waiting] .x .to")).to_contain_text("(now)")
    expect(card.locator("[data-chart=waiting] .x .from")).to_have_text(re.compile(r"\d{1,2}:\d{2}:\d{2}"))

    card.locator("[data-field=rate]").fill("3")
    expect(card.locator("[data-hint=rate]")).to_have_text("6 every 2000 ms")
    card.locator("[data-action=rate]").click()
    expect(card.locator(".result")).to_contain_text("Saved")
    status, body = http("GET", stack.queue(target_id, "/config"))
    # The control changed the rate and kept the rest of the target's own configuration.
    assert body["config"] == {"batch": 6, "tickMs": 2000, "displayName": "Air Runner 90"}
    expect(card.locator(".figures")).to_contain_text(re.compile(r"configured\s*3/s"))


def test_a_target_opened_that_nobody_entered_shows_an_empty_line_not_an_error(shopper, stack, target_id):
    """`make run` opens its demo targets before anyone enters: their cards show an idle, empty line."""
    stack.configure(target_id)  # PUT {}: open, with the global defaults
    card = open_console(shopper, stack, target_id)
    expect(card.locator(".figures")).to_contain_text(re.compile(r"waiting\s*0"))
    expect(card).to_contain_text("idle")
    expect(card.locator("[data-chart=waiting] figcaption")).to_contain_text("now 0")
    assert "unavailable" not in card.inner_text()


def test_console_pauses_and_resumes_while_the_shopper_keeps_their_place(shopper, stack, target_id):
    # One a second, so the server advises frequent polls; only the test ticks (a tick every 2 s at most).
    stack.configure(target_id, batch=2, tickMs=2000)
    for user in range(1, 4):
        stack.enter(target_id, user)
    room = shopper.page.context.new_page()
    room.goto(f"{stack.url}/waiting-room/limited-drop/{target_id}?user=77")
    expect(room.locator("body")).to_have_attribute("data-view", "waiting", timeout=20_000)
    expect(room.locator("#position")).to_have_text("4")

    card = open_console(shopper, stack, target_id)
    card.locator("[data-action=pause]").click()
    expect(card.locator(".badges")).to_contain_text("paused")
    expect(card.locator("[data-action=pause]")).to_have_text("Resume")
    expect(room.locator("#paused")).to_be_visible(timeout=20_000)
    expect(room.locator("#eta")).to_have_text("–")
    shopper.shot("console-paused")
    shopper.shot("paused", page=room)
    # Paused: ticks admit nobody, and the shopper keeps their place.
    stack.tick(target_id)
    stack.tick(target_id)
    room.wait_for_timeout(3_000)
    expect(room.locator("#position")).to_have_text("4")

    card.locator("[data-action=pause]").click()
    expect(card.locator("[data-action=pause]")).to_have_text("Pause")
    expect(room.locator("#paused")).to_be_hidden(timeout=20_000)
    stack.tick(target_id)  # the line moves again (the pump may catch up: up to the shopper's turn)
    room.wait_for_function(
        "() => document.body.dataset.view === 'admitted' || document.getElementById('position').textContent !== '4'",
        timeout=20_000,
    )


def test_console_marks_the_sale_sold_out_and_the_shopper_hears_it(shopper, stack, target_id):
    stack.configure(target_id, batch=60, tickMs=60_000)
    stack.enter(target_id, 1)
    room = shopper.page.context.new_page()
    room.goto(f"{stack.url}/waiting-room/limited-drop/{target_id}?user=77")
    expect(room.locator("body")).to_have_attribute("data-view", "waiting", timeout=20_000)

    card = open_console(shopper, stack, target_id)
    shopper.page.once("dialog", lambda dialog: dialog.accept())
    card.locator("[data-action=soldout]").click()
    expect(card.locator(".badges")).to_contain_text("sold out")
    expect(room.locator("body")).to_have_attribute("data-view", "soldout", timeout=20_000)
    shopper.shot("soldout", page=room)
    # Cleared, the line takes newcomers again.
    card.locator("[data-action=soldout]").click()
    expect(card.locator(".badges")).not_to_contain_text("sold out")
    status, _ = http("POST", stack.queue(target_id, "/entries"), {"X-User-Id": "78"})
    assert status == 200


def test_console_shows_a_safety_net_passing_through_then_queueing(shopper, stack, target_id):
    stack.configure(target_id, batch=1, tickMs=60_000, safetyNet=True)
    card = open_console(shopper, stack, target_id)
    net = card.locator(".badge.net")
    expect(net).to_have_text("safety net: passing through")
    # One a minute: the first passes through, the second waits, and the room is queueing until the line drains.
    assert stack.enter(target_id, 1)["queued"] is False
    assert stack.enter(target_id, 2)["status"] == "WAITING"
    expect(net).to_have_text("safety net: queueing")
    expect(card.locator(".figures")).to_contain_text(re.compile(r"passed through\s*1"))
    shopper.shot("console-safety-net")


def test_console_sorts_busy_lines_first_then_by_number_filters_and_works_from_the_keyboard(shopper, stack):
    page = shopper.page
    ids = (9, 10, 124_740)
    for target_id in ids:
        stack.configure(target_id, batch=1, tickMs=1000, maxWaiting=500, displayName=f"Drop {target_id}")
    stack.enter(124_740, 1)  # the only one with people in line
    page.goto(f"{stack.url}/console?" + "&".join(f"watch=limited-drop/{i}" for i in (10, 124_740, 9)))
    cards = page.locator("section.target")
    for target_id in ids:
        expect(page.locator(f"section.target[data-target='limited-drop/{target_id}']")).to_be_visible(timeout=10_000)
    mine = [f"limited-drop/{i}" for i in ids]
    page.wait_for_function(
        "(mine) => { const order = [...document.querySelectorAll('section.target')].map((c) => c.dataset.target)"
        ".filter((t) => mine.includes(t)); return order.join() === ['limited-drop/124740', 'limited-drop/9',"
        " 'limited-drop/10'].join(); }",
        arg=mine,
        timeout=10_000,
    )
    # States as the queue knows them: people wait and no pump ticks here (the test ticks), the others are idle.
    expect(page.locator("section.target[data-target='limited-drop/124740'] .state")).to_contain_text("waiting")
    expect(page.locator("section.target[data-target='limited-drop/9'] .state")).to_have_text("idle")

    # "/" jumps to the filter; a word of a target's name, id or state keeps only the targets that have it.
    page.locator("body").press("/")
    expect(page.locator("#filter")).to_be_focused()
    page.keyboard.type("idle")
    expect(cards.filter(visible=True)).not_to_have_count(0)
    for card in cards.filter(visible=True).all():
        expect(card.locator(".state")).to_have_text("idle")
    page.locator("#filter").fill("")
    page.keyboard.type("limited-drop/9")
    expect(cards.filter(visible=True)).to_have_count(1)
    nine = page.locator("section.target[data-target='limited-drop/9']")
    expect(nine).to_be_visible()
    shopper.shot("console-filtered")

    # From the filter, Tab reaches the shown card's rate; Enter there saves it with a PATCH of the rate alone.
    for _ in range(12):
        page.keyboard.press("Tab")
        if nine.locator("[data-field=rate]").evaluate("(el) => el === document.activeElement"):
            break
    expect(nine.locator("[data-field=rate]")).to_be_focused()
    page.keyboard.press("Control+A")
    page.keyboard.type("0.5")
    page.keyboard.press("Enter")
    expect(nine.locator(".result")).to_contain_text("Saved")
    assert http("GET", stack.queue(9, "/config"))[1]["config"] == {
        "batch": 1,
        "tickMs": 2000,
        "maxWaiting": 500,
        "displayName": "Drop 9",
    }
    # Shift+Tab back to Pause (a button: Space presses it).
    for _ in range(6):
        page.keyboard.press("Shift+Tab")
        if nine.locator("[data-action=pause]").evaluate("(el) => el === document.activeElement"):
            break
    page.keyboard.press("Space")
    expect(nine.locator(".state")).to_have_text("paused")
    assert http("GET", stack.queue(9, "/config"))[1]["config"]["paused"] is True
