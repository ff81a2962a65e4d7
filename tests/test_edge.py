"""The edge: no answer of the API is stored by a cache (the app's, Chalice's own and API Gateway's), the pages send
a Content-Security-Policy that lets exactly their own scripts run and fill their placeholders in one pass, and the
built template throttles every route (arrivals on their own) for what reaches the origin behind the CloudFront
distribution, and can limit each shopper address's enters and requests with WAF, sized for a NAT's crowd. The
pages under that policy in Chromium: tests/test_browser.py and tests/test_console.py; the distribution itself:
tests/test_deploy.py."""

import base64
import hashlib
import json
import re
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path

import pytest

from chalicelib import page, polling
from chalicelib.queue import WaitingRoom
from tests.support.buying import mint

ROOT = Path(__file__).resolve().parents[1]
# The account's API Gateway quota per region (default; docs/identity.md "The edge").
ACCOUNT_RATE, ACCOUNT_BURST = 10_000, 5_000
# The deployed heartbeat timeout (.chalice/config.json), which sets how often waiting users poll.
HEARTBEAT_S = int(
    json.loads((ROOT / ".chalice" / "config.json").read_text())["environment_variables"]["VQ_HEARTBEAT_TIMEOUT_S"]
)
# With the edge in front, a shopper polls the origin only once their turn is this near (VQ_PRESENCE_WINDOW_S,
# docs/architecture.md: the far line at the edge); farther back they read the line's public state from the edge.
PRESENCE_WINDOW_S = 120
# The crowd one address may hold: a company's proxy or a mobile carrier's NAT (docs/identity.md).
NAT_USERS = 5000
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
        api.http.put("/virtual-queues/limited-drop/42/config", headers={"Content-Type": "text/plain"}, body="x"),  # 415
    ):
        assert 400 <= refused.status_code < 500 and no_store(refused), refused.status_code
    assert no_store(api.http.get("/virtual-queues/limited-drop/42/stats"))
    assert no_store(api.http.get("/virtual-queues/limited-drop/42/config"))


def test_chalices_own_errors_are_never_stored(api, monkeypatch):
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


# --- every answer: X-Content-Type-Options: nosniff ---


def test_every_answer_says_nosniff_the_shops_purchase_answers_included(api, origin, signer, monkeypatch):
    """A browser runs no answer of the API as anything but the type it names: the shop's to a purchase (whatever
    Content-Type it chose), the app's, its errors and Chalice's own."""
    entered = api.http.post(ENTRIES, headers={"X-User-Id": "7"})
    me = {"X-User-Id": "7", "X-Queue-Ticket": entered.json_body["queueTicket"]}
    buying = {**JSON, "X-User-Id": "8", "X-Entry-Token": mint(signer, user=8).text}
    answers = {
        "enter": entered,
        "poll": api.http.get(ENTRIES + "/me", headers=me),
        "leave": api.http.delete(ENTRIES + "/me", headers=me),
        "400": api.http.post(ENTRIES, headers={"X-User-Id": "9" * 200}),
        "415": api.http.put("/virtual-queues/limited-drop/42/config", headers={"Content-Type": "text/plain"}, body="x"),
        "405": api.http.patch(ENTRIES, headers={"X-User-Id": "7"}),
        "stats": api.http.get("/virtual-queues/limited-drop/42/stats"),
        "the shop's answer": api.http.post("/limited-drops/42/orders", headers=buying, body='{"sku": "x"}'),
        "a used token": api.http.post("/limited-drops/42/orders", headers=buying, body='{"sku": "x"}'),
        "page": api.http.get(PAGE),
    }
    monkeypatch.setattr(WaitingRoom, "enter", lambda *args: 1 / 0)
    answers["500"] = api.http.post(ENTRIES, headers={"X-User-Id": "7"})
    assert [answer.status_code for answer in answers.values()] == [
        200,
        200,
        204,
        400,
        415,
        405,
        200,
        201,
        403,
        200,
        500,
    ]
    assert {
        name for name, answer in answers.items() if answer.headers.get("X-Content-Type-Options") != "nosniff"
    } == set()


# --- the pages: their own caching rule, and a policy that runs only their own scripts ---


class Scripts(HTMLParser):
    """The text of every inline script a browser would run in a page (a data block of another type it never runs),
    and the address of every script it loads."""

    def __init__(self, html):
        super().__init__(convert_charrefs=False)
        self.run, self.loaded, self._open = [], [], None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        named = dict(attrs)
        if tag == "script" and named.get("type") in (None, "text/javascript", "module"):
            if "src" in named:
                self.loaded.append(named["src"])
            else:
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
    scripts = Scripts(answer.body.decode())
    # Its own origin's only for a page that loads a script from it: the waiting room, the client library.
    own = ["'self'"] if scripts.loaded else []
    assert scripts.run and sorted(policy["script-src"]) == sorted([sha256(s) for s in scripts.run] + own)
    assert scripts.loaded == (["../virtual-queue.min.js"] if path != "/console" else [])
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


def test_a_template_loading_a_script_of_its_own_origin_allows_self_and_no_cdn(static):
    (static / "t.html").write_text('<script src="../lib.js"></script><script>\n__SCRIPT__</script>')
    (static / "t.js").write_text("lib();\n")
    filled = page.Template("t.html", {"SCRIPT": "t.js"}).fill({}, {})
    assert sorted(directives(filled.content_security_policy)["script-src"]) == sorted(["'self'", sha256("\nlib();\n")])


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
        ('<script src="//cdn.example/x.js"></script>', "script src"),
        ('<script src="javascript:alert(1)"></script>', "script src"),
        ('<script src="__LIBRARY__"></script>', "script src"),
        ('<button onclick="buy()">Buy</button>', "inline handler"),
    ],
)
def test_a_template_the_policy_would_break_is_refused_when_loaded(static, template, problem):
    (static / "t.html").write_text(template)
    with pytest.raises(ValueError, match=problem):
        page.Template("t.html", {})


# --- the template: throttling, the WAF rules, API Gateway's own answers ---


def parameter_defaults(template):
    return {name: spec.get("Default") for name, spec in template["Parameters"].items()}


def route_of(resource_path):
    """A MethodSetting's ResourcePath as the route it names ("~1" is "/")."""
    return resource_path[1:].replace("~1", "/")


@pytest.mark.slow
def test_every_route_is_throttled_and_arrivals_have_a_limit_of_their_own(resources, openapi_paths):
    settings = {(s["ResourcePath"], s["HttpMethod"]): s for s in resources["RestAPI"]["Properties"]["MethodSettings"]}
    stage_default = settings.pop(("/*", "*"))
    assert stage_default["ThrottlingRateLimit"] == {"Ref": "ThrottleRate"}
    assert stage_default["ThrottlingBurstLimit"] == {"Ref": "ThrottleBurst"}
    arrivals = {(route_of(path), method) for path, method in settings}
    assert arrivals == {
        ("/virtual-queues/{queue_type}/{target_id}/entries", "POST"),
        ("/waiting-room/{queue_type}/{target_id}", "GET"),
    }
    for (path, method), setting in settings.items():
        assert method.lower() in openapi_paths[route_of(path)]  # a route that exists, or the setting does nothing
        assert setting["ThrottlingRateLimit"] == {"Ref": "ArrivalThrottleRate"}
        assert setting["ThrottlingBurstLimit"] == {"Ref": "ArrivalThrottleBurst"}


def polls_near_the_front():
    """The polls one user sends from the presence window's edge to their turn, at the pacing's shortest gaps."""
    eta_s, polls = float(PRESENCE_WINDOW_S), 0
    while eta_s > 0:
        eta_s -= polling.waiting_poll_after_ms(eta_s, HEARTBEAT_S, rand=lambda: 1.0) / 1000
        polls += 1
    return polls


@pytest.mark.slow
def test_default_limits_fit_the_account_quota_and_what_reaches_the_origin_behind_the_edge(template):
    p = parameter_defaults(template)
    # Each route has a bucket of its own: polls, enters and page loads all at their limits stay within the quota.
    assert p["ThrottleRate"] + 2 * p["ArrivalThrottleRate"] <= ACCOUNT_RATE
    assert max(p["ThrottleBurst"], p["ArrivalThrottleBurst"]) <= ACCOUNT_BURST
    # Behind the edge the far line reads from CloudFront: the poll route carries the users near the front, about
    # 11 polls per admission, whatever the line's length; with room for three times the default rate.
    assert 10 <= polls_near_the_front() <= 13
    admissions_per_s = p["BatchSize"] / (p["TickMs"] / 1000)
    assert 3 * admissions_per_s * polls_near_the_front() <= p["ThrottleRate"]
    # An opening crowd's enters are throttled on purpose beyond their own rate; the page comes from the edge.
    assert p["ArrivalThrottleRate"] >= 10 * admissions_per_s


@pytest.mark.slow
def test_api_gateways_own_answers_are_never_stored_nor_sniffed(openapi):
    responses = openapi["x-amazon-apigateway-gateway-responses"]
    assert {"DEFAULT_4XX", "DEFAULT_5XX"} <= set(responses)  # every type nobody set (429 THROTTLED among them)
    for kind, response in responses.items():
        assert response["responseParameters"]["gatewayresponse.header.Cache-Control"] == "'no-store'", kind
        assert response["responseParameters"]["gatewayresponse.header.X-Content-Type-Options"] == "'nosniff'", kind


@pytest.mark.slow
def test_the_edges_own_answers_say_nosniff(resources):
    """What the WAF and the distribution answer themselves carries nosniff as the app's answers do."""
    blocks = [rule["Action"]["Block"]["CustomResponse"] for rule in rules(resources).values()]
    assert blocks and all(
        {"Name": "X-Content-Type-Options", "Value": "nosniff"} in block["ResponseHeaders"] for block in blocks
    )
    security = resources["EdgeResponseHeaders"]["Properties"]["ResponseHeadersPolicyConfig"]["SecurityHeadersConfig"]
    assert "ContentTypeOptions" in security


def waf_resources(resources):
    return {name: r for name, r in resources.items() if r["Type"].startswith("AWS::WAFv2::")}


@pytest.mark.slow
def test_a_limit_of_0_creates_no_waf_resource_at_all(template, resources):
    assert template["Parameters"]["EnterLimitPerIp"]["MinValue"] == 0
    assert template["Conditions"]["EdgeWebAclOn"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "EnterLimitPerIp"}, 0]}]}
    waf = waf_resources(resources)
    assert set(waf) == {"EdgeWebAcl", "EdgeWebAclAssociation"}
    assert all(r["Condition"] == "EdgeWebAclOn" for r in waf.values())
    # Nothing unconditional refers to them (else a limit of 0 would not deploy).
    others = json.dumps({name: r for name, r in resources.items() if name not in waf} | template.get("Outputs", {}))
    assert not any(name in others for name in waf)
    association = waf["EdgeWebAclAssociation"]["Properties"]
    assert association["WebACLArn"] == {"Fn::GetAtt": ["EdgeWebAcl", "Arn"]}
    arn = association["ResourceArn"]["Fn::Join"][1]
    assert {"Ref": "RestAPI"} in arn and {"Ref": "RestAPI.Stage"} in arn  # the API's one stage


def rules(resources, edge=True):
    """The web ACL's rules by name, as they are with the edge on (a rule under Fn::If: its first branch) or off."""
    found = {}
    for rule in resources["EdgeWebAcl"]["Properties"]["Rules"]:
        if "Fn::If" in rule:
            condition, on, off = rule["Fn::If"]
            assert condition == "EdgeOn"
            rule = on if edge else off
        if rule != {"Ref": "AWS::NoValue"}:
            found[rule["Name"]] = rule
    return found


def shopper_address(rule, edge):
    """How a rate rule tells shoppers apart, with the edge on or off."""
    rate = rule["Statement"]["RateBasedStatement"]
    branch = 1 if edge else 2
    return rate["AggregateKeyType"]["Fn::If"][branch], rate["ForwardedIPConfig"]["Fn::If"][branch]


@pytest.mark.slow
def test_the_waf_limits_each_shopper_address_and_answers_429_with_retry_after(template, resources):
    acl = resources["EdgeWebAcl"]["Properties"]
    assert acl["Scope"] == "REGIONAL" and acl["DefaultAction"] == {"Allow": {}}
    limits = {"enters-per-ip": "EnterLimitPerIp", "requests-per-ip": "RequestLimitPerIp"}
    assert set(rules(resources, edge=False)) == set(limits)
    assert set(rules(resources)) == set(limits) | {"through-the-edge"}
    for name, rule in rules(resources, edge=False).items():
        rate = rule["Statement"]["RateBasedStatement"]
        assert rate["Limit"] == {"Ref": limits[name]} and rate["EvaluationWindowSec"] == 300
        # Without the edge, the connection's address; behind it, the one the edge's function wrote (never
        # X-Forwarded-For, whose first address the client writes), and a request without one is not counted.
        assert shopper_address(rule, edge=False) == ("IP", {"Ref": "AWS::NoValue"})
        assert shopper_address(rule, edge=True) == (
            "FORWARDED_IP",
            {"HeaderName": "X-Viewer-Ip", "FallbackBehavior": "NO_MATCH"},
        )
        response = rule["Action"]["Block"]["CustomResponse"]
        assert response["ResponseCode"] == 429
        headers = {h["Name"]: h["Value"] for h in response["ResponseHeaders"]}
        assert int(headers["Retry-After"]) > 0 and headers["Cache-Control"] == "no-store"
        body = json.loads(acl["CustomResponseBodies"][response["CustomResponseBodyKey"]]["Content"])
        assert "code" not in body  # so a client tells the edge's 429 from the queue's QUEUE_FULL
    assert "ScopeDownStatement" not in rules(resources)["requests-per-ip"]["Statement"]["RateBasedStatement"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "path, secret, blocked",
    [
        ("/api/virtual-queues/limited-drop/42/entries", True, False),
        ("/api/virtual-queues/limited-drop/42/entries", False, True),
        ("/api/virtual-queues/limited-drop/42/entries/me", False, True),
        ("/api/waiting-room/limited-drop/42", False, True),
        ("/api/limited-drops/42/orders", False, True),
        ("/api/virtual-queues/limited-drop/42/line", False, True),
        # Operators call the stage itself, signed: IAM guards these.
        ("/api/virtual-queues", False, False),
        ("/api/virtual-queues/limited-drop/42/stats", False, False),
        ("/api/virtual-queues/ticketing-event/9/config", False, False),
        ("/api/console", False, False),
    ],
)
def test_behind_the_edge_the_stage_turns_away_what_did_not_come_through_it(resources, path, secret, blocked):
    rule = rules(resources)["through-the-edge"]
    assert rule["Priority"] < min(r["Priority"] for r in rules(resources, edge=False).values())
    has_secret, not_operator = rule["Statement"]["AndStatement"]["Statements"]
    header = has_secret["NotStatement"]["Statement"]["ByteMatchStatement"]
    assert header["FieldToMatch"] == {"SingleHeader": {"Name": "x-origin-verify"}}
    assert header["PositionalConstraint"] == "EXACTLY"
    # The value CloudFront sends (tests/test_deploy.py: the distribution's origin).
    assert header["SearchString"] == {"Fn::Sub": "{{resolve:secretsmanager:${EdgeOriginSecret}}}"}
    operators = not_operator["NotStatement"]["Statement"]["RegexMatchStatement"]
    assert operators["FieldToMatch"] == {"UriPath": {}}
    assert bool(not secret and not re.search(operators["RegexString"], path)) == blocked
    assert rule["Action"]["Block"]["CustomResponse"]["ResponseCode"] == 403


@pytest.mark.slow
def test_the_default_waf_limits_let_a_nat_of_thousands_in_line(template, resources):
    p = parameter_defaults(template)
    assert template["Parameters"]["RequestLimitPerIp"]["MinValue"] == 10  # WAF's lowest limit
    # 5,000 shoppers behind one address arriving within the 5-minute window, each entering twice (a reload).
    assert p["EnterLimitPerIp"] >= 2 * NAT_USERS
    # ... and all of them in line at once, far from the front, polling the origin as clients did before the edge
    # (at the pacing's shortest far gap), besides their enters: under the limit even then. Behind the edge they
    # poll only near the front, about 11 polls each over two minutes.
    shortest_gap_s = polling.longest_interval_ms(HEARTBEAT_S) * (1 - polling.JITTER) / 1000
    assert NAT_USERS * 300 / shortest_gap_s + 2 * NAT_USERS <= p["RequestLimitPerIp"]
    assert NAT_USERS * (polls_near_the_front() + 3) <= p["RequestLimitPerIp"]
    # Blocked anyway, they are asked back often enough to keep their place once the address is let through.
    response = rules(resources)["requests-per-ip"]["Action"]["Block"]["CustomResponse"]
    retry_after = int({h["Name"]: h["Value"] for h in response["ResponseHeaders"]}["Retry-After"])
    assert 3 * (retry_after + 1) < HEARTBEAT_S  # the page adds up to a second to Retry-After


@pytest.mark.slow
@pytest.mark.parametrize(
    "method, path, counted",
    [
        ("POST", "/api/virtual-queues/limited-drop/42/entries", True),
        ("POST", "/api/virtual-queues/limited-drop/42/entries/", True),
        ("POST", "/api/virtual-queues/limited-drop/42/entrie%73", True),  # decoded before matching
        ("POST", "/virtual-queues/ticketing-event/9/entries", True),  # under a custom domain's base path
        ("GET", "/api/virtual-queues/limited-drop/42/entries/me", False),
        ("DELETE", "/api/virtual-queues/limited-drop/42/entries/me", False),
        ("GET", "/api/waiting-room/limited-drop/42", False),
        ("POST", "/api/limited-drops/42/orders", False),
    ],
)
def test_the_enter_rule_counts_enters_only(resources, method, path, counted):
    rule = rules(resources)["enters-per-ip"]
    statements = rule["Statement"]["RateBasedStatement"]["ScopeDownStatement"]["AndStatement"]["Statements"]
    by_method, by_path = statements[0]["ByteMatchStatement"], statements[1]["RegexMatchStatement"]
    assert by_method["FieldToMatch"] == {"Method": {}} and by_method["PositionalConstraint"] == "EXACTLY"
    assert by_path["FieldToMatch"] == {"UriPath": {}}
    assert by_path["TextTransformations"] == [{"Priority": 0, "Type": "URL_DECODE"}]
    matched = method == by_method["SearchString"] and re.search(by_path["RegexString"], urllib.parse.unquote(path))
    assert bool(matched) == counted


@pytest.fixture(scope="module")
def openapi(resources):
    return resources["RestAPI"]["Properties"]["DefinitionBody"]


@pytest.fixture(scope="module")
def openapi_paths(openapi):
    return openapi["paths"]
