"""The waiting-room page in jwt mode, in Chromium: the shop's sign-in hands the page a JWT in the URL fragment, with
the state the page drew before sending the shopper there; the page keeps the JWT in session storage and takes it out
of the address bar, and ignores a JWT without its own state; the shopper waits, is admitted and buys as the verified
user; `?user=` counts for nothing; a JWT that expires or is refused sends the shopper back to sign in.
The stack is tests/support/browser.py's `jwt_stack` (its provider: infra/local/dev_login.py)."""

import base64
import json
from urllib.parse import parse_qs, quote, urlsplit

import pytest

from tests.support.browser import http

pytestmark = pytest.mark.slow


def page_url(stack, target_id, query=""):
    return f"{stack.url}/waiting-room/limited-drop/{target_id}{query}"


def signed_in(page, stack, target_id, token):
    """The page as the shop's sign-in leaves it with `token`: the page sends the shopper to sign in with a state of
    its own, and the shop answers with the JWT and that state (what the demo shop's /login does for a JWT it signs)."""
    page.goto(page_url(stack, target_id))
    page.wait_for_url("**/login?return=*")
    state = parse_qs(urlsplit(page.url).query)["state"][0]
    page.goto(page_url(stack, target_id) + "#token=" + quote(token) + "&state=" + quote(state))


def ticket_user(shopper):
    """The user of the queue ticket the page keeps (a ticket's payload is base64url text: tokens.py)."""
    tickets = shopper.page.evaluate(
        "() => Object.keys(localStorage).filter((k) => k.startsWith('vq:')).map((k) => localStorage[k])"
    )
    (kept,) = tickets  # the library's record of the place (clients/js/src/storage.ts)
    payload = json.loads(kept)["ticket"].split(".")[0]
    fields = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode().split("|")
    user = fields[4]
    return base64.urlsafe_b64decode(user + "=" * (-len(user) % 4)).decode()


def admitted_and_bought(shopper, stack, target_id):
    """Tick the shopper in and buy from the page: the users the shop took orders of for the target."""
    stack.tick(target_id)
    shopper.expect_view("admitted")
    shopper.page.click("#buy")
    shopper.expect_view("bought")
    _, orders = http("GET", stack.local.shop.url + "/orders")
    return [o["userId"] for o in orders["orders"] if o["item"] == f"/limited-drops/{target_id}/orders"]


def test_the_shop_s_sign_in_hands_the_page_a_jwt_that_never_stays_in_the_address_bar(shopper, jwt_stack, target_id):
    page, stack = shopper.page, jwt_stack
    stack.configure(target_id, batch=60, tickMs=60_000)
    # ?user= counts for nothing in jwt mode: without a JWT the page asks the shop's sign-in for one.
    page.goto(page_url(stack, target_id, "?user=7"))
    page.wait_for_url("**/login?return=*")
    page.fill("#user", "auth0|alice")
    page.click("button[type=submit]")
    shopper.expect_view("waiting")
    assert "token" not in page.url and page.url.endswith(f"/waiting-room/limited-drop/{target_id}?user=7")
    kept = page.evaluate("() => sessionStorage.getItem('vq-jwt')")
    assert kept and kept.count(".") == 2
    assert page.evaluate("() => JSON.stringify(localStorage)").find(kept) == -1  # only for this tab
    assert ticket_user(shopper) == "auth0|alice"

    assert admitted_and_bought(shopper, stack, target_id) == ["auth0|alice"]
    shopper.shot("jwt-bought")


def test_a_reload_keeps_the_place_and_another_device_gets_it_back(shopper, jwt_stack, target_id, browser):
    page, stack = shopper.page, jwt_stack
    stack.configure(target_id, batch=60, tickMs=60_000)
    signed_in(page, stack, target_id, stack.local.login.token("auth0|bob"))
    shopper.expect_view("waiting")
    position = page.locator("#position").inner_text()
    page.reload()
    shopper.expect_view("waiting")
    assert page.locator("#position").inner_text() == position
    # Another browser (no storage of this one) with a fresh JWT of the same user: the same place, no dead end.
    other = browser.new_context()
    try:
        second = other.new_page()
        signed_in(second, stack, target_id, stack.local.login.token("auth0|bob"))
        second.wait_for_selector("body[data-view=waiting]")
        assert second.locator("#position").inner_text() == position
    finally:
        other.close()


def test_an_expired_or_refused_jwt_asks_for_a_new_one(shopper, jwt_stack, target_id):
    page, stack = shopper.page, jwt_stack
    # Straight from a sign-in, a refused JWT leaves a button, not a loop of redirects.
    signed_in(page, stack, target_id, stack.local.login.token("auth0|carol", ttl_s=-120))
    shopper.expect_view("signin")
    assert page.evaluate("() => sessionStorage.getItem('vq-jwt')") is None
    page.click("#signin")
    page.wait_for_url("**/login?return=*")
    # A JWT kept from earlier that has since expired: the page goes to the sign-in by itself.
    signed_in(page, stack, target_id, stack.local.login.token("auth0|carol", ttl_s=2))
    shopper.expect_view("waiting")
    page.wait_for_timeout(2500)
    page.reload()
    page.wait_for_url("**/login?return=*")


def test_a_link_carrying_someone_elses_jwt_is_ignored(shopper, jwt_stack, target_id):
    """Login CSRF: a link with the attacker's JWT would make the victim queue and buy as the attacker."""
    page, stack = shopper.page, jwt_stack
    stack.configure(target_id, batch=60, tickMs=60_000)
    link = page_url(stack, target_id) + "#token=" + quote(stack.local.login.token("auth0|mallory"))
    # Without a JWT of her own: the attacker's is not taken, and the page asks the shop's sign-in for hers.
    page.goto(link)
    page.wait_for_url("**/login?return=*")
    assert page.evaluate("() => sessionStorage.getItem('vq-jwt')") is None
    page.fill("#user", "auth0|alice")
    page.click("button[type=submit]")
    shopper.expect_view("waiting")
    hers = page.evaluate("() => sessionStorage.getItem('vq-jwt')")
    # Signed in: the link again, with a state of the attacker's making. Her JWT and place stay hers.
    page.goto("about:blank")
    page.goto(link + "&state=0123456789abcdef0123456789abcdef")
    shopper.expect_view("waiting")
    assert page.evaluate("() => sessionStorage.getItem('vq-jwt')") == hers
    assert "token" not in page.url
    assert ticket_user(shopper) == "auth0|alice"
    assert admitted_and_bought(shopper, stack, target_id) == ["auth0|alice"]
