"""The waiting-room page route: HTML for a valid line, the API's JSON errors for a bad one (test_browser drives it)."""

import json
import re

import pytest


def config_of(html):
    return json.loads(re.search(r'<script id="vq-config" type="application/json">(.*?)</script>', html, re.S)[1])


@pytest.mark.parametrize("path, purchase", [
    ("/waiting-room/limited-drop/42", "../../limited-drops/42/orders"),
    ("/waiting-room/ticketing-event/9", "../../events/9/seats/select"),
])
def test_page_is_html_that_calls_this_lines_routes_relative_to_itself(api, path, purchase):
    answer = api.http.get(path)
    assert answer.status_code == 200
    assert answer.headers["Content-Type"] == "text/html; charset=utf-8"
    html = answer.body.decode()
    assert html.startswith("<!doctype html>") and "__CONFIG__" not in html
    config = config_of(html)
    queue_type, target_id = path.split("/")[2:]
    assert config["queueType"] == queue_type and config["targetId"] == target_id
    # Relative, so they resolve the same below an API Gateway stage prefix (/api/waiting-room/...).
    assert config["entries"] == f"../../virtual-queues/{queue_type}/{target_id}/entries"
    assert config["purchase"] == purchase


@pytest.mark.parametrize("path, status, code", [
    ("/waiting-room/flash-sale/1", 404, "UNKNOWN_TARGET_TYPE"),
    ("/waiting-room/limited-drop/0", 400, "INVALID_ARGUMENT"),
    ("/waiting-room/limited-drop/042", 400, "INVALID_ARGUMENT"),
    ("/waiting-room/limited-drop/1e3", 400, "INVALID_ARGUMENT"),
    ("/waiting-room/limited-drop/" + "9" * 19, 400, "INVALID_ARGUMENT"),
    ("/waiting-room/limited-drop/%3Cscript%3E", 400, "INVALID_ARGUMENT"),
])
def test_bad_line_is_the_apis_json_error(api, path, status, code):
    answer = api.http.get(path)
    assert answer.status_code == status
    assert answer.headers["Content-Type"] == "application/json"
    assert json.loads(answer.body)["code"] == code
