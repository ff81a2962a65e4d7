"""The public queue API over HTTP (chalice.test.Client): contract shapes and the bad-input matrix."""

import json
import time
from urllib.parse import quote

import hypothesis
import pytest
from hypothesis import strategies as st

from chalicelib import runtime
from tests.support.ticks import admit_through

BASE = "/virtual-queues/limited-drop/42/entries"

BAD_IDS = [
    "0",
    "-1",
    "+7",
    " 42",
    "42 ",
    "1_000",
    "١٢",
    "1e3",
    "0x10",
    "1.0",
    "٤٢",
    "４２",
    "9" * 19,
    "1" * 30,
    "",
    "07",
]


def body(response):
    return json.loads(response.body)


def redis_keys():
    store = runtime.store()
    return sorted(store.client.scan_iter(match=f"{store.prefix}:*"))


def enter(api, user="7", path=BASE):
    return api.http.post(path, headers={"X-User-Id": user})


def test_enter_status_leave_over_http(api):
    first = enter(api)
    assert first.status_code == 200
    assert first.headers["Content-Type"] == "application/json"
    entry = body(first)
    assert entry["status"] == "WAITING" and entry["position"] == 1 and entry["aheadCount"] == 0
    assert isinstance(entry["etaSeconds"], int)
    ticket = entry["queueTicket"]
    assert "queueTicket" not in body(enter(api))

    me = {"X-User-Id": "7", "X-Queue-Ticket": ticket}
    polled = api.http.get(BASE + "/me", headers=me)
    assert polled.status_code == 200 and body(polled)["position"] == 1

    admit_through(runtime.store(), runtime.waiting_room().signer.read_ticket(ticket).target)
    admitted = body(api.http.get(BASE + "/me", headers=me))
    assert admitted["status"] == "ADMITTED" and admitted["entryToken"] and admitted["tokenExpiresAt"].endswith("Z")

    left = api.http.delete(BASE + "/me", headers=me)
    assert left.status_code == 204 and left.body == b""
    assert api.http.delete(BASE + "/me", headers=me).status_code == 204
    gone = api.http.get(BASE + "/me", headers=me)
    assert gone.status_code == 404 and body(gone)["code"] == "NOT_IN_QUEUE"


def test_queue_full_is_429_with_retry_after(api, env):
    env(VQ_MAX_WAITING=1)
    assert enter(api, "1").status_code == 200
    full = enter(api, "2")
    assert full.status_code == 429
    assert body(full)["code"] == "QUEUE_FULL"
    assert int(full.headers["Retry-After"]) >= 1


@pytest.mark.parametrize("bad", BAD_IDS)
def test_bad_target_id_is_400_and_changes_nothing(api, bad):
    before = redis_keys()
    for response in (
        api.http.post(f"/virtual-queues/limited-drop/{quote(bad)}/entries", headers={"X-User-Id": "7"}),
        api.http.get(f"/virtual-queues/limited-drop/{quote(bad)}/entries/me", headers={"X-User-Id": "7"}),
        api.http.delete(f"/virtual-queues/limited-drop/{quote(bad)}/entries/me", headers={"X-User-Id": "7"}),
    ):
        assert response.status_code in (400, 404), bad  # an empty segment matches no route at all
        if response.status_code == 400:
            assert body(response)["code"] == "INVALID_ARGUMENT"
    assert redis_keys() == before


# User ids are opaque: 1 to 128 printable ASCII characters without spaces (chalicelib/targets.py).
BAD_USER_IDS = [" 42", "42 ", "4 2", "tab\there", "١٢", "４２", "é", "", "x" * 129]


@pytest.mark.parametrize("bad", BAD_USER_IDS)
def test_bad_user_id_is_400_and_changes_nothing(api, bad):
    before = redis_keys()
    response = enter(api, bad)
    assert response.status_code == 400
    assert body(response) == {
        "code": "INVALID_ARGUMENT",
        "detail": "X-User-Id must be 1 to 128 printable ASCII characters without spaces",
    }
    assert redis_keys() == before


@pytest.mark.parametrize("user", ["0", "07", "auth0|abc123", "8f14e45f-ceea-467a-9575-0b6e4c7b5a2d", "x" * 128])
def test_opaque_user_ids_work_as_they_are(api, user):
    ticket = body(enter(api, user))["queueTicket"]
    polled = api.http.get(BASE + "/me", headers={"X-User-Id": user, "X-Queue-Ticket": ticket})
    assert body(polled)["status"] == "WAITING"
    assert runtime.signer().read_ticket(ticket).user_id == user


def test_missing_user_header_is_400(api):
    response = api.http.post(BASE)
    assert response.status_code == 400 and body(response)["code"] == "INVALID_ARGUMENT"
    assert redis_keys() == []


@pytest.mark.parametrize(
    ("method", "path", "content_type", "status", "code"),
    [
        ("TRACE", "/virtual-queues/limited-drop/1/entries", None, 405, "METHOD_NOT_ALLOWED"),
        ("PUT", "/virtual-queues/limited-drop/1/stats", None, 405, "METHOD_NOT_ALLOWED"),
        ("PATCH", "/virtual-queues/limited-drop/1/config", "text/plain", 415, "UNSUPPORTED_MEDIA_TYPE"),
    ],
)
def test_chalice_s_own_refusals_answer_in_the_api_s_shape(api, method, path, content_type, status, code):
    headers = {"Content-Type": content_type} if content_type else {}
    answer = api.http.request(method, path, body=b"x" if content_type else b"", headers=headers)
    assert answer.status_code == status and json.loads(answer.body)["code"] == code
    assert set(json.loads(answer.body)) == {"code", "detail"}
    if status == 405:
        assert answer.headers["Allow"]


@pytest.mark.parametrize("type_", ["limited-drops", "LIMITED-DROP", "tickets", "x" * 200])
def test_unknown_queue_type_is_404_and_changes_nothing(api, type_):
    response = api.http.post(f"/virtual-queues/{type_}/42/entries", headers={"X-User-Id": "7"})
    assert response.status_code == 404
    assert body(response)["code"] == "UNKNOWN_TARGET_TYPE"
    assert redis_keys() == []


@pytest.mark.parametrize("ticket", [None, "", "junk", "a.b", "x" * 10_000])
def test_status_and_leave_without_a_valid_ticket_are_403(api, ticket):
    enter(api)
    before = redis_keys()
    headers = {"X-User-Id": "7"} | ({"X-Queue-Ticket": ticket} if ticket is not None else {})
    for response in (api.http.get(BASE + "/me", headers=headers), api.http.delete(BASE + "/me", headers=headers)):
        assert response.status_code == 403
        assert body(response)["code"] == "INVALID_QUEUE_TICKET"
    assert redis_keys() == before


def test_someone_elses_ticket_cannot_take_their_place(api):
    ticket = body(enter(api, "7"))["queueTicket"]
    stolen = {"X-User-Id": "8", "X-Queue-Ticket": ticket}
    assert api.http.get(BASE + "/me", headers=stolen).status_code == 403
    assert api.http.delete(BASE + "/me", headers=stolen).status_code == 403
    # Knowing user 7's id is not enough either: re-entering as 7 gives no ticket.
    assert "queueTicket" not in body(enter(api, "7"))


def test_app_refuses_to_start_without_signing_keys(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-c", "import app"],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "POWERTOOLS_TRACE_DISABLED": "1"},
    )
    assert result.returncode != 0
    assert "VQ_TOKEN_KEYS is not set" in result.stderr


# --- bad input on purchases and configuration: a 400, and nothing used up ---

ORDERS = "/limited-drops/42/orders"


def mint(user=7):
    from chalicelib.targets import Target

    return runtime.signer().mint_entry_token(Target("limited-drop", 42), str(user), time.time(), 300)


def purchase(api, token, user="7", content_type="application/json"):
    headers = {"X-User-Id": user, "Content-Type": content_type}
    if token is not None:
        headers["X-Entry-Token"] = token.text
    return api.http.post(ORDERS, headers=headers, body=b'{"sku": "x"}')


# Chalice answers 415 itself unless the media type is JSON; what follows it reaches the gate.
@pytest.mark.parametrize(
    "content_type", ["application/json; charset=ütf-8", "application/json; x=\u2028", "application/json; " + "x" * 300]
)
def test_a_content_type_that_cannot_be_forwarded_is_400_before_the_token_is_used(api, origin, content_type):
    token = mint()
    refused = purchase(api, token, content_type=content_type)
    assert refused.status_code == 400 and body(refused)["code"] == "INVALID_ARGUMENT"
    assert origin.requests == []
    assert purchase(api, token).status_code == 201


CONFIG = "/virtual-queues/limited-drop/42/config"
# Every route that reads a JSON body, with a body it takes.
JSON_ROUTES = {"PUT config": ("PUT", CONFIG), "PATCH config": ("PATCH", CONFIG), "purchase": ("POST", ORDERS)}


def send_json(api, route, content_type, token):
    method, path = JSON_ROUTES[route]
    headers = {"X-User-Id": "7", "X-Entry-Token": token.text}
    if content_type is not None:
        headers["Content-Type"] = content_type
    payload = b'{"quantity": 1}' if path == ORDERS else b'{"batch": 7}'
    return getattr(api.http, method.lower())(path, headers=headers, body=payload)


@pytest.mark.parametrize(
    "content_type, status",
    [
        (None, 415),
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),
        ('text/plain; x="application/json"', 415),
        ("application/jsonx", 415),
        ("*/*", 415),
        ("text/plain;application/json", 400),  # a list, not one media type: Chalice's own check let it through
        ("application/json, text/plain", 400),
        ("text/plain; x=application/json", 400),  # a parameter's value with a slash is quoted
    ],
)
@pytest.mark.parametrize("route", list(JSON_ROUTES))
def test_every_json_route_refuses_a_missing_or_other_media_type_and_changes_nothing(
    api, origin, route, content_type, status
):
    opened = api.http.put(CONFIG, headers={"Content-Type": "application/json"}, body=b'{"batch": 3}')
    assert opened.status_code == 200
    token = mint()
    refused = send_json(api, route, content_type, token)
    assert refused.status_code == status, refused.body
    assert body(refused)["code"] == {415: "UNSUPPORTED_MEDIA_TYPE", 400: "INVALID_ARGUMENT"}[status]
    assert body(refused)["detail"]
    assert body(api.http.get(CONFIG))["config"] == {"batch": 3}
    assert origin.requests == []
    assert purchase(api, token).status_code == 201  # the token was not used


@pytest.mark.parametrize(
    "route, content_type",
    [
        ("PUT config", "Application/JSON; charset=utf-8"),
        ("PATCH config", "application/merge-patch+json"),
        ("PATCH config", "application/json"),
        ("purchase", "application/json;charset=UTF-8"),
    ],
)
def test_each_json_route_takes_its_own_media_types(api, origin, route, content_type):
    api.http.put(CONFIG, headers={"Content-Type": "application/json"}, body=b"{}")
    answer = send_json(api, route, content_type, mint())
    assert answer.status_code in (200, 201), answer.body


def test_a_merge_patch_is_no_purchase_or_put_body(api, origin):
    api.http.put(CONFIG, headers={"Content-Type": "application/json"}, body=b"{}")
    for route in ("PUT config", "purchase"):
        refused = send_json(api, route, "application/merge-patch+json", mint())
        assert refused.status_code == 415 and body(refused)["code"] == "UNSUPPORTED_MEDIA_TYPE"
    assert origin.requests == []


@pytest.mark.parametrize("bad", ["a b", "7 ", "٧", "", "x" * 129])
def test_a_malformed_user_id_under_a_percentage_rollout_is_400_and_denied_by_the_authorizer(
    api, env, origin, tmp_path, bad
):
    flags = tmp_path / "flags.json"
    flags.write_text(
        json.dumps(
            {
                "virtual_queue_enabled": {
                    "default": True,
                    "rules": {
                        "half off": {
                            "when_match": False,
                            "conditions": [
                                {
                                    "action": "MODULO_RANGE",
                                    "key": "user_id",
                                    "value": {"base": 100, "start": 0, "end": 49},
                                }
                            ],
                        }
                    },
                }
            }
        )
    )
    env(VQ_FLAGS_FILE=flags)
    refused = purchase(api, None, user=bad)
    assert refused.status_code == 400 and body(refused)["code"] == "INVALID_ARGUMENT"
    assert origin.requests == []
    arn = "arn:aws:execute-api:eu-west-1:123456789012:a1b2c3d4e5/api/POST/limited-drops/42/orders"
    verdict = api.lambda_.invoke("purchase_authorizer", {"methodArn": arn, "headers": {"X-User-Id": bad}}).payload
    assert verdict["policyDocument"]["Statement"][0]["Effect"] == "Deny"


@pytest.mark.parametrize(
    "nested",
    [
        b"[" * 2000 + b"]" * 2000,
        b'{"batch": ' + b"[" * 2000 + b"]" * 2000 + b"}",
        b'{"a":' * 800 + b"1" + b"}" * 800,
    ],
)
def test_a_deeply_nested_configuration_is_400_and_the_old_one_stays(api, nested):
    config = "/virtual-queues/limited-drop/42/config"
    assert (
        api.http.put(config, body=json.dumps({"batch": 5}), headers={"Content-Type": "application/json"}).status_code
        == 200
    )
    refused = api.http.put(config, body=nested, headers={"Content-Type": "application/json"})
    assert refused.status_code == 400 and body(refused)["code"] == "INVALID_ARGUMENT"
    assert body(api.http.get(config))["config"] == {"batch": 5}


@hypothesis.settings(
    max_examples=150, deadline=None, suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture]
)
@hypothesis.given(
    content_type=st.one_of(st.none(), st.text(max_size=300)),
    user=st.one_of(st.none(), st.text(max_size=24), st.integers(-5, 10**19).map(str)),
)
def test_fuzz_purchase_headers_never_500_and_only_a_forwarded_purchase_uses_the_token(api, origin, content_type, user):
    """Any user id and Content-Type: a 4xx that leaves the token unused, or the purchase forwarded once."""
    from chalicelib.errors import QueueError
    from chalicelib.purchase import PurchaseRequest

    token = mint()
    before = len(origin.requests)
    request = PurchaseRequest(
        target_type="limited-drop",
        target_id="42",
        entry_token=token.text,
        user_id=user,
        authorizer=None,
        body=b"{}",
        content_type=content_type,
    )
    gate = runtime.purchase_gate()
    try:
        status = gate.purchase(request).status
    except QueueError as refusal:
        status = refusal.status
    if status == 201:
        assert len(origin.requests) == before + 1
    else:
        assert status in (400, 403, 415) and len(origin.requests) == before
        assert (
            gate.purchase(
                PurchaseRequest(
                    target_type="limited-drop",
                    target_id="42",
                    entry_token=token.text,
                    user_id="7",
                    authorizer=None,
                    body=b"{}",
                    content_type="application/json",
                )
            ).status
            == 201
        )


def test_functions_that_sign_nothing_start_without_keys_and_cannot_sign():
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import app; from chalicelib import runtime\n"
        "try:\n    runtime.signer()\nexcept runtime.ConfigError as err:\n    print(err)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "POWERTOOLS_TRACE_DISABLED": "1", "VQ_SIGNS_TOKENS": "false"},
    )
    assert result.returncode == 0, result.stderr
    assert "without signing keys" in result.stdout


def test_a_user_id_with_braces_and_bars_keeps_to_its_target_s_slot_through_the_whole_journey(api, origin):
    """Also on the 3-node cluster (make test's reliability step), where a key of another slot fails the script with
    CROSSSLOT: the user's keys follow the target's hash tag, whatever braces the id holds."""
    from redis.crc import key_slot

    from chalicelib.targets import Target

    user = "{limited-drop:9}|x:config"
    me = {"X-User-Id": user, "X-Queue-Ticket": body(enter(api, user))["queueTicket"]}
    store, target = runtime.store(), Target("limited-drop", 42)
    keys = store.keys(target)
    assert key_slot(keys.token(user).encode()) == key_slot(keys.waiting.encode())
    admit_through(store, target)
    admitted = body(api.http.get(BASE + "/me", headers=me))
    assert admitted["status"] == "ADMITTED"
    buying = {"X-User-Id": user, "X-Entry-Token": admitted["entryToken"], "Content-Type": "application/json"}
    assert api.http.post(ORDERS, headers=buying, body=b"{}").status_code == 201
    assert origin.requests[-1]["headers"]["X-User-Id"] == user
    # The user's token key ends in ":config" like a target's settings: flag_sync marks only the target.
    assert store.publish_flag("v-test", {}) == 1
    assert api.http.delete(BASE + "/me", headers=me).status_code == 204
