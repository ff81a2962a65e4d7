"""A cluster's topology changing mid-sale is not an outage (docs/architecture.md#when-redis-fails).

While virtual users enter, poll, leave and buy through four containers and a pump ticks (tests/support/load.py), a
busy target's slot is migrated (the classic way, as online resharding does, and with Valkey 9's atomic slot
migration), or its primary is killed and the cluster promotes the replica; each for a one-line target and for one
whose line spans 3 sub-lines, one on each node, of which one moves or loses its node (docs/sharding.md).
Throughout: nobody is let in directly (no DIRECT_ADMITTED), no place is lost, nobody is given a second token id,
nothing buys unrecorded, and a target on an untouched node is served without a 503 while the pump keeps admitting
there. The line admits in seq order across its sub-lines at no more than the rate: while one sub-line cannot be
read no plan is made, so the whole line waits for it (a share of the last plan that sub-line missed is the first
thing it admits again); once settled, every tick admits exactly the batch. Also: a moving slot's retry budget and
its 503, and the pump that stalled for every target while its client's default node was down.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections import defaultdict

import pytest
import redis
from redis.crc import key_slot

from chalicelib import runtime
from chalicelib.answers import TargetTick
from chalicelib.errors import QueueUnavailable
from chalicelib.pump import Pump
from chalicelib.queue_keys import QueueKeys, shard_of
from chalicelib.redis_connection import MOVING_BUDGET_S, connect
from chalicelib.store import QueueStore
from chalicelib.target_config import TargetConfig
from chalicelib.targets import Target
from tests.support.load import Load, PumpTick, RecordedPump, between, containers
from tests.support.observed import counted
from tests.support.redis_servers import ValkeyCluster, supports_atomic_migration

pytestmark = [pytest.mark.cluster, pytest.mark.faults]

# A call on a moving slot: the budget and its last attempt (redis-py's own retries, ~0.1 s), with room for a 2-core
# machine shared with the load's threads, the pump and the servers.
CALL_BUDGET_S = MOVING_BUDGET_S + 0.1 + 0.8
CANDIDATES = [Target(kind, n) for kind in ("limited-drop", "ticketing-event") for n in range(1, 100)]
FROM_REDIS = {"WAITING", "ADMITTED"}
TICK_MS, BATCH, CATCHUP_TICKS = 100, 3, 5


def slot_of(target: Target, prefix: str, sub_line: int = 0, shards: int = 1) -> int:
    return key_slot(QueueKeys(prefix, target, sub_line, shards).base.encode())


def target_on(
    cluster: ValkeyCluster, port: int, prefix: str, shards: int = 1, sub_line: int = 0, other_than: Target | None = None
) -> Target:
    """A target (not `other_than`) whose sub-line `sub_line` of `shards` is on `port`: a line of 3 has its sub-lines
    on the 3 nodes (chalicelib/queue_keys.py `sub_line_tag`; tests/test_cluster.py checks it)."""
    return next(
        t for t in CANDIDATES if t != other_than and cluster.owner(slot_of(t, prefix, sub_line, shards)) == port
    )


@pytest.fixture
def cluster():
    """A 3-node cluster of the test's own: the test changes its topology."""
    nodes = ValkeyCluster()
    yield nodes
    nodes.stop()


@pytest.fixture
def replicated_cluster():
    """3 primaries with a replica each, failing a dead primary over within about 2 s (node timeout 1 s)."""
    nodes = ValkeyCluster(replicas=1, config={"cluster-node-timeout": "1000"})
    yield nodes
    nodes.stop()


def on_cluster(env, cluster: ValkeyCluster, prefix: str, **settings) -> None:
    env(REDIS_URL=cluster.url, VQ_REDIS_CLUSTER="true", VQ_KEY_PREFIX=prefix, **settings)


@contextlib.contextmanager
def busy_sale(env, cluster: ValkeyCluster, prefix: str, moving: Target, untouched: Target, shards: int = 1):
    """Four containers, each serving both targets one call at a time, and a pump of its own, under load; the moving
    target configured by its operator to span `shards` sub-lines. The pump's store keeps the events (the
    UserAdmitted of every admission, on the sub-line that made it)."""
    on_cluster(
        env,
        cluster,
        prefix,
        VQ_TICK_MS=TICK_MS,
        VQ_BATCH_SIZE=BATCH,
        VQ_CATCHUP_TICKS=CATCHUP_TICKS,
        VQ_BREAKER_COOLDOWN_MS=300,
    )
    runtime.waiting_room().configure(moving, TargetConfig(shards=shards))
    store = QueueStore(connect(cluster.url, cluster=True), prefix, outbox_cap=100_000)
    pump = RecordedPump(store, runtime.settings())
    load = Load(containers(4), pump, (moving, untouched), threads=4)
    with load:
        time.sleep(1.0)
        yield load
        time.sleep(1.5)  # the moved target serves again


def assert_nobody_past_the_line(load: Load, moving: Target, untouched: Target, began: float, ended: float) -> None:
    """No newcomer let in directly, no place lost, no second token id, nothing bought unrecorded; the untouched
    target served without a 503, its line moving; every call answered within the budget; the moved target serves
    from Redis again."""
    run = load.run
    assert not run.failures, run.failures
    # No 500, and no 503 without Retry-After.
    assert not [c for c in run.calls if c.error], [c for c in run.calls if c.error][:5]
    assert not [c for c in run.calls if c.answer == "DIRECT_ADMITTED"], "a newcomer was let past the line"
    assert not [c for c in run.calls if c.op == "status" and c.answer == "NOT_IN_QUEUE"], "a place was lost"
    token_ids: dict[tuple, set] = defaultdict(set)
    for c in run.calls:
        if c.answer == "ADMITTED":
            token_ids[c.target, c.user].add(c.token_id)
    assert all(len(ids) == 1 for ids in token_ids.values()), "a user was given a second token id"
    assert not any(len(gate.outage) for _, gate in load.containers), "a purchase went through unrecorded"
    assert not [c for c in run.calls if c.target == untouched and c.status >= 500], "the untouched target was refused"
    window = [c for c in between(run.calls, began, max(ended, began + 1.0)) if c.target == untouched]
    assert any(c.answer == "ADMITTED" for c in window), "the pump stopped admitting on the untouched target"
    slow = [c for c in run.calls if c.took > CALL_BUDGET_S]
    assert not slow, f"{len(slow)} calls over {CALL_BUDGET_S} s, e.g. {slow[:3]}"
    after = [c for c in between(run.calls, ended + 0.5, float("inf")) if c.target == moving]
    assert {c.answer for c in after} & FROM_REDIS, "the moved target does not serve again"
    assert not [c for c in after if c.status >= 500], "the moved target still refuses once settled"


def assert_the_other_sub_lines_served(load: Load, moving: Target, shards: int, sub_line: int) -> None:
    """The moving target's users on the sub-lines that stayed put entered, polled, left and bought without a 503
    throughout: only the moving sub-line's users were refused."""
    others = [c for c in load.run.calls if c.target == moving and shard_of(str(c.user), shards) != sub_line]
    assert others, "nobody used the other sub-lines"
    refused = [c for c in others if c.status >= 500]
    assert not refused, f"{len(refused)} calls on sub-lines that did not move were refused, e.g. {refused[:3]}"


def assert_in_order_at_the_rate(load: Load, moving: Target, shards: int, sub_line: int, ended: float) -> None:
    """The moving target's line admitted in seq order across its sub-lines and never above the rate; while its
    sub-line `sub_line` could not be read the whole line waited (but for the shares of a plan made as it stopped
    answering, which the first tick that finished the line again admitted there first); once settled (half a
    second after `ended`), every tick admitted exactly the batch for each tick it covered.

    Judged from the UserAdmitted events each sub-line recorded (a script's server time falls within the pump tick
    that ran it: tests/support/load.py's PumpTick) and, at the end, from what still waits on each sub-line."""
    pump: RecordedPump = load.pump  # type: ignore[assignment]
    client = pump.store.client
    keys = [QueueKeys(pump.store.prefix, moving, i, shards) for i in range(shards)]
    admitted = []  # (server time ms, seq, sub-line)
    for i, k in enumerate(keys):
        for entry_id, fields in client.xrange(k.events):
            if fields["type"] == "UserAdmitted":
                admitted.append((int(entry_id.split("-")[0]), int(fields["seq"]), i))
    ticks = pump.ticks
    spans = [(math.floor(t.started * 1000), math.ceil(t.ended * 1000)) for t in ticks]
    by_tick: list[list[tuple[int, int]]] = [[] for _ in ticks]  # per tick: (seq, sub-line)
    for ms, seq, i in admitted:
        at = next((n for n, (start, end) in enumerate(spans) if start <= ms <= end), None)
        assert at is not None, f"seq {seq} was admitted outside the pump's ticks"
        by_tick[at].append((seq, i))
    assert admitted and len(ticks) > 20, "the line did not move"
    assert {i for _, _, i in admitted} == set(range(shards)), "not every sub-line admitted"

    # In order, the whole line waiting while one sub-line cannot be read: a tick that did not finish the target
    # (its sub-line `sub_line` not answering) may have applied a plan on the other sub-lines, but the ticks after
    # it admit nobody until one finishes the target; whoever a later tick admits below the highest seq admitted so
    # far was left behind, only by a tick that did not finish the target, only on that sub-line, and the first tick
    # that finished it admitted them.
    finished = [isinstance(tick.report.targets.get(moving), TargetTick) for tick in ticks]
    highest = 0
    for n, now in enumerate(by_tick):
        if n and not finished[n - 1] and not finished[n]:
            assert not now, f"tick {n} admitted {now} while a sub-line could not be read"
        highest = max([highest, *(seq for seq, _ in now)])
        behind = {(seq, i) for later in by_tick[n + 1 :] for seq, i in later if seq < highest}
        if behind:
            assert not finished[n], f"tick {n} admitted past {sorted(behind)}"
            assert {i for _, i in behind} == {sub_line}, f"tick {n} left {sorted(behind)} behind"
            resumed = next(m for m in range(n + 1, len(ticks)) if finished[m])
            assert behind <= set(by_tick[resumed]), f"{sorted(behind)} were not the first admitted again"
    # ...and nobody who still waits at the end was passed.
    for k in keys:
        mark = client.get(k.mark) or "0"
        passed = client.zrangebyscore(k.waiting, f"({int(mark)}", highest, withscores=True)
        assert not passed, f"{passed} still wait below the highest seq admitted, {highest}"

    # At the rate: admissions up to each tick at most the batch for every tick since the first that admitted, the
    # ticks numbered as Redis applied them (a tick that did not finish the target counts with the next that did).
    numbers = [tick_applied(tick, moving) for tick in ticks]
    first = next(n for n, now in enumerate(by_tick) if now)
    assert numbers[first] is not None, "the first admissions came from a tick that did not finish the line"
    total = 0
    for n in range(first, len(ticks)):
        total += len(by_tick[n])
        if numbers[n] is not None:
            assert total <= BATCH * (numbers[n] - numbers[first] + 1), f"{total} admitted by tick {numbers[n]}"

    # Settled: every tick finished the target and admitted the batch for each tick it covered.
    settled = [n for n, tick in enumerate(ticks) if tick.started >= ended + 0.5]
    assert len(settled) >= 5, "too few ticks once settled"
    for n in settled:
        now, before = numbers[n], numbers[n - 1]
        assert now is not None and before is not None, ticks[n - 1 : n + 1]
        covered = min(now - before, CATCHUP_TICKS)
        assert len(by_tick[n]) == BATCH * covered, f"tick {n} admitted {len(by_tick[n])} for {covered} ticks"


def tick_applied(tick: PumpTick, target: Target) -> int | None:
    """The Redis tick (its number) the pump's tick applied on `target`'s line; None if it did not finish it."""
    result = tick.report.targets.get(target)
    return result.applied_tick if isinstance(result, TargetTick) else None


@pytest.mark.parametrize(
    ("shards", "sub_line"), [pytest.param(1, 0, id="one-line"), pytest.param(3, 1, id="sub-line-1-of-3")]
)
def test_a_classic_slot_migration_mid_sale_lets_nobody_past_the_line(
    env, origin, cluster, prefix, capsys, shards, sub_line
):
    first, second, third = cluster.ports
    moving = target_on(cluster, first, prefix, shards, sub_line)
    untouched = target_on(cluster, third, prefix, other_than=moving)
    slot = slot_of(moving, prefix, sub_line, shards)
    with busy_sale(env, cluster, prefix, moving, untouched, shards) as load:
        began = time.monotonic()
        cluster.migrate_classic(slot, second, spread_s=3.0)
        ended = time.monotonic()
        ended_at = time.time()
    assert cluster.owner(slot) == second
    run = load.run
    assert_nobody_past_the_line(load, moving, untouched, began, ended)
    assert_in_order_at_the_rate(load, moving, shards, sub_line, ended_at)
    if shards > 1:
        assert_the_other_sub_lines_served(load, moving, shards, sub_line)
    # The window was real: the moving target's scripts were refused (TRYAGAIN), with 503 and Retry-After.
    refused = [c for c in between(run.calls, began, ended) if c.target == moving and c.status == 503]
    assert refused and {c.answer for c in refused} == {"QUEUE_UNAVAILABLE"}
    out = capsys.readouterr().out
    assert counted(out, "RedisSlotMoving") and not counted(out, "DirectAdmitted")
    assert not counted(out, "PumpErrors"), "a moving slot is not a pump fault"


@pytest.mark.parametrize(
    ("shards", "sub_line"), [pytest.param(1, 0, id="one-line"), pytest.param(3, 0, id="sub-line-0-of-3")]
)
def test_an_atomic_slot_migration_mid_sale_lets_nobody_past_the_line(env, origin, cluster, prefix, shards, sub_line):
    first, second, third = cluster.ports
    if not supports_atomic_migration(cluster.admin(first)):
        pytest.skip("the server has no atomic slot migration (CLUSTER MIGRATESLOTS: Valkey 9)")
    moving = target_on(cluster, first, prefix, shards, sub_line)
    untouched = target_on(cluster, third, prefix, other_than=moving)
    slot = slot_of(moving, prefix, sub_line, shards)
    with busy_sale(env, cluster, prefix, moving, untouched, shards) as load:
        began = time.monotonic()
        cluster.migrate_atomic(slot, second)
        ended = time.monotonic()
        ended_at = time.time()
    assert cluster.owner(slot) == second
    assert_nobody_past_the_line(load, moving, untouched, began, ended)
    assert_in_order_at_the_rate(load, moving, shards, sub_line, ended_at)
    if shards > 1:
        assert_the_other_sub_lines_served(load, moving, shards, sub_line)


@pytest.mark.parametrize(
    ("shards", "sub_line"), [pytest.param(1, 0, id="one-line"), pytest.param(3, 2, id="sub-line-2-of-3")]
)
def test_a_primary_killed_mid_sale_and_its_replica_promoted_lets_nobody_past_the_line(
    env, origin, replicated_cluster, shards, sub_line
):
    cluster = replicated_cluster
    # The hardest node to lose: the pump client's default node (redis-py asked it for every script's keys), holding
    # the busy target (its sub-line `sub_line`), the target registry and the pump lock.
    victim = redis.RedisCluster.from_url(cluster.url).get_default_node().port
    prefix = next(
        p
        for p in (f"vqkill{i}" for i in itertools.count())
        if cluster.owner(key_slot(f"{p}:targets".encode())) == victim
        and cluster.owner(key_slot(f"{p}:pump-lock".encode())) == victim
    )
    moving = target_on(cluster, victim, prefix, shards, sub_line)
    untouched = target_on(cluster, next(p for p in cluster.ports if p != victim), prefix, other_than=moving)
    replica = cluster.replica_of(victim)
    with busy_sale(env, cluster, prefix, moving, untouched, shards) as load:
        assert load.pump.store.client.get_default_node().port == victim
        began = time.monotonic()
        cluster.kill(victim)
        cluster.wait_promoted(replica)
        ended = time.monotonic()
        ended_at = time.time()
    assert_nobody_past_the_line(load, moving, untouched, began, ended)
    assert_in_order_at_the_rate(load, moving, shards, sub_line, ended_at)
    if shards > 1:
        assert_the_other_sub_lines_served(load, moving, shards, sub_line)


def test_the_pump_ticks_the_live_nodes_while_its_clients_default_node_is_down(env, replicated_cluster, prefix):
    """Reproduces the stall: redis-py's cluster pipeline asked its default node for the keys of every script it
    sent (COMMAND GETKEYS), so with that node down no target ticked, on any node, until the client changed its
    default node (12.5 s after a promotion, once)."""
    cluster = replicated_cluster
    on_cluster(env, cluster, prefix, VQ_TICK_MS=100, VQ_BATCH_SIZE=1)
    room = runtime.waiting_room()
    targets = CANDIDATES[:12]
    for target in targets:
        for user in range(100):
            room.enter(target, str(user))
    pump = Pump(QueueStore(connect(cluster.url, cluster=True), prefix), runtime.settings())
    assert pump.tick().errors == 0
    victim = pump.store.client.get_default_node().port
    live = [t for t in targets if cluster.owner(slot_of(t, prefix)) != victim]
    on_victim = [t for t in targets if t not in live]
    assert live and on_victim
    replica = cluster.replica_of(victim)

    cluster.kill(victim)
    ticks = []  # (seconds after the kill, the targets the tick admitted on)
    killed = time.monotonic()
    while not cluster._promoted(replica):
        ticks.append((time.monotonic() - killed, admitted_on(pump.tick())))
        time.sleep(0.1)
    promoted = time.monotonic() - killed
    while time.monotonic() - killed < promoted + 2.0:
        ticks.append((time.monotonic() - killed, admitted_on(pump.tick())))
        time.sleep(0.1)

    down = [admitted for at, admitted in ticks if at < promoted]
    assert len(down) >= 5, "the node was down for a few ticks"
    # Every live target ticked nearly every tick (a CLUSTERDOWN as the node is marked failed may cost one or two).
    assert sum(set(live) <= admitted for admitted in down) >= len(down) - 2, down
    first_whole = next(at for at, admitted in ticks if at >= promoted and set(on_victim) <= admitted)
    assert first_whole - promoted < 1.0, "the promoted node's targets tick again at once"


def admitted_on(report) -> set[Target]:
    return {t for t, result in report.targets.items() if isinstance(result, TargetTick) and result.admitted}


def test_a_moving_slot_is_retried_within_the_budget_then_refused_with_retry_after(env, cluster, prefix, capsys):
    first, second, third = cluster.ports
    moving, untouched = target_on(cluster, first, prefix), target_on(cluster, third, prefix)
    on_cluster(env, cluster, prefix, VQ_BREAKER_FAILURES=1)
    room = runtime.waiting_room()
    ticket = room.enter(moving, "1").queue_ticket
    source, destination = cluster.admin(first), cluster.admin(second)
    slot = slot_of(moving, prefix)
    # The slot migrating, none of its keys moved yet: every script with a key absent on purpose (a token not yet
    # issued) answers TRYAGAIN, as it does from the moment a classic migration begins.
    destination.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(first))
    source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(second))
    try:
        for call in (lambda: room.enter(moving, "2"), lambda: room.status(moving, "1", ticket)):
            started = time.monotonic()
            with pytest.raises(QueueUnavailable) as refused:
                call()
            took = time.monotonic() - started
            assert refused.value.headers["Retry-After"]
            assert MOVING_BUDGET_S <= took < CALL_BUDGET_S, took
        # Its breaker (one failure opens it) counted nothing, and another node's target queues as ever.
        assert runtime.store().breaker_of(moving).current_state == "closed"
        assert room.enter(untouched, "3").status == "WAITING"
    finally:
        for node in (source, destination):
            node.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
    assert room.enter(moving, "2").status == "WAITING"
    out = capsys.readouterr().out
    assert len(counted(out, "RedisSlotMoving")) == 2
    assert not counted(out, "RedisDegraded") and not counted(out, "DirectAdmitted")
