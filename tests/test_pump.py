"""The admission pump against a real Redis: rate under concurrent and frozen pumps, no wasted slots,
eviction, the pump lock, failure isolation, forgetting idle targets, and the Lambda entry point."""

import copy
import itertools
import json
import random
import threading
import time

import pytest
from redis.exceptions import LockNotOwnedError

from chalicelib import runtime
from chalicelib.answers import TargetTick
from chalicelib.errors import NotInQueue
from chalicelib.pump import RUN_WINDOW_MS, STOP_BEFORE_DEADLINE_MS, Pump, PumpRun, ticks_requested
from chalicelib.redis_connection import connect
from chalicelib.store import OPEN_KEPT_MS, OPEN_LOOKAHEAD_MS, QueueStore
from chalicelib.target_config import iso_time, parse_config
from chalicelib.targets import Target
from tests.support.ticks import server_ms, wait_for_next_tick

DROP = Target("limited-drop", 42)
EVENT = Target("ticketing-event", 7)
SHOW = Target("ticketing-event", 8)


def fill(room, target, users):
    """Enter `users` in order; returns each user's queue ticket."""
    return {user: room.enter(target, str(user)).queue_ticket for user in users}


def stay_clear_of_tick_boundary(client, tick_ms, margin_ms=1000):
    """With long ticks, make sure the next calls all fall in one tick."""
    if tick_ms - server_ms(client) % tick_ms < margin_ms:
        wait_for_next_tick(client, tick_ms)


def mark_of(client, store, target):
    return int(client.get(store.keys(target).mark) or 0)


def admitted_of(client, store, target):
    """Users up to the mark: those admitted, while nobody has collected a token."""
    return client.zcount(store.keys(target).waiting, "-inf", mark_of(client, store, target))


def seq_at(client, store, rank, target=DROP):
    """The seq of the `rank`-th user in line (from 1): seqs follow the server clock, so tests count by rank."""
    return int(client.zrange(store.keys(target).waiting, rank - 1, rank - 1, withscores=True)[0][1])


def only(report, target=DROP) -> TargetTick:
    result = report.targets[target]
    assert isinstance(result, TargetTick), result
    return result


@pytest.mark.slow
def test_eight_pumps_with_freezes_admit_exactly_batch_per_elapsed_tick_and_apply_no_tick_twice(
    env,
    connect_redis,
    client,
    store,
):
    batch, tick_ms = 7, 100
    # Catch-up covers any gap the freezes leave (2 s), so the total must come out exact.
    env(VQ_TICK_MS=tick_ms, VQ_BATCH_SIZE=batch, VQ_PUMP_LEASE_TICKS=2, VQ_CATCHUP_TICKS=20)
    room = runtime.waiting_room()
    fill(room, DROP, range(1, 1501))
    settings = runtime.settings()
    lease_s = settings.pump_lease_ticks * tick_ms / 1000
    results = []

    class FreezingStore(QueueStore):
        """A Lambda that freezes after it checked the lock and before its tick's work, every few ticks."""

        def __init__(self, *args):
            super().__init__(*args)
            self.rng = random.Random()
            self.calls_until_freeze = self.rng.randint(3, 8)

        def admit_and_evict_all(self, targets, rules, seen=None):
            self.calls_until_freeze -= 1
            if self.calls_until_freeze == 0:
                self.calls_until_freeze = self.rng.randint(3, 8)
                # Past the lease by one to two ticks: it wakes when a successor has taken over, mostly in a
                # tick the successor has already applied.
                time.sleep(self.rng.uniform(lease_s + 0.1, lease_s + 0.19))
            answer = super().admit_and_evict_all(targets, rules, seen)
            results.extend(answer.values())
            return answer

    deadline = time.monotonic() + 3.0
    failures = []

    def one_pump():
        try:
            Pump(FreezingStore(connect_redis(), settings.key_prefix), settings).run(
                remaining_ms=lambda: (deadline - time.monotonic()) * 1000 + STOP_BEFORE_DEADLINE_MS
            )
        except BaseException as err:  # noqa: BLE001 (a thread's failure must reach the test)
            failures.append(err)

    threads = [threading.Thread(target=one_pump) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not failures
    assert all(isinstance(r, TargetTick) for r in results)
    applied = sorted(r.applied_tick for r in results if r.applied_tick is not None)
    assert len(applied) == len(set(applied)), "a tick was applied twice"
    elapsed = applied[-1] - applied[0] + 1
    mark = mark_of(client, store, DROP)
    # Nobody left: everyone up to the mark is an admitted user still in line.
    admitted = client.zcount(store.keys(DROP).waiting, "-inf", mark)
    assert sum(r.admitted for r in results) == admitted == batch * elapsed
    assert mark == seq_at(client, store, admitted)
    assert int(client.hget(store.keys(DROP).stats, "admitted")) == admitted
    assert int(client.get(store.keys(DROP).tick)) == applied[-1] * settings.tick_ms  # kept as the tick's start (ms)
    # The run really exercised overlap: frozen pumps came back to ticks already applied, and lapses were caught up.
    assert any(r.applied_tick is None for r in results)
    assert max(b - a for a, b in itertools.pairwise(applied)) > 1


def test_the_same_tick_twice_is_a_no_op(env, client, store):
    env(VQ_TICK_MS=60_000, VQ_BATCH_SIZE=10)
    fill(runtime.waiting_room(), DROP, range(1, 31))
    rules = Pump(store, runtime.settings()).rules
    stay_clear_of_tick_boundary(client, 60_000)

    first = store.admit_and_evict_all([DROP], rules)[DROP]
    state = {key: client.dump(key) for key in (store.keys(DROP).mark, store.keys(DROP).tick, store.keys(DROP).waiting)}
    second = store.admit_and_evict_all([DROP], rules)[DROP]

    tenth = seq_at(client, store, 10)
    assert (first.applied_tick is not None, first.admitted, first.mark, first.waiting) == (True, 10, tenth, 20)
    assert (second.applied_tick, second.admitted, second.mark, second.waiting) == (None, 0, tenth, 20)
    assert {key: client.dump(key) for key in state} == state


def test_missed_ticks_are_made_up_to_the_cap_and_the_mark_never_passes_the_last_seq(env, client, store):
    env(VQ_TICK_MS=60_000, VQ_BATCH_SIZE=10, VQ_CATCHUP_TICKS=5)
    fill(runtime.waiting_room(), DROP, range(1, 121))
    rules = Pump(store, runtime.settings()).rules
    k = store.keys(DROP)
    stay_clear_of_tick_boundary(client, 60_000)
    now = store.admit_and_evict_all([DROP], rules)[DROP].applied_tick

    # The last applied tick is kept as its start time (ms).
    client.set(k.tick, (now - 3) * 60_000)  # three ticks missed: three batches
    assert store.admit_and_evict_all([DROP], rules)[DROP].admitted == 30
    client.set(k.tick, (now - 50) * 60_000)  # far behind: the cap holds
    assert store.admit_and_evict_all([DROP], rules)[DROP].admitted == 50
    client.set(k.tick, (now - 50) * 60_000)  # more due than waiting: everyone, and no further
    last = store.admit_and_evict_all([DROP], rules)[DROP]
    assert (last.admitted, last.mark, last.waiting) == (30, seq_at(client, store, 120), 0)
    assert int(client.get(k.seq)) == last.mark


def test_users_who_left_are_skipped_so_every_tick_admits_batch_users_still_waiting(env, client, store):
    batch, tick_ms = 10, 100
    env(VQ_TICK_MS=tick_ms, VQ_BATCH_SIZE=batch)
    fill(runtime.waiting_room(), DROP, range(1, 201))
    leavers = set(random.Random(3).sample(range(1, 201), 60))  # 30 %
    seqs = {int(user): int(seq) for user, seq in client.zrange(store.keys(DROP).waiting, 0, -1, withscores=True)}
    for user in leavers:
        store.leave(DROP, str(user), seqs[user], 0, 60_000, 2000)
    pump = Pump(store, runtime.settings())
    waiting_key = store.keys(DROP).waiting
    skipped = 0
    previous_tick = None

    for _ in range(8):
        wait_for_next_tick(client, tick_ms)
        before = mark_of(client, store, DROP)
        result = only(pump.tick())
        ticks = 1 if previous_tick is None else result.applied_tick - previous_tick
        previous_tick = result.applied_tick
        admitted_now = client.zrangebyscore(waiting_key, f"({before}", result.mark)
        assert len(admitted_now) == result.admitted == batch * ticks
        assert not leavers & {int(user) for user in admitted_now}
        skipped += sum(1 for user in leavers if before < seqs[user] <= result.mark)

    assert skipped > 0, "some users who left were passed over, costing no slot"


def test_users_who_stopped_polling_are_evicted_and_those_behind_move_up(env, client, store):
    # The whole line inside the presence window (at one a minute, 120 s would hold two places): all must poll.
    env(
        VQ_TICK_MS=60_000,
        VQ_BATCH_SIZE=1,
        VQ_MAX_EVICT_PER_TICK=10,
        VQ_HEARTBEAT_TIMEOUT_S=60,
        VQ_PRESENCE_WINDOW_S=100_000,
    )
    room = runtime.waiting_room()
    # Their last poll was two minutes ago.
    stale_room = copy.copy(room)
    stale_room.clock = lambda: time.time() - 120
    stale = fill(stale_room, DROP, range(1, 26))
    fresh = fill(room, DROP, [26, 27, 28])
    pump = Pump(store, runtime.settings())
    stay_clear_of_tick_boundary(client, 60_000)
    assert room.status(DROP, "26", fresh[26]).ahead_count == 25

    evicted, ahead = [], []
    for _ in range(4):
        evicted.append(only(pump.tick()).evicted)
        ahead.append(room.status(DROP, "26", fresh[26]).ahead_count)

    # Tick 1 also admits seq 11 (the first tick's batch of one); tick 2 evicts it, as it never collected its token.
    assert evicted == [10, 10, 5, 0]
    assert client.hget(store.keys(DROP).stats, "evicted") == "25"
    assert ahead == [14, 5, 0, 0]
    assert [room.status(DROP, str(user), fresh[user]).status for user in fresh] == ["WAITING"] * 3
    for user in (1, 11, 25):
        with pytest.raises(NotInQueue):
            room.status(DROP, str(user), stale[user])


def test_the_pump_lock_is_released_and_extended_only_by_its_owner_and_taken_once_expired(env, client, store):
    first = store.pump_lock(10_000)
    assert first.acquire()
    assert not store.pump_lock(10_000).acquire()

    client.pexpire(store.global_keys.pump_lock, 1)  # the owner froze past its lease
    time.sleep(0.01)
    second = store.pump_lock(10_000)
    assert second.acquire()
    with pytest.raises(LockNotOwnedError):
        first.extend(10, replace_ttl=True)
    with pytest.raises(LockNotOwnedError):
        first.release()
    assert client.get(store.global_keys.pump_lock) == second.local.token.decode()
    assert second.extend(10, replace_ttl=True)
    second.release()
    assert client.get(store.global_keys.pump_lock) is None


def test_a_pump_whose_lock_lapsed_stands_aside_and_does_not_release_the_new_owners_lock(env, client, store):
    env(VQ_TICK_MS=100)
    fill(runtime.waiting_room(), DROP, range(1, 11))
    settings = runtime.settings()
    frozen, successor = Pump(store, settings), Pump(QueueStore(client, settings.key_prefix), settings)
    assert frozen.tick().held_lock

    client.pexpire(store.global_keys.pump_lock, 1)
    time.sleep(0.01)
    assert successor.tick().held_lock
    token = client.get(store.global_keys.pump_lock)
    assert frozen.run(ticks=1).ticks == 1  # lapsed: does no work, and its release leaves the lock alone
    assert not frozen.holding
    assert client.get(store.global_keys.pump_lock) == token

    successor.run(ticks=1)
    assert client.get(store.global_keys.pump_lock) is None


def test_a_failing_target_does_not_stop_the_others_and_the_pump_never_raises(env, client, store):
    env(VQ_TICK_MS=100, VQ_BATCH_SIZE=5)
    room = runtime.waiting_room()
    for target in (DROP, EVENT, SHOW):
        fill(room, target, range(1, 21))
    client.delete(store.keys(EVENT).mark)
    client.rpush(store.keys(EVENT).mark, "not a number")  # a wrong-type key makes admit.lua fail

    run = Pump(store, runtime.settings()).run(ticks=2)

    assert run.errors == 2
    assert admitted_of(client, store, DROP) == admitted_of(client, store, SHOW) == run.admitted / 2 >= 10


def test_a_pump_without_redis_counts_errors_and_goes_on(env):
    env(VQ_TICK_MS=100)
    dead = QueueStore(connect("redis://127.0.0.1:1"), "nowhere")

    run = Pump(dead, runtime.settings()).run(ticks=2)

    assert (run.ticks, run.errors, run.admitted) == (2, 2, 0)


def test_the_pump_reloads_scripts_the_server_lost(env, client, store):
    env(VQ_TICK_MS=100, VQ_BATCH_SIZE=5)
    fill(runtime.waiting_room(), DROP, range(1, 11))
    client.script_flush()  # as after a restart or a failover

    assert only(Pump(store, runtime.settings()).tick()).admitted == 5


def test_idle_targets_are_forgotten_and_registered_again_on_the_next_enter(env, client, store):
    env(VQ_TICK_MS=100)
    room = runtime.waiting_room()
    ticket = room.enter(DROP, "1").queue_ticket
    fill(room, EVENT, [1])
    room.leave(DROP, "1", ticket)
    pump = Pump(store, runtime.settings())

    assert only(pump.tick()).idle
    assert set(store.registered_targets()) == {EVENT}
    assert client.exists(store.keys(DROP).registered) == 0

    room.enter(DROP, "2")
    assert set(store.registered_targets()) == {DROP, EVENT}


def test_an_enter_that_registers_the_target_while_the_pump_forgets_it_is_not_lost(env, client, store):
    tick_ms = 100
    env(VQ_TICK_MS=tick_ms)
    room = runtime.waiting_room()
    ticket = room.enter(DROP, "1").queue_ticket
    room.leave(DROP, "1", ticket)
    read_nonce = store.registered_targets()[DROP]
    entered = []

    class RacingStore(QueueStore):
        def forget_targets(self, nonces):
            # Between the pump's eviction (which dropped the marker) and its forgetting: a new user enters.
            entered.append(room.enter(DROP, "2"))
            return super().forget_targets(nonces)

    pump = Pump(RacingStore(client, store.prefix), runtime.settings())
    assert only(pump.tick()).idle

    assert store.registered_targets()[DROP] != read_nonce
    wait_for_next_tick(client, tick_ms)
    assert only(pump.tick()).admitted == 1
    assert room.status(DROP, "2", entered[0].queue_ticket).status == "ADMITTED"


def test_forgetting_with_a_stale_nonce_keeps_the_target(env, store):
    fill(runtime.waiting_room(), DROP, [1])
    nonce = store.registered_targets()[DROP]

    assert store.forget_targets({DROP: nonce + 1}) == []
    assert store.registered_targets() == {DROP: nonce}
    assert store.forget_targets({DROP: nonce}) == [DROP]
    assert store.registered_targets() == {}


def test_each_tick_emits_the_gauges_of_each_target(env, store, capsys):
    env(VQ_TICK_MS=100, VQ_BATCH_SIZE=3)
    fill(runtime.waiting_room(), DROP, range(1, 11))
    capsys.readouterr()

    Pump(store, runtime.settings()).tick()

    blobs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"_aws"')]
    gauges = [b for b in blobs if b.get("target") == str(DROP)]
    assert len(gauges) == 1
    assert gauges[0]["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "VirtualQueue"
    assert {name: gauges[0][name] for name in ("QueueLength", "Admitted", "Evicted")} == {
        "QueueLength": [7.0],
        "Admitted": [3.0],
        "Evicted": [0.0],
    }


def test_a_run_stops_shortly_before_the_deadline(env, store):
    env(VQ_TICK_MS=100)
    now = [1000.0]
    deadline = now[0] + STOP_BEFORE_DEADLINE_MS / 1000 + 1.0

    def sleep(seconds):
        now[0] += seconds

    def remaining_ms():
        return (deadline - now[0]) * 1000

    run = Pump(store, runtime.settings(), clock=lambda: now[0], sleep=sleep).run(remaining_ms=remaining_ms)

    assert 9 <= run.ticks <= 12
    assert STOP_BEFORE_DEADLINE_MS <= remaining_ms() < STOP_BEFORE_DEADLINE_MS + 110


def test_a_run_hands_over_before_the_next_scheduled_invocation(env, store):
    env(VQ_TICK_MS=2000)
    now = [1000.0]

    def sleep(seconds):
        now[0] += seconds

    run = Pump(store, runtime.settings(), clock=lambda: now[0], sleep=sleep).run(remaining_ms=lambda: 70_000.0)

    assert RUN_WINDOW_MS - 2010 < (now[0] - 1000.0) * 1000 <= RUN_WINDOW_MS
    assert run.ticks >= 29


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_the_lambda_entry_point_runs_the_requested_ticks(env, api, client, store):
    env(VQ_TICK_MS=100, VQ_BATCH_SIZE=3)
    # Builds the settings now: the test client patches in .chalice/config.json's VQ_TICK_MS for the invocation.
    fill(runtime.waiting_room(), DROP, range(1, 31))

    answer = api.lambda_.invoke("admission_pump", {"ticks": 2}).payload

    assert answer["ticks"] == 2
    assert answer["errors"] == 0
    assert answer["admitted"] == admitted_of(client, store, DROP) >= 6
    assert client.get(store.global_keys.pump_lock) is None


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_the_lambda_entry_point_takes_the_scheduled_event_as_run_until_the_deadline_or_idle(env, api):
    env(VQ_TICK_MS=100)
    event = api.events.generate_cw_event(
        source="aws.events",
        detail_type="Scheduled Event",
        detail={},
        resources=["arn:aws:events:rule/pump"],
    )
    assert api.lambda_.invoke("admission_pump", event).payload["ticks"] == 0  # nothing on sale: back at once

    fill(runtime.waiting_room(), DROP, [1, 2])
    # The test client's Lambda context has about 3 s left: one tick, then it is time to stop.
    assert api.lambda_.invoke("admission_pump", event).payload["ticks"] == 1


@pytest.mark.parametrize("event", [{"ticks": 0}, {"ticks": "2"}, {"ticks": True}, {"ticks": -1}])
def test_a_malformed_ticks_request_is_refused(event):
    with pytest.raises(ValueError):
        ticks_requested(event)


# --- the scheduled pump while nothing is on sale (docs/deploy.md: what it costs idle) ---


def test_a_scheduled_run_returns_at_once_while_no_target_is_registered_or_open(env, client, store):
    env(VQ_TICK_MS=100)

    def sleep(seconds):
        raise AssertionError("an idle run must not wait for a tick")

    run = Pump(store, runtime.settings(), sleep=sleep).run(remaining_ms=lambda: 60_000.0, until_idle=True)

    assert run == PumpRun(ticks=0, admitted=0, evicted=0, errors=0)
    assert client.get(store.global_keys.pump_lock) is None  # not even the lock was taken
    assert Pump(store, runtime.settings()).run(ticks=1, until_idle=True).ticks == 1  # asked for ticks: ticks


def test_an_opened_target_keeps_the_scheduled_pump_ticking_and_its_first_user_is_admitted_at_the_next_tick(env, store):
    env(VQ_TICK_MS=100, VQ_BATCH_SIZE=5)
    room = runtime.waiting_room()
    room.configure(DROP, parse_config(b"{}"))  # opened at once, nobody in line yet
    ticks = []  # per tick: how many the pump admitted
    entered_after_tick = []

    class Recording(QueueStore):
        def admit_and_evict_all(self, targets, rules, seen=None):
            answer = super().admit_and_evict_all(targets, rules, seen)
            ticks.append(sum(r.admitted for r in answer.values() if isinstance(r, TargetTick)))
            return answer

    def sleep(seconds):
        time.sleep(seconds)
        if len(ticks) == 3:
            room.enter(DROP, "1")  # the sale's first user, while the pump is between ticks
            entered_after_tick.append(len(ticks))

    pump = Pump(Recording(store.client, store.prefix), runtime.settings(), sleep=sleep)
    run = pump.run(remaining_ms=lambda: 60_000.0 if len(ticks) < 6 else 0.0, until_idle=True)

    assert entered_after_tick == [3]
    assert ticks[:3] == [0, 0, 0]  # awake for the open target although nobody waited
    assert ticks[3] == 1 and run.admitted == 1  # the tick right after the first enter admitted it


def test_the_pump_is_awake_from_shortly_before_an_opening_until_long_after_it(env, client, store):
    env(VQ_TICK_MS=100)
    now_ms = server_ms(client)
    opening_ms = now_ms + 600_000
    runtime.waiting_room().configure(DROP, parse_config(json.dumps({"opensAt": iso_time(opening_ms)}).encode()))

    assert not store.pump_has_work(now_ms)  # ten minutes ahead: nothing to do yet
    assert store.pump_has_work(opening_ms - OPEN_LOOKAHEAD_MS)  # the run that starts before it ticks through it
    assert store.pump_has_work(opening_ms + OPEN_KEPT_MS)
    assert not store.pump_has_work(opening_ms + OPEN_KEPT_MS + 1)
    assert 0 < opening_ms + OPEN_KEPT_MS - now_ms - client.pttl(store.global_keys.open) < 10_000  # and the key expires


def test_a_scheduled_run_stops_after_a_tick_that_found_nothing_on_sale(env, store):
    env(VQ_TICK_MS=100)
    room = runtime.waiting_room()
    room.leave(DROP, "1", room.enter(DROP, "1").queue_ticket)  # registered, then nobody left in line

    run = Pump(store, runtime.settings()).run(remaining_ms=lambda: 60_000.0, until_idle=True)

    assert run.ticks == 2  # the first forgets the idle target, the second finds nothing
    assert store.registered_targets() == {}
