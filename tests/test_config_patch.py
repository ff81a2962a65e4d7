"""PATCH .../config: a JSON Merge Patch of a target's configuration, validated like PUT, versioned by an ETag that
If-Match checks in the same Redis step as the write (412 on a concurrent change), and never losing a concurrent
writer's fields."""

import json
import threading

import pytest

from chalicelib import runtime
from chalicelib.queue import PATCH_ATTEMPTS
from chalicelib.shop_health import Purchase
from chalicelib.store import config_version
from chalicelib.target_config import UNCONDITIONAL, Precondition, TargetConfig, parse_patch
from chalicelib.targets import Target

DROP = Target("limited-drop", 42)
CONFIG = "/virtual-queues/limited-drop/42/config"


def put(api, body, **headers):
    return api.http.put(CONFIG, headers={"Content-Type": "application/json", **headers}, body=json.dumps(body))


def patch(api, body, content_type="application/merge-patch+json", **headers):
    raw = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return api.http.patch(CONFIG, headers={"Content-Type": content_type, **headers}, body=raw)


def etag_of(answer):
    return answer.headers["ETag"]


def test_patch_merges_into_the_configuration_and_keeps_every_other_field(api):
    put(api, {"batch": 50, "tickMs": 1000, "displayName": "Sneaker 42", "originSlo": {"p95Ms": 800}})
    answer = patch(api, {"paused": True})
    assert answer.status_code == 200, answer.body
    expected = {"batch": 50, "tickMs": 1000, "paused": True, "displayName": "Sneaker 42", "originSlo": {"p95Ms": 800}}
    assert answer.json_body["config"] == expected
    assert api.http.get(CONFIG).json_body["config"] == expected
    # Nested objects merge too, and plain JSON is accepted as well as the merge-patch media type.
    answer = patch(api, {"originSlo": {"errorRate": 0.05}}, content_type="application/json")
    assert answer.json_body["config"]["originSlo"] == {"p95Ms": 800, "errorRate": 0.05}


def test_null_removes_a_setting_and_an_empty_objective_stops_following_the_shop(api):
    put(api, {"batch": 50, "paused": True, "opensAt": "2030-01-01T00:00:00Z", "originSlo": {"p95Ms": 800}})
    answer = patch(api, {"batch": None, "paused": None, "opensAt": None, "originSlo": {"p95Ms": None}})
    assert answer.status_code == 200, answer.body
    assert answer.json_body["config"] == {}
    assert answer.json_body["effective"]["batch"] == 100  # back to the global default
    assert answer.json_body["effective"]["paused"] is False


BAD_PATCHES = [
    {"batch": 0},
    {"batch": "5"},
    {"tickMs": 99},
    {"colour": "red"},
    {"colour": None},
    {"originSlo": {"p99Ms": 5}},
    {"originSlo": "fast"},
    {"closesAt": "2029-12-31T00:00:00Z"},  # before the stored opensAt
    {"displayName": ""},
    [],
    "not json",
    "",
]


@pytest.mark.parametrize("body", BAD_PATCHES, ids=[str(i) for i in range(len(BAD_PATCHES))])
def test_a_bad_patch_is_400_and_changes_nothing(api, body):
    stored = put(api, {"batch": 9, "opensAt": "2030-01-01T00:00:00Z"})
    answer = patch(api, body)
    assert answer.status_code == 400, answer.body
    assert answer.json_body["code"] == "INVALID_ARGUMENT"
    after = api.http.get(CONFIG)
    assert after.json_body["config"] == {"batch": 9, "opensAt": "2030-01-01T00:00:00.000Z"}
    assert etag_of(after) == etag_of(stored)


def test_patch_of_a_target_no_operator_opened_is_404_and_opens_nothing(api, env):
    env(VQ_TARGETS_OPEN_ON_FIRST_USE="false")
    answer = patch(api, {"paused": True})
    assert answer.status_code == 404 and answer.json_body["code"] == "UNKNOWN_TARGET"
    assert api.http.get(CONFIG).status_code == 404


def test_every_config_answer_carries_the_version_and_only_a_change_moves_it(api):
    first = put(api, {"batch": 5})
    assert first.headers["ETag"].startswith('"') and len(first.headers["ETag"]) == 42
    assert etag_of(api.http.get(CONFIG)) == etag_of(first)
    # The same content is the same version, whoever wrote it; another content another version.
    assert etag_of(patch(api, {"batch": 5})) == etag_of(first)
    assert etag_of(patch(api, {"batch": 6})) != etag_of(first)


def test_a_stale_if_match_is_412_with_the_current_version_and_changes_nothing(api):
    read = put(api, {"batch": 5})
    other = patch(api, {"tickMs": 500})  # another operator, meanwhile
    for send in (patch, put):
        stale = send(api, {"paused": True}, **{"If-Match": etag_of(read)})
        assert stale.status_code == 412, stale.body
        assert stale.json_body["code"] == "CONFIG_CHANGED"
        assert etag_of(stale) == etag_of(other)
    assert api.http.get(CONFIG).json_body["config"] == {"batch": 5, "tickMs": 500}
    # With the version read now, the change goes through; a list of versions matches any of them.
    fresh = patch(api, {"paused": True}, **{"If-Match": f'"{"0" * 40}", {etag_of(other)}'})
    assert fresh.status_code == 200 and fresh.json_body["config"]["paused"] is True
    assert put(api, {"batch": 7}, **{"If-Match": etag_of(fresh)}).status_code == 200


@pytest.mark.parametrize(
    ("header", "value", "status"),
    [
        ("If-Match", "*", 200),
        ("If-Match", 'W/"abc"', 412),  # weak: strong comparison never matches
        ("If-Match", "not-quoted", 400),
        ("If-None-Match", "*", 412),
        ("If-None-Match", '"abc"', 400),
    ],
)
def test_preconditions_on_an_open_target(api, header, value, status):
    put(api, {"batch": 5})
    answer = patch(api, {"batch": 6}, **{header: value})
    assert answer.status_code == status, answer.body
    assert api.http.get(CONFIG).json_body["config"]["batch"] == (6 if status == 200 else 5)


def test_put_with_if_none_match_opens_a_target_once(api, env):
    env(VQ_TARGETS_OPEN_ON_FIRST_USE="false")
    assert put(api, {"batch": 5}, **{"If-None-Match": "*"}).status_code == 200
    again = put(api, {"batch": 9}, **{"If-None-Match": "*"})
    assert again.status_code == 412 and "already open" in again.json_body["detail"]
    assert api.http.get(CONFIG).json_body["config"] == {"batch": 5}


def test_concurrent_patches_of_different_fields_all_land(room):
    room.configure(DROP, TargetConfig())
    fields = [{"batch": 7}, {"tickMs": 700}, {"maxWaiting": 70}, {"maxActive": 7}, {"displayName": "seven"}]
    fields += [{"paused": True}, {"opensAt": "2030-01-01T00:00:00Z"}, {"originSlo": {"p95Ms": 700}}]
    start = threading.Barrier(len(fields))
    refused = []

    def send(body):
        patch_room = runtime.waiting_room()
        start.wait()
        try:
            patch_room.patch_config(DROP, parse_patch(json.dumps(body).encode()))
        except Exception as err:  # reported below: a thread's exception would otherwise only be printed
            refused.append(err)

    threads = [threading.Thread(target=send, args=(body,)) for body in fields]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert refused == []
    merged = {name: value for body in fields for name, value in body.items()}
    merged["opensAt"] = "2030-01-01T00:00:00.000Z"
    assert room.config(DROP).body["config"] == merged


def test_a_patch_that_keeps_losing_the_race_is_409_and_writes_nothing(room, monkeypatch):
    room.configure(DROP, TargetConfig(batch=5))
    tries = []

    def always_changed(target, config, now_ms, precondition=UNCONDITIONAL, **_):
        tries.append(precondition)
        return "CHANGED", "0" * 40

    monkeypatch.setattr(room.store, "configure", always_changed)
    with pytest.raises(Exception) as refused:
        room.patch_config(DROP, {"batch": 6})
    assert (refused.value.status, refused.value.code) == (409, "CONFIG_CHANGED")
    assert len(tries) == PATCH_ATTEMPTS and all(p.etags and p.given for p in tries)
    monkeypatch.undo()
    assert room.config(DROP).body["config"] == {"batch": 5}


def test_the_scripts_version_is_the_one_get_computes_and_the_shops_sold_out_moves_it(room, store, client):
    written = room.configure(DROP, TargetConfig(batch=5, display_name="한정판 ✓", slo_error_rate=0.05))
    stored = client.hgetall(store.keys(DROP).config)
    assert written.etag == config_version(stored) == room.config(DROP).etag
    # The flag's mark and the opening time are not the operator's: the version leaves them out.
    client.hset(store.keys(DROP).config, "flag_version", "v9")
    assert room.config(DROP).etag == written.etag
    store.observe_purchase(DROP, Purchase(sent_ms=1, latency_ms=1, ok=True), accepted=False, sold_out=True)
    assert room.config(DROP).body["config"]["soldOut"] is True
    assert room.config(DROP).etag != written.etag
    stale = Precondition.parse(f'"{written.etag}"', None)
    with pytest.raises(Exception) as refused:
        room.patch_config(DROP, {"paused": True}, stale)
    assert refused.value.status == 412
