"""The waiting-room page as a shopper uses it, in Chromium at desktop (English) and phone (Korean) size: every
answer the API can give reaches its own view by polling alone, trouble is visible and heals by itself, and the
page stays readable and keyboard-usable. Fixtures and checks: tests/support/browser.py."""

import itertools
import json
import re
import time

import pytest
from playwright.sync_api import expect

from tests.support.browser import QUEUE_OFF, SIZES, http, iso_in

pytestmark = pytest.mark.slow


def open_page(shopper, stack, target_id, user_id):
    shopper.page.goto(f"{stack.url}/waiting-room/limited-drop/{target_id}?user={user_id}")


def wait_second_in_line(shopper, stack, target_id):
    """User 7 waits behind user 1. One admission a second on paper, so the server advises a poll about every
    second; only the test ticks."""
    stack.configure(target_id, batch=60, tickMs=60_000)
    stack.enter(target_id, 1)
    open_page(shopper, stack, target_id, 7)
    shopper.expect_view("waiting")


def tick_until_view(shopper, stack, target_id, view, ticks=20):
    """Tick the target until the page shows `view` (the pump may catch up missed ticks: not one user a tick)."""
    for _ in range(ticks):
        if shopper.page.locator("body").get_attribute("data-view") == view:
            return
        stack.tick(target_id)
        shopper.page.wait_for_timeout(500)
    shopper.expect_view(view)


def wait_until(page, condition, timeout_s):
    """Wait for a condition on what route handlers record (they run only while Playwright waits, not in sleep)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        page.wait_for_timeout(100)


def progress(shopper):
    return int(shopper.page.locator("#bar").get_attribute("aria-valuenow"))


def test_full_line_then_waiting_then_admitted_then_order_confirmed(shopper, stack, target_id):
    page, t = shopper.page, shopper.t
    # The picture's host stands in for the shop's CDN (the network is closed here).
    page.route("https://img.example/**", lambda route: route.fulfill(content_type="image/svg+xml", body=SNEAKER))
    stack.configure(
        target_id,
        maxWaiting=10,
        batch=1,
        tickMs=1000,
        displayName="Air Runner 90 “Seoul”",
        imageUrl="https://img.example/air-runner.svg",
    )
    for user in range(1, 11):
        stack.enter(target_id, user)

    open_page(shopper, stack, target_id, 77)
    shopper.expect_view("full")
    expect(page.locator("h1")).to_have_text("Air Runner 90 “Seoul”")
    expect(page.locator("#picture")).to_be_visible()
    assert "77" not in page.locator("main").inner_text()  # no user id shown
    expect(page.locator("#full-text")).to_contain_text(re.compile(r"\d"))
    shopper.shot("full")

    # Some of the others are let in: the page's retry (after Retry-After) gets a place behind the rest.
    stack.tick(target_id)
    shopper.expect_view("waiting")
    first_ahead = int(page.locator("#ahead").inner_text())
    assert first_ahead >= 5
    expect(page.locator("#position")).to_have_text(str(first_ahead + 1))
    expect(page.locator("#announce")).to_contain_text(str(first_ahead + 1))  # told to screen readers, politely
    stack.tick(target_id)
    page.wait_for_function(f"() => Number(document.getElementById('ahead').textContent) < {first_ahead}")
    made = progress(shopper)
    assert 0 < made < 100
    shopper.shot("waiting", readme="desktop")

    # A reload keeps the place and the progress made.
    page.reload()
    shopper.expect_view("waiting")
    assert progress(shopper) == made

    tick_until_view(shopper, stack, target_id, "admitted")
    shopper.expect_view("admitted")
    expect(page.locator("#turn")).to_have_text(t["admitted_h"])
    expect(page.locator("#pass-left")).to_contain_text(re.compile(r"[0-5]:\d\d"))
    shopper.shot("admitted", readme="desktop")

    # The Buy button has the focus: Enter buys.
    expect(page.locator("#buy")).to_be_focused()
    page.keyboard.press("Enter")
    shopper.expect_view("bought")
    expect(page.locator("#bought-text")).to_contain_text("Air Runner 90")
    expect(page.locator("#order-number")).to_contain_text(re.compile(r"\d"))
    assert "{" not in page.locator("main").inner_text()  # words, never the shop's raw JSON
    shopper.shot("bought", readme="phone")
    assert [
        o["userId"] for o in stack.local.shop.summary()["orders"] if o["item"].endswith(f"/{target_id}/orders")
    ] == ["77"]

    # A reload after buying shows the order, not a Buy button for a pass already used.
    page.reload()
    shopper.expect_view("bought")
    expect(page.locator("#buy")).to_be_hidden()


def test_pre_queue_counts_down_and_takes_a_place_at_the_opening_without_a_reload(shopper, stack, target_id):
    page = shopper.page
    stack.configure(target_id, batch=1, tickMs=500, opensAt=iso_in(8))
    stack.enter(target_id, 1)
    open_page(shopper, stack, target_id, 7)
    shopper.expect_view("prequeue")
    expect(page.locator("#opens-in")).to_have_text(re.compile(r"^0:0[0-8]$"))
    expect(page.locator("#opens-at")).not_to_be_empty()
    # The fair-order note shows the commitment to the draw's seed that stats publish.
    _, stats = http("GET", stack.queue(target_id, "/stats"))
    expect(page.locator("#commitment")).to_contain_text(stats["openingDraw"]["commitment"])
    shopper.shot("prequeue", readme="phone")
    page.evaluate("window.sameDocument = true")

    # The pump's first tick after the opening makes the pre-queue the line and admits its first (batch 1); the page
    # finds its place by polling: admitted if it was drawn first, else next in line.
    page.wait_for_function("() => document.getElementById('opens-in').textContent === '0:00'", timeout=15_000)
    stack.tick(target_id)
    page.wait_for_function("() => ['waiting', 'admitted'].includes(document.body.dataset.view)", timeout=20_000)
    if page.evaluate("document.body.dataset.view") == "waiting":
        expect(page.locator("#position")).to_have_text("1")
    assert page.evaluate("window.sameDocument") is True
    tick_until_view(shopper, stack, target_id, "admitted")
    assert page.evaluate("window.sameDocument") is True


def test_trouble_is_visible_and_heals_by_itself(shopper, stack, target_id):
    page, t = shopper.page, shopper.t
    wait_second_in_line(shopper, stack, target_id)
    expect(page.locator("#trouble")).to_be_hidden()

    # Hung: calls stay unanswered; the page says it is reconnecting, with the time of its last good answer.
    stack.hang_api()
    try:
        expect(page.locator("#trouble")).to_be_visible(timeout=15_000)
        expect(page.locator("#trouble")).to_contain_text(t["reconnecting"])
        expect(page.locator("#last-update")).to_contain_text(re.compile(r"\d\d:\d\d:\d\d"))
    finally:
        stack.resume_api()
    expect(page.locator("#trouble")).to_be_hidden(timeout=20_000)

    # Down: connections refused until it comes back. The service worker claims the page once it has kept a copy of
    # it (service-worker.js): on a loaded machine that can come after the place is in view, and a reload before it
    # finds no copy.
    page.wait_for_function("navigator.serviceWorker.controller !== null", timeout=15_000)
    shopper.tolerated.append("ERR_CONNECTION_REFUSED")
    stack.stop_api()
    try:
        expect(page.locator("#trouble")).to_be_visible(timeout=15_000)
        shopper.expect_view("waiting")  # the last place stays in view, marked as old
        shopper.shot("reconnecting", readme="desktop")
        # A reload while it is down shows the page (the copy its service worker kept), not the browser's error.
        page.reload()
        shopper.expect_view("waiting")
        expect(page.locator("#position")).to_have_text("2")
        expect(page.locator("#trouble")).to_be_visible(timeout=15_000)
        expect(page.locator("#last-update")).to_contain_text(re.compile(r"\d\d:\d\d:\d\d"))
    finally:
        stack.start_api()
    expect(page.locator("#trouble")).to_be_hidden(timeout=30_000)
    shopper.expect_view("waiting")
    expect(page.locator("#position")).to_have_text("2")


def test_losing_the_place_offers_to_join_again_by_keyboard(shopper, stack, target_id):
    page, t = shopper.page, shopper.t
    wait_second_in_line(shopper, stack, target_id)

    # Taken out of line behind its back (as an eviction would): its next poll hears NOT_IN_QUEUE.
    ticket = page.evaluate(f"JSON.parse(localStorage.getItem('vq:limited-drop:{target_id}:7')).ticket")
    status, _ = http("DELETE", stack.queue(target_id, "/entries/me"), {"X-User-Id": "7", "X-Queue-Ticket": ticket})
    assert status == 204
    shopper.expect_view("gone")
    expect(page.locator("section[data-view=gone] h2")).to_have_text(t["gone_h"])
    shopper.shot("gone")

    button = page.locator("section[data-view=gone] button")
    for _ in range(10):  # keyboard reachable: Tab gets there
        page.keyboard.press("Tab")
        if button.evaluate("b => b === document.activeElement"):
            break
    expect(button).to_be_focused()
    page.keyboard.press("Enter")
    shopper.expect_view("waiting")
    expect(page.locator("#position")).to_have_text("2")


def test_a_pass_used_elsewhere_or_run_out_says_so(shopper, stack, target_id):
    page, t = shopper.page, shopper.t
    stack.configure(target_id, batch=1, tickMs=500)
    open_page(shopper, stack, target_id, 7)
    tick_until_view(shopper, stack, target_id, "admitted")
    # The same pass buys first from elsewhere (another window): this page's click hears ENTRY_TOKEN_USED.
    ticket = page.evaluate(f"JSON.parse(localStorage.getItem('vq:limited-drop:{target_id}:7')).ticket")
    status, entry = http("GET", stack.queue(target_id, "/entries/me"), {"X-User-Id": "7", "X-Queue-Ticket": ticket})
    assert status == 200 and entry["status"] == "ADMITTED"
    status, _ = http(
        "POST",
        f"{stack.url}/limited-drops/{target_id}/orders",
        {"X-User-Id": "7", "X-Entry-Token": entry["entryToken"]},
        body={"quantity": 1},
    )
    assert status == 201
    page.locator("#buy").click()
    shopper.expect_view("used")
    expect(page.locator("section[data-view=used] button")).to_be_visible()
    shopper.shot("used")

    # A pass that runs out before the click (an answer standing in for one 3 s from its end): the countdown
    # ends in a view of its own, with a way back into line.
    expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3))
    page.route(
        f"**/limited-drop/{target_id}/entries",
        lambda route: route.fulfill(
            content_type="application/json",
            body=json.dumps({"status": "ADMITTED", "aheadCount": 0, "entryToken": "x.y", "tokenExpiresAt": expires}),
        ),
    )
    page.reload()
    shopper.expect_view("admitted")
    shopper.expect_view("expired", timeout_s=10)
    assert shopper.heading() == t["expired_h"]
    expect(page.locator("section[data-view=expired] button")).to_be_visible()
    shopper.shot("expired")


def test_a_reload_once_admitted_shows_the_kept_pass_without_entering_again(shopper, stack, target_id):
    page = shopper.page
    stack.configure(target_id, batch=1, tickMs=500)
    open_page(shopper, stack, target_id, 7)
    tick_until_view(shopper, stack, target_id, "admitted")
    entries = []
    page.on("response", lambda answer: entries.append(answer.status) if answer.url.endswith("/entries") else None)
    # The library kept the pass with the place (entering again by id would hand over none in header mode: 409
    # ALREADY_ADMITTED): the reload shows it and buys with it, asking nothing first.
    page.reload()
    shopper.expect_view("admitted")
    assert entries == []
    page.locator("#buy").click()
    shopper.expect_view("bought")


def test_sold_out_tells_the_line_at_its_next_poll_and_newcomers_at_once(shopper, stack, target_id):
    wait_second_in_line(shopper, stack, target_id)
    stack.configure(target_id, batch=60, tickMs=60_000, soldOut=True)
    shopper.expect_view("soldout")
    assert shopper.heading() == shopper.t["soldout_h"]
    shopper.shot("soldout")
    newcomer = shopper.page.context.new_page()
    newcomer.goto(f"{stack.url}/waiting-room/limited-drop/{target_id}?user=8")
    expect(newcomer.locator("body")).to_have_attribute("data-view", "soldout", timeout=20_000)


def test_closed_line(shopper, stack, target_id):
    stack.configure(target_id, closesAt=iso_in(-60))
    open_page(shopper, stack, target_id, 7)
    shopper.expect_view("closed")
    assert shopper.heading() == shopper.t["closed_h"]
    shopper.shot("closed")


def test_queue_off_goes_straight_to_buy(shopper, stack):
    target_id = QUEUE_OFF[list(SIZES).index(shopper.size)]
    open_page(shopper, stack, target_id, 9)
    shopper.expect_view("admitted")
    expect(shopper.page.locator("#turn")).to_have_text(shopper.t["direct_h"])
    shopper.shot("direct")
    shopper.page.locator("#buy").click()
    shopper.expect_view("bought")


def test_the_safety_net_skips_the_waiting_view_and_goes_straight_to_buy(shopper, stack, target_id):
    stack.configure(target_id, safetyNet=True)
    # Every view the page shows, from its first one.
    shopper.page.add_init_script(
        "window.views = []; new MutationObserver(() => window.views.push(document.body.dataset.view))"
        ".observe(document, {subtree: true, attributeFilter: ['data-view']});"
    )
    open_page(shopper, stack, target_id, 9)
    shopper.expect_view("admitted")
    expect(shopper.page.locator("#turn")).to_have_text(shopper.t["direct_h"])
    views = shopper.page.evaluate("window.views")
    assert views[-1] == "admitted" and "waiting" not in views, views
    shopper.page.locator("#buy").click()
    shopper.expect_view("bought")


def test_status_the_page_does_not_know_gets_a_neutral_view_and_polling_goes_on(shopper, stack, target_id):
    page = shopper.page
    wait_second_in_line(shopper, stack, target_id)
    # A newer server's status (and no pollAfterMs) stands in for the real answer for a while.
    polls = []

    def newer(route):
        polls.append(route.request.url)
        route.fulfill(content_type="application/json", body='{"status": "SOMETHING_NEW", "aheadCount": 1}')

    page.route("**/entries/me", newer)
    shopper.expect_view("unknown")
    shopper.shot("unknown")
    page.wait_for_timeout(6_000)
    assert len(polls) >= 2  # still polling
    page.unroute("**/entries/me")
    shopper.expect_view("waiting")


def test_the_wait_shows_as_a_range_in_the_page_s_language(shopper, stack, target_id):
    page, t = shopper.page, shopper.t
    wait_second_in_line(shopper, stack, target_id)
    answer = {"status": "WAITING", "position": 900, "aheadCount": 899, "paused": False, "pollAfterMs": 500}
    shown = {"etaSeconds": 300, "etaLowSeconds": 250, "etaHighSeconds": 350}

    def waiting(route):
        route.fulfill(content_type="application/json", body=json.dumps({**answer, **shown}))

    page.route("**/entries/me", waiting)
    expect(page.locator("#eta")).to_have_text(t["etaRangeMinutes"].format(low=4, high=6))  # "about 4-6 min"
    shown.update(etaSeconds=40, etaLowSeconds=31, etaHighSeconds=46)
    expect(page.locator("#eta")).to_have_text(t["etaRangeSeconds"].format(low=31, high=46))
    shown.update(etaSeconds=None, etaLowSeconds=None, etaHighSeconds=None)
    answer["paused"] = True
    expect(page.locator("#eta")).to_have_text("–")
    page.unroute("**/entries/me")


def test_polls_follow_the_servers_pollAfterMs(shopper, stack, target_id):
    page = shopper.page
    wait_second_in_line(shopper, stack, target_id)
    # The server's advice, varied from the test: often near the front, rarely far from it.
    advice = {"pollAfterMs": 400}
    polls = []

    def advised(route):
        polls.append(time.monotonic())
        route.fulfill(
            content_type="application/json",
            body=json.dumps(
                {"status": "WAITING", "position": 2, "aheadCount": 1, "etaSeconds": 1, "paused": False, **advice}
            ),
        )

    page.route("**/entries/me", advised)
    wait_until(page, lambda: len(polls) >= 6, timeout_s=15)
    gaps = sorted(b - a for a, b in itertools.pairwise(polls))
    # About 0.4 s apart; the page's own pace (2-3 s) would be five times slower.
    assert gaps[len(gaps) // 2] < 1.2, gaps
    advice["pollAfterMs"] = 30_000
    told = len(polls) + 1
    wait_until(page, lambda: len(polls) >= told, timeout_s=5)  # the poll that hears the new advice
    page.wait_for_timeout(5_000)
    assert len(polls) == told, "polled again within 5 s of being told 30 s"
    page.unroute("**/entries/me")


def test_a_target_no_operator_opened_says_so_and_looks_again(shopper, stack, target_id):
    page = shopper.page
    # Deployed, enter answers 404 UNKNOWN_TARGET until an operator configures the target.
    page.route(
        "**/entries",
        lambda route: route.fulfill(
            status=404, content_type="application/json", body='{"code": "UNKNOWN_TARGET", "detail": "not open"}'
        ),
    )
    open_page(shopper, stack, target_id, 7)
    shopper.expect_view("unopened")
    shopper.shot("unopened")


def test_the_page_runs_its_own_script_and_nothing_injected_into_it(shopper, stack, target_id):
    page = shopper.page
    stack.configure(target_id, batch=60, tickMs=60_000)

    def injected(route):
        answer = route.fetch()
        body = answer.text().replace("</body>", "<script>window.injected = true</script></body>")
        route.fulfill(response=answer, body=body)

    page.route(f"**/waiting-room/limited-drop/{target_id}?*", injected)
    open_page(shopper, stack, target_id, 7)
    shopper.expect_view("waiting")  # its own script runs under the policy
    assert page.evaluate("window.injected") is None
    # The refusal is reported (and would fail any other test): taken off this one's errors once seen.
    wait_until(page, lambda: any("CSP violation: script-src" in e for e in shopper.errors), timeout_s=5)
    shopper.errors[:] = [e for e in shopper.errors if "Content Security Policy" not in e and "CSP violation" not in e]


def test_the_gateways_429_without_a_body_is_retried_with_backoff_and_the_place_kept(shopper, stack, target_id):
    """API Gateway's throttle and the WAF rule answer 429 without the queue's `code`: unlike QUEUE_FULL, the page
    treats it as trouble on the way, backs off, and carries on by itself."""
    page, t = shopper.page, shopper.t
    stack.configure(target_id, batch=60, tickMs=60_000)
    stack.enter(target_id, 1)
    # When the page sent each call and what it heard, timed by the page itself (a route handler hears of a
    # request only when Playwright gets round to it, later and later on a loaded machine).
    page.add_init_script(THROTTLED_POLLS_TIMED)
    hold = {"entries"}  # first only the enters; the polls later, once the page has its place
    entered = []

    def throttle(route):
        kind = "entries/me" if route.request.url.endswith("/me") else "entries"
        if kind not in hold:
            return route.continue_()
        entered.append(kind)
        route.fulfill(status=429, body="")

    page.route(f"**/limited-drop/{target_id}/entries**", throttle)
    open_page(shopper, stack, target_id, 7)
    expect(page.locator("#trouble")).to_be_visible(timeout=10_000)
    wait_until(page, lambda: entered.count("entries") >= 2, timeout_s=15)
    shopper.expect_view("entering")  # not "the line is full", not an error
    hold.discard("entries")
    shopper.expect_view("waiting")
    expect(page.locator("#trouble")).to_be_hidden()
    expect(page.locator("#position")).to_have_text("2")

    # Throttled while in line: the place stays in view, marked as old, and the page asks less and less often.
    hold.add("entries/me")
    expect(page.locator("#trouble")).to_be_visible(timeout=10_000)
    page.wait_for_function("() => window.throttledPolls.length >= 3", timeout=40_000)
    polls = page.evaluate("window.throttledPolls")[:3]
    gaps = [b - a for a, b in itertools.pairwise(polls)]
    # The library's back-off from the edge's throttle (clients/js/src/pacing.ts, retryDelay): 5 s, then 10, less up
    # to a tenth, and never less than the last advice: never the 1 s advised, nor a quick retry that multiplies
    # the load.
    assert all(gap >= shortest for gap, shortest in zip(gaps, (4500, 9000), strict=True)), gaps
    shopper.expect_view("waiting")
    expect(page.locator("#last-update")).to_contain_text(re.compile(r"\d\d:\d\d:\d\d"))
    # The pump evicts nobody for it: a throttled poll costs no more than a lost one (docs/api.md).
    stack.pump.tick()
    hold.discard("entries/me")
    expect(page.locator("#trouble")).to_be_hidden(timeout=30_000)  # the next try comes within 20 s
    expect(page.locator("#position")).to_have_text("2")
    assert t["reconnecting"] in page.locator("#trouble b").inner_text()


def test_far_back_the_page_reads_the_line_not_its_place_and_polls_once_inside_the_window(shopper, stack, target_id):
    """Beyond the presence window the page asks the line's public state (the edge's), moves its place on locally,
    and polls its own place only once the line puts it within the window."""
    page = shopper.page
    stack.configure(target_id, batch=1, tickMs=60_000)  # one a minute: the 120 s window holds the first two
    for user in range(1, 7):
        stack.enter(target_id, user)
    stack.tick(target_id)  # admits 1, and writes the line
    asked = []
    line_edit = {"readCapS": 1}  # read about every second here, not every 90 s

    def status(route):
        asked.append("status")
        route.continue_()

    def line(route):
        asked.append("line")
        if line_edit.pop("throttled", False):
            return route.fulfill(status=429, body="")  # the edge's throttle: no code, no Retry-After
        answer = route.fetch()
        route.fulfill(response=answer, body=json.dumps({**answer.json(), **line_edit}))

    def entered(route):
        answer = route.fetch()
        body = answer.json()
        assert "lineAfterMs" in body and body["pollAfterMs"] == body["lineAfterMs"]
        route.fulfill(response=answer, body=json.dumps({**body, "pollAfterMs": 300, "lineAfterMs": 300}))

    page.route("**/entries/me", status)
    page.route(f"**/limited-drop/{target_id}/line", line)
    page.route(f"**/limited-drop/{target_id}/entries", entered)
    open_page(shopper, stack, target_id, 7)
    shopper.expect_view("waiting")
    wait_until(page, lambda: asked.count("line") >= 4, timeout_s=20)
    assert "status" not in asked, asked
    expect(page.locator("#position")).to_have_text("6")  # five wait ahead: placed from the line's shape
    expect(page.locator("#eta")).to_contain_text(re.compile(r"\d"))
    # Throttled on /line, the page waits it out on /line itself (the library's back-off, 5 s), never moving the
    # load onto its place, the origin's.
    line_edit["throttled"] = True
    read = asked.count("line")
    expect(page.locator("#trouble")).to_be_visible(timeout=10_000)
    wait_until(page, lambda: asked.count("line") >= read + 2, timeout_s=20)
    expect(page.locator("#trouble")).to_be_hidden()
    assert "status" not in asked, asked
    # The line moves fast enough to put the page within the window: it polls its place, its heartbeat there.
    line_edit["ratePerSec"] = 1000
    wait_until(page, lambda: "status" in asked, timeout_s=10)
    shopper.expect_view("waiting")


# Records in window.throttledPolls when (performance.now(), ms) each status poll answered 429 was sent.
THROTTLED_POLLS_TIMED = """window.throttledPolls = [];
const pageFetch = window.fetch;
window.fetch = async (url, ...rest) => {
    const sent = performance.now();
    const answer = await pageFetch(url, ...rest);
    if (String(url).endsWith("/entries/me") && answer.status === 429) window.throttledPolls.push(sent);
    return answer;
};"""


def test_a_throttled_purchase_gives_the_pass_back(shopper, stack, target_id):
    page, t = shopper.page, shopper.t
    stack.configure(target_id, batch=1, tickMs=500)
    open_page(shopper, stack, target_id, 7)
    tick_until_view(shopper, stack, target_id, "admitted")
    page.route(f"**/limited-drops/{target_id}/orders", lambda route: route.fulfill(status=429, body=""))
    page.locator("#buy").click()
    expect(page.locator("#buy-message")).to_have_text(t["busy"])
    shopper.expect_view("admitted")
    expect(page.locator("#buy")).to_be_enabled()
    page.unroute(f"**/limited-drops/{target_id}/orders")
    page.locator("#buy").click()
    shopper.expect_view("bought")


SNEAKER = """<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 120 120">
<rect width="120" height="120" fill="#f1e4d3"/>
<path d="M14 78c10-2 22-14 30-26 6 4 14 6 22 4l8 10c10 6 24 8 34 10 4 1 6 5 4 9l-2 5H16c-4 0-6-4-4-7z" fill="#c2412d"/>
<path d="M14 92h96v6H14z" fill="#fff"/>
<path d="M44 52l8 14M52 48l8 14M60 46l6 12" stroke="#fff" stroke-width="3"/></svg>"""
