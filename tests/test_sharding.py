"""One target's line over several sub-lines (docs/sharding.md), against a real Redis: each user's every call reaches
their own sub-line, a stale count of sub-lines never makes a second place, the configuration reaches every sub-line
with one seed and one pre-queue block, and what users and operators are told covers the whole line."""

import json
import math
import time
from collections import Counter

import pytest
from redis.crc import REDIS_CLUSTER_HASH_SLOTS as SLOTS
from redis.crc import key_slot

from chalicelib import opening, runtime, shop_health
from chalicelib.answers import Waiting
from chalicelib.config import load_settings
from chalicelib.errors import EntryTokenUsed, QueueSoldOut, ShardsInUse
from chalicelib.events import read_event
from chalicelib.purchase import PurchaseGate
from chalicelib.queue_keys import QueueKeys, shard_of, sub_line_tag
from chalicelib.store import QueueStore
from chalicelib.target_config import MAX_SHARDS, TargetConfig
from chalicelib.targets import Target
from chalicelib.tokens import TokenSigner
from tests.test_cluster import purchase

DROP = Target("limited-drop", 77)
USERS = [f"shopper-{n}" for n in range(60)]


def sharded(room, shards=3, **settings):
    room.configure(DROP, TargetConfig(shards=shards, **settings))


def sub_line_of(store, user, shards=3):
    return store.keys(DROP, shard_of(user, shards), shards)


def places(store, user, shards=3):
    """Every sub-line `user` holds a place on (in line or pre-queued), with its seq."""
    held = {}
    for shard in range(shards):
        k = store.keys(DROP, shard, shards)
        seq = store.client.zscore(k.waiting, user) or store.client.zscore(k.prequeue, user)
        if seq is not None:
            held[shard] = int(seq)
    return held


def held_anywhere(store, user, counts):
    """Every sub-line of a line of any of `counts` where `user` holds a place, by its keys' name, with its seq."""
    held = {}
    for shards in counts:
        for shard in range(shards):
            k = store.keys(DROP, shard, shards)
            seq = store.client.zscore(k.waiting, user) or store.client.zscore(k.prequeue, user)
            if seq is not None:
                held[k.base] = int(seq)
    return held


def admit(store, user, shards=3):
    """Move the mark of `user`'s sub-line past them, as the pump would."""
    k = sub_line_of(store, user, shards)
    store.client.set(k.mark, int(store.client.zscore(k.waiting, user)))


def test_each_sub_line_s_slot_lies_in_a_window_of_its_own_of_the_slot_space():
    # The N windows cut the slot space evenly, so on slots split evenly over N node groups (or a multiple of N)
    # each sub-line has a node group of its own.
    for shards in range(1, MAX_SHARDS + 1):
        for target in [Target("limited-drop", n) for n in range(4)] + [Target("ticketing-event", 987_654_321)]:
            windows = []
            for shard in range(shards):
                slot = key_slot(sub_line_tag(target, shard, shards).encode())
                window = (slot * shards) // SLOTS
                # Inside the window however an even split rounds its ends.
                assert shard == 0 or -(-window * SLOTS // shards) <= slot < (window + 1) * SLOTS // shards
                windows.append(window)
            assert windows == [(windows[0] + shard) % shards for shard in range(shards)]
            assert QueueKeys("vq", target, 0, shards).base == f"vq:{{{target}}}"


def test_a_user_entering_twice_has_one_place_on_their_own_sub_line(room):
    sharded(room)
    first = room.enter(DROP, "shopper-1")
    again = room.enter(DROP, "shopper-1")
    assert first.status == again.status == "WAITING"
    assert first.seq == again.seq
    assert places(room.store, "shopper-1") == {shard_of("shopper-1", 3): first.seq}


def test_users_spread_over_the_sub_lines(room):
    sharded(room)
    for user in USERS:
        assert room.enter(DROP, user).status == "WAITING"
    found = Counter()
    for user in USERS:
        held = places(room.store, user)
        assert list(held) == [shard_of(user, 3)]
        found[shard_of(user, 3)] += 1
    assert set(found) == {0, 1, 2} and sum(found.values()) == len(USERS)


def test_status_leave_and_purchase_reach_the_user_s_sub_line(room, origin, store, signer):
    sharded(room)
    # Users on a sub-line past the first: every call must find them there.
    user, other = [u for u in USERS if shard_of(u, 3) == 2][:2]
    tickets = {u: room.enter(DROP, u).queue_ticket for u in (user, other)}
    assert room.status(DROP, user, tickets[user]).status == "WAITING"
    room.leave(DROP, other, tickets[other])
    assert places(room.store, other) == {}
    assert room.stats(DROP)["leftCount"] == 1

    admit(room.store, user)
    admitted = room.status(DROP, user, tickets[user])
    assert admitted.status == "ADMITTED"
    assert room.store.client.get(sub_line_of(room.store, user).token(user)) is not None
    gate = PurchaseGate(room.store, signer, load_settings(), runtime.switch())
    origin.answers = [(503, {"error": "try again"})]
    assert purchase(gate, admitted.entry_token, DROP).status == 503  # used, then restored on the same sub-line
    assert purchase(gate, admitted.entry_token, DROP).status == 201
    with pytest.raises(EntryTokenUsed):
        purchase(gate, admitted.entry_token, DROP)
    token_id = admitted.entry_token.token_id
    assert room.store.client.exists(sub_line_of(room.store, user).consumed(token_id)) == 1
    assert room.store.client.exists(room.store.keys(DROP).consumed(token_id)) == 0
    assert room.stats(DROP)["ordersCount"] == 1


def test_a_stale_count_of_sub_lines_never_makes_a_second_place(room, client, prefix, origin, signer):
    # Containers that have not seen the target since it was sharded believe it has one sub-line.
    user = next(u for u in USERS if shard_of(u, 3) != 0)
    entering, polling, leaving = (QueueStore(client, prefix) for _ in range(3))
    sharded(room)
    room.store = entering
    assert entering.shard_count(DROP) == 1
    entry = room.enter(DROP, user)
    assert entry.status == "WAITING" and entering.shard_count(DROP) == 3
    assert places(entering, user) == {shard_of(user, 3): entry.seq}

    # A poll routed to sub-line 0 must not restore the ticket's place there: it routes again.
    room.store = polling
    assert room.status(DROP, user, entry.queue_ticket).seq == entry.seq
    assert places(polling, user) == {shard_of(user, 3): entry.seq}

    admit(polling, user)
    token = room.status(DROP, user, entry.queue_ticket).entry_token
    buying = QueueStore(client, prefix)
    gate = PurchaseGate(buying, signer, load_settings(), runtime.switch())
    assert purchase(gate, token, DROP).status == 201
    assert buying.shard_count(DROP) == 3

    other = next(u for u in USERS if shard_of(u, 3) != 0 and u != user)
    ticket = room.enter(DROP, other).queue_ticket
    room.store = leaving
    room.leave(DROP, other, ticket)
    assert places(leaving, other) == {} and leaving.shard_count(DROP) == 3


def test_a_container_that_believes_more_sub_lines_than_a_shrink_left_routes_again(room, client, prefix):
    sharded(room)
    believing_three = QueueStore(client, prefix)
    room.store, kept = believing_three, room.store
    room.leave(DROP, "warm-up", room.enter(DROP, "warm-up").queue_ticket)
    assert believing_three.shard_count(DROP) == 3
    room.store = kept
    sharded(room, shards=2)
    # The sub-line the shrink gave up keeps only the new count.
    assert client.hgetall(kept.keys(DROP, 2, 3).config) == {"shards": "2"}
    user = next(u for u in USERS if shard_of(u, 3) == 2)
    room.store = believing_three
    entry = room.enter(DROP, user)
    assert entry.status == "WAITING" and believing_three.shard_count(DROP) == 2
    assert held_anywhere(believing_three, user, (2, 3)) == {sub_line_of(kept, user, 2).base: entry.seq}


@pytest.mark.parametrize("holding", ["waiting", "pre-queued", "a live token"])
def test_changing_the_count_of_sub_lines_under_someone_is_refused_and_changes_nothing(room, holding):
    opens_at = int(time.time() * 1000) + 600_000 if holding == "pre-queued" else None
    sharded(room, opens_at_ms=opens_at)
    user = next(u for u in USERS if shard_of(u, 3) == 1)
    ticket = room.enter(DROP, user).queue_ticket
    if holding == "a live token":
        admit(room.store, user)
        assert room.status(DROP, user, ticket).status == "ADMITTED"
    before = [room.store.client.hgetall(room.store.keys(DROP, s, n).config) for n in (3, 4) for s in range(n)]
    etag = room.config(DROP).etag
    with pytest.raises(ShardsInUse) as refused:
        sharded(room, shards=4, opens_at_ms=opens_at)
    assert refused.value.status == 409 and refused.value.code == "SHARDS_IN_USE"
    assert [room.store.client.hgetall(room.store.keys(DROP, s, n).config) for n in (3, 4) for s in range(n)] == before
    assert room.config(DROP).etag == etag
    # The same count with other settings is no resize: it is written.
    sharded(room, batch=7, opens_at_ms=opens_at)
    assert all(room.store.client.hget(room.store.keys(DROP, s, 3).config, "batch") == "7" for s in range(3))


def test_every_sub_line_gets_the_configuration_one_seed_and_one_pre_queue_block(room):
    opens_at = int(time.time() * 1000) + 600_000
    sharded(room, opens_at_ms=opens_at, batch=5)
    configs = [room.store.client.hgetall(room.store.keys(DROP, shard, 3).config) for shard in range(3)]
    assert {c["batch"] for c in configs} == {"5"} and {c["shards"] for c in configs} == {"3"}
    assert len({(c["draw_seed"], c["draw_commitment"], c["draw_block"]) for c in configs}) == 1
    first, last = map(int, configs[0]["draw_block"].split())
    assert last == opens_at * 1000 - 1

    users = USERS[:30]
    for user in users:
        assert room.enter(DROP, user).status == "PRE_QUEUE"
    drawn = {user: next(iter(places(room.store, user).values())) for user in users}
    # Each place is the opening draw's, from the one seed over the one block, whichever sub-line holds it.
    seed = configs[0]["draw_seed"]
    assert drawn == {user: opening.drawn_seq(seed, user, first, last) for user in users}
    blocks = {tuple(room.store.client.hmget(room.store.keys(DROP, s, 3).draw, "first", "last")) for s in range(3)}
    assert blocks == {(str(first), str(last))}

    # Moving the opening keeps the seed and the block (the places drawn stand).
    sharded(room, opens_at_ms=opens_at + 60_000, batch=5)
    assert room.store.client.hget(room.store.keys(DROP, 2, 3).config, "draw_block") == configs[0]["draw_block"]


def test_the_stats_are_the_sums_of_the_sub_lines(room):
    sharded(room)
    tickets = {user: room.enter(DROP, user).queue_ticket for user in USERS[:20]}
    for user in USERS[:3]:
        room.leave(DROP, user, tickets[user])
    admitted = next(u for u in USERS[3:20] if shard_of(u, 3) == 1)
    admit(room.store, admitted)
    assert room.status(DROP, admitted, tickets[admitted]).status == "ADMITTED"
    stats = room.stats(DROP)
    client = room.store.client
    per_sub_line = [room.store.keys(DROP, shard, 3) for shard in range(3)]
    assert stats["waitingCount"] == sum(client.zcard(k.waiting) for k in per_sub_line) == 16
    assert stats["leftCount"] == sum(int(client.hget(k.stats, "left") or 0) for k in per_sub_line) == 3
    assert stats["activeCount"] == 1 and stats["waitsMeasured"] == 1
    assert stats["config"]["shards"] == 3


def test_ahead_scaled_to_the_whole_line_is_as_accurate_as_docs_sharding_md_says(room, settings):
    """A real line of 3000 users over 3 sub-lines: each newcomer is told N times the count ahead on their sub-line,
    which is the whole line's on average, within sqrt(A(N-1)) for A users truly ahead."""
    sharded(room)
    store, shards = room.store, 3
    terms = room.signer.grant_terms(DROP, "x", time.time(), 60)
    errors = []
    for truly_ahead in range(3000):
        user = f"line-{truly_ahead}"
        place = store.enter(DROP, user, int(time.time() * 1000), terms, room.defaults)
        assert isinstance(place, Waiting)
        local = store.client.zcount(sub_line_of(store, user).waiting, "-inf", f"({place.seq}")
        assert place.ahead == shards * local
        if truly_ahead >= 30:
            errors.append((place.ahead - truly_ahead) / math.sqrt(truly_ahead * (shards - 1)))
    # No newcomer is told a count further off than four standard deviations; over the line, the errors are of the
    # size the standard deviation says, and centred.
    assert max(abs(z) for z in errors) < 4
    rms = math.sqrt(sum(z * z for z in errors) / len(errors))
    assert 0.2 < rms < 2
    # The rate is scaled alike: with no measured rate, a sub-line's share of the configured one, N times over.
    assert place.rate == pytest.approx(settings.batch_size * 1000 / settings.tick_ms)


def test_the_flag_mark_and_a_shop_s_sold_out_reach_every_sub_line(room, store):
    sharded(room)
    assert store.publish_flag("v-sharded", {}) == 1  # one target, however many sub-lines
    assert [store.client.hget(store.keys(DROP, s, 3).config, "flag_version") for s in range(3)] == ["v-sharded"] * 3

    user = next(u for u in USERS if shard_of(u, 3) == 2)
    ticket = room.enter(DROP, user).queue_ticket
    admit(store, user)
    token = room.status(DROP, user, ticket).entry_token
    assert store.consume(token, "c1", int(time.time() * 1000)) == "FIRST"
    noted = store.observe_purchase(DROP, shop_health.Purchase(0, 5, True), False, True, token=token, status=409)
    assert noted == 2
    assert [store.client.hget(store.keys(DROP, s, 3).config, "sold_out") for s in range(3)] == ["1"] * 3
    with pytest.raises(QueueSoldOut):
        room.enter(DROP, next(u for u in USERS if shard_of(u, 3) == 0))


def test_every_sub_line_s_outbox_is_published_and_the_events_name_the_target(client, prefix):
    store = QueueStore(client, prefix, outbox_cap=100)
    now_ms = int(time.time() * 1000)
    store.configure(DROP, TargetConfig(shards=3), now_ms, fresh_seed=opening.new_seed())
    leaving = {shard: next(u for u in USERS if shard_of(u, 3) == shard) for shard in range(3)}
    signer_terms = TokenSigner(load_settings().keyring).grant_terms(DROP, "x", time.time(), 60)
    defaults = runtime.waiting_room().defaults
    for user in leaving.values():
        place = store.enter(DROP, user, now_ms, signer_terms, defaults)
        assert store.leave(DROP, user, place.seq, now_ms, defaults.idle_ttl_ms, defaults.tick_ms) is True

    entries, dropped = QueueStore(client, prefix).pending_events([DROP], 100)[DROP]
    kinds = Counter(fields["type"] for _, fields in entries)
    assert kinds == {"TargetConfigChanged": 1, "UserLeft": 3} and dropped == 0
    ids = [entry_id for entry_id, _ in entries]
    assert {entry_id.partition("#")[2] for entry_id in ids} == {"", "1", "2"}
    assert [read_event(DROP, entry_id, dict(fields)).target for entry_id, fields in entries] == [DROP] * 4

    QueueStore(client, prefix).events_published({DROP: ids}, {DROP: 0})
    assert [client.xlen(store.keys(DROP, s, 3).events) for s in range(3)] == [0, 0, 0]


def test_a_patch_of_shards_under_a_waiting_user_is_a_409_json_error_and_writes_nothing(api):
    config = "/virtual-queues/limited-drop/77/config"
    headers = {"Content-Type": "application/json"}
    assert api.http.put(config, headers=headers, body=json.dumps({"shards": 3, "batch": 4})).status_code == 200
    entered = api.http.post("/virtual-queues/limited-drop/77/entries", headers={"X-User-Id": "7"})
    assert json.loads(entered.body)["status"] == "WAITING"
    before = api.http.get(config)
    answer = api.http.patch(config, headers=headers, body=json.dumps({"shards": 2, "batch": 9}))
    assert answer.status_code == 409
    assert json.loads(answer.body)["code"] == "SHARDS_IN_USE"
    after = api.http.get(config)
    assert after.headers["ETag"] == before.headers["ETag"] and json.loads(after.body)["config"] == {
        "shards": 3,
        "batch": 4,
    }


def test_a_count_learnt_before_several_resizes_still_routes_to_the_user_s_sub_line(room, client, prefix):
    sharded(room, shards=5)
    believing_five = QueueStore(client, prefix)
    kept, room.store = room.store, believing_five
    room.leave(DROP, "warm-up", room.enter(DROP, "warm-up").queue_ticket)
    room.store = kept
    sharded(room, shards=2)
    sharded(room, shards=3)
    # Sub-line 4, given up by the shrink to 2, still says 2; the line has 3.
    assert client.hgetall(kept.keys(DROP, 4, 5).config) == {"shards": "2"}
    user = next(u for u in USERS if shard_of(u, 5) == 4 and shard_of(u, 2) != shard_of(u, 3))
    room.store = believing_five
    entry = room.enter(DROP, user)
    assert entry.status == "WAITING" and believing_five.shard_count(DROP) == 3
    assert held_anywhere(believing_five, user, (2, 3, 5)) == {sub_line_of(kept, user, 3).base: entry.seq}


def test_a_tag_a_resize_gave_up_names_a_count_a_later_resize_changed_and_sub_line_0_is_asked(room, client, prefix):
    sharded(room, shards=5)
    believing_five = QueueStore(client, prefix)
    kept, room.store = room.store, believing_five
    room.leave(DROP, "warm-up", room.enter(DROP, "warm-up").queue_ticket)
    room.store = kept
    sharded(room, shards=3)
    sharded(room, shards=2)
    # Sub-line 1 of 5, given up by the shrink to 3, still says 3: a line of 3 no longer holds anyone's place.
    assert client.hgetall(kept.keys(DROP, 1, 5).config) == {"shards": "3"}
    user = next(u for u in USERS if shard_of(u, 5) == 1)
    room.store = believing_five
    entry = room.enter(DROP, user)
    assert entry.status == "WAITING" and believing_five.shard_count(DROP) == 2
    assert held_anywhere(believing_five, user, (2, 3, 5)) == {sub_line_of(kept, user, 2).base: entry.seq}


def test_a_stale_count_that_reaches_a_tag_never_written_routes_again(room, client, prefix):
    # A tag past sub-line 0 depends on the count, so a stale count may reach one nothing wrote (here: the ones a
    # shrink gave up, their config lost): it reads as a line of 1, which must neither take a place nor say the
    # target is unknown.
    sharded(room, shards=5)
    entering, polling, leaving = (QueueStore(client, prefix) for _ in range(3))
    kept = room.store
    for believing in (entering, polling, leaving):
        room.store = believing
        room.leave(DROP, "warm-up", room.enter(DROP, "warm-up").queue_ticket)
        assert believing.shard_count(DROP) == 5
    room.store = kept
    sharded(room, shards=3)
    current = {kept.keys(DROP, shard, 3).base for shard in range(3)}
    for shard in range(1, 5):
        if kept.keys(DROP, shard, 5).base not in current:
            client.delete(kept.keys(DROP, shard, 5).config)
    user, other = [u for u in USERS if sub_line_of(kept, u, 5).base not in current][:2]
    room.store = entering
    tickets = {user: room.enter(DROP, user)}
    assert tickets[user].status == "WAITING" and entering.shard_count(DROP) == 3
    room.store = kept
    tickets[other] = room.enter(DROP, other)
    assert client.exists(*(sub_line_of(kept, u, 5).config for u in (user, other))) == 0

    room.store = polling
    assert room.status(DROP, user, tickets[user].queue_ticket).seq == tickets[user].seq
    assert held_anywhere(polling, user, (3, 5)) == {sub_line_of(kept, user, 3).base: tickets[user].seq}
    room.store = leaving
    room.leave(DROP, other, tickets[other].queue_ticket)
    assert held_anywhere(leaving, other, (3, 5)) == {} and leaving.shard_count(DROP) == 3


def test_the_opening_draw_in_the_stats_counts_the_places_of_every_sub_line(room):
    sharded(room)
    # As the opening leaves each sub-line's record (lua/admit.lua): one seed and block, each its own places.
    for shard, placed in enumerate((4, 5, 6)):
        room.store.client.hset(
            room.store.keys(DROP, shard, 3).draw,
            mapping={
                "state": "done",
                "seed": "s",
                "commitment": "c",
                "first": 10,
                "last": 20,
                "placed": placed,
                "drawn_at_ms": 1_796_000_000_000,
            },
        )
    drawn = room.stats(DROP)["openingDraw"]
    assert drawn["placed"] == 15 and (drawn["firstSeq"], drawn["lastSeq"]) == (10, 20)
