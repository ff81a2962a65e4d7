"""The line's public state (GET .../line) and the presence window, against real Redis: one answer for everyone, a
far-back user keeps a silent place, a silent user inside the window is evicted before its turn, and a client placing
itself from /line is within 1 % of its exact place (docs/api.md#far-back-read-the-line-not-your-place)."""

import copy
import json
import random
import time

import pytest

from chalicelib import runtime
from chalicelib.answers import TargetTick
from chalicelib.config import ConfigError, load_settings
from chalicelib.pump import Pump
from chalicelib.targets import Target
from infra.local.stack import free_port
from tests.support.ticks import admit_through, server_ms, wait_for_next_tick

DROP = Target("limited-drop", 39)
LINE = "/virtual-queues/limited-drop/39/line"


def fill(room, users):
    return {user: room.enter(DROP, str(user)).queue_ticket for user in users}


def tick(pump) -> TargetTick:
    result = pump.tick().targets[DROP]
    assert isinstance(result, TargetTick), result
    return result


def in_line(store, user) -> bool:
    return store.client.zscore(store.keys(DROP).waiting, str(user)) is not None


def place(line: dict, seq: int) -> float:
    """docs/api.md's client: how many users wait ahead of `seq`, interpolated from the line's shape."""
    points = [(int(s), ahead) for s, ahead in line["shape"]]
    if seq <= int(line["mark"]) or seq <= points[0][0]:
        return 0.0
    for (s1, a1), (s2, a2) in zip(points, points[1:], strict=False):
        if s1 <= seq <= s2:
            return a1 + (a2 - a1) * (seq - s1) / (s2 - s1)
    return float(line["waitingCount"])


def test_line_is_one_answer_for_everyone_cacheable_and_carries_nobody_s_data(api, env, store):
    env(VQ_TARGETS_OPEN_ON_FIRST_USE="true", VQ_BATCH_SIZE=1, VQ_TICK_MS=60_000)
    tickets = [
        json.loads(api.http.post(LINE.replace("line", "entries"), headers={"X-User-Id": f"u{n}"}).body)["queueTicket"]
        for n in range(5)
    ]
    tick(Pump(store, runtime.settings()))
    anonymous = api.http.get(LINE)
    someone = api.http.get(LINE, headers={"X-User-Id": "u3", "X-Queue-Ticket": tickets[3], "Authorization": "Bearer x"})
    assert anonymous.status_code == someone.status_code == 200
    assert anonymous.headers["Cache-Control"] == someone.headers["Cache-Control"]
    assert anonymous.headers["Cache-Control"] == "public, max-age=1, stale-while-revalidate=5, stale-if-error=60"
    first, second = json.loads(anonymous.body), json.loads(someone.body)
    assert {**first, "serverTimeMs": 0} == {**second, "serverTimeMs": 0}
    assert first["waitingCount"] == 4 and first["state"] == "OPEN"  # the first tick admitted one
    assert first["presenceWindowS"] == 120 and first["readCapS"] == 300
    text = anonymous.body.decode()
    assert not any(f"u{n}" in text or tickets[n] in text for n in range(5))


def test_an_unknown_target_is_a_briefly_cacheable_404_and_an_unticked_one_a_503(api, room):
    unknown = api.http.get(LINE)
    assert unknown.status_code == 404 and json.loads(unknown.body)["code"] == "UNKNOWN_TARGET"
    assert unknown.headers["Cache-Control"] == "public, max-age=5"
    room.store.client.hset(room.store.keys(DROP).config, "known_since_ms", 1)
    unticked = api.http.get(LINE)
    assert unticked.status_code == 503 and json.loads(unticked.body)["code"] == "LINE_NOT_PUBLISHED"
    assert unticked.headers["Retry-After"] == "1" and unticked.headers["Cache-Control"] == "no-store"


def test_with_redis_down_line_is_a_503_with_retry_after_the_edge_serves_its_copy_meanwhile(api, env):
    env(REDIS_URL=f"redis://127.0.0.1:{free_port()}")
    down = api.http.get(LINE)
    assert down.status_code == 503 and json.loads(down.body)["code"] == "QUEUE_UNAVAILABLE"
    assert int(down.headers["Retry-After"]) >= 1 and down.headers["Cache-Control"] == "no-store"


def test_positions_placed_from_line_are_within_one_percent_of_the_exact_ones(make_room, api):
    room = make_room(VQ_TICK_MS=60_000, VQ_BATCH_SIZE=7, VQ_TARGETS_OPEN_ON_FIRST_USE="true")
    users = range(1, 1501)
    tickets = fill(room, users)
    # Departures thin the line unevenly: places are counted by who is left, not by seq.
    rng = random.Random(39)
    for user in rng.sample(list(users)[:500], 300):
        room.leave(DROP, str(user), tickets[user])
    admit_through(room.store, DROP, "600")
    tick(Pump(room.store, room.settings))
    line = json.loads(api.http.get(LINE).body)
    waiting = line["waitingCount"]
    assert 95 <= len(line["shape"]) <= 102
    keys = room.store.keys(DROP)
    worst = 0.0
    for user, seq in room.store.client.zrangebyscore(keys.waiting, f"({line['mark']}", "+inf", withscores=True):
        exact = room.status(DROP, user, tickets[int(user)]).ahead_count
        worst = max(worst, abs(place(line, int(seq)) - exact))
    assert worst <= waiting / 100


def test_a_far_back_user_silent_for_five_heartbeat_timeouts_keeps_the_place_and_is_admitted_in_order(make_room, client):
    # One admission a minute: the 120 s window holds the first three places (0.017 a second measured).
    room = make_room(VQ_TICK_MS=60_000, VQ_BATCH_SIZE=1, VQ_HEARTBEAT_TIMEOUT_S=60)
    store, pump = room.store, Pump(room.store, room.settings)
    if 60_000 - server_ms(client) % 60_000 < 5_000:
        wait_for_next_tick(client, 60_000)
    tickets = fill(room, [1, 2, 3, 4, 5])
    tick(pump)  # admits 1; the window: 2 to 4, and 5 stands beyond it
    silent = copy.copy(room)
    silent.clock = lambda: time.time() - 5 * 60  # entered five heartbeat timeouts ago, silent since
    tickets |= fill(silent, range(6, 12))
    assert tick(pump).evicted == 0 and tick(pump).evicted == 0
    assert all(in_line(store, user) for user in range(5, 12))
    # The line moves: 5 and 6 cross into the window, their clock starts there, and they poll in time.
    admit_through(store, DROP, "3")
    assert tick(pump).evicted == 0
    for user in range(4, 12):
        admit_through(store, DROP, str(user))
        assert room.status(DROP, str(user), tickets[user]).status == "ADMITTED"
        if user < 11:
            behind = room.status(DROP, str(user + 1), tickets[user + 1])
            assert (behind.status, behind.ahead_count) == ("WAITING", 0)
        assert tick(pump).evicted == 0


@pytest.mark.slow
def test_a_user_silent_inside_the_window_is_evicted_before_the_mark_reaches_them_and_takes_no_slot(make_room, client):
    # One a second, a 3 s heartbeat and a 6 s window: user 9 crosses into it a few ticks in, is evicted 3 s later,
    # about three places before the mark.
    room = make_room(VQ_TICK_MS=1000, VQ_BATCH_SIZE=1, VQ_HEARTBEAT_TIMEOUT_S=3, VQ_PRESENCE_WINDOW_S=6)
    store, pump = room.store, Pump(room.store, room.settings)
    tickets = fill(room, range(1, 15))
    mark_when_evicted = None
    admitted = []
    for _ in range(30):
        wait_for_next_tick(client, 1000)
        result = tick(pump)
        if result.evicted:
            assert not in_line(store, 9) and mark_when_evicted is None
            mark_when_evicted = result.mark
        for user in range(1, 15):
            polled = user != 9 and user not in admitted and in_line(store, user)
            if polled and room.status(DROP, str(user), tickets[user]).status == "ADMITTED":
                admitted.append(user)
        if len(admitted) == 13:
            break
    assert admitted == [u for u in range(1, 15) if u != 9]
    assert mark_when_evicted is not None and mark_when_evicted < int(tickets_seq(store, tickets, 9))
    stats = store.client.hgetall(store.keys(DROP).stats)
    assert stats["evicted"] == "1" and stats["admitted"] == "13"


def tickets_seq(store, tickets, user):
    """The seq user's ticket names (it has left the line): the entry number in the ticket."""
    return runtime.signer().read_ticket(tickets[user]).seq


def test_a_presence_window_under_twice_the_heartbeat_timeout_is_refused_at_start():
    # A silent user crossing in would be evicted only after the mark had passed them: a wasted slot.
    with pytest.raises(ConfigError, match="VQ_PRESENCE_WINDOW_S"):
        load_settings({"VQ_HEARTBEAT_TIMEOUT_S": "60", "VQ_PRESENCE_WINDOW_S": "119"})


@pytest.mark.parametrize("path", ["/virtual-queues/limited-drop/07/line", "/virtual-queues/no-such-type/39/line"])
def test_a_malformed_target_on_line_is_a_4xx_that_no_cache_keeps(api, path):
    refused = api.http.get(path)
    assert refused.status_code in (400, 404) and json.loads(refused.body)["code"] in (
        "INVALID_ARGUMENT",
        "UNKNOWN_TARGET_TYPE",
    )
    assert refused.headers["Cache-Control"] == "no-store"


def test_an_unset_presence_window_widens_to_twice_a_long_heartbeat_timeout():
    assert (
        load_settings(
            {"VQ_HEARTBEAT_TIMEOUT_S": "600", "VQ_TOKEN_KEYS": '{"k1": "' + "s" * 32 + '"}'}
        ).presence_window_s
        == 1200
    )
