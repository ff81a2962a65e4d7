"""Per-target configuration at run time, the scheduled opening with its fair draw, and the max-active cap."""

import hashlib
import hmac
import itertools
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from chalicelib.errors import NotInQueue, QueueClosed
from chalicelib.opening import draw_order, drawn_seq
from chalicelib.pump import Pump
from chalicelib.target_config import TargetConfig, parse_config
from chalicelib.targets import Target

DROP = Target("limited-drop", 42)
CONFIG = "/virtual-queues/limited-drop/42/config"


def iso(epoch_s):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch_s)) + f".{int(epoch_s * 1000) % 1000:03d}Z"


def put(api, body):
    raw = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return api.http.put(CONFIG, headers={"Content-Type": "application/json"}, body=raw)


def wait_for_next_tick(client, tick_ms):
    seconds, micros = client.time()
    time.sleep((tick_ms - (seconds * 1000 + micros // 1000) % tick_ms + 5) / 1000)


# --- configuration over HTTP ---


def test_put_then_get_gives_the_own_and_the_effective_configuration(api):
    answer = put(api, {"batch": 7, "tickMs": 500, "opensAt": "2030-01-01T10:00:00+01:00"})
    assert answer.status_code == 200
    got = api.http.get(CONFIG).json_body
    assert got["config"] == {"batch": 7, "tickMs": 500, "opensAt": "2030-01-01T09:00:00.000Z"}
    assert got["effective"] == {
        "batch": 7,
        "tickMs": 500,
        "maxWaiting": 100_000,
        "opensAt": "2030-01-01T09:00:00.000Z",
        "paused": False,
        "soldOut": False,
        "inviteOnly": False,
        "safetyNet": False,
    }
    # PUT replaces: fields left out fall back to the global defaults.
    put(api, {"maxActive": 3})
    assert api.http.get(CONFIG).json_body["effective"] == {
        "batch": 100,
        "tickMs": 2000,
        "maxWaiting": 100_000,
        "maxActive": 3,
        "paused": False,
        "soldOut": False,
        "inviteOnly": False,
        "safetyNet": False,
    }


def test_answers_are_utf8_json_with_the_display_name_as_set(api):
    shown = {"displayName": "한정판 “Air” 90 \\ ✓", "imageUrl": "https://img.example/a.png?w=200&h=200"}
    assert put(api, shown).status_code == 200
    answer = api.http.get(CONFIG)
    assert answer.headers["Content-Type"] == "application/json"
    assert json.loads(answer.body.decode("utf-8"))["config"] == shown


BAD_BODIES = [
    {"batch": -1},
    {"batch": 0},
    {"batch": 10**9},
    {"batch": "5"},
    {"batch": 5.0},
    {"batch": True},
    {"batch": None},
    {"tickMs": 99},
    {"tickMs": 60_001},
    {"maxWaiting": 0},
    {"maxWaiting": [1]},
    {"maxActive": -5},
    {"maxActive": 1e3},
    {"shards": 0},
    {"shards": 65},
    {"shards": "3"},
    {"shards": 2, "safetyNet": True},  # a sharded line has no single front to pass through (docs/sharding.md)
    {"opensAt": "2026-12-01"},
    {"opensAt": "2026-12-01T11:00:00"},
    {"opensAt": "tomorrow"},
    {"opensAt": 1_800_000_000},
    {"opensAt": "2026-13-01T00:00:00Z"},
    {"opensAt": "2026-12-01 11:00:00Z"},
    {"opensAt": "1999-12-31T23:59:59Z"},
    {"opensAt": "２０２６-12-01T11:00:00Z"},
    {"opensAt": "2030-01-01T00:00:00Z", "closesAt": "2030-01-01T00:00:00Z"},
    {"opensAt": "2030-01-02T00:00:00Z", "closesAt": "2030-01-01T00:00:00Z"},
    {"batch": 5, "colour": "red"},
    [],
    "[1]",
    "not json",
    "",
    "{" * 5000,
    b"\xff\xfe",
]


@pytest.mark.parametrize("body", BAD_BODIES, ids=[str(i) for i in range(len(BAD_BODIES))])
def test_bad_configuration_is_400_and_the_old_one_stays(api, body):
    assert put(api, {"batch": 9, "maxWaiting": 50}).status_code == 200
    answer = put(api, body)
    assert answer.status_code == 400, answer.body
    assert answer.json_body["code"] == "INVALID_ARGUMENT"
    assert api.http.get(CONFIG).json_body["config"] == {"batch": 9, "maxWaiting": 50}


def test_configuration_routes_check_the_target(api):
    assert api.http.get("/virtual-queues/nope/42/config").status_code == 404
    assert put(api, {}).status_code == 200
    assert (
        api.http.put(
            "/virtual-queues/limited-drop/0/config", body="{}", headers={"Content-Type": "application/json"}
        ).status_code
        == 400
    )


def test_parse_config_reads_times_to_the_millisecond():
    config = parse_config(b'{"opensAt": "2030-01-01T00:00:00.250Z", "closesAt": "2030-01-01T01:00:00-02:00"}')
    assert config == TargetConfig(opens_at_ms=1_893_456_000_250, closes_at_ms=1_893_466_800_000)


# --- configuration in force ---


def test_own_capacity_applies_instead_of_the_global_one(room):
    room.configure(DROP, TargetConfig(max_waiting=2))
    room.enter(DROP, "1")
    room.enter(DROP, "2")
    with pytest.raises(Exception) as full:
        room.enter(DROP, "3")
    assert full.value.code == "QUEUE_FULL"
    assert room.enter(Target("limited-drop", 43), "3").status == "WAITING"  # other targets keep the default


def test_a_configuration_change_takes_effect_on_the_next_tick_with_pumps_running(make_room):
    room = make_room(VQ_TICK_MS=100, VQ_BATCH_SIZE=2)
    for user in range(1, 2001):
        room.store.client.zadd(room.store.keys(DROP).waiting, {str(user): user})
    room.store.client.set(room.store.keys(DROP).seq, 2000)
    room.store.client.zadd(room.store.global_keys.targets, {str(DROP): 1})
    stop = threading.Event()

    def pump():
        p = Pump(room.store.__class__(room.store.client, room.store.prefix), room.settings)
        while not stop.is_set():
            p.run(ticks=1)
            time.sleep(0.02)

    pumps = [threading.Thread(target=pump) for _ in range(3)]
    for thread in pumps:
        thread.start()
    try:
        time.sleep(0.5)
        room.configure(DROP, TargetConfig(batch=7))
        changed_at = room.store.client.time()
        time.sleep(0.6)
    finally:
        stop.set()
        for thread in pumps:
            thread.join()
    # From the admissions log: each tick before the change admitted 2, each from the next tick on, 7.
    log = [entry.split(":") for entry in room.store.client.lrange(room.store.keys(DROP).admissions, 0, -1)]
    change_ms = changed_at[0] * 1000 + changed_at[1] // 1000
    per_tick = sorted((int(start), int(admitted) // int(covered)) for start, admitted, covered in log)
    before = {n for start, n in per_tick if start + 100 <= change_ms}
    after = [n for start, n in per_tick if start >= change_ms + 100]
    assert before == {2}
    assert after and set(after) == {7}


def test_stats_report_the_configuration_beside_the_live_figures(room):
    room.configure(DROP, TargetConfig(batch=3, max_active=9))
    room.enter(DROP, "1")
    stats = room.stats(DROP)
    assert stats["config"] == {
        "batch": 3,
        "tickMs": 2000,
        "maxWaiting": 100_000,
        "maxActive": 9,
        "paused": False,
        "soldOut": False,
        "inviteOnly": False,
        "safetyNet": False,
    }
    assert stats["waitingCount"] == 1 and stats["activeCount"] == 0 and stats["preQueuedCount"] == 0


def test_pump_gauges_carry_the_configuration(room, capsys):
    room.configure(DROP, TargetConfig(batch=4, tick_ms=500, max_active=6))
    room.enter(DROP, "1")
    Pump(room.store, room.settings).tick()
    line = next(json.loads(line) for line in capsys.readouterr().out.splitlines() if '"ConfiguredRatePerSec"' in line)
    assert line["target"] == str(DROP)
    assert (line["ConfiguredRatePerSec"], line["Capacity"], line["MaxActive"]) == ([8.0], [100_000], [6])


def test_closed_queue_refuses_newcomers_but_keeps_its_line(room, api):
    ticket = room.enter(DROP, "1").queue_ticket
    room.configure(DROP, TargetConfig(closes_at_ms=int(time.time() * 1000) - 1))
    with pytest.raises(QueueClosed):
        room.enter(DROP, "2")
    assert room.enter(DROP, "1").status == "WAITING"
    assert room.status(DROP, "1", ticket).position == 1
    answer = api.http.post("/virtual-queues/limited-drop/42/entries", headers={"X-User-Id": "3"})
    assert answer.status_code == 409 and answer.json_body["code"] == "QUEUE_CLOSED"


# --- scheduled opening ---


BLOCK = (1_790_000_000_000_000, 1_790_000_600_000_000)  # ten minutes of seqs, as a pre-queue's block might be


def test_the_draw_is_uniform_over_orders():
    """Chi-square over all 24 orders of a 4-user pre-queue, from 12,000 draws with independent seeds."""
    seeds = random.Random(20261129)
    counts = dict.fromkeys(itertools.permutations(["11", "22", "33", "44"]), 0)
    draws = 12_000
    for _ in range(draws):
        order = draw_order(seeds.randbytes(32).hex(), ["11", "22", "33", "44"], *BLOCK)
        assert all(BLOCK[0] <= seq <= BLOCK[1] for _, seq in order)
        counts[tuple(user for user, _ in order)] += 1
    expected = draws / 24
    chi_square = sum((seen - expected) ** 2 / expected for seen in counts.values())
    assert chi_square < 49.73  # 23 degrees of freedom, p = 0.001
    assert min(counts.values()) > 0


def test_the_draw_is_checkable_from_its_seed():
    seed = bytes(range(32)).hex()
    digests = {user: hmac.new(seed.encode(), user.encode(), hashlib.sha1).hexdigest() for user in "789"}
    # The seq is the HMAC's first 52 bits as a fraction of the block: over a block of 2**52 seqs, those bits.
    assert [drawn_seq(seed, user, 0, 2**52 - 1) for user in "789"] == [int(digests[u][:13], 16) for u in "789"]
    order = draw_order(seed, "789", *BLOCK)
    assert [user for user, _ in order] == sorted("789", key=digests.get)
    # Equal seqs (a block narrower than the pre-queue) stand in user id order, as Redis sorts them.
    assert [user for user, _ in draw_order(seed, ["b", "a", "c"], 5, 5)] == ["a", "b", "c"]


@pytest.mark.slow
def test_pre_queue_opens_in_a_fair_draw_ahead_of_everyone_after_opening(make_room, client):
    room = make_room(VQ_TICK_MS=100, VQ_BATCH_SIZE=5)
    opens_at = time.time() + 3.0  # room for the entries below on a slow machine
    room.configure(DROP, TargetConfig(opens_at_ms=int(opens_at * 1000)))
    early = {user: room.enter(DROP, str(user)) for user in range(100, 130)}
    assert {entry.status for entry in early.values()} == {"PRE_QUEUE"}
    body = early[100].to_body()
    assert body["opensAt"] == iso(int(opens_at * 1000) / 1000) and body["queueTicket"] and "position" not in body
    assert room.enter(DROP, "100").queue_ticket is None  # re-entering keeps the pre-queue place, no new ticket
    assert room.status(DROP, "101", early[101].queue_ticket).status == "PRE_QUEUE"
    room.leave(DROP, "129", early[129].queue_ticket)  # a change of mind before opening

    pump = Pump(room.store, room.settings)
    pump.run(ticks=1)
    assert room.stats(DROP)["preQueuedCount"] == 29  # nothing happens before the opening
    time.sleep(max(0, opens_at - time.time()) + 0.05)
    late = [room.enter(DROP, str(user)) for user in (1, 2, 3)]  # after the opening, before the pump's tick
    assert {entry.status for entry in late} == {"WAITING"}
    pump.run(ticks=1)  # the first tick after the opening opens the line and admits its first batch

    line = client.zrange(room.store.keys(DROP).waiting, 0, -1, withscores=True)
    stats = room.stats(DROP)
    assert stats["admittedCount"] == 5 and stats["preQueuedCount"] == 0
    draw = stats["openingDraw"]
    assert draw["placed"] == 29
    # Everyone from the pre-queue stands at the seq their ticket named when they entered, which is the place the
    # revealed seed gives them, in the order it gives ...
    tickets = {str(u): room.signer.read_ticket(entry.queue_ticket).seq for u, entry in early.items() if u != 129}
    expected = draw_order(draw["seed"], tickets, draw["firstSeq"], draw["lastSeq"])
    assert [(user, int(seq)) for user, seq in line[:29]] == expected
    assert dict(expected) == tickets
    # ... all ahead of everyone who entered after the opening.
    assert [user for user, _ in line[29:]] == ["1", "2", "3"]
    first_five = [int(user) for user, _ in expected[:5]]
    assert {room.status(DROP, str(u), early[u].queue_ticket).status for u in first_five} == {"ADMITTED"}


def commitment_of(seed):
    return hashlib.sha256(seed.encode("utf-8")).hexdigest()


@pytest.mark.slow
def test_the_opening_seed_is_committed_when_configured_and_revealed_by_the_draw(make_room, api, client):
    room = make_room(VQ_TICK_MS=100, VQ_BATCH_SIZE=5)
    assert put(api, {"opensAt": iso(time.time() + 3600)}).status_code == 200
    published = api.http.get(CONFIG.replace("config", "stats")).json_body["openingDraw"]
    commitment = published["commitment"]
    assert published == {"commitment": commitment} and len(commitment) == 64
    assert commitment == commitment.lower() and int(commitment, 16) >= 0
    # Moving the opening (a PUT or a PATCH) keeps the commitment: the seed cannot be drawn again.
    opens_at = time.time() + 3.0
    assert put(api, {"opensAt": iso(opens_at), "batch": 5}).status_code == 200
    patched = api.http.patch(
        CONFIG, headers={"Content-Type": "application/merge-patch+json"}, body=json.dumps({"tickMs": 100})
    )
    assert patched.status_code == 200
    assert room.stats(DROP)["openingDraw"] == {"commitment": commitment}
    # No API answer shows the seed before the opening: not the config, the stats, the page nor an entry.
    seed = client.hget(room.store.keys(DROP).config, "draw_seed")
    assert commitment_of(seed) == commitment
    entries = {user: room.enter(DROP, str(user)) for user in range(100, 120)}
    answers = [
        api.http.get(CONFIG).body,
        api.http.get(CONFIG.replace("config", "stats")).body,
        api.http.get("/waiting-room/limited-drop/42").body,
        json.dumps([entry.to_body() for entry in entries.values()]).encode(),
    ]
    assert not any(seed.encode() in answer for answer in answers)
    assert commitment.encode() in answers[2]  # the page's fair-order note carries the commitment

    time.sleep(max(0, opens_at - time.time()) + 0.05)
    Pump(room.store, room.settings).run(ticks=1)  # the opening
    revealed = room.stats(DROP)["openingDraw"]
    assert revealed["seed"] == seed and revealed["commitment"] == commitment and revealed["placed"] == 20
    # Anyone can check the seed against the commitment, and recompute every place in line from it.
    line = client.zrange(room.store.keys(DROP).waiting, 0, -1, withscores=True)
    block = revealed["firstSeq"], revealed["lastSeq"]
    assert draw_order(revealed["seed"], map(str, entries), *block) == [(user, int(seq)) for user, seq in line]
    # The seed is used once: the next new opening commits to another.
    assert put(api, {"opensAt": iso(time.time() + 3600)}).status_code == 200
    assert room.stats(DROP)["openingDraw"]["commitment"] not in (commitment, None)


def test_no_api_sets_or_reads_the_opening_seed(api, client, room):
    assert put(api, {"opensAt": iso(time.time() + 3600)}).status_code == 200
    commitment = room.stats(DROP)["openingDraw"]["commitment"]
    for field in ("seed", "drawSeed", "openingSeed", "commitment", "openingDraw"):
        assert put(api, {"opensAt": iso(time.time() + 3600), field: "00" * 32}).status_code == 400
        patched = api.http.patch(
            CONFIG, headers={"Content-Type": "application/merge-patch+json"}, body=json.dumps({field: "00" * 32})
        )
        assert patched.status_code == 400
    assert room.stats(DROP)["openingDraw"] == {"commitment": commitment}
    assert commitment_of(client.hget(room.store.keys(DROP).config, "draw_seed")) == commitment
    # The seed is not the operator's: it is left out of the configuration's version, so writing it by hand into
    # Redis would not even show in an ETag, and no route names it.
    from app import app

    assert not any("seed" in path or "draw" in path for path in app.routes)


def test_pre_queue_counts_against_capacity(room):
    room.configure(DROP, TargetConfig(max_waiting=2, opens_at_ms=int(time.time() * 1000) + 60_000))
    room.enter(DROP, "1")
    room.enter(DROP, "2")
    with pytest.raises(Exception) as full:
        room.enter(DROP, "3")
    assert full.value.code == "QUEUE_FULL"


def test_an_opening_configured_before_seeds_were_committed_keeps_arrival_order(room, client):
    keys = room.store.keys(DROP)
    opens_at_ms = int(time.time() * 1000) + 60_000
    room.configure(DROP, TargetConfig(opens_at_ms=opens_at_ms))
    client.hdel(keys.config, "draw_seed", "draw_commitment")  # as a target configured before seeds were committed
    tickets = {user: room.enter(DROP, user).queue_ticket for user in ("c", "a", "b")}
    seqs = [room.signer.read_ticket(tickets[user]).seq for user in ("c", "a", "b")]
    assert seqs == sorted(seqs)  # arrival numbers, from the line's counter
    room.configure(DROP, TargetConfig(opens_at_ms=int(time.time() * 1000)))
    client.hdel(keys.config, "draw_seed", "draw_commitment")
    wait_for_next_tick(client, room.settings.tick_ms)
    Pump(room.store, room.settings).run(ticks=1)
    assert client.zrange(keys.waiting, 0, -1) == ["c", "a", "b"]
    opened = room.stats(DROP)["openingDraw"]
    assert opened["placed"] == 3 and not {"seed", "commitment", "firstSeq"} & set(opened)


def test_a_pre_queued_heartbeat_is_the_opening_and_one_silent_past_it_is_evicted(room, client):
    keys = room.store.keys(DROP)
    opens_at_ms = int(time.time() * 1000) + 60_000
    room.configure(DROP, TargetConfig(opens_at_ms=opens_at_ms))
    tickets = {user: room.enter(DROP, user).queue_ticket for user in ("1", "2")}
    assert client.zmscore(keys.heartbeat, ["1", "2"]) == [opens_at_ms, opens_at_ms]
    # The opening is put off: a pre-queued user's poll moves their heartbeat with it.
    later_ms = opens_at_ms + 60_000
    room.configure(DROP, TargetConfig(opens_at_ms=later_ms))
    assert room.status(DROP, "1", tickets["1"]).status == "PRE_QUEUE"
    assert client.zscore(keys.heartbeat, "1") == later_ms
    # User 2 never polled: once the opening they were told of is a heartbeat timeout past, they go.
    client.zadd(keys.heartbeat, {"2": int(time.time() * 1000) - room.settings.heartbeat_timeout_s * 1000 - 1})
    Pump(room.store, room.settings).run(ticks=1)
    assert client.zrange(keys.prequeue, 0, -1) == ["1"] and room.stats(DROP)["evictedCount"] == 1
    with pytest.raises(NotInQueue):
        room.status(DROP, "2", tickets["2"])  # eviction is final: the ticket restores nothing
    # An opening taken off the configuration leaves the pre-queue waiting, its polls answered.
    room.configure(DROP, TargetConfig())
    assert room.status(DROP, "1", tickets["1"]).status == "PRE_QUEUE"


def enter_many(room, users):
    """Enter every user (eight at a time, as concurrent requests would); their answers by user id."""
    with ThreadPoolExecutor(8) as pool:
        return dict(zip(map(str, users), pool.map(lambda user: room.enter(DROP, str(user)), users), strict=True))


def open_now(room, client, opens_at_ms):
    """Wait for the opening and for the next tick to begin, then run the pump's first tick after the opening."""
    time.sleep(max(0, opens_at_ms / 1000 - time.time()))
    wait_for_next_tick(client, room.settings.tick_ms)
    Pump(room.store, room.settings).run(ticks=1)


@pytest.mark.slow
def test_a_large_pre_queue_opens_with_its_first_batch_admitted_in_the_first_tick(make_room, client):
    room = make_room(VQ_TICK_MS=1000, VQ_BATCH_SIZE=50)
    room.configure(DROP, TargetConfig())
    already = enter_many(room, range(1, 4))  # a line waiting before the opening was set stays ahead of it
    opens_at_ms = int(time.time() * 1000) + 60_000
    room.configure(DROP, TargetConfig(opens_at_ms=opens_at_ms))
    early = enter_many(room, range(100, 20_100))
    assert {entry.status for entry in early.values()} == {"PRE_QUEUE"}
    opens_at_ms = int(time.time() * 1000) + 200
    room.configure(DROP, TargetConfig(opens_at_ms=opens_at_ms))  # opened early
    open_now(room, client, opens_at_ms)

    stats = room.stats(DROP)
    assert stats["admittedCount"] == 50 and stats["preQueuedCount"] == 0 and stats["waitingCount"] == 20_003 - 50
    draw = stats["openingDraw"]
    assert draw["placed"] == 20_000
    line = client.zrange(room.store.keys(DROP).waiting, 0, -1, withscores=True)
    assert {user for user, _ in line[:3]} == set(already)
    # The line is the draw anyone can recompute from the revealed seed, at the seqs the tickets named.
    expected = draw_order(draw["seed"], early, draw["firstSeq"], draw["lastSeq"])
    assert [(user, int(seq)) for user, seq in line[3:]] == expected
    assert all(room.signer.read_ticket(early[user].queue_ticket).seq == seq for user, seq in expected[:100])
    admitted = [user for user, _ in expected[:47]]
    assert {room.status(DROP, user, early[user].queue_ticket).status for user in admitted} == {"ADMITTED"}
    assert room.status(DROP, expected[47][0], early[expected[47][0]].queue_ticket).position == 1


@pytest.mark.slow
def test_an_opening_larger_than_a_tick_can_move_admits_nobody_until_the_line_is_whole(make_room, client):
    room = make_room(VQ_TICK_MS=200, VQ_BATCH_SIZE=10)
    room.configure(DROP, TargetConfig())
    enter_many(room, range(1, 5_002))  # one more than a tick moves (admit.lua's OPENING_MOVE)
    opens_at_ms = int(time.time() * 1000) + 60_000
    room.configure(DROP, TargetConfig(opens_at_ms=opens_at_ms))
    early = enter_many(room, range(10_000, 15_003))
    opens_at_ms = int(time.time() * 1000) + 200
    room.configure(DROP, TargetConfig(opens_at_ms=opens_at_ms))
    open_now(room, client, opens_at_ms)
    # The line moved 5,000 of its users into the pre-queue: one left to move, and nobody admitted meanwhile.
    stats = room.stats(DROP)
    assert (stats["admittedCount"], stats["waitingCount"], stats["preQueuedCount"]) == (0, 1, 10_003)
    assert "seed" not in stats["openingDraw"]
    assert room.enter(DROP, "new").status == "WAITING"  # a newcomer after the opening goes behind all of them
    wait_for_next_tick(client, room.settings.tick_ms)
    Pump(room.store, room.settings).run(ticks=1)
    stats = room.stats(DROP)
    assert (stats["admittedCount"], stats["preQueuedCount"], stats["openingDraw"]["placed"]) == (10, 0, 5_003)
    line = client.zrange(room.store.keys(DROP).waiting, 0, -1)
    draw = stats["openingDraw"]
    assert set(line[:5_001]) == {str(user) for user in range(1, 5_002)}
    assert line[5_001:-1] == [user for user, _ in draw_order(draw["seed"], early, draw["firstSeq"], draw["lastSeq"])]
    assert line[-1] == "new"


# --- max active ---


def live_active(room):
    return room.stats(DROP)["activeCount"]


@pytest.mark.slow
def test_max_active_caps_live_admitted_users_and_refills_as_tokens_are_used_or_expire(make_room):
    room = make_room(VQ_TICK_MS=100, VQ_BATCH_SIZE=10, VQ_TOKEN_TTL_S=3)
    room.configure(DROP, TargetConfig(max_active=5))
    tickets = {user: room.enter(DROP, str(user)).queue_ticket for user in range(1, 41)}
    pump = Pump(room.store, room.settings)

    pump.run(ticks=3)
    assert room.stats(DROP)["admittedCount"] == 5 and live_active(room) == 5
    tokens = [room.status(DROP, str(user), tickets[user]).entry_token for user in range(1, 6)]
    assert all(tokens)
    pump.run(ticks=2)
    assert room.stats(DROP)["admittedCount"] == 5  # collected but unused tokens still hold their room

    for token in tokens[:2]:
        assert room.store.consume(token, "purchase", int(time.time() * 1000))
    pump.run(ticks=2)
    assert room.stats(DROP)["admittedCount"] == 7 and live_active(room) == 5  # two bought: two more let in

    time.sleep(3.1)  # every token issued so far has expired
    for user in (6, 7):
        room.status(DROP, str(user), tickets[user])  # collect (fresh tokens, 3 s)
    pump.run(ticks=2)
    assert room.stats(DROP)["admittedCount"] == 10  # three expired tokens freed their room
    assert live_active(room) <= 5


@pytest.mark.slow
def test_max_active_holds_under_concurrent_pumps(make_room):
    room = make_room(VQ_TICK_MS=100, VQ_BATCH_SIZE=20)
    room.configure(DROP, TargetConfig(max_active=15))
    tickets = {user: room.enter(DROP, str(user)).queue_ticket for user in range(1, 201)}
    stop = threading.Event()
    seen = []

    def pump():
        p = Pump(room.store.__class__(room.store.client, room.store.prefix), room.settings)
        while not stop.is_set():
            p.run(ticks=1)

    def buyer():
        # Users collect their tokens and buy; the cap must hold at every moment regardless.
        while not stop.is_set():
            seen.append(live_active(room))
            for user, ticket in list(tickets.items())[:60]:
                entry = room.status(DROP, str(user), ticket)
                if entry.status == "ADMITTED" and random.random() < 0.5:
                    room.store.consume(entry.entry_token, "buy", int(time.time() * 1000))
            time.sleep(0.01)

    threads = [threading.Thread(target=pump) for _ in range(4)] + [threading.Thread(target=buyer)]
    for thread in threads:
        thread.start()
    time.sleep(2.0)
    stop.set()
    for thread in threads:
        thread.join()
    assert max(seen) <= 15 and max(seen) == 15
    assert room.stats(DROP)["admittedCount"] > 15  # it refilled as tokens were used
