"""enter / status / leave against a real Redis: FIFO, capacity, admission by seq, tickets, tokens."""

import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest
from redis.connection import Connection
from redis.crc import key_slot

from chalicelib.errors import AlreadyAdmitted, InvalidQueueTicket, NotInQueue, QueueFull
from chalicelib.store import REGISTRATION_REFRESH_MS
from chalicelib.targets import Target
from tests.support.ticks import admit_through

DROP = Target("limited-drop", 42)
EVENT = Target("ticketing-event", 42)


def admit_up_to(room, target, user):
    """Move the admitted mark as the pump would, to `user`'s seq."""
    admit_through(room.store, target, user)


def test_concurrent_enters_give_each_user_one_seq_and_no_two_users_the_same(room):
    users = [user for user in range(1, 201) for _ in range(5)]
    seconds, micros = room.store.client.time()
    started_us = seconds * 1_000_000 + micros

    def enter(user):
        # The store's answer carries the seq itself; the room's answer carries the ticket naming it.
        place = room.store.enter(DROP, str(user), 1, room.signer.grant_terms(DROP, str(user), 0, 60), room.defaults)
        return user, place

    with ThreadPoolExecutor(max_workers=32) as pool:
        answers = list(pool.map(enter, users))

    seqs_seen = defaultdict(set)
    for user, place in answers:
        seqs_seen[user].add(place.seq)
    assert all(len(seqs) == 1 for seqs in seqs_seen.values())
    seqs = sorted(seqs.pop() for seqs in seqs_seen.values())
    assert len(set(seqs)) == 200
    # Never below the server clock in microseconds (the seq fence), and the counter holds the last one handed out.
    assert seqs[0] >= started_us and int(room.store.client.get(room.store.keys(DROP).seq)) == seqs[-1]
    assert sum(place.created for _, place in answers) == 200
    assert room.store.client.zcard(room.store.keys(DROP).waiting) == 200


def test_concurrent_enters_hand_out_exactly_one_ticket_per_user(room):
    users = [user for user in range(1, 51) for _ in range(4)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(lambda user: (user, room.enter(DROP, str(user))), users))
    tickets = defaultdict(list)
    for user, entry in answers:
        assert entry.status == "WAITING"
        if entry.queue_ticket:
            tickets[user].append(room.signer.read_ticket(entry.queue_ticket))
    waiting = dict(room.store.client.zrange(room.store.keys(DROP).waiting, 0, -1, withscores=True))
    for user in range(1, 51):
        assert len(tickets[user]) == 1
        assert tickets[user][0].seq == int(waiting[str(user)])


def test_reentry_is_idempotent_and_keeps_the_place(room):
    first = room.enter(DROP, "1")
    room.enter(DROP, "2")
    again = room.enter(DROP, "1")
    assert first.queue_ticket and again.queue_ticket is None
    assert (again.status, again.position, again.ahead_count) == ("WAITING", 1, 0)
    assert room.enter(DROP, "2").position == 2


def test_capacity_holds_under_concurrent_arrivals(make_room):
    room = make_room(VQ_MAX_WAITING=100)
    outcomes = []

    def arrive(user):
        try:
            room.enter(DROP, str(user))
            outcomes.append("accepted")
        except QueueFull as full:
            assert full.headers["Retry-After"].isdigit()
            outcomes.append("full")

    with ThreadPoolExecutor(max_workers=50) as pool:
        list(pool.map(arrive, range(1, 501)))
    assert outcomes.count("accepted") == 100
    assert outcomes.count("full") == 400
    assert room.store.client.zcard(room.store.keys(DROP).waiting) == 100


def test_a_user_already_in_line_is_not_refused_when_the_line_is_full(make_room):
    room = make_room(VQ_MAX_WAITING=2)
    room.enter(DROP, "1")
    room.enter(DROP, "2")
    with pytest.raises(QueueFull):
        room.enter(DROP, "3")
    assert room.enter(DROP, "1").position == 1


def test_admitted_users_free_their_capacity(make_room):
    room = make_room(VQ_MAX_WAITING=2)
    room.enter(DROP, "1")
    room.enter(DROP, "2")
    admit_up_to(room, DROP, 1)
    assert room.enter(DROP, "3").position == 2


def test_admission_is_judged_by_seq_not_rank(room):
    tickets = {user: room.enter(DROP, str(user)).queue_ticket for user in (1, 2, 3)}
    admit_up_to(room, DROP, 2)
    room.leave(DROP, "1", tickets[1])
    third = room.status(DROP, "3", tickets[3])
    assert third.status == "WAITING"
    assert (third.position, third.ahead_count) == (1, 0)  # user 2 is admitted, no longer ahead
    assert room.status(DROP, "2", tickets[2]).status == "ADMITTED"


def test_status_reports_place_and_eta_from_the_configured_rate(make_room):
    room = make_room(VQ_BATCH_SIZE=10, VQ_TICK_MS=2000)  # 5 admissions per second
    tickets = [room.enter(DROP, str(user)).queue_ticket for user in range(1, 23)]
    entry = room.status(DROP, "22", tickets[-1])
    assert (entry.status, entry.position, entry.ahead_count, entry.eta_seconds) == ("WAITING", 22, 21, 5)
    body = entry.to_body()
    # Asked back after half the 4.2 s wait, shortened by up to a quarter (chalicelib/polling.py).
    assert 1575 <= body.pop("pollAfterMs") <= 2100
    # The entry's place as /line places it (docs/api.md), as text: 16 digits.
    assert body.pop("seq") == str(room.store.client.zscore(room.store.keys(DROP).waiting, "22").__int__())
    # The range: around the 4.2 s, a quarter of the 2 s tick and the 0.5 s to the poll that tells of the turn
    # (5.2 s), by half a tick, half a poll and 5 % either side (1.76 s): 3.44 to 6.96 s (chalicelib/eta.py).
    assert body == {
        "status": "WAITING",
        "position": 22,
        "aheadCount": 21,
        "etaSeconds": 5,
        "etaLowSeconds": 3,
        "etaHighSeconds": 7,
        "paused": False,
    }


def test_admitted_user_gets_one_token_until_it_expires(make_room):
    clock = FakeClock(1_800_000_000.0)
    room = make_room(clock=clock, VQ_TOKEN_TTL_S=300)
    ticket = room.enter(DROP, "1").queue_ticket
    room.enter(DROP, "2")
    admit_up_to(room, DROP, 1)

    admitted = room.status(DROP, "1", ticket)
    assert admitted.status == "ADMITTED"
    token = admitted.entry_token
    assert token.grants(DROP, "1") and token.expires_at == 1_800_000_300
    assert admitted.to_body()["tokenExpiresAt"] == "2027-01-15T08:05:00Z"
    assert "position" not in admitted.to_body() and "etaSeconds" not in admitted.to_body()

    # Polling again returns the very same token; entering again by id hands over nothing (header mode).
    assert room.status(DROP, "1", ticket).entry_token == token
    with pytest.raises(AlreadyAdmitted):
        room.enter(DROP, "1")
    # The admitted user left the line: the next user is first now.
    assert room.store.client.zscore(room.store.keys(DROP).waiting, "1") is None
    assert room.store.client.zscore(room.store.keys(DROP).heartbeat, "1") is None


def test_admitted_user_who_reenters_before_polling_is_told_to_poll_and_the_poll_collects_the_token(room):
    ticket = room.enter(DROP, "1").queue_ticket
    admit_up_to(room, DROP, 1)
    with pytest.raises(AlreadyAdmitted):
        room.enter(DROP, "1")
    entry = room.status(DROP, "1", ticket)
    assert entry.status == "ADMITTED" and entry.entry_token.grants(DROP, "1")


def test_token_key_expires_with_the_token(make_room, client):
    room = make_room(VQ_TOKEN_TTL_S=300)
    ticket = room.enter(DROP, "1").queue_ticket
    admit_up_to(room, DROP, 1)
    # Judged on absolute times, so a loaded machine's delays only widen the window by what they measurably took.
    started = time.time()
    token = room.status(DROP, "1", ticket).entry_token
    took_ms = (time.time() - started) * 1000
    expires_ms = client.pexpiretime(room.store.keys(DROP).token(1))
    assert token.expires_at * 1000 - 5 <= expires_ms <= token.expires_at * 1000 + took_ms + 5


def test_status_without_place_or_token_is_not_in_queue(room, signer):
    room.enter(DROP, "1")
    ticket = signer.issue_ticket(DROP, "5", seq=1, entered_at_ms=1).text
    with pytest.raises(NotInQueue):
        room.status(DROP, "5", ticket)


def test_status_refreshes_the_heartbeat_of_a_waiting_user(make_room, client):
    clock = FakeClock(1_800_000_000.0)
    room = make_room(clock=clock)
    ticket = room.enter(DROP, "1").queue_ticket
    clock.now += 30
    room.status(DROP, "1", ticket)
    assert client.zscore(room.store.keys(DROP).heartbeat, "1") == 1_800_000_030_000


@pytest.mark.parametrize("forge", ["missing", "junk", "other user", "other target", "other type"])
def test_status_and_leave_need_the_users_own_ticket(room, signer, forge):
    seq = signer.read_ticket(room.enter(DROP, "1").queue_ticket).seq
    ticket = {
        "missing": None,
        "junk": "not-a-ticket",
        "other user": signer.issue_ticket(DROP, "2", 1, 1).text,
        "other target": signer.issue_ticket(Target("limited-drop", 43), "1", 1, 1).text,
        "other type": signer.issue_ticket(EVENT, "1", 1, 1).text,
    }[forge]
    with pytest.raises(InvalidQueueTicket):
        room.status(DROP, "1", ticket)
    with pytest.raises(InvalidQueueTicket):
        room.leave(DROP, "1", ticket)
    assert room.store.client.zscore(room.store.keys(DROP).waiting, "1") == seq


def test_an_entry_token_is_not_a_queue_ticket(room):
    ticket = room.enter(DROP, "1").queue_ticket
    admit_up_to(room, DROP, 1)
    token = room.status(DROP, "1", ticket).entry_token.text
    with pytest.raises(InvalidQueueTicket):
        room.status(DROP, "1", token)


def test_leave_removes_the_user_and_is_idempotent(room):
    tickets = {user: room.enter(DROP, str(user)).queue_ticket for user in (1, 2)}
    room.leave(DROP, "1", tickets[1])
    room.leave(DROP, "1", tickets[1])
    with pytest.raises(NotInQueue):
        room.status(DROP, "1", tickets[1])
    assert room.status(DROP, "2", tickets[2]).position == 1


def test_leaving_after_admission_drops_the_held_token(room):
    ticket = room.enter(DROP, "1").queue_ticket
    admit_up_to(room, DROP, 1)
    room.status(DROP, "1", ticket)
    room.leave(DROP, "1", ticket)
    with pytest.raises(NotInQueue):
        room.status(DROP, "1", ticket)


def test_reentering_after_leaving_goes_to_the_back_with_a_new_ticket(room):
    first = room.enter(DROP, "1")
    second = room.enter(DROP, "2")
    room.leave(DROP, "1", first.queue_ticket)
    again = room.enter(DROP, "1")
    assert again.queue_ticket and again.queue_ticket != first.queue_ticket
    assert room.signer.read_ticket(again.queue_ticket).seq > room.signer.read_ticket(second.queue_ticket).seq
    assert again.position == 2


def test_targets_are_independent_lines(room):
    room.enter(DROP, "1")
    assert room.enter(EVENT, "1").position == 1
    assert room.enter(Target("limited-drop", 43), "1").position == 1


def test_all_keys_of_a_target_share_one_hash_slot(room, client):
    ticket = room.enter(DROP, "1").queue_ticket
    room.enter(DROP, "2")
    admit_up_to(room, DROP, 1)
    room.status(DROP, "1", ticket)
    keys = list(client.scan_iter(match=f"{room.store.prefix}:{{{DROP}}}*"))
    assert len(keys) >= 6
    assert len({key_slot(key.encode()) for key in keys}) == 1


def test_enter_registers_the_target_for_the_pump_once(room, client):
    room.enter(DROP, "1")
    room.enter(DROP, "2")
    room.enter(EVENT, "1")
    assert set(client.zrange(room.store.global_keys.targets, 0, -1)) == {"limited-drop:42", "ticketing-event:42"}


def test_queue_keys_carry_the_idle_ttl(make_room, client):
    room = make_room(VQ_QUEUE_IDLE_TTL_S=600)
    room.enter(DROP, "1")
    keys = room.store.keys(DROP)
    for key in (keys.waiting, keys.heartbeat, keys.seq):
        assert 599_000 < client.pttl(key) <= 600_000, key
    # The registration is refreshed by the first enter after it lapses, so a lost one heals within a minute.
    assert 59_000 < client.pttl(keys.registered) <= REGISTRATION_REFRESH_MS


def test_a_lost_registration_is_made_again_by_a_later_enter(room, client):
    room.enter(DROP, "1")
    client.delete(room.store.global_keys.targets)  # e.g. lost in a failover, or a failed second round trip
    client.delete(room.store.keys(DROP).registered)  # ...and its marker lapsed
    room.enter(DROP, "2")
    assert client.zrange(room.store.global_keys.targets, 0, -1) == [str(DROP)]


def test_each_client_call_is_one_round_trip(room, client, monkeypatch):
    """Counted at the socket: each packed send to Redis is one round trip (a pipeline is one send)."""
    room.enter(DROP, "1")  # the first entry of a queue also registers it, once per queue lifetime
    ticket = room.enter(DROP, "2").queue_ticket
    sends = []
    original = Connection.send_packed_command
    monkeypatch.setattr(
        Connection, "send_packed_command", lambda conn, *a, **kw: (sends.append(1), original(conn, *a, **kw))[1]
    )

    def round_trips(call):
        sends.clear()
        call()
        return len(sends)

    assert round_trips(lambda: room.enter(DROP, "3")) == 1
    assert round_trips(lambda: room.enter(DROP, "3")) == 1
    assert round_trips(lambda: room.status(DROP, "2", ticket)) == 1
    admit_up_to(room, DROP, 2)
    assert round_trips(lambda: room.status(DROP, "2", ticket)) == 1
    assert round_trips(lambda: room.status(DROP, "2", ticket)) == 1
    third = room.signer.issue_ticket(DROP, "3", int(client.zscore(room.store.keys(DROP).waiting, "3")), 1).text
    assert round_trips(lambda: room.leave(DROP, "3", third)) == 1


class FakeClock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def test_a_waiting_poll_draws_no_grant_and_one_the_mark_passed_unforeseen_admits_on_a_second_call(make_room, client):
    room = make_room(VQ_BATCH_SIZE=1)
    tickets = {user: room.enter(DROP, str(user)).queue_ticket for user in range(1, 6)}
    drawn = []
    grant = room.signer.grant
    room.signer.grant = lambda *args: drawn.append(args) or grant(*args)
    calls = []
    run = room.store._status.run
    room.store._status.run = lambda keys, args: calls.append(len(args)) or run(keys, args)
    # Four ahead at one a tick: these polls cannot admit, and carry nothing of admitting.
    for _ in range(2):
        assert room.status(DROP, "5", tickets[5]).status == "WAITING"
    assert drawn == [] and calls == [8, 8]
    # The mark passes user 5 where this container could not see it: Due, then the poll again with its grant.
    admit_up_to(room, DROP, 5)
    calls.clear()
    assert room.status(DROP, "5", tickets[5]).status == "ADMITTED"
    assert len(drawn) == 1 and calls == [8, 16]
    # User 4 is behind a mark this container has seen: one call, with its grant.
    calls.clear()
    assert room.status(DROP, "4", tickets[4]).status == "ADMITTED"
    assert calls == [16]
