"""The edge: no answer of the API is stored by a cache (the app's and Chalice's own), and the pages send a
Content-Security-Policy that lets exactly their own scripts run and fill their placeholders in one pass. The pages
under that policy in Chromium: tests/test_browser.py and tests/test_console.py."""

import base64
import hashlib
import json
import re
from html.parser import HTMLParser

import pytest

from chalicelib import page
from chalicelib.queue import WaitingRoom
from tests.support.buying import mint

ENTRIES = "/virtual-queues/limited-drop/42/entries"
PAGE = "/waiting-room/limited-drop/42"
JSON = {"Content-Type": "application/json"}


# --- every answer of the API: Cache-Control: no-store ---


def no_store(answer):
    return answer.headers.get("Cache-Control") == "no-store"


def test_queue_answers_and_errors_are_never_stored(api):
    entered = api.http.post(ENTRIES, headers={"X-User-Id": "7"})
    assert entered.status_code == 200 and no_store(entered)
    ticket = entered.json_body["queueTicket"]
    polled = api.http.get(ENTRIES + "/me", headers={"X-User-Id": "7", "X-Queue-Ticket": ticket})
    assert polled.status_code == 200 and no_store(polled)
    left = api.http.delete(ENTRIES + "/me", headers={"X-User-Id": "7", "X-Queue-Ticket": ticket})
    assert left.status_code == 204 and no_store(left)
    for refused in (
        api.http.post(ENTRIES, headers={"X-User-Id": "9" * 200}),  # 400
        api.http.get(ENTRIES + "/me", headers={"X-User-Id": "7", "X-Queue-Ticket": ticket}),  # 404 or 403
        api.http.get("/virtual-queues/flash-sale/1/stats"),  # 404
        api.http.get("/waiting-room/limited-drop/0"),  # the page's route, answering the API's JSON error
    ):
        assert 400 <= refused.status_code < 500 and no_store(refused), refused.status_code
    assert no_store(api.http.get("/virtual-queues/limited-drop/42/stats"))
    assert no_store(api.http.get("/virtual-queues/limited-drop/42/config"))


def test_chalices_own_errors_are_never_stored(api, monkeypatch):
    config = "/virtual-queues/limited-drop/42/config"
    unsupported = api.http.put(config, headers={"Content-Type": "text/plain"}, body="batch=5")
    assert unsupported.status_code == 415 and no_store(unsupported)
    not_allowed = api.http.patch(ENTRIES, headers={"X-User-Id": "7"})
    assert not_allowed.status_code == 405 and no_store(not_allowed)

    def broken(*args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(WaitingRoom, "enter", broken)
    crashed = api.http.post(ENTRIES, headers={"X-User-Id": "7"})
    assert crashed.status_code == 500 and no_store(crashed)


def test_the_shops_answer_to_a_purchase_is_never_stored_whatever_the_shop_said(api, origin, signer):
    origin.answer_headers = {"Cache-Control": "public, max-age=3600"}
    headers = {**JSON, "X-User-Id": "7", "X-Entry-Token": mint(signer).text}
    bought = api.http.post("/limited-drops/42/orders", headers=headers, body='{"sku": "x"}')
    assert bought.status_code == 201 and no_store(bought)
    again = api.http.post("/limited-drops/42/orders", headers=headers, body='{"sku": "x"}')
    assert again.status_code == 403 and no_store(again)


# --- the pages: their own caching rule, and a policy that runs only their own scripts ---


class Scripts(HTMLParser):
    """The text of every script a browser would run in a page (a data block of another type it never runs)."""

    def __init__(self, html):
        super().__init__(convert_charrefs=False)
        self.run, self._open = [], None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        if tag == "script" and dict(attrs).get("type") in (None, "text/javascript", "module"):
            self._open = []

    def handle_data(self, data):
        if self._open is not None:
            self._open.append(data)

    def handle_endtag(self, tag):
        if tag == "script" and self._open is not None:
            self.run.append("".join(self._open))
            self._open = None


def directives(policy):
    return {d.split()[0]: d.split()[1:] for d in (part.strip() for part in policy.split(";")) if d}


def sha256(script):
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"


@pytest.mark.parametrize("path", [PAGE, "/waiting-room/ticketing-event/9?lang=ko", "/console"])
def test_pages_allow_exactly_their_own_scripts_and_no_framing(api, path):
    answer = api.http.get(path)
    assert answer.status_code == 200
    assert answer.headers["Cache-Control"] == "no-cache"  # revalidated on every load, as before
    assert answer.headers["X-Content-Type-Options"] == "nosniff"
    assert answer.headers["Referrer-Policy"] == "no-referrer"
    policy = directives(answer.headers["Content-Security-Policy"])
    scripts = Scripts(answer.body.decode()).run
    assert scripts and sorted(policy["script-src"]) == sorted(sha256(script) for script in scripts)
    assert policy["default-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
    assert policy["base-uri"] == ["'none'"] and policy["connect-src"] == ["'self'"]


def test_a_script_changed_on_its_way_is_not_the_one_the_policy_allows(api):
    answer = api.http.get(PAGE)
    (script,) = Scripts(answer.body.decode()).run
    allowed = directives(answer.headers["Content-Security-Policy"])["script-src"]
    assert sha256(script) in allowed and sha256(script + ";alert(1)") not in allowed


def test_the_service_worker_is_not_sniffed_and_keeps_its_caching(api):
    answer = api.http.get("/waiting-room/service-worker.js")
    assert answer.headers["X-Content-Type-Options"] == "nosniff" and answer.headers["Cache-Control"] == "no-cache"


@pytest.mark.parametrize("name", ["__CONFIG__", "__SCRIPT__", "{{title}}", "{{name}} __CONFIG__", "__X__ {{nope}}"])
def test_a_display_name_spelled_like_a_placeholder_shows_as_that_text(api, name):
    put = api.http.put("/virtual-queues/limited-drop/42/config", headers=JSON, body=json.dumps({"displayName": name}))
    assert put.status_code == 200
    answer = api.http.get(PAGE)
    html = answer.body.decode()
    assert f'<h1 id="name">{name}</h1>' in html and f"<title>{name} · " in html
    config = json.loads(re.search(r'<script id="vq-config" type="application/json">(.*?)</script>', html, re.S)[1])
    assert config["queueType"] == "limited-drop" and config["targetId"] == "42"
    (script,) = Scripts(html).run  # the page's own script, once, unchanged
    assert sha256(script) in answer.headers["Content-Security-Policy"]


@pytest.fixture
def static(tmp_path, monkeypatch):
    """A static/ folder of the test's own pages."""
    monkeypatch.setattr(page, "STATIC", tmp_path)
    page._static.cache_clear()
    yield tmp_path
    page._static.cache_clear()


def test_a_template_fills_text_escaped_and_trusted_values_as_they_are(static):
    (static / "t.html").write_text('<p title="{{a}}">{{a}}</p><script type="application/json">__DATA__</script>')
    filled = page.Template("t.html", {}).fill({"a": "<b> & __DATA__"}, {"DATA": '{"x": "{{a}}"}'})
    assert filled.html == (
        '<p title="&lt;b&gt; &amp; __DATA__">&lt;b&gt; &amp; __DATA__</p>'
        '<script type="application/json">{"x": "{{a}}"}</script>'
    )
    assert directives(filled.content_security_policy)["script-src"] == ["'none'"]  # it runs no script


def test_a_template_includes_its_script_once_and_the_policy_allows_that_script(static):
    (static / "t.html").write_text("<script>\n__SCRIPT__</script><h1>{{a}}</h1>")
    (static / "t.js").write_text('const x = "{{a}} __SCRIPT__";\n')  # an include is never filled
    filled = page.Template("t.html", {"SCRIPT": "t.js"}).fill({"a": "A"}, {})
    assert filled.html == '<script>\nconst x = "{{a}} __SCRIPT__";\n</script><h1>A</h1>'
    assert directives(filled.content_security_policy)["script-src"] == [sha256('\nconst x = "{{a}} __SCRIPT__";\n')]


@pytest.mark.parametrize(
    "template, problem",
    [
        ("<script>const name = '{{name}}';</script>", "placeholder inside a script"),
        ("<script>const config = __CONFIG__;</script>", "placeholder inside a script"),
        ('<script src="https://cdn.example/x.js"></script>', "script src"),
        ('<button onclick="buy()">Buy</button>', "inline handler"),
    ],
)
def test_a_template_the_policy_would_break_is_refused_when_loaded(static, template, problem):
    (static / "t.html").write_text(template)
    with pytest.raises(ValueError, match=problem):
        page.Template("t.html", {})
