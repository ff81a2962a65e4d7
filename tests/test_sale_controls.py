"""What operators steer a sale with: known targets (an unknown one answers 404 and creates nothing), pause,
and sold out (set by the operator or by the shop's X-Queue-Sold-Out header)."""

import json
import time

import pytest

from chalicelib import runtime
from chalicelib.errors import QueueSoldOut, UnknownTarget
from chalicelib.pump import Pump
from chalicelib.target_config import TargetConfig
from chalicelib.targets import Target
from tests.support.observed import counted

DROP = Target("limited-drop", 42)
ENTRIES = "/virtual-queues/limited-drop/42/entries"


def keys_under(client, prefix):
    return sorted(client.scan_iter(match=f"{prefix}:*", count=1000))


def enter(api, user, path=ENTRIES):
    return api.http.post(path, headers={"X-User-Id": str(user)})


def poll(api, user, ticket, path=ENTRIES):
    return api.http.get(path + "/me", headers={"X-User-Id": str(user), "X-Queue-Ticket": ticket})


def put_config(api, body, target=DROP):
    return api.http.put(
        f"/virtual-queues/{target.type}/{target.id}/config",
        headers={"Content-Type": "application/json"},
        body=json.dumps(body),
    )


def pump_ticks(room, ticks):
    return Pump(room.store, room.settings).run(ticks=ticks)


# --- known targets ---


@pytest.fixture
def closed_api(env, api):
    """The API as deployed: targets exist only once an operator configured them."""
    env(VQ_TARGETS_OPEN_ON_FIRST_USE="false")
    return api


def test_enter_on_an_unknown_target_is_404_and_creates_no_key_no_registration_no_metric(
    closed_api, client, prefix, capsys
):
    capsys.readouterr()
    answer = enter(closed_api, 7)
    assert answer.status_code == 404 and answer.json_body["code"] == "UNKNOWN_TARGET"
    assert keys_under(client, prefix) == []
    assert runtime.store().registered_targets() == {}
    emitted = capsys.readouterr().out
    assert "limited-drop:42" not in emitted


def test_status_with_a_genuine_ticket_stats_and_config_of_an_unknown_target_are_404(closed_api, client, prefix):
    ticket = runtime.signer().issue_ticket(DROP, "7", 1, int(time.time() * 1000)).text
    for answer in (
        poll(closed_api, 7, ticket),
        closed_api.http.get("/virtual-queues/limited-drop/42/stats"),
        closed_api.http.get("/virtual-queues/limited-drop/42/config"),
    ):
        assert answer.status_code == 404 and answer.json_body["code"] == "UNKNOWN_TARGET"
    assert keys_under(client, prefix) == []


def test_an_operators_put_opens_the_target(closed_api):
    assert put_config(closed_api, {}).status_code == 200
    first = enter(closed_api, 7)
    assert first.status_code == 200 and first.json_body["status"] == "WAITING"
    assert closed_api.http.get("/virtual-queues/limited-drop/42/stats").status_code == 200
    # Replacing the configuration keeps the target open.
    put_config(closed_api, {"batch": 3})
    assert enter(closed_api, 8).status_code == 200


def test_locally_a_first_enter_opens_the_target(api):
    assert enter(api, 7).json_body["status"] == "WAITING"
    assert api.http.get("/virtual-queues/limited-drop/42/config").json_body["config"] == {}


# --- pause ---


def test_paused_admits_nobody_and_waiting_users_keep_their_place_and_heartbeat(make_room, client):
    room = make_room(VQ_BATCH_SIZE=2, VQ_TICK_MS=100)
    tickets = {user: room.enter(DROP, str(user)).queue_ticket for user in range(1, 7)}
    room.configure(DROP, TargetConfig(paused=True))
    assert pump_ticks(room, 3).admitted == 0

    entry = room.status(DROP, "3", tickets[3])
    assert (entry.status, entry.position, entry.eta_seconds, entry.paused) == ("WAITING", 3, None, True)
    assert entry.to_body()["paused"] is True and entry.to_body()["etaSeconds"] is None
    before = client.zscore(room.store.keys(DROP).heartbeat, "3")
    time.sleep(0.01)
    room.status(DROP, "3", tickets[3])
    assert client.zscore(room.store.keys(DROP).heartbeat, "3") > before
    assert room.stats(DROP)["config"]["paused"] is True and room.stats(DROP)["effectiveRatePerSec"] == 0


def test_resuming_goes_on_in_the_same_order_at_the_rate_without_catching_up(make_room, client):
    from tests.support.ticks import wait_for_next_tick

    room = make_room(VQ_BATCH_SIZE=2, VQ_TICK_MS=100)
    tickets = {user: room.enter(DROP, str(user)).queue_ticket for user in range(1, 9)}
    room.configure(DROP, TargetConfig(paused=True))
    pump_ticks(room, 4)
    room.configure(DROP, TargetConfig(paused=False))
    wait_for_next_tick(client, 100)
    run = pump_ticks(room, 1)
    # One tick's batch (two, should a loaded machine slip a tick), not the paused ticks made up for (10).
    assert run.admitted in (2, 4)
    statuses = {user: room.status(DROP, str(user), tickets[user]).status for user in tickets}
    assert [user for user, status in sorted(statuses.items()) if status == "ADMITTED"] == list(
        range(1, run.admitted + 1)
    )


# --- sold out ---


def test_sold_out_answers_every_waiting_users_next_poll_and_releases_their_place(make_room):
    room = make_room(VQ_BATCH_SIZE=1, VQ_TICK_MS=100)
    tickets = {user: room.enter(DROP, str(user)).queue_ticket for user in range(1, 5)}
    pump_ticks(room, 1)
    holder = room.status(DROP, "1", tickets[1])
    assert holder.status == "ADMITTED"

    room.configure(DROP, TargetConfig(sold_out=True))
    assert pump_ticks(room, 2).admitted == 0
    assert room.stats(DROP)["waitingCount"] == 3
    assert room.status(DROP, "2", tickets[2]).to_body() == {"status": "SOLD_OUT"}
    assert room.status(DROP, "2", tickets[2]).status == "SOLD_OUT"  # and again at the next poll
    stats = room.stats(DROP)
    assert stats["waitingCount"] == 2 and stats["soldOutReleasedCount"] == 1
    assert stats["config"]["soldOut"] is True and stats["effectiveRatePerSec"] == 0
    # Tokens already issued stay valid: the holder still gets theirs.
    again = room.status(DROP, "1", tickets[1])
    assert again.status == "ADMITTED" and again.entry_token.text == holder.entry_token.text


def test_enter_on_a_sold_out_target_is_409_and_releases_a_place(make_room, api):
    room = make_room()
    room.enter(DROP, "2")
    room.configure(DROP, TargetConfig(sold_out=True))
    with pytest.raises(QueueSoldOut):
        room.enter(DROP, "3")
    answer = enter(api, 2)
    assert answer.status_code == 409 and answer.json_body["code"] == "SOLD_OUT"
    assert room.stats(DROP)["waitingCount"] == 0


def test_a_pre_queued_user_hears_sold_out_too(make_room):
    room = make_room()
    room.configure(DROP, TargetConfig(opens_at_ms=int(time.time() * 1000) + 60_000))
    ticket = room.enter(DROP, "5").queue_ticket
    room.configure(DROP, TargetConfig(opens_at_ms=int(time.time() * 1000) + 60_000, sold_out=True))
    assert room.status(DROP, "5", ticket).status == "SOLD_OUT"
    assert room.stats(DROP)["preQueuedCount"] == 0


def test_the_shops_sold_out_header_marks_the_target_sold_out_and_the_token_it_answered_stays_used(
    make_room, origin, capsys
):
    from tests.support.buying import mint, request_for

    room = make_room()
    tickets = {user: room.enter(DROP, str(user)).queue_ticket for user in (1, 2)}
    origin.answers = [(201, {"orderId": 1})]
    assert runtime.purchase_gate().purchase(request_for(mint(runtime.signer()))).status == 201
    assert room.stats(DROP)["config"]["soldOut"] is False and room.stats(DROP)["ordersCount"] == 1

    origin.answers = [(409, {"code": "SOLD_OUT"})]
    origin.answer_headers = {"X-Queue-Sold-Out": "true"}
    capsys.readouterr()
    assert runtime.purchase_gate().purchase(request_for(mint(runtime.signer(), user=8), user="8")).status == 409
    assert counted(capsys.readouterr().out, "SoldOutByShop") == [
        {"target": "limited-drop:42", "service": "virtual-queue"}
    ]
    assert room.config(DROP).body["config"] == {"soldOut": True}
    assert room.status(DROP, "2", tickets[2]).status == "SOLD_OUT"
    with pytest.raises(QueueSoldOut):
        room.enter(DROP, "3")


def test_a_direct_entry_token_for_an_unknown_target_buys_nothing(env, origin, client, prefix, capsys):
    # Minted with the queue off or Redis down, a token names whatever target the caller asked for.
    env(VQ_TARGETS_OPEN_ON_FIRST_USE="false")
    from tests.support.buying import mint, request_for

    origin.answer_headers = {"X-Queue-Sold-Out": "true"}
    capsys.readouterr()
    with pytest.raises(UnknownTarget):
        runtime.purchase_gate().purchase(request_for(mint(runtime.signer())))
    assert origin.requests == [] and keys_under(client, prefix) == []
    assert "limited-drop:42" not in capsys.readouterr().out
    with pytest.raises(UnknownTarget):
        runtime.waiting_room().enter(DROP, "7")


def test_with_the_queue_off_an_unknown_target_is_still_404_and_a_known_one_lets_users_in(
    closed_api, env, tmp_path, capsys
):
    off = tmp_path / "off.json"
    off.write_text(json.dumps({"virtual_queue_enabled": {"default": False}}))
    env(VQ_FLAGS_FILE=off)
    capsys.readouterr()
    unknown = enter(closed_api, 7)
    assert unknown.status_code == 404 and unknown.json_body["code"] == "UNKNOWN_TARGET"
    assert put_config(closed_api, {}).status_code == 200
    assert enter(closed_api, 7).json_body["status"] == "DIRECT_ADMITTED"
    # Counted for the whole service only: a direct admission made with Redis down cannot tell a known target.
    assert counted(capsys.readouterr().out, "DirectAdmitted") == [{"service": "virtual-queue"}]
