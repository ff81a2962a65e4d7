"""The public queue API over HTTP (chalice.test.Client): contract shapes and the bad-input matrix."""

import json
from urllib.parse import quote

import pytest

from chalicelib import runtime

BASE = "/virtual-queues/limited-drop/42/entries"

BAD_IDS = ["0", "-1", "+7", " 42", "42 ", "1_000", "١٢", "1e3", "0x10", "1.0", "٤٢", "４２", "9" * 19, "1" * 30, "", "07"]


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

    runtime.store().client.set(runtime.store().keys(runtime.waiting_room().signer.read_ticket(ticket).target).mark, 1)
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


@pytest.mark.parametrize("bad", BAD_IDS)
def test_bad_user_id_is_400_and_changes_nothing(api, bad):
    before = redis_keys()
    response = enter(api, bad)
    assert response.status_code == 400
    assert body(response) == {"code": "INVALID_ARGUMENT", "detail": "X-User-Id must be a positive integer of 1 to 18 ASCII digits"}
    assert redis_keys() == before


def test_missing_user_header_is_400(api):
    response = api.http.post(BASE)
    assert response.status_code == 400 and body(response)["code"] == "INVALID_ARGUMENT"
    assert redis_keys() == []


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
        [sys.executable, "-c", "import app"], cwd=root, capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", "POWERTOOLS_TRACE_DISABLED": "1"},
    )
    assert result.returncode != 0
    assert "VQ_TOKEN_KEYS is not set" in result.stderr
