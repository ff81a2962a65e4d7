"""The fences that make a Redis failover's lost writes harmless (docs/failover.md#the-fences), against a real Redis:
a signed ticket restores a place the store lost, leaving and eviction stay final, a ticket of an earlier opening
serves no new entry, a token given back after its holder left stays refused, a restore keeps to maxActive, and the
pump fences a node that lost writes. The lost writes are made by hand here, as a promoted replica lacks them;
tests/test_failover_scenario.py makes them with a real primary and replica."""

import logging
import time

import pytest

from chalicelib import runtime
from chalicelib.errors import InvalidQueueTicket, NotInQueue, QueueBypassDenied
from chalicelib.pump import Pump
from chalicelib.store import FENCE_MARGIN_US
from chalicelib.target_config import TargetConfig
from chalicelib.targets import Target
from tests.support.buying import request_for
from tests.support.ticks import admit_through, wait_for_next_tick

DROP = Target("limited-drop", 42)


def lose(room, *users):
    """What a promoted replica that lagged lacks: these users' entries, as if they never reached it."""
    keys = room.store.keys(DROP)
    for user in users:
        room.store.client.zrem(keys.waiting, str(user))
        room.store.client.zrem(keys.heartbeat, str(user))


def enter_all(room, users):
    return {user: room.enter(DROP, str(user)).queue_ticket for user in users}


def seq_of(room, ticket):
    return room.signer.read_ticket(ticket).seq


# --- a signed ticket restores its place ---


def test_a_ticket_restores_a_lost_place_at_its_seq_with_its_position(room, client):
    tickets = enter_all(room, range(1, 5))
    lose(room, 2)
    back = room.status(DROP, "2", tickets[2])
    assert (back.status, back.ahead_count, back.position) == ("WAITING", 1, 2)
    assert client.zscore(room.store.keys(DROP).waiting, "2") == seq_of(room, tickets[2])
    # Those behind still have it ahead of them; the restore is counted for operators.
    assert room.status(DROP, "4", tickets[4]).position == 4
    assert room.stats(DROP)["restoredCount"] == 1
    # Admitted when the mark reaches it, like any place.
    admit_through(room.store, DROP, "2")
    assert room.status(DROP, "2", tickets[2]).status == "ADMITTED"


def test_a_lost_pre_queue_place_is_restored_to_the_pre_queue(room, client):
    room.configure(DROP, TargetConfig(opens_at_ms=int(time.time() * 1000) + 60_000))
    tickets = enter_all(room, (1, 2))
    client.zrem(room.store.keys(DROP).prequeue, "1")
    assert room.status(DROP, "1", tickets[1]).status == "PRE_QUEUE"
    assert client.zscore(room.store.keys(DROP).prequeue, "1") == seq_of(room, tickets[1])


def test_a_newcomer_after_a_restore_stands_behind_it_whatever_the_counter_says(room, client):
    tickets = enter_all(room, (1, 2))
    keys = room.store.keys(DROP)
    # A node that lacks user 2's entry and whose counter is behind: the clock fences the newcomer's seq.
    lose(room, 2)
    client.set(keys.seq, seq_of(room, tickets[1]))
    assert room.status(DROP, "2", tickets[2]).position == 2
    newcomer = room.enter(DROP, "3")
    assert seq_of(room, newcomer.queue_ticket) > seq_of(room, tickets[2]) and newcomer.position == 3


def test_leaving_stays_final(room):
    tickets = enter_all(room, (1, 2))
    room.leave(DROP, "1", tickets[1])
    with pytest.raises(NotInQueue):
        room.status(DROP, "1", tickets[1])
    # Entering again is a new entry at the back, and its own ticket restores it; the old one still does not.
    again = room.enter(DROP, "1").queue_ticket
    lose(room, 1)
    assert room.status(DROP, "1", again).position == 2
    with pytest.raises(InvalidQueueTicket):
        room.status(DROP, "1", tickets[1])


def test_leaving_a_place_the_store_lost_is_final_too(room):
    tickets = enter_all(room, (1, 2))
    lose(room, 1)
    room.leave(DROP, "1", tickets[1])
    with pytest.raises(NotInQueue):
        room.status(DROP, "1", tickets[1])


def test_eviction_stays_final(make_room, client):
    room = make_room(VQ_TICK_MS=60_000, VQ_BATCH_SIZE=1, VQ_HEARTBEAT_TIMEOUT_S=60)
    stale_room = make_room(VQ_TICK_MS=60_000, VQ_BATCH_SIZE=1, VQ_HEARTBEAT_TIMEOUT_S=60)
    stale_room.clock = lambda: time.time() - 120  # their last poll was two minutes ago
    stale = {user: stale_room.enter(DROP, str(user)).queue_ticket for user in (1, 2)}
    fresh = enter_all(room, (3,))
    assert Pump(room.store, room.settings).tick().targets[DROP].evicted == 2
    for user in (1, 2):
        with pytest.raises(NotInQueue):
            room.status(DROP, str(user), stale[user])
    assert room.status(DROP, "3", fresh[3]).status in ("WAITING", "ADMITTED")  # the tick's batch of one


def test_a_ticket_the_mark_passed_restores_nothing(room):
    # Admitted, collected and then gone (its token expired or bought): its turn is over.
    tickets = enter_all(room, (1, 2))
    admit_through(room.store, DROP, "1")
    assert room.status(DROP, "1", tickets[1]).status == "ADMITTED"
    room.store.client.delete(room.store.keys(DROP).token("1"))  # the token expired
    with pytest.raises(NotInQueue):
        room.status(DROP, "1", tickets[1])


def test_a_ticket_of_an_earlier_line_restores_nothing(room, signer):
    room.enter(DROP, "1")
    # Genuine, but from before this line began (its keys had expired): below the new line's mark.
    old = signer.issue_ticket(DROP, "5", 1_000_000, 1).text
    with pytest.raises(NotInQueue):
        room.status(DROP, "5", old)


def opening(room, client, users):
    """An opening: `users` pre-queue for it, then it is brought forward to now and the pump opens the line."""
    room.configure(DROP, TargetConfig(opens_at_ms=int(time.time() * 1000) + 600_000))
    tickets = enter_all(room, users)
    assert {room.status(DROP, str(u), t).status for u, t in tickets.items()} == {"PRE_QUEUE"}
    opens_at_ms = int(time.time() * 1000)
    room.configure(DROP, TargetConfig(opens_at_ms=opens_at_ms))
    wait_for_next_tick(client, room.settings.tick_ms)
    Pump(room.store, room.settings).run(ticks=1)  # the opening
    draw = client.hgetall(room.store.keys(DROP).draw)
    assert (draw["state"], draw["opens_at_ms"]) == ("done", str(opens_at_ms))
    return tickets


@pytest.mark.slow
def test_a_ticket_of_an_earlier_opening_serves_no_new_entry(make_room, client):
    room = make_room(VQ_BATCH_SIZE=1)
    first = opening(room, client, (1, 2))
    room.leave(DROP, "1", first[1])
    # A second opening of the same target: user 1 pre-queues again, with a new ticket.
    second = opening(room, client, (1, 3))
    for call in (room.status, room.leave):
        with pytest.raises(InvalidQueueTicket):
            call(DROP, "1", first[1])
    assert room.status(DROP, "1", second[1]).status in ("WAITING", "ADMITTED")


@pytest.mark.slow
def test_a_pre_queue_ticket_restores_its_drawn_place_after_the_opening(make_room, client):
    room = make_room(VQ_BATCH_SIZE=1)
    tickets = opening(room, client, range(1, 6))
    line = client.zrange(room.store.keys(DROP).waiting, 0, -1, withscores=True)  # in the drawn order
    lose(room, *range(1, 6))
    # A pre-queue ticket names the seq drawn as its holder entered, which is their place in line: a lost place
    # comes back where it was ...
    for user, seq in line[1:]:
        assert room.status(DROP, user, tickets[int(user)]).status == "WAITING"
        assert client.zscore(room.store.keys(DROP).waiting, user) == seq
    assert [room.status(DROP, user, tickets[int(user)]).position for user, _ in line[1:]] == [1, 2, 3, 4]
    # ... but not the first, whom the opening's tick admitted: the mark passed it.
    with pytest.raises(NotInQueue):
        room.status(DROP, line[0][0], tickets[int(line[0][0])])


# --- a token given back ---


@pytest.fixture
def gate(origin):
    return runtime.purchase_gate()


def admitted_token(room, user, ticket):
    admit_through(room.store, DROP, user)
    return room.status(DROP, user, ticket).entry_token


def test_a_token_given_back_after_its_holder_left_stays_refused(room, gate, origin):
    ticket = enter_all(room, (1,))[1]
    token = admitted_token(room, "1", ticket)
    consumed = room.store.consume(token, "purchase", int(time.time() * 1000))
    assert consumed == "FIRST"
    room.leave(DROP, "1", ticket)  # while the purchase is under way
    assert room.store.restore(token, "purchase") is False
    with pytest.raises(QueueBypassDenied):
        gate.purchase(request_for(token, DROP, token.user_id))
    assert origin.requests == []
    assert room.stats(DROP)["activeCount"] == 0


def test_a_purchase_of_unknown_outcome_is_sent_again_under_its_key_after_its_holder_left(room, gate, origin):
    ticket = enter_all(room, (1,))[1]
    token = admitted_token(room, "1", ticket)
    origin.answers = [(500, {"error": "boom"}, {"commit": True})]
    assert gate.purchase(request_for(token, DROP, token.user_id)).status == 500
    room.leave(DROP, "1", ticket)
    assert gate.purchase(request_for(token, DROP, token.user_id)).status == 201  # the shop answers the order it took
    assert origin.orders_per_key() == {token.token_id: 1}


def test_a_restore_never_lifts_the_active_count_past_max_active(room, gate, origin):
    room.configure(DROP, TargetConfig(max_active=1))
    tickets = enter_all(room, (1, 2))
    token = admitted_token(room, "1", tickets[1])
    assert room.store.consume(token, "purchase", int(time.time() * 1000)) == "FIRST"
    # While the purchase is under way, its slot goes to user 2 (the pump admits up to the cap).
    admit_through(room.store, DROP, "2")
    assert room.stats(DROP)["activeCount"] == 1
    assert room.store.restore(token, "purchase") is False  # the shop did not take it, but the room is full
    assert room.stats(DROP)["activeCount"] == 1
    # With room, a token is given back as before.
    room.leave(DROP, "2", tickets[2])
    other = enter_all(room, (3,))[3]
    token_3 = admitted_token(room, "3", other)
    assert room.store.consume(token_3, "purchase-3", int(time.time() * 1000)) == "FIRST"
    assert room.store.restore(token_3, "purchase-3") is True
    assert room.stats(DROP)["activeCount"] == 1


# --- the pump fences a failover ---


def test_the_pump_fences_a_node_that_lost_writes(make_room, client, caplog):
    tick_ms = 200
    room = make_room(VQ_TICK_MS=tick_ms, VQ_BATCH_SIZE=2, VQ_HEARTBEAT_TIMEOUT_S=60)
    keys = room.store.keys(DROP)
    pump = Pump(room.store, room.settings)
    tickets = enter_all(room, range(1, 5))
    wait_for_next_tick(client, tick_ms)
    pump.tick()  # admits users 1 and 2
    # What the promoted replica will hold: everything up to here.
    node = {key: client.dump(key) for key in (keys.tick, keys.mark, keys.seq, keys.waiting, keys.heartbeat)}
    node_tick, node_mark = int(client.get(keys.tick)), int(client.get(keys.mark))
    tickets |= enter_all(room, (5, 6))
    for _ in range(2):
        wait_for_next_tick(client, tick_ms)
        pump.tick()  # admits users 3 and 4, then 5 and 6
    tickets |= enter_all(room, (7,))
    seen_tick, seen_mark = int(client.get(keys.tick)), int(client.get(keys.mark))
    assert seen_mark == seq_of(room, tickets[6])

    # The failover: the node lacks the last two ticks, their admissions, and users 5 to 7's entries.
    for key, value in node.items():
        client.restore(key, 0, value, replace=True)
    caplog.set_level(logging.WARNING)
    result = pump.tick().targets[DROP]
    seconds, micros = client.time()
    now_us = seconds * 1_000_000 + micros
    # Tick and mark are back to what the pump had applied, the seq above the clock, and the range recorded: from
    # the node's last tick (what came before it reached the node) to the raised seq.
    assert int(client.get(keys.mark)) == seen_mark and int(client.get(keys.tick)) >= seen_tick
    assert result.fenced == (max(node_tick * 1000, node_mark), int(client.get(keys.seq)))
    lost_from, lost_to = result.fenced
    assert lost_from < seq_of(room, tickets[5]) and now_us < lost_to <= now_us + FENCE_MARGIN_US
    stats = room.stats(DROP)
    assert stats["failovers"] == {"fenced": 1, "lostSeqsFrom": lost_from, "lostSeqsTo": lost_to}
    assert any("failover fenced" in r.getMessage() for r in caplog.records)

    # Users admitted before the failover are admitted, those whose entry was lost too (from their ticket); a user
    # who entered last is back in line; a newcomer stands behind everyone acknowledged before the failover.
    for user in (3, 4, 5, 6):
        assert room.status(DROP, str(user), tickets[user]).status == "ADMITTED"
    assert room.status(DROP, "7", tickets[7]).status in ("WAITING", "ADMITTED")
    newcomer = room.enter(DROP, "8")
    assert seq_of(room, newcomer.queue_ticket) > lost_to
    # Admitted again once only: once the restored token is gone, the same ticket restores nothing more.
    client.delete(keys.token("5"))
    with pytest.raises(NotInQueue):
        room.status(DROP, "5", tickets[5])


def test_places_restored_admitted_past_the_batch_take_the_pumps_next_slots(make_room, client):
    tick_ms = 300
    room = make_room(VQ_TICK_MS=tick_ms, VQ_BATCH_SIZE=2, VQ_HEARTBEAT_TIMEOUT_S=60)
    keys = room.store.keys(DROP)
    pump = Pump(room.store, room.settings)
    tickets = enter_all(room, range(1, 5))
    wait_for_next_tick(client, tick_ms)
    pump.tick()  # admits users 1 and 2
    node = {key: client.dump(key) for key in (keys.tick, keys.mark, keys.seq, keys.waiting, keys.heartbeat)}
    tickets |= enter_all(room, range(5, 9))
    wait_for_next_tick(client, tick_ms)
    pump.tick()  # admits users 3 and 4: the mark the old primary reached
    # The failover: the node lacks the last tick and users 5 to 8's entries, whose holders have not polled since.
    for key, value in node.items():
        client.restore(key, 0, value, replace=True)
    tickets |= enter_all(room, (9,))
    wait_for_next_tick(client, tick_ms)
    assert pump.tick().targets[DROP].fenced is not None
    # The mark passed the lost seqs to reach the newcomer: their tickets are restored admitted, four beyond the batch.
    assert room.status(DROP, "9", tickets[9]).status == "ADMITTED"
    for user in range(5, 9):
        assert room.status(DROP, str(user), tickets[user]).status == "ADMITTED"
    # They took the next two ticks' slots: the line behind them waits, then goes on at the batch.
    tickets |= enter_all(room, range(10, 13))
    for _ in range(2):
        wait_for_next_tick(client, tick_ms)
        assert pump.tick().targets[DROP].admitted == 0
    wait_for_next_tick(client, tick_ms)
    assert pump.tick().targets[DROP].admitted == 2
    assert [room.status(DROP, str(user), tickets[user]).status for user in (10, 11, 12)] == [
        "ADMITTED",
        "ADMITTED",
        "WAITING",
    ]


def test_a_pump_that_saw_nothing_lost_fences_nothing(make_room, client):
    tick_ms = 200
    room = make_room(VQ_TICK_MS=tick_ms, VQ_BATCH_SIZE=2)
    enter_all(room, range(1, 6))
    pump = Pump(room.store, room.settings)
    for _ in range(3):
        wait_for_next_tick(client, tick_ms)
        assert pump.tick().targets[DROP].fenced is None
    assert room.stats(DROP)["failovers"] == {"fenced": 0}


def test_a_node_that_lost_everything_restores_no_admitted_place(make_room, client):
    tick_ms = 200
    room = make_room(VQ_TICK_MS=tick_ms, VQ_BATCH_SIZE=2)
    keys = room.store.keys(DROP)
    tickets = enter_all(room, range(1, 5))
    pump = Pump(room.store, room.settings)
    wait_for_next_tick(client, tick_ms)
    pump.tick()  # admits users 1 and 2
    # An empty node (a restart without its data): only the operator's configuration is back.
    client.delete(
        keys.waiting, keys.heartbeat, keys.seq, keys.mark, keys.tick, keys.stats, keys.admissions, keys.pace, keys.fence
    )
    wait_for_next_tick(client, tick_ms)
    assert pump.tick().targets[DROP].fenced is not None
    # Nothing bounds what it lost: an admitted user's ticket is not admitted again; a waiting one's place comes back.
    with pytest.raises(NotInQueue):
        room.status(DROP, "1", tickets[1])
    assert room.status(DROP, "4", tickets[4]).status in ("WAITING", "ADMITTED")
