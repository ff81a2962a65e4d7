"""The web pages' routes: the waiting room (HTML for a valid line in Korean or English, with the target's display
fields; the API's JSON errors for a bad line), its service worker, and the operator console. Chromium drives
them in tests/test_browser.py and tests/test_console.py."""

import json
import re

import pytest

from chalicelib import page
from chalicelib.target_config import parse_config
from chalicelib.targets import TARGET_TYPES


def config_of(html):
    return json.loads(re.search(r'<script id="vq-config" type="application/json">(.*?)</script>', html, re.S)[1])


@pytest.mark.parametrize(
    "path, purchase",
    [
        ("/waiting-room/limited-drop/42", "/limited-drops/42/orders"),
        ("/waiting-room/ticketing-event/9", "/events/9/seats/select"),
    ],
)
def test_page_is_html_that_calls_this_lines_routes_relative_to_itself(api, path, purchase):
    answer = api.http.get(path)
    assert answer.status_code == 200
    assert answer.headers["Content-Type"] == "text/html; charset=utf-8"
    assert answer.headers["Vary"] == "Accept-Language"
    html = answer.body.decode()
    assert html.startswith("<!doctype html>") and "__CONFIG__" not in html and "{{" not in html
    config = config_of(html)
    queue_type, target_id = path.split("/")[2:]
    assert config["queueType"] == queue_type and config["targetId"] == target_id
    # Relative, so they resolve the same below an API Gateway stage prefix (/api/waiting-room/...).
    assert config["base"] == "../../"  # the library's baseUrl: it calls virtual-queues/{type}/{id}/entries there
    assert config["purchasePath"] == purchase
    assert config["serviceWorker"] == "../../waiting-room/service-worker.js"
    # The icon is inline: no /favicon.ico request, which API Gateway would answer 403.
    assert '<link rel="icon" href="data:image/svg+xml,' in html


@pytest.mark.parametrize(
    "accept_language, asked, lang",
    [
        ("ko-KR,ko;q=0.9,en-US;q=0.8,en;q=0.7", None, "ko"),
        ("en-US,en;q=0.9,ko;q=0.8", None, "en"),
        ("ja-JP,ja;q=0.9,ko;q=0.5,en;q=0.4", None, "ko"),
        ("en;q=0.2, KO-kr;q=0.3", None, "ko"),
        ("fr-FR,fr;q=0.9", None, "en"),
        ("ko;q=0", None, "en"),
        (None, None, "en"),
        ("ko;q=banana, en", None, "en"),
        ("ko-KR", "en", "en"),
        ("en", "ko", "ko"),
        ("ko", "xx", "ko"),
    ],
)
def test_language_is_korean_or_english_from_accept_language_or_the_pages_switch(accept_language, asked, lang):
    assert page.language(accept_language, asked) == lang


def test_page_speaks_the_language_asked_for(api):
    korean = api.http.get("/waiting-room/limited-drop/42", headers={"Accept-Language": "ko-KR,ko;q=0.9,en;q=0.5"})
    html = korean.body.decode()
    assert '<html lang="ko">' in html and "한정판 발매 #42" in html and config_of(html)["lang"] == "ko"
    switched = api.http.get("/waiting-room/limited-drop/42?lang=en", headers={"Accept-Language": "ko"}).body.decode()
    assert '<html lang="en">' in switched and "Limited drop #42" in switched


def test_both_languages_have_every_text():
    texts = page.messages()
    assert set(texts) == set(page.LANGUAGES)
    assert set(texts["en"]) == set(texts["ko"])
    used = set(re.findall(r"\{\{(\w+)\}\}", (page.STATIC / "waiting-room.html").read_text())) - {"lang", "name"}
    assert used <= set(texts["en"])


def test_page_shows_the_display_name_and_picture_an_operator_set_escaped(api):
    body = {"displayName": "<b>Air</b> & “Seoul” 90", "imageUrl": "https://img.example/a.png?w=200&h=200"}
    assert (
        api.http.put(
            "/virtual-queues/limited-drop/42/config",
            body=json.dumps(body),
            headers={"Content-Type": "application/json"},
        ).status_code
        == 200
    )
    html = api.http.get("/waiting-room/limited-drop/42").body.decode()
    assert "<b>Air</b>" not in html
    assert '<h1 id="name">&lt;b&gt;Air&lt;/b&gt; &amp; “Seoul” 90</h1>' in html
    assert config_of(html)["imageUrl"] == body["imageUrl"]
    assert "</b>" not in re.search(r'<script id="vq-config".*?</script>', html, re.S)[0]
    assert api.http.get("/virtual-queues/limited-drop/42/config").json_body["config"] == body


@pytest.mark.parametrize(
    "body",
    [
        {"displayName": ""},
        {"displayName": "   "},
        {"displayName": "x" * 81},
        {"displayName": 5},
        {"displayName": "a\nb"},
        {"displayName": "evil\u202egnp.exe"},
        {"displayName": "\u0378"},
        {"imageUrl": "http://img.example/a.png"},
        {"imageUrl": "javascript:alert(1)"},
        {"imageUrl": "https://"},
        {"imageUrl": "https://user:pw@img.example/a.png"},
        {"imageUrl": "https://img.example/a b.png"},
        {"imageUrl": 'https://img.example/a".png'},
        {"imageUrl": "https://img.example/" + "a" * 500},
        {"imageUrl": "https://[::1/a.png"},
        {"imageUrl": "data:image/png;base64,AAAA"},
        {"imageUrl": ["https://x.y"]},
    ],
)
def test_bad_display_fields_are_refused_with_a_400_and_change_nothing(api, body):
    config = "/virtual-queues/limited-drop/42/config"
    api.http.put(config, body=json.dumps({"displayName": "Kept"}), headers={"Content-Type": "application/json"})
    answer = api.http.put(config, body=json.dumps(body), headers={"Content-Type": "application/json"})
    assert answer.status_code == 400 and answer.json_body["code"] == "INVALID_ARGUMENT"
    assert api.http.get(config).json_body["config"] == {"displayName": "Kept"}


def test_display_fields_round_trip_through_redis_as_text():
    config = parse_config(json.dumps({"displayName": "나이키 덩크 로우 ‘Panda’", "batch": 5}).encode())
    assert type(config).from_redis({k: str(v) for k, v in config.to_redis().items()}) == config


def test_page_loads_without_its_display_fields_when_redis_is_down(api, env):
    env(REDIS_URL="redis://127.0.0.1:1/0")  # nothing listens there
    answer = api.http.get("/waiting-room/limited-drop/42")
    assert answer.status_code == 200 and "Limited drop #42" in answer.body.decode()


@pytest.mark.parametrize(
    "path, status, code",
    [
        ("/waiting-room/flash-sale/1", 404, "UNKNOWN_TARGET_TYPE"),
        ("/waiting-room/limited-drop/0", 400, "INVALID_ARGUMENT"),
        ("/waiting-room/limited-drop/042", 400, "INVALID_ARGUMENT"),
        ("/waiting-room/limited-drop/1e3", 400, "INVALID_ARGUMENT"),
        ("/waiting-room/limited-drop/" + "9" * 19, 400, "INVALID_ARGUMENT"),
        ("/waiting-room/limited-drop/%3Cscript%3E", 400, "INVALID_ARGUMENT"),
    ],
)
def test_bad_line_is_the_apis_json_error(api, path, status, code):
    answer = api.http.get(path)
    assert answer.status_code == status
    assert answer.headers["Content-Type"] == "application/json"
    assert json.loads(answer.body)["code"] == code


def test_service_worker_is_served_as_script_from_the_folder_it_covers(api):
    answer = api.http.get("/waiting-room/service-worker.js")
    assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("text/javascript")
    assert b'addEventListener("fetch"' in answer.body


def test_the_client_library_is_served_as_script_beside_the_service_worker(api):
    """The page loads it as ../virtual-queue.min.js (tests/test_edge.py): /waiting-room/, under the edge's page
    behaviour and the service worker's scope. The copy served is the committed bundle, which the test-js step keeps
    equal to a fresh `npm run bundle` (clients/js/test/bundle.test.mjs)."""
    answer = api.http.get(page.LIBRARY_PATH)
    assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("text/javascript")
    assert answer.headers["X-Content-Type-Options"] == "nosniff" and answer.headers["Cache-Control"] == "no-cache"
    assert answer.body == (page.STATIC / "virtual-queue.min.js").read_bytes()
    assert answer.body.startswith(b'"use strict";var VirtualQueue=')


def test_console_page_reads_the_operator_routes_relative_to_itself_and_knows_the_target_types(api):
    answer = api.http.get("/console")
    assert answer.status_code == 200 and answer.headers["Content-Type"] == "text/html; charset=utf-8"
    assert config_of(answer.body.decode()) == {"queues": "virtual-queues", "types": list(TARGET_TYPES)}


def test_operators_list_the_targets_with_users_in_line(api):
    for target in ("ticketing-event/7", "limited-drop/9", "limited-drop/10"):
        assert api.http.post(f"/virtual-queues/{target}/entries", headers={"X-User-Id": "1"}).status_code == 200
    assert api.http.get("/virtual-queues").json_body == {
        "targets": [
            {"type": "limited-drop", "id": "9"},
            {"type": "limited-drop", "id": "10"},
            {"type": "ticketing-event", "id": "7"},
        ]
    }
