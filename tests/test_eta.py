"""The ETA's range (etaLowSeconds, etaHighSeconds) and its accuracy, measured at admission (etaAccuracy)."""

import time

import pytest

from chalicelib import eta
from chalicelib.pump import Pump
from chalicelib.target_config import TargetConfig
from chalicelib.targets import Target
from tests.support.ticks import admit_through

DROP = Target("limited-drop", 42)
T0 = 1_900_000_000.0  # the room's clock: every wait below is exact


def at(room, seconds):
    room.clock = lambda: T0 + seconds


def test_the_range_is_centred_on_the_line_thinned_by_its_departures():
    # By hand: 1,000 ahead at 10 a second is 100 s if all stay. 30,000 users left and 10,000 were evicted while
    # users waited 10,000,000 s in all, to which the prior adds 192 departures over 600,000 s: h = 40,192 /
    # 10,600,000 = 0.00379 a second. The line then reaches the user after ln(1 + 0.379) / 0.00379 = 84.79 s; with
    # 2 s ticks the turn comes a quarter tick later and the poll tells half a second after: 85.79 s. Either side,
    # half a tick, half a near-front poll and 5 % of that: 5.79 s, so 79.996 to 91.57 s, outwards to whole seconds.
    departures = eta.Departures(left=30_000, evicted=10_000, waiting_user_ms=10_000_000_000)
    assert departures.rate_per_s() == pytest.approx(40_192 / 10_600_000)
    assert eta.estimate(1000, 10.0, departures, tick_s=2.0, configured_rate=10.0) == eta.Estimate(
        eta_s=100, low_s=79, high_s=92
    )
    # Before anyone waited, the prior alone: 0.00032 a second, ln(1.032) / 0.00032 = 98.44 s, and 1 s: 99.44 s,
    # 6.47 s either side.
    assert eta.Departures().rate_per_s() == pytest.approx(0.00032)
    assert eta.estimate(1000, 10.0, eta.Departures(), tick_s=2.0, configured_rate=10.0) == eta.Estimate(
        eta_s=100, low_s=92, high_s=106
    )
    # At the front: never promised to the second. The tick and the poll that tell of the turn: 1 s, 1.55 s either
    # side; with 1 s ticks, 0.75 s and 1.04 s.
    assert eta.estimate(0, 10.0, eta.Departures(), tick_s=2.0, configured_rate=10.0) == eta.Estimate(
        eta_s=0, low_s=0, high_s=3
    )
    assert eta.estimate(0, 10.0, eta.Departures(), tick_s=1.0, configured_rate=10.0) == eta.Estimate(
        eta_s=0, low_s=0, high_s=2
    )


def test_the_range_is_never_narrower_than_the_tick_and_the_poll_allow():
    """No "34-35 s": whatever the line, at least half a tick and half a near-front poll either side."""
    for tick_s in (0.5, 1.0, 2.0, 5.0):
        for ahead in (0, 1, 10, 100, 1_000, 10_000, 100_000):
            told = eta.estimate(ahead, 50.0, eta.Departures(), tick_s, configured_rate=50.0)
            assert told.high_s - told.low_s >= min(told.high_s, 2 * (tick_s / 2 + 0.5)), (tick_s, ahead, told)


def test_a_line_measured_slower_than_configured_may_speed_up_again():
    # 1,000 ahead, measured at 5 a second (the shop's health cut the rate) though configured for 10: centred on
    # the measured rate (ln(1.064) / 0.00032 = 193.9 s and 1 s: 194.9 s, ±11.24 s up to 206.1 s), reaching down to
    # the configured rate's wait (99.44 s, ±6.47 s from 92.96 s).
    told = eta.estimate(1000, 5.0, eta.Departures(), tick_s=2.0, configured_rate=10.0)
    assert told == eta.Estimate(eta_s=200, low_s=92, high_s=207)
    # Measured at the configured rate, or faster: the range of that rate alone.
    assert eta.estimate(1000, 10.0, eta.Departures(), 2.0, configured_rate=5.0).low_s == 92


def test_every_waiting_answer_carries_the_range_and_paused_ones_null(make_room):
    room = make_room(VQ_BATCH_SIZE=10, VQ_TICK_MS=1000)  # 10 admissions per second
    entries = [room.enter(DROP, str(user)) for user in range(1, 42)]
    polled = [room.status(DROP, str(user), entries[user - 1].queue_ticket) for user in range(1, 42)]
    for answer in [*entries, *polled]:
        body = answer.to_body()
        assert body["status"] == "WAITING"
        low, high = body["etaLowSeconds"], body["etaHighSeconds"]
        assert isinstance(low, int) and isinstance(high, int) and 0 <= low <= high
    # 40 ahead at 10 a second: 4 s; 4.75 s with a quarter tick and the telling poll, 1.24 s either side.
    last = polled[-1].to_body()
    assert (last["etaSeconds"], last["etaLowSeconds"], last["etaHighSeconds"]) == (4, 3, 6)
    room.configure(DROP, TargetConfig(batch=10, tick_ms=1000, paused=True))
    paused = [room.enter(DROP, "1").to_body(), room.enter(DROP, "99").to_body()]
    paused.append(room.status(DROP, "41", entries[-1].queue_ticket).to_body())
    for body in paused:
        assert body["paused"] is True
        assert (body["etaSeconds"], body["etaLowSeconds"], body["etaHighSeconds"]) == (None, None, None)


def test_departures_counted_move_the_range_down(make_room):
    room = make_room(VQ_BATCH_SIZE=10, VQ_TICK_MS=1000)
    keys = room.store.keys(DROP)
    room.store.client.zadd(keys.waiting, {f"x{seq}": seq for seq in range(1, 1002)})
    room.store.client.set(keys.seq, 1001)
    # Users waited 10,000,000 s in all (the pump's count) and nobody departed.
    room.store.client.hset(keys.stats, mapping={"waiting_user_ms": 10_000_000_000})
    before = room.enter(DROP, "newcomer")  # 1,001 ahead at 10 a second
    # Over the same time, 10,000 were evicted and 30,000 left in ways the range counts (lua/leave.lua).
    room.store.client.hset(keys.stats, mapping={"eta_left": 30_000, "evicted": 10_000})
    after = room.enter(DROP, "newcomer")
    assert after.eta_seconds == before.eta_seconds == 101
    assert before.eta_range == (94, 107)  # h = 192 / 10,600,000: 100.0 s, 100.76 with the tick and the poll, ±6.04
    assert after.eta_range == (80, 91)  # h = 40,192 / 10,600,000: 84.9 s, 85.61 with the tick and the poll, ±5.28


def test_one_account_looping_enter_and_leave_bends_no_one_s_range(make_room):
    """Issue 42's M1: every leave used to count as a departure, so one account looping enter and leave made everyone
    else's range promise a shorter wait than the line would give (-18 % here)."""
    room = make_room(VQ_BATCH_SIZE=1, VQ_TICK_MS=1000)  # 1 admission a second
    for user in range(1, 301):
        room.enter(DROP, f"x{user}")
    ticket = room.enter(DROP, "shopper").queue_ticket  # 300 ahead: 300 s if everyone stays
    before = room.status(DROP, "shopper", ticket).eta_range
    for _ in range(1000):
        room.leave(DROP, "looper", room.enter(DROP, "looper").queue_ticket)
    after = room.status(DROP, "shopper", ticket).eta_range
    assert room.stats(DROP)["leftCount"] == 1000  # operators still see every leave
    shift = max(abs(a - b) / b for a, b in zip(after, before, strict=True))
    assert shift < 0.05, (before, after)


def test_a_leave_counts_as_a_departure_after_a_tick_in_line_once_per_user(make_room):
    room = make_room(VQ_BATCH_SIZE=1, VQ_TICK_MS=100)
    stats = room.store.keys(DROP).stats

    def counted():
        return int(room.store.client.hget(stats, "eta_left") or 0)

    def stay(user, seconds):
        ticket = room.enter(DROP, user).queue_ticket
        time.sleep(seconds)
        return ticket

    room.configure(DROP, TargetConfig(tick_ms=60_000))
    room.leave(DROP, "a", stay("a", 0.12))  # within its first tick: the pump counted none of its time
    assert counted() == 0
    room.configure(DROP, TargetConfig(tick_ms=100))
    room.leave(DROP, "b", stay("b", 0.12))  # a tick and more in line
    assert counted() == 1
    room.leave(DROP, "b", stay("b", 0.12))  # again within ten minutes: once per user
    assert counted() == 1
    room.leave(DROP, "c", stay("c", 0.12))  # someone else counts
    assert counted() == 2
    ticket = stay("d", 0.12)
    admit_through(room.store, DROP, "d")
    room.leave(DROP, "d", ticket)  # after their turn came: not a departure ahead of anyone
    assert counted() == 2
    assert room.stats(DROP)["leftCount"] == 5


def test_the_pump_counts_the_time_users_wait(make_room):
    room = make_room(VQ_BATCH_SIZE=1, VQ_TICK_MS=100)
    for user in range(1, 6):
        room.enter(DROP, str(user))
    started = time.monotonic()
    Pump(room.store, room.settings).run(ticks=3)  # 5 wait through the first tick, 4 the next, 3 the third
    elapsed_ms = (time.monotonic() - started) * 1000
    counted = int(room.store.client.hget(room.store.keys(DROP).stats, "waiting_user_ms"))
    # Counted in whole ticks since the last one (a late tick counts all the time since): at most the time that
    # passed and the first tick's, the first and last ticks' boundaries rounding it by a tick each.
    assert 1200 <= counted <= 5 * (elapsed_ms + 3 * 100)


def test_accuracy_is_measured_at_admission_against_the_first_estimate(make_room):
    room = make_room(VQ_BATCH_SIZE=1, VQ_TICK_MS=100)  # 10 admissions per second
    at(room, 0)
    room.configure(DROP, TargetConfig(batch=1, tick_ms=100))
    entries = {user: room.enter(DROP, str(user)) for user in range(1, 21)}
    for user in (3, 4):  # departures: they leave before their turn and are no sample
        room.leave(DROP, str(user), entries[user].queue_ticket)
    at(room, 0.5)
    room.status(DROP, "5", entries[5].queue_ticket)  # a poll that finds them waiting changes nothing
    admit_through(room.store, DROP)  # everyone in line
    waits = {user: 1.5 if user <= 10 else 30.0 for user in entries if user not in (3, 4)}
    for user, wait_s in sorted(waits.items(), key=lambda item: item[1]):
        at(room, wait_s)
        assert room.status(DROP, str(user), entries[user].queue_ticket).status == "ADMITTED"
    room.status(DROP, "20", entries[20].queue_ticket)  # collecting again is no second sample
    # What each was told on entering, against the wait they had.
    inside = sum(entries[u].eta_range[0] <= w <= entries[u].eta_range[1] for u, w in waits.items())
    assert inside == 8  # the 8 admitted after 1.5 s were told so, none of the 10 after 30 s
    errors = sorted(abs(w - entries[u].eta_seconds) for u, w in waits.items())
    accuracy = room.stats(DROP)["etaAccuracy"]
    assert accuracy["samples"] == 18
    assert accuracy["insideRangeShare"] == round(inside / 18, 3)
    median = errors[8]  # the 9th of 18, as the histogram's 0.5 quantile counts
    assert median >= 28 and median <= accuracy["medianAbsErrorSeconds"] <= median * 1.1  # within 10 %


def test_an_entry_told_no_estimate_is_no_sample(make_room):
    room = make_room(VQ_BATCH_SIZE=1, VQ_TICK_MS=100)
    at(room, 0)
    room.configure(DROP, TargetConfig(batch=1, tick_ms=100, paused=True))
    ticket = room.enter(DROP, "1").queue_ticket
    assert room.signer.read_ticket(ticket).told is None
    room.configure(DROP, TargetConfig(batch=1, tick_ms=100))
    admit_through(room.store, DROP, "1")
    assert room.status(DROP, "1", ticket).status == "ADMITTED"
    assert room.stats(DROP)["etaAccuracy"] == {"samples": 0, "insideRangeShare": None, "medianAbsErrorSeconds": None}
    assert room.stats(DROP)["waitsMeasured"] == 1


def test_the_ticket_carries_the_first_estimate_signed(room):
    ticket = room.signer.issue_ticket(DROP, "u", 7, 1, eta.Estimate(12, 8, 16))
    read = room.signer.read_ticket(ticket.text)
    assert (read.seq, read.told) == (7, eta.Estimate(12, 8, 16))
    assert room.signer.read_ticket(room.signer.issue_ticket(DROP, "u", 7, 1).text).told is None
