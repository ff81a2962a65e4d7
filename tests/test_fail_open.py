"""Redis outages against a real server process of the test's own: fail-open answers, the breaker, recovery."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from redis.connection import Connection

from chalicelib.errors import QueueUnavailable
from chalicelib.redis_connection import connect
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
    polled, took = timed(lambda: room.status(DROP, "1", ticket))
    assert polled.status == "DIRECT_ADMITTED" and took < BUDGET_S
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
    assert tries >= 3 and room.store.breaker.current_state == "open"
    for user in range(5, 50):
        assert room.enter(DROP, str(user)).status == "DIRECT_ADMITTED"
    assert len(sends) == tries, "an open breaker must not touch Redis"

    own_redis.restart()
    time.sleep(0.4)
    assert room.enter(DROP, "50").status == "WAITING"  # the probe succeeds and closes it
    assert room.store.breaker.current_state == "closed"


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
    assert (
        api.http.get("/virtual-queues/limited-drop/42/entries/me", headers=me).json_body["status"] == "DIRECT_ADMITTED"
    )
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


def test_the_breaker_lets_nobody_in_directly_once_a_probe_finds_redis_again(make_room, own_redis):
    room = make_room(REDIS_URL=own_redis.url)  # the default breaker: 3 failures, 1 s cool-down
    room.enter(DROP, "0")
    own_redis.pause()
    try:
        for user in range(1, 4):
            assert room.enter(DROP, str(user)).status == "DIRECT_ADMITTED"
        assert room.store.breaker.current_state == "open"
    finally:
        own_redis.resume()
    resumed = time.monotonic()
    answers = []
    for user in range(4, 1000):
        answers.append(room.enter(DROP, str(user)).status)
        if answers[-1] == "WAITING" or time.monotonic() - resumed > 5:
            break
        time.sleep(0.02)
    # Direct admissions last at most the cool-down past Redis answering (with a loaded machine's slack)...
    assert answers[-1] == "WAITING" and time.monotonic() - resumed < 1.0 + 1.0
    # ...and once a probe succeeded, every enter is answered from Redis.
    assert {room.enter(DROP, str(user)).status for user in range(1000, 1020)} == {"WAITING"}
