"""The pump on a sharded line (docs/sharding.md) against a real Redis: one batch a tick across the sub-lines in one seq
order under concurrent pumps and arrivals, a plan a dead pump left half applied, the merged /line against the
brute-force truth, holds and maxActive over all sub-lines, and a store that learns a line's sub-lines."""

import bisect
import dataclasses
import json
import random
import threading
import time
from collections import defaultdict

import pytest

from chalicelib import opening, runtime
from chalicelib.answers import TargetTick
from chalicelib.pump import STOP_BEFORE_DEADLINE_MS, Pump
from chalicelib.queue_keys import QueueKeys, shard_of
from chalicelib.scripts import run_pipelined
from chalicelib.sharding import Plan, front_of, plan_of
from chalicelib.store import QueueStore
from chalicelib.target_config import TargetConfig
from chalicelib.targets import Target
from tests.support.ticks import server_ms, wait_for_next_tick

DROP = Target("limited-drop", 42)
SHOW = Target("ticketing-event", 8)
SHARDS = 3


def open_line(store, target, config):
    """Open `target` with `config` as an operator does: every sub-line its configuration, and registered."""
    store.configure(target, config, int(time.time() * 1000), fresh_seed=opening.new_seed())


def enter_all(store, users, target=DROP):
    room = runtime.waiting_room()
    for user in users:
        now = time.time()
        terms = room.signer.grant_terms(target, str(user), now, 60)
        store.enter(target, str(user), int(now * 1000), terms, room.defaults)


def sub_line_keys(store, target=DROP):
    return [QueueKeys(store.prefix, target, shard, SHARDS) for shard in range(SHARDS)]


def places(client, store):
    """Every user in line: seq -> (sub-line, admitted), admitted being at or below their own sub-line's mark."""
    found = {}
    for shard, k in enumerate(sub_line_keys(store)):
        mark = int(client.get(k.mark) or 0)
        for _, seq in client.zrange(k.waiting, 0, -1, withscores=True):
            found[int(seq)] = (shard, int(seq) <= mark)
    return found


def assert_one_order(client, store):
    """Admissions follow seq across the sub-lines: nobody waits unadmitted below the highest seq admitted."""
    line = places(client, store)
    admitted = [seq for seq, (_, done) in line.items() if done]
    passed_over = [seq for seq, (_, done) in line.items() if not done and seq < max(admitted)]
    assert not passed_over, f"{len(passed_over)} users were passed over"
    return sorted(admitted)


def only(report, target=DROP) -> TargetTick:
    result = report.targets[target]
    assert isinstance(result, TargetTick), result
    return result


def stay_clear_of_tick_boundary(client, tick_ms, margin_ms=5000):
    """With long ticks, make sure the next calls all fall in one tick."""
    if tick_ms - server_ms(client) % tick_ms < margin_ms:
        wait_for_next_tick(client, tick_ms)


class Unlocked(Pump):
    """A pump whose lease lapsed under it, ticking on as if it held the lock: only Redis keeps one plan a tick."""

    def _hold_lock(self):
        return True

    def _release(self):
        pass


@pytest.mark.slow
def test_eight_pumps_and_arrivals_admit_one_batch_a_tick_across_the_sub_lines_in_one_seq_order(
    env, connect_redis, client, store
):
    batch, tick_ms = 7, 100
    env(VQ_TICK_MS=tick_ms, VQ_BATCH_SIZE=batch, VQ_CATCHUP_TICKS=20)
    settings = runtime.settings()
    open_line(store, DROP, TargetConfig(shards=SHARDS, batch=batch, tick_ms=tick_ms))
    enter_all(store, range(600))
    deadline = time.monotonic() + 3.0
    failures, results = [], []

    class Stuttering(QueueStore):
        """Now and then late to its tick: it overlaps the next pump's, or finds its tick's plan recorded."""

        rng = random.Random()

        def admit_and_evict_all(self, targets, rules, seen=None):
            if self.rng.random() < 0.3:
                time.sleep(self.rng.uniform(0, 0.15))
            answer = super().admit_and_evict_all(targets, rules, seen)
            results.extend(answer.values())
            return answer

    def one_pump():
        try:
            Unlocked(Stuttering(connect_redis(), store.prefix), settings).run(
                remaining_ms=lambda: (deadline - time.monotonic()) * 1000 + STOP_BEFORE_DEADLINE_MS
            )
        except BaseException as err:  # noqa: BLE001 (a thread's failure must reach the test)
            failures.append(err)

    def arrivals(users):
        try:
            enter_all(QueueStore(connect_redis(), store.prefix), users)
        except BaseException as err:  # noqa: BLE001
            failures.append(err)

    threads = [threading.Thread(target=one_pump) for _ in range(8)]
    threads += [threading.Thread(target=arrivals, args=(range(start, 3000, 2),)) for start in (600, 601)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not failures
    assert results and all(isinstance(r, TargetTick) for r in results)
    # Each sub-line notes every tick it applied that left users waiting (all of them, here): tick:admitted:covered.
    per_tick = defaultdict(list)
    for k in sub_line_keys(store):
        noted = [entry.split(":") for entry in client.lrange(k.admissions, 0, -1)]
        ticks = [int(tick) for tick, _, _ in noted]
        assert len(ticks) == len(set(ticks)), "a sub-line applied a tick twice"
        for tick, admitted, covered in noted:
            per_tick[int(tick)].append((int(admitted), int(covered)))
    assert len(per_tick) > 20
    for tick, shares in per_tick.items():
        assert len(shares) == SHARDS, f"tick {tick} was not applied on every sub-line"
        covered = {c for _, c in shares}
        assert len(covered) == 1
        assert sum(a for a, _ in shares) == batch * covered.pop(), f"tick {tick} admitted {shares}"
    admitted = assert_one_order(client, store)
    counted = sum(int(client.hget(k.stats, "admitted")) for k in sub_line_keys(store))
    assert counted == len(admitted) == sum(r.admitted for r in results)
    # The plan's cutoff is the line's mark.
    assert json.loads(client.get(store.keys(DROP).line))["mark"] == str(admitted[-1])
    # Concurrent pumps really overlapped: some found their tick applied already.
    assert any(r.applied_tick is None for r in results)


def front_calls_and_plan(store, rules):
    """What a pump reads and plans at the start of a sharded tick."""
    replies = run_pipelined(store.client, store._front_calls(DROP, SHARDS, rules))
    reads = [store._front.read(r) for r in (replies[2], replies[4], replies[6])]
    fronts = [front_of(read) for read in reads]
    return plan_of(fronts, Plan.recorded(reads[0].plan), rules.catchup_ticks)


def test_a_plan_a_dead_pump_applied_to_one_sub_line_is_finished_by_the_next_tick(env, client, store):
    batch, tick_ms = 30, 1000
    env(VQ_TICK_MS=tick_ms, VQ_BATCH_SIZE=batch)
    open_line(store, DROP, TargetConfig(shards=SHARDS, batch=batch, tick_ms=tick_ms))
    enter_all(store, range(300))
    pump = Pump(store, runtime.settings())
    wait_for_next_tick(client, tick_ms)
    assert only(pump.tick()).admitted == batch
    marks = [int(client.get(k.mark)) for k in sub_line_keys(store)]

    # The next tick's pump records its plan and applies it to sub-line 0, then dies.
    wait_for_next_tick(client, tick_ms)
    plan = front_calls_and_plan(store, pump.rules)
    assert sum(plan.shares) == batch and all(plan.shares), plan
    store._plan(plan=store.keys(DROP).plan, **plan.args(), idle_ttl_ms=pump.rules.idle_ttl_ms)
    call = store._admit_call(sub_line_keys(store)[0], pump.rules, (0, 0), SHARDS, plan, 0)
    assert call.script.run(call.keys, call.args)[1] == plan.shares[0]
    assert [int(client.get(k.mark)) for k in sub_line_keys(store)][1:] == marks[1:]

    wait_for_next_tick(client, tick_ms)
    result = only(pump.tick())
    # The rest of the dead pump's plan, then this tick's.
    assert result.admitted == plan.shares[1] + plan.shares[2] + batch
    assert len(assert_one_order(client, store)) == 3 * batch
    assert json.loads(client.get(store.keys(DROP).line))["mark"] == str(result.mark)


def test_a_tick_applies_the_one_plan_recorded_first_for_it(env, client, store):
    batch, tick_ms = 30, 60_000
    env(VQ_TICK_MS=tick_ms, VQ_BATCH_SIZE=batch)
    open_line(store, DROP, TargetConfig(shards=SHARDS, batch=batch, tick_ms=tick_ms))
    enter_all(store, range(300))
    pump = Pump(store, runtime.settings())
    stay_clear_of_tick_boundary(client, tick_ms)
    plan = front_calls_and_plan(store, pump.rules)
    # Another pump recorded its plan for this tick first: one that reached sub-line 0 alone (say).
    first = dataclasses.replace(plan, shares=(plan.shares[0], 0, 0), throughs=(plan.throughs[0], 0, 0))
    recorded = store._plan(plan=store.keys(DROP).plan, **first.args(), idle_ttl_ms=pump.rules.idle_ttl_ms)
    assert Plan.recorded(recorded) == first
    # Recording again for the same tick, or an earlier one, records nothing and answers the first.
    for later in (plan, dataclasses.replace(plan, tick_ms=plan.tick_ms - tick_ms)):
        assert Plan.recorded(store._plan(plan=store.keys(DROP).plan, **later.args(), idle_ttl_ms=1000)) == first

    result = only(pump.tick())
    assert result.admitted == plan.shares[0]
    assert [int(client.get(k.tick)) for k in sub_line_keys(store)] == [plan.tick_ms] * SHARDS


def test_a_sub_line_that_lost_writes_to_a_failover_is_fenced_on_its_own(env, client, store):
    batch, tick_ms = 30, 1000
    env(VQ_TICK_MS=tick_ms, VQ_BATCH_SIZE=batch)
    open_line(store, DROP, TargetConfig(shards=SHARDS, batch=batch, tick_ms=tick_ms))
    enter_all(store, range(300))
    pump = Pump(store, runtime.settings())
    lagging = sub_line_keys(store)[1]
    wait_for_next_tick(client, tick_ms)
    only(pump.tick())
    before = {key: client.dump(key) for key in (lagging.mark, lagging.tick)}
    wait_for_next_tick(client, tick_ms)
    only(pump.tick())
    seen = pump.seen[(DROP, 1)]

    # Sub-line 1's node fails over to a replica that lagged a tick: its mark and tick go back.
    for key, value in before.items():
        client.restore(key, 0, value, replace=True)
    wait_for_next_tick(client, tick_ms)
    result = only(pump.tick())
    assert result.fenced is not None
    # Back to what the pump saw there, then on: nobody admitted twice, nobody passed over, the batch a tick.
    assert int(client.get(lagging.mark)) >= seen[1]
    assert result.admitted == batch
    assert len(assert_one_order(client, store)) == 3 * batch


def test_the_merged_line_places_everyone_within_one_percent_of_the_line(env, client, store):
    batch, tick_ms = 50, 60_000
    env(VQ_TICK_MS=tick_ms, VQ_BATCH_SIZE=batch)
    open_line(store, DROP, TargetConfig(shards=SHARDS, batch=batch, tick_ms=tick_ms))
    open_line(store, SHOW, TargetConfig(batch=batch, tick_ms=tick_ms))
    # Uneven sub-lines, in random order of arrival: each sub-line's points are far apart in the others' seqs.
    users = [user for user in range(6000) if shard_of(str(user), SHARDS) == 0][:1800]
    users += [user for user in range(6000) if shard_of(str(user), SHARDS) == 1][:700]
    users += [user for user in range(6000) if shard_of(str(user), SHARDS) == 2][:250]
    random.Random(7).shuffle(users)
    enter_all(store, users)
    enter_all(store, range(100), SHOW)
    Pump(store, runtime.settings()).tick()

    waiting = sorted(seq for seq, (_, done) in places(client, store).items() if not done)
    stored = client.get(store.keys(DROP).line)
    line = json.loads(stored)
    assert line["waitingCount"] == len(waiting) == len(users) - batch
    assert line["state"] == "OPEN"
    assert line["mark"] == str(assert_one_order(client, store)[-1])
    assert 90 <= len(line["shape"]) <= 110
    assert line["shape"][0] == [str(waiting[0]), 0]
    assert line["shape"][-1] == [str(waiting[-1]), len(waiting) - 1]
    for seq, ahead in line["shape"]:
        truth = bisect.bisect_left(waiting, int(seq))
        assert abs(ahead - truth) <= len(waiting) / 100, (seq, ahead, truth)
    # The /line answer's format: a one-line target's, field for field, in the same order and spelling.
    one_line = client.get(store.keys(SHOW).line)
    assert list(json.loads(one_line)) == list(line)
    assert '"ratePerSec":0.833,' in one_line
    # The rate is the sum of the sub-lines' (each their share of the batch a minute), each rounded to 0.001.
    assert abs(line["ratePerSec"] - batch / 60) <= 0.002
    assert f'"ratePerSec":{line["ratePerSec"]:.3f},' in stored


def test_a_hold_on_any_sub_line_and_max_active_hold_the_whole_line(env, client, store):
    batch, tick_ms = 7, 1000
    env(VQ_TICK_MS=tick_ms, VQ_BATCH_SIZE=batch)
    open_line(store, DROP, TargetConfig(shards=SHARDS, batch=batch, tick_ms=tick_ms, paused=True))
    enter_all(store, range(400))
    pump = Pump(store, runtime.settings())

    wait_for_next_tick(client, tick_ms)
    paused = only(pump.tick())
    assert (paused.admitted, paused.paused, paused.per_tick) == (0, True, 0.0)
    assert json.loads(client.get(store.keys(DROP).line))["state"] == "PAUSED"

    open_line(store, DROP, TargetConfig(shards=SHARDS, batch=batch, tick_ms=tick_ms, max_active=10))
    admitted = []
    for _ in range(3):
        wait_for_next_tick(client, tick_ms)
        admitted.append(only(pump.tick()).admitted)
    # Nobody collects a token: ten admitted users fill the room, across the sub-lines.
    assert admitted == [7, 3, 0]
    assert len(assert_one_order(client, store)) == 10

    open_line(store, DROP, TargetConfig(shards=SHARDS, batch=batch, tick_ms=tick_ms))
    # A purchase on sub-line 2 hears the shop sell out (observe_purchase.lua marks the buyer's sub-line).
    client.hset(sub_line_keys(store)[2].config, "sold_out", "1")
    wait_for_next_tick(client, tick_ms)
    sold_out = only(pump.tick())
    assert (sold_out.admitted, sold_out.sold_out) == (0, True)
    assert [client.hget(k.config, "sold_out") for k in sub_line_keys(store)] == ["1"] * SHARDS
    assert json.loads(client.get(store.keys(DROP).line))["state"] == "SOLD_OUT"


def test_no_sub_line_admits_until_every_sub_line_has_opened(env, client, store):
    batch, tick_ms = 30, 1000
    env(VQ_TICK_MS=tick_ms, VQ_BATCH_SIZE=batch)
    opens_at = server_ms(client) + 1500
    config = TargetConfig(shards=SHARDS, batch=batch, tick_ms=tick_ms, opens_at_ms=opens_at)
    open_line(store, DROP, config)
    enter_all(store, range(150))
    assert all(client.zcard(k.prequeue) > 0 for k in sub_line_keys(store))
    pump = Pump(store, runtime.settings())
    time.sleep(max(0, opens_at - server_ms(client)) / 1000)

    wait_for_next_tick(client, tick_ms)
    opening = only(pump.tick())
    # Every sub-line moved its pre-queue into its line this tick: nobody was admitted while any was still moving.
    assert (opening.admitted, opening.needs_draw, opening.waiting) == (0, True, 150)
    assert all(client.zcard(k.prequeue) == 0 for k in sub_line_keys(store))

    wait_for_next_tick(client, tick_ms)
    opened = only(pump.tick())
    assert (opened.admitted, opened.needs_draw) == (batch, False)
    assert len(assert_one_order(client, store)) == batch
    assert json.loads(client.get(store.keys(DROP).line))["state"] == "OPEN"


def test_a_store_learns_a_line_s_sub_lines_at_its_first_tick_and_ticks_one_line_targets_as_before(env, client, store):
    batch, tick_ms = 5, 60_000
    env(VQ_TICK_MS=tick_ms, VQ_BATCH_SIZE=batch)
    open_line(store, DROP, TargetConfig(shards=SHARDS, batch=batch, tick_ms=tick_ms))
    open_line(store, SHOW, TargetConfig(batch=batch, tick_ms=tick_ms))
    enter_all(store, range(60))
    enter_all(store, range(20), SHOW)
    pump = Pump(store, runtime.settings())

    report = pump.tick()
    sharded, single = only(report), only(report, SHOW)
    assert (sharded.shards, sharded.admitted, sharded.waiting) == (SHARDS, batch, 60 - batch)
    assert (single.shards, single.admitted, single.waiting, single.sub_lines) == (1, batch, 15, ())
    assert json.loads(client.get(store.keys(DROP).line))["waitingCount"] == 60 - batch
    # The pump saw each sub-line's own tick and mark: what the failover fence compares.
    for shard, k in enumerate(sub_line_keys(store)):
        seen = pump.seen[DROP if shard == 0 else (DROP, shard)]
        assert seen == (int(client.get(k.tick)), int(client.get(k.mark) or 0))
    # Within the same tick, nothing more: the plan is applied.
    again = only(pump.tick())
    assert (again.applied_tick, again.admitted) == (None, 0)
