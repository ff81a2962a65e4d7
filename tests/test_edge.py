"""The edge: the pages send a Content-Security-Policy that lets exactly their own scripts run and fill their
placeholders in one pass. The pages under that policy in Chromium: tests/test_browser.py and tests/test_console.py."""

import base64
import hashlib
import json
import re
from html.parser import HTMLParser

import pytest

from chalicelib import page

PAGE = "/waiting-room/limited-drop/42"
JSON = {"Content-Type": "application/json"}


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
