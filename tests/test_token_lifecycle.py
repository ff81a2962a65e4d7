"""An entry token with no loose ends: leaving revokes it, a ticket belongs to one entry, purchases during an
outage are bounded and written back, and an out-of-memory Redis never opens the gate (real Redis, real HTTP)."""

import json
import time

import pytest

from chalicelib import runtime
from chalicelib.errors import EntryTokenUsed, InvalidQueueTicket, QueueBypassDenied
from chalicelib.purchase import PurchaseGate, PurchaseRequest
from chalicelib.redis_connection import connect
from chalicelib.store import QueueStore
from chalicelib.target_config import TargetConfig
from chalicelib.targets import Target
from infra.local.demo_shop import idempotency_key
from tests.support import jwts
from tests.support.observed import counted
from tests.support.ticks import admit_through

DROP = Target("limited-drop", 42)


class FakeClock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def admit_up_to(room):
    admit_through(room.store, DROP)


def request_for(token):
    return PurchaseRequest(
        target_type=DROP.type,
        target_id=str(DROP.id),
        entry_token=token.text,
        user_id=str(token.user_id),
        authorizer=None,
        body=b'{"sku":"x"}',
        content_type="application/json",
    )


@pytest.fixture
def gate(origin):
    return runtime.purchase_gate()


# --- leaving revokes ---


def test_leaving_revokes_the_unused_token_and_frees_its_max_active_slot(room, gate, origin):
    room.configure(DROP, TargetConfig(max_active=1))
    ticket = room.enter(DROP, "1").queue_ticket
    admit_up_to(room)
    token = room.status(DROP, "1", ticket).entry_token
    assert room.stats(DROP)["activeCount"] == 1
    room.leave(DROP, "1", ticket)
    assert room.stats(DROP)["activeCount"] == 0
    with pytest.raises(QueueBypassDenied):
        gate.purchase(request_for(token))
    assert origin.requests == []


def test_leave_and_enter_again_never_holds_two_live_tokens(room, gate, origin):
    tokens = []
    for _ in range(3):
        ticket = room.enter(DROP, "1").queue_ticket
        admit_up_to(room)
        tokens.append(room.status(DROP, "1", ticket).entry_token)
        room.leave(DROP, "1", ticket)
    ticket = room.enter(DROP, "1").queue_ticket
    admit_up_to(room)
    live = room.status(DROP, "1", ticket).entry_token
    for old in tokens:
        with pytest.raises(QueueBypassDenied):
            gate.purchase(request_for(old))
    assert gate.purchase(request_for(live)).status == 201
    assert len(origin.requests) == 1


def test_one_entry_gets_one_token_id_however_it_is_admitted(make_room, origin):
    # jwt mode: a verified owner's enter collects their token (in header mode only a poll with the ticket does).
    room = make_room(**jwts.jwt_env())
    gate = runtime.purchase_gate()
    tickets = [room.signer.read_ticket(room.enter(DROP, user).queue_ticket) for user in ("1", "2")]
    admit_up_to(room)  # through user 2, the last in line
    by_poll = room.status(DROP, "1", tickets[0].text).entry_token
    by_enter = room.enter(DROP, "2").entry_token  # enter.lua draws the id from the seq it admits
    now = time.time()
    assert by_poll.token_id == room.signer.mint_entry_token(DROP, "1", now, 60, entry=tickets[0].seq).token_id
    assert by_enter.token_id == room.signer.mint_entry_token(DROP, "2", now, 60, entry=tickets[1].seq).token_id
    assert by_poll.token_id != by_enter.token_id
    # A failover loses the admission but not the place (as the promoted node may): admitted again, the same id.
    keys = room.store.keys(DROP)
    room.store.client.delete(keys.token("1"))
    room.store.client.zadd(keys.waiting, {"1": tickets[0].seq})
    again = room.status(DROP, "1", tickets[0].text).entry_token
    assert again.token_id == by_poll.token_id
    assert gate.purchase(request_for(by_poll)).status == 201
    with pytest.raises(EntryTokenUsed):
        gate.purchase(request_for(again))
    assert [idempotency_key(r["headers"]["Idempotency-Key"]) for r in origin.requests] == [by_poll.token_id]


def test_tokens_minted_without_redis_cannot_buy_on_a_held_target_once_redis_answers(room, gate, origin):
    room.configure(DROP, TargetConfig())
    now = time.time()
    turn, direct, queued = (
        room.signer.mint_entry_token(DROP, str(user), now, 60, entry=user, minted=minted)
        for user, minted in ((1, "turn"), (2, "direct"), (3, "queue"))
    )
    room.configure(DROP, TargetConfig(paused=True))
    for token in (turn, direct):
        with pytest.raises(QueueBypassDenied, match="paused"):
            gate.purchase(request_for(token))
    assert gate.purchase(request_for(queued)).status == 201  # handed out from the line before the pause
    room.configure(DROP, TargetConfig(sold_out=True))
    for token in (turn, direct):
        with pytest.raises(QueueBypassDenied, match="sold out"):
            gate.purchase(request_for(token))
    # Closed keeps newcomers out, not those who held a place: nothing was written, the refused tokens stay whole.
    room.configure(DROP, TargetConfig(closes_at_ms=int(now * 1000) - 1))
    with pytest.raises(QueueBypassDenied, match="closed"):
        gate.purchase(request_for(direct))
    assert gate.purchase(request_for(turn)).status == 201
    assert [idempotency_key(r["headers"]["Idempotency-Key"]) for r in origin.requests] == [
        queued.token_id,
        turn.token_id,
    ]


def test_leaving_after_buying_keeps_the_purchase(room, gate, origin):
    ticket = room.enter(DROP, "1").queue_ticket
    admit_up_to(room)
    token = room.status(DROP, "1", ticket).entry_token
    assert gate.purchase(request_for(token)).status == 201
    room.leave(DROP, "1", ticket)
    with pytest.raises(EntryTokenUsed):
        gate.purchase(request_for(token))


def test_a_revocation_lives_as_long_as_the_token_and_the_margin(room, client):
    from chalicelib.store import CLOCK_SKEW_MARGIN_MS

    ticket = room.enter(DROP, "1").queue_ticket
    admit_up_to(room)
    token = room.status(DROP, "1", ticket).entry_token
    room.leave(DROP, "1", ticket)
    revoked = room.store.keys(DROP).revoked
    assert client.zscore(revoked, token.token_id) == token.expires_at * 1000 + CLOCK_SKEW_MARGIN_MS
    assert abs(client.pexpiretime(revoked) - (token.expires_at * 1000 + CLOCK_SKEW_MARGIN_MS)) <= 1


# --- a ticket belongs to one entry ---


def test_an_earlier_entrys_ticket_is_refused_and_changes_nothing(room, client):
    first = room.enter(DROP, "1").queue_ticket
    room.leave(DROP, "1", first)
    second = room.enter(DROP, "1").queue_ticket
    for call in (room.status, room.leave):
        with pytest.raises(InvalidQueueTicket):
            call(DROP, 1, first)
    assert client.zscore(room.store.keys(DROP).waiting, "1") == room.signer.read_ticket(second).seq
    # Once the later entry is admitted, the earlier ticket still cannot collect its token.
    admit_up_to(room)
    with pytest.raises(InvalidQueueTicket):
        room.status(DROP, "1", first)
    assert room.status(DROP, "1", second).status == "ADMITTED"
    with pytest.raises(InvalidQueueTicket):
        room.status(DROP, "1", first)
    with pytest.raises(InvalidQueueTicket):
        room.leave(DROP, "1", first)
    assert client.exists(room.store.keys(DROP).token(1))


def test_waits_count_from_the_entrys_own_time(make_room):
    clock = FakeClock(1_800_000_000.0)
    room = make_room(clock=clock)
    first = room.enter(DROP, "1").queue_ticket
    room.leave(DROP, "1", first)
    clock.now += 20
    second = room.enter(DROP, "1").queue_ticket
    admit_up_to(room)
    clock.now += 0.9
    with pytest.raises(InvalidQueueTicket):
        room.status(DROP, "1", first)
    assert room.status(DROP, "1", second).status == "ADMITTED"
    assert room.stats(DROP)["avgWaitSeconds"] == 0.9


# --- Redis unreachable: one purchase per token per container, written back on recovery ---


@pytest.fixture
def gate_on_own_redis(env, origin, own_redis):
    env(REDIS_URL=own_redis.url, VQ_BREAKER_FAILURES=1, VQ_BREAKER_COOLDOWN_MS=200)
    return runtime.purchase_gate()


def another_container(settings):
    """A second gate over the same Redis, as another Lambda container would have: nothing in memory."""
    store = QueueStore(connect(settings.redis_url), settings.key_prefix)
    return PurchaseGate(store, runtime.signer(), settings, runtime.switch())


def test_during_an_outage_a_token_buys_once_per_container_and_cannot_buy_after_recovery(
    gate_on_own_redis,
    own_redis,
    origin,
    capsys,
    log_lines,
):
    gate = gate_on_own_redis
    signer = runtime.signer()
    token = signer.mint_entry_token(DROP, "7", time.time(), 300)
    own_redis.pause()  # unreachable (its port stays this test's, which a restart could lose to another server)
    try:
        assert gate.purchase(request_for(token)).status == 201
        for _ in range(8):
            with pytest.raises(EntryTokenUsed):
                gate.purchase(request_for(token))
    finally:
        own_redis.resume()
    out = capsys.readouterr().out
    assert len(counted(out, "PurchaseUnrecorded")) == 1
    logged = [line for line in log_lines() if line.get("token_id")]
    assert [line["token_id"] for line in logged] == [token.token_id]
    assert token.text not in out and token.text not in json.dumps(log_lines())

    time.sleep(0.3)  # the breaker's cool-down
    # The next purchase in this container that reaches Redis writes the outage's purchases back.
    other = signer.mint_entry_token(DROP, "8", time.time(), 300)
    assert gate.purchase(request_for(other)).status == 201
    assert counted(capsys.readouterr().out, "PurchaseUnrecorded") == []
    with pytest.raises(EntryTokenUsed):
        gate.purchase(request_for(token))
    with pytest.raises(EntryTokenUsed):
        another_container(runtime.settings()).purchase(request_for(token))
    assert origin.orders_per_key() == {token.token_id: 1, other.token_id: 1}


def test_an_outage_purchase_the_shop_did_not_take_gives_the_token_back(gate_on_own_redis, own_redis, origin):
    token = runtime.signer().mint_entry_token(DROP, "7", time.time(), 300)
    own_redis.kill()  # killed and never restarted: connections are refused at once
    origin.answers = [(503, {}, {"not_taken": True})]
    assert gate_on_own_redis.purchase(request_for(token)).status == 503
    assert gate_on_own_redis.purchase(request_for(token)).status == 201
    assert origin.orders_per_key() == {token.token_id: 1}


# --- Redis out of memory: full is not down ---


@pytest.fixture
def full_redis(env, origin, own_redis):
    """The environment on a Redis of its own that refuses every write (maxmemory reached, `noeviction`)."""
    env(REDIS_URL=own_redis.url, VQ_BREAKER_FAILURES=1)
    runtime.waiting_room().enter(DROP, "1")
    client = connect(own_redis.url)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    return client


def test_out_of_memory_never_lets_anyone_in_and_is_not_an_outage(full_redis, api, origin, capsys):
    entered = api.http.post("/virtual-queues/limited-drop/42/entries", headers={"X-User-Id": "2"})
    assert entered.status_code == 503 and entered.json_body["code"] == "QUEUE_UNAVAILABLE"
    assert int(entered.headers["Retry-After"]) >= 1
    token = runtime.signer().mint_entry_token(DROP, "7", time.time(), 300)
    bought = api.http.post(
        "/limited-drops/42/orders",
        body=b"{}",
        headers={"X-Entry-Token": token.text, "X-User-Id": "7", "Content-Type": "application/json"},
    )
    assert bought.status_code == 503 and bought.json_body["code"] == "QUEUE_UNAVAILABLE"
    assert origin.requests == []
    for user in range(3, 8):
        again = api.http.post("/virtual-queues/limited-drop/42/entries", headers={"X-User-Id": str(user)})
        assert again.status_code == 503
    assert runtime.store().breaker_of(DROP).current_state == "closed"
    out = capsys.readouterr().out
    assert len(counted(out, "RedisOutOfMemory")) == 7 and counted(out, "RedisDegraded") == []
    assert counted(out, "DirectAdmitted") == []
    # Reading still works: operators see the line.
    assert api.http.get("/virtual-queues/limited-drop/42/stats").json_body["waitingCount"] == 1
    full_redis.config_set("maxmemory", 0)
    assert (
        api.http.post("/virtual-queues/limited-drop/42/entries", headers={"X-User-Id": "2"}).json_body["status"]
        == "WAITING"
    )
