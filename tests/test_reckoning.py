"""Dead reckoning of a line while Redis cannot be asked: a ticket holder's turn comes at the rate, never sooner."""

from chalicelib.answers import Waiting
from chalicelib.reckoning import MAX_SIGHTINGS, Reckoner, Turn
from chalicelib.targets import Target

DROP = Target("limited-drop", 42)
T0 = 1_000.0


def poll(seq, ahead, mark=0, batch=2, tick_ms=1000, rate=None, paused=False, drawn=0):
    """What status.lua answered a user with `seq` and `ahead` users ahead (rate: the configured one, if not given)."""
    rate = batch * 1000 / tick_ms if rate is None else rate
    return Waiting(seq, ahead, rate, paused, mark=mark, batch=batch, tick_ms=tick_ms, drawn=drawn)


def line(*places, at=T0):
    reckoner = Reckoner()
    for place in places:
        reckoner.saw(DROP, place, at)
    return reckoner


def test_ticket_holders_come_in_seq_order_at_batch_per_tick_and_never_sooner():
    # Ten users at seqs 11..20, the mark at 10, 2 a tick of 1 s.
    reckoner = line(*(poll(seq, seq - 11, mark=10) for seq in range(11, 21)))
    admitted_by_tick = []
    for tick in range(7):
        now = T0 + tick + 0.999  # the end of each tick: still that tick
        admitted_by_tick.append(len([seq for seq in range(11, 21) if reckoner.turn(DROP, seq, now).admitted]))
    assert admitted_by_tick == [0, 2, 4, 6, 8, 10, 10]
    # ...always the first ones in line:
    assert [seq for seq in range(11, 21) if reckoner.turn(DROP, seq, T0 + 3.5).admitted] == [11, 12, 13, 14, 15, 16]


def test_a_waiting_holder_is_told_how_many_are_ahead_and_when_their_turn_is_due():
    reckoner = line(poll(15, 4, mark=10))
    assert reckoner.turn(DROP, 15, T0 + 0.5) == Turn(admitted=False, ahead=4, due_s=2.5)
    assert reckoner.turn(DROP, 15, T0 + 1.5) == Turn(admitted=False, ahead=2, due_s=1.5)
    assert reckoner.turn(DROP, 15, T0 + 3.0).admitted


def test_a_count_seen_behind_a_holder_bounds_theirs_and_nothing_else_does():
    reckoner = line(poll(30, 9, mark=10))
    # Seq 20 is ahead of seq 30: at most 8 ahead of it, so admitted once 9 can have been (5 ticks of 2).
    assert not reckoner.turn(DROP, 20, T0 + 4.5).admitted
    assert reckoner.turn(DROP, 20, T0 + 5.0).admitted
    # Nobody seen behind seq 31: it cannot be bounded.
    assert reckoner.turn(DROP, 31, T0 + 3600) is None
    assert Reckoner().turn(DROP, 20, T0) is None


def test_seqs_the_mark_passed_are_admitted_and_a_later_mark_counts():
    reckoner = line(poll(40, 20, mark=10))
    assert reckoner.turn(DROP, 9, T0).admitted
    reckoner.saw(DROP, poll(40, 5, mark=30), T0 + 1)
    assert reckoner.turn(DROP, 30, T0 + 1).admitted
    assert not reckoner.turn(DROP, 31, T0 + 1).admitted


def test_the_lower_of_batch_and_measured_rate_paces_it():
    reckoner = line(poll(15, 4, mark=10, batch=10, rate=1.0))  # 10 a tick configured, 1 a second measured
    assert not reckoner.turn(DROP, 15, T0 + 4.5).admitted
    assert reckoner.turn(DROP, 15, T0 + 5.0).admitted


def test_a_paused_line_admits_nobody():
    reckoner = line(poll(15, 4, mark=10, paused=True))
    assert reckoner.turn(DROP, 15, T0 + 3600) == Turn(admitted=False, ahead=4, paused=True)
    assert reckoner.turn(DROP, 10, T0 + 3600).admitted  # the pump admitted it before the pause


def test_places_an_opening_draw_dealt_are_bounded_only_from_behind_the_draw():
    # The draw dealt numbers 1..100 anew: ticket 50 may stand anywhere up to 100.
    reckoner = line(poll(120, 30, mark=40, drawn=100), poll(60, 3, mark=40, drawn=100))
    assert not reckoner.turn(DROP, 39, T0 + 1).admitted  # under the mark, but it may have been dealt 99
    assert not reckoner.turn(DROP, 60, T0 + 14.5).admitted  # seq 60 (a dealt place) tells nothing
    assert reckoner.turn(DROP, 60, T0 + 15).admitted  # ...but seq 120 bounds it: at most 29 ahead
    assert line(poll(120, 30, mark=100, drawn=100)).turn(DROP, 60, T0).admitted  # the mark passed the whole draw


def test_a_draw_not_yet_settled_reckons_nothing():
    reckoner = line(poll(120, 0, mark=0, drawn=-1))
    assert reckoner.turn(DROP, 120, T0 + 3600) is None


def test_a_sold_out_line_is_forgotten_and_memory_stays_bounded():
    reckoner = line(*(poll(seq, seq, mark=0) for seq in range(1, MAX_SIGHTINGS + 101)))
    assert len(reckoner._lines[DROP].ahead_of) == MAX_SIGHTINGS
    reckoner.forget(DROP)
    assert reckoner.turn(DROP, 1, T0) is None


def test_turns_reckoned_are_owed_to_the_mark_once_redis_answers_unless_it_lost_the_line():
    reckoner = line(poll(15, 4, mark=10))
    assert reckoner.turn(DROP, 13, T0 + 2).admitted
    reckoner.admitted(DROP, 13)
    reckoner.admitted(DROP, 12)
    reckoner.admitted(DROP, 9)  # the mark passed it: owes nothing
    assert reckoner.saw(DROP, poll(15, 4, mark=10), T0 + 3) == 13
    assert reckoner.saw(DROP, poll(15, 4, mark=10), T0 + 4) is None  # taken
    reckoner.admitted(DROP, 14)
    assert reckoner.saw(DROP, poll(15, 0, mark=14), T0 + 5) is None  # the pump got there first
    # Redis came back without the line's writes: its numbers may mean other places now.
    reckoner.admitted(DROP, 15)
    assert reckoner.saw(DROP, poll(3, 2, mark=0), T0 + 6) is None
    assert reckoner.turn(DROP, 12, T0 + 6) is None  # nobody seen behind it in the line as it is now


def test_everyone_ahead_of_a_reckoned_turn_is_due_until_the_mark_passes_it():
    reckoner = line(poll(15, 4, mark=10), poll(30, 10, mark=10))
    reckoner.admitted(DROP, 15)
    assert reckoner.reckoned_in(DROP, 12) and reckoner.reckoned_in(DROP, 15) and not reckoner.reckoned_in(DROP, 16)
    assert reckoner.turn(DROP, 12, T0).admitted  # not yet due by the counts seen, but someone behind was let in
    assert reckoner.saw(DROP, poll(30, 10, mark=10), T0 + 1) == 15
    assert reckoner.reckoned_in(DROP, 12)  # written back, but Redis's mark has not passed it yet
    reckoner.saw(DROP, poll(30, 5, mark=15), T0 + 2)
    assert not reckoner.reckoned_in(DROP, 12)


def test_an_admission_redis_answered_moves_the_mark_seen():
    reckoner = line(poll(40, 20, mark=10))
    assert not reckoner.turn(DROP, 25, T0).admitted
    reckoner.saw_admitted(DROP, 30)  # someone at seq 30 was admitted: the pump's mark passed seq 25 too
    assert reckoner.turn(DROP, 25, T0).admitted
    reckoner.saw_admitted(DROP, 20)
    assert reckoner.turn(DROP, 30, T0).admitted and not reckoner.turn(DROP, 31, T0).admitted


def test_a_poll_is_near_its_turn_within_a_tick_of_the_front_or_once_the_mark_passed_it():
    # 2 a tick of 1 s: seq 15 with 4 ahead is due in 3 ticks, seq 12 with 1 ahead within this one.
    reckoner = line(poll(15, 4, mark=10), poll(12, 1, mark=10))
    assert reckoner.near_turn(DROP, 12, T0)
    assert not reckoner.near_turn(DROP, 15, T0)
    assert reckoner.near_turn(DROP, 15, T0 + 2.0)  # two ticks later: 4 can have gone, it is next
    assert reckoner.near_turn(DROP, 9, T0)  # the mark passed it
    # A line this container never saw, a seq it saw no poll of, a paused line: nothing foreseen.
    assert not Reckoner().near_turn(DROP, 12, T0)
    assert not reckoner.near_turn(DROP, 16, T0)
    assert not reckoner.near_turn(DROP, 14, T0 + 3600)
    assert not line(poll(12, 1, mark=10, paused=True)).near_turn(DROP, 12, T0)
