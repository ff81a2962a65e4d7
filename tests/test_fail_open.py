"""Redis outages against a real server process of the test's own: fail-open answers, the breaker, recovery."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from redis.connection import Connection

from chalicelib.errors import QueueUnavailable
from chalicelib.pump import Pump
from chalicelib.redis_connection import connect
from chalicelib.target_config import TargetConfig
from chalicelib.targets import Target

DROP = Target("limited-drop", 42)
# Connect timeout 0.2 s, command timeout 0.5 s: one failed call costs at most this, with room for a slow machine.
BUDGET_S = 2.0


@pytest.fixture
def room_on_own_redis(make_room, own_redis):
    return make_room(REDIS_URL=own_redis.url, VQ_BREAKER_FAILURES=3, VQ_BREAKER_COOLDOWN_MS=300)


def timed(call):
    start = time.monotonic()
    result = call()
    return result, time.monotonic() - start


def test_killed_redis_answers_direct_admitted_then_queueing_resumes(room_on_own_redis, own_redis, capsys):
    room = room_on_own_redis
    ticket = room.enter(DROP, "1").queue_ticket
    assert room.enter(DROP, "2").status == "WAITING"

    own_redis.kill()
    for user in (3, 4, 5, 6):
        entry, took = timed(lambda user=user: room.enter(DROP, str(user)))
        assert entry.status == "DIRECT_ADMITTED" and took < BUDGET_S
        assert entry.entry_token.grants(DROP, str(user))
    # A ticket holder is never let in directly: this container never saw their line, so they poll again.
    start = time.monotonic()
    with pytest.raises(QueueUnavailable) as unplaced:
        room.status(DROP, "1", ticket)
    assert unplaced.value.headers["Retry-After"] and time.monotonic() - start < BUDGET_S
    assert '"RedisDegraded"' in capsys.readouterr().out

    own_redis.restart()  # empty: the data is lost with the process
    time.sleep(0.4)  # the breaker's cool-down
    assert room.enter(DROP, "7").status == "WAITING"
    assert room.enter(DROP, "8").position == 2


def test_paused_redis_answers_within_the_timeout_budget_and_recovers(room_on_own_redis, own_redis):
    room = room_on_own_redis
    ticket = room.enter(DROP, "1").queue_ticket
    own_redis.pause()
    try:
        for user in (2, 3, 4):
            entry, took = timed(lambda user=user: room.enter(DROP, str(user)))
            assert entry.status == "DIRECT_ADMITTED" and took < BUDGET_S
    finally:
        own_redis.resume()
    time.sleep(0.4)
    polled = room.status(DROP, "1", ticket)
    assert (polled.status, polled.position) == ("WAITING", 1)  # nothing was lost


def test_concurrent_callers_during_a_pause_each_wait_one_timeout_not_each_others(room_on_own_redis, own_redis):
    # The breaker holds no lock across the Redis call: with one, callers queued behind each other's timeouts.
    room = room_on_own_redis
    room.enter(DROP, "1")
    own_redis.pause()
    try:
        with ThreadPoolExecutor(max_workers=6) as pool:
            answers = list(pool.map(lambda user: timed(lambda: room.enter(DROP, str(user))), range(2, 8)))
    finally:
        own_redis.resume()
    assert {entry.status for entry, _ in answers} == {"DIRECT_ADMITTED"}
    assert max(took for _, took in answers) < 1.0  # one command timeout (0.5 s), not three in a row


def test_open_breaker_skips_redis_until_its_cool_down(room_on_own_redis, own_redis, monkeypatch):
    room = room_on_own_redis
    room.enter(DROP, "1")
    own_redis.kill()
    sends = []
    original = Connection.send_packed_command
    monkeypatch.setattr(
        Connection,
        "send_packed_command",
        lambda conn, *args, **kwargs: (sends.append(1), original(conn, *args, **kwargs))[1],
    )

    for user in range(2, 5):  # three failures in a row open it
        room.enter(DROP, str(user))
    tries = len(sends)
    assert tries >= 3 and room.store.breaker_of(DROP).current_state == "open"
    for user in range(5, 50):
        assert room.enter(DROP, str(user)).status == "DIRECT_ADMITTED"
    assert len(sends) == tries, "an open breaker must not touch Redis"

    own_redis.restart()
    time.sleep(0.4)
    assert room.enter(DROP, "50").status == "WAITING"  # the probe succeeds and closes it
    assert room.store.breaker_of(DROP).current_state == "closed"


def test_fail_closed_answers_503_with_retry_after(make_room, own_redis):
    room = make_room(REDIS_URL=own_redis.url, VQ_FAIL_MODE="closed")
    ticket = room.enter(DROP, "1").queue_ticket
    own_redis.kill()
    for call in (
        lambda: room.enter(DROP, "2"),
        lambda: room.status(DROP, "1", ticket),
        lambda: room.leave(DROP, "1", ticket),
    ):
        with pytest.raises(QueueUnavailable) as refused:
            call()
        assert refused.value.status == 503 and int(refused.value.headers["Retry-After"]) >= 1


def test_outage_over_http_is_never_a_5xx_other_than_an_explained_503(api, env, own_redis):
    env(REDIS_URL=own_redis.url)
    entered = api.http.post("/virtual-queues/limited-drop/42/entries", headers={"X-User-Id": "1"})
    ticket = entered.json_body["queueTicket"]
    own_redis.kill()
    me = {"X-User-Id": "1", "X-Queue-Ticket": ticket}
    assert (
        api.http.post("/virtual-queues/limited-drop/42/entries", headers={"X-User-Id": "2"}).json_body["status"]
        == "DIRECT_ADMITTED"
    )
    polled = api.http.get("/virtual-queues/limited-drop/42/entries/me", headers=me)
    assert polled.status_code == 503 and polled.json_body["code"] == "QUEUE_UNAVAILABLE"
    assert int(polled.headers["Retry-After"]) >= 1
    left = api.http.delete("/virtual-queues/limited-drop/42/entries/me", headers=me)
    assert left.status_code == 503 and left.json_body["code"] == "QUEUE_UNAVAILABLE"
    stats = api.http.get("/virtual-queues/limited-drop/42/stats")
    assert stats.status_code == 503 and stats.json_body["code"] == "QUEUE_UNAVAILABLE"


def test_the_client_connects_on_its_first_command_and_keeps_one_connection_per_thread(own_redis):
    # Built during an outage, it raises nothing until a command (which the breaker and fail-open then handle).
    client = connect("redis://127.0.0.1:1")
    with pytest.raises(redis.ConnectionError):
        client.get("anything")

    client = connect(own_redis.url)
    mine = {client.client_id() for _ in range(3)}
    with ThreadPoolExecutor(max_workers=2) as pool:
        theirs = set(pool.map(lambda _: client.client_id(), range(2)))
    assert len(mine) == 1 and mine.isdisjoint(theirs)
    client.client_setname("before-the-restart")
    own_redis.kill()
    own_redis.restart()
    # The connection the server closed is noticed before the next command, which goes over a new one.
    assert client.client_getname() is None


class FakeClock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def test_ticket_holders_seen_in_line_are_admitted_in_turn_at_the_rate_while_redis_is_down(make_room, own_redis):
    clock = FakeClock(time.time())
    room = make_room(clock, REDIS_URL=own_redis.url, VQ_BATCH_SIZE=2, VQ_TICK_MS=1000, VQ_BREAKER_COOLDOWN_MS=300)
    tickets = {user: room.enter(DROP, str(user)).queue_ticket for user in range(1, 8)}
    for user in (2, 5, 7):  # polls this container answered: the line as it stood
        assert room.status(DROP, str(user), tickets[user]).status == "WAITING"
    seen_at = clock.now
    own_redis.kill()

    admitted = {}
    for tick in range(5):
        clock.now = seen_at + tick + 0.9
        for user, ticket in tickets.items():
            if user not in admitted:
                entry = room.status(DROP, str(user), ticket)
                if entry.status == "ADMITTED":
                    admitted[user] = (tick, entry.entry_token)
                    assert entry.entry_token.expires_at == int(clock.now) + 60  # VQ_OUTAGE_TOKEN_TTL_S
                else:
                    assert entry.status == "WAITING" and entry.poll_after_ms > 0
    # Two a tick, in seq order, from the tick after the last poll seen; seqs 6 and 7 are bounded by seq 7's count.
    assert {user: tick for user, (tick, _) in admitted.items()} == {1: 1, 2: 1, 3: 2, 4: 2, 5: 3, 6: 3, 7: 4}
    for user, (_, token) in admitted.items():
        assert token.minted == "turn" and token.grants(DROP, str(user))
        # The id the pump's own admission of this entry will carry.
        seq = room.signer.read_ticket(tickets[user]).seq
        assert token.token_id == room.signer.grant(DROP, str(user), seq, clock.now, 300).token_id
    # A newcomer follows VQ_FAIL_MODE: let in directly, on a short-lived token of its own kind.
    direct = room.enter(DROP, "8")
    assert direct.status == "DIRECT_ADMITTED" and direct.entry_token.minted == "direct"
    assert direct.entry_token.expires_at == int(clock.now) + 60


def test_a_paused_line_admits_no_ticket_holder_while_redis_is_down(make_room, own_redis):
    clock = FakeClock(time.time())
    room = make_room(clock, REDIS_URL=own_redis.url, VQ_BATCH_SIZE=2, VQ_TICK_MS=1000)
    ticket = room.enter(DROP, "1").queue_ticket
    room.configure(DROP, TargetConfig(paused=True))
    assert room.status(DROP, "1", ticket).paused
    own_redis.kill()
    clock.now += 3600
    entry = room.status(DROP, "1", ticket)
    assert (entry.status, entry.position, entry.paused, entry.eta_seconds) == ("WAITING", 1, True, None)


def test_fail_closed_reckons_nothing(make_room, own_redis):
    room = make_room(REDIS_URL=own_redis.url, VQ_FAIL_MODE="closed")
    ticket = room.enter(DROP, "1").queue_ticket
    room.status(DROP, "1", ticket)
    own_redis.kill()
    room.clock = lambda: time.time() + 3600
    with pytest.raises(QueueUnavailable):
        room.status(DROP, "1", ticket)


@pytest.mark.slow
def test_the_breaker_lets_nobody_in_directly_once_a_probe_finds_redis_again(make_room, own_redis):
    room = make_room(REDIS_URL=own_redis.url)  # the default breaker: 3 failures, 1 s cool-down
    room.enter(DROP, "0")
    own_redis.pause()
    try:
        for user in range(1, 4):
            assert room.enter(DROP, str(user)).status == "DIRECT_ADMITTED"
        assert room.store.breaker_of(DROP).current_state == "open"
    finally:
        own_redis.resume()
    resumed = time.monotonic()
    answers = []
    for user in range(4, 1000):
        answers.append(room.enter(DROP, str(user)).status)
        if answers[-1] == "WAITING" or time.monotonic() - resumed > 6:
            break
        time.sleep(0.02)
    # Direct admissions last at most the cool-down past Redis answering (with a loaded machine's slack)...
    assert answers[-1] == "WAITING" and time.monotonic() - resumed < 1.0 + 2.0
    # ...and once a probe succeeded, every enter is answered from Redis.
    assert {room.enter(DROP, str(user)).status for user in range(1000, 1020)} == {"WAITING"}


def test_turns_reckoned_in_an_outage_move_the_mark_once_redis_answers(make_room, own_redis):
    clock = FakeClock(time.time())
    room = make_room(clock, REDIS_URL=own_redis.url, VQ_BATCH_SIZE=1, VQ_TICK_MS=1000, VQ_BREAKER_COOLDOWN_MS=300)
    tickets = {user: room.enter(DROP, str(user)).queue_ticket for user in range(1, 5)}
    for user, ticket in tickets.items():
        room.status(DROP, str(user), ticket)
    own_redis.pause()
    try:
        clock.now += 2.5
        reckoned = {user: room.status(DROP, str(user), tickets[user]) for user in (1, 2, 3)}
    finally:
        own_redis.resume()
    assert [entry.status for entry in reckoned.values()] == ["ADMITTED", "ADMITTED", "WAITING"]
    time.sleep(0.4)  # the breaker's cool-down
    # The first poll Redis answers writes the turns back: the line goes on after them, nobody is admitted twice.
    assert room.status(DROP, "3", tickets[3]).status == "WAITING"
    assert room.store.client.get(room.store.keys(DROP).mark) == str(room.signer.read_ticket(tickets[2]).seq)
    entry = room.status(DROP, "3", tickets[3])
    assert (entry.status, entry.position) == ("WAITING", 1)
    again = room.status(DROP, "1", tickets[1])
    assert again.status == "ADMITTED" and again.entry_token.token_id == reckoned[1].entry_token.token_id


@pytest.mark.parametrize("reckoned", [True, False])
def test_the_pump_makes_up_no_tick_the_reckoning_stood_in_for(make_room, reckoned):
    room = make_room(VQ_BATCH_SIZE=1, VQ_TICK_MS=100, VQ_CATCHUP_TICKS=5)
    tickets = [room.enter(DROP, str(user)).queue_ticket for user in range(1, 11)]
    pump = Pump(room.store, room.settings)
    assert pump.run(ticks=1).admitted == 1
    time.sleep(0.6)  # six ticks with no pump: Redis down, say
    if reckoned:  # ...while a container let seqs 2 and 3 in by dead reckoning
        room.store.raise_mark(DROP, room.signer.read_ticket(tickets[2]).seq, 100, 60_000)
    admitted = pump.run(ticks=1).admitted
    assert admitted <= 1 if reckoned else admitted >= 2  # made up for, up to VQ_CATCHUP_TICKS, only if nobody was


def test_nobody_is_told_to_wait_behind_a_turn_reckoned_here(make_room, own_redis):
    clock = FakeClock(time.time())
    room = make_room(clock, REDIS_URL=own_redis.url, VQ_BATCH_SIZE=1, VQ_TICK_MS=1000, VQ_BREAKER_COOLDOWN_MS=300)
    tickets = {user: room.enter(DROP, str(user)).queue_ticket for user in range(1, 4)}
    for user, ticket in tickets.items():
        room.status(DROP, str(user), ticket)
    own_redis.pause()
    try:
        clock.now += 2.5
        reckoned = room.status(DROP, "2", tickets[2])  # user 1 does not poll in the outage
    finally:
        own_redis.resume()
    assert reckoned.status == "ADMITTED"
    time.sleep(0.4)  # the breaker's cool-down
    # Redis still has user 1 waiting when it answers their poll (the turns are written back by that very poll).
    first = room.status(DROP, "1", tickets[1])
    assert first.status == "ADMITTED" and first.entry_token.minted == "turn"
    again = room.status(DROP, "1", tickets[1])  # ...and now from Redis, under the same id
    assert (again.status, again.entry_token.minted) == ("ADMITTED", "queue")
    assert again.entry_token.token_id == first.entry_token.token_id
    assert room.status(DROP, "3", tickets[3]).position == 1
