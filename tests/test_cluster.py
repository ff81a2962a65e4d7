"""Cluster mode: every operation on many targets spread over the slots of a 3-node Valkey cluster, through
redis-py's RedisCluster, never crossing a slot; and the fail-open answers when cluster nodes fail.

The rest of the store's suite runs against the same cluster with `pytest --redis-cluster` (see the Makefile).
"""

import logging
import os
import signal
import time

import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import RedisClusterException

from chalicelib import runtime
from chalicelib.answers import TargetTick
from chalicelib.config import load_settings
from chalicelib.errors import EntryTokenUsed, QueueUnavailable
from chalicelib.pump import Pump
from chalicelib.purchase import PurchaseGate, PurchaseRequest
from chalicelib.queue import WaitingRoom
from chalicelib.queue_keys import shard_of
from chalicelib.redis_connection import Breakers, connect
from chalicelib.store import QueueStore
from chalicelib.target_config import TargetConfig
from chalicelib.targets import Target
from chalicelib.tokens import TokenSigner
from infra.local.stack import free_port
from tests.support.redis_servers import ValkeyCluster

pytestmark = pytest.mark.cluster

# Enough targets that every node holds several of them.
TARGETS = [Target("limited-drop", n) for n in range(1, 31)] + [Target("ticketing-event", n) for n in range(1, 31)]
USERS = (1, 2, 3)


class Parts:
    """The waiting room, purchase gate and pump over one RedisCluster client, built the way runtime.py builds them."""

    def __init__(self, url, prefix, settings, breakers=None):
        self.client = connect(url, cluster=True)
        self.store = QueueStore(self.client, prefix, breakers)
        signer = TokenSigner(settings.keyring)
        self.room = WaitingRoom(self.store, signer, settings, runtime.switch())
        self.gate = PurchaseGate(self.store, signer, settings, runtime.switch())
        self.pump = Pump(self.store, settings)


@pytest.fixture
def on_cluster(valkey_cluster, env, origin, prefix):
    env(VQ_TICK_MS=100, VQ_BATCH_SIZE=2)
    parts = Parts(valkey_cluster.url, prefix, load_settings())
    yield parts
    keys = list(parts.client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        parts.client.delete(*keys)


@pytest.fixture
def redis_errors(caplog):
    """Everything redis-py and the app logged at WARNING or above (a CROSSSLOT would show here)."""
    caplog.set_level(logging.WARNING)
    return lambda: [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def purchase(gate, token, target):
    return gate.purchase(
        PurchaseRequest(
            target_type=target.type,
            target_id=str(target.id),
            entry_token=token.text,
            user_id=str(token.user_id),
            authorizer=None,
            body=b'{"sku":"x"}',
            content_type="application/json",
        )
    )


def nodes_of(client, keys):
    return {client.nodes_manager.get_node_from_slot(key_slot(key.encode())).port for key in keys}


def test_the_targets_spread_over_all_three_nodes(on_cluster, valkey_cluster):
    keys = [on_cluster.store.keys(target).waiting for target in TARGETS]
    assert nodes_of(on_cluster.client, keys) == set(valkey_cluster.ports)
    assert len({key_slot(key.encode()) for key in keys}) == len(TARGETS)


def test_every_operation_on_many_targets_stays_in_one_slot(on_cluster, origin, capsys, redis_errors):
    room, gate, store = on_cluster.room, on_cluster.gate, on_cluster.store
    tickets = {}
    for target in TARGETS:
        for user in USERS:
            entry = room.enter(target, str(user))
            assert entry.status == "WAITING", (target, entry)  # a CROSSSLOT would fail open: DIRECT_ADMITTED
            tickets[target, user] = entry.queue_ticket
        assert room.status(target, "3", tickets[target, 3]).position == 3
        room.leave(target, "2", tickets[target, 2])
        assert room.stats(target)["waitingCount"] == 2
    assert set(store.registered_targets()) == set(TARGETS)

    report = on_cluster.pump.tick()  # lock, registry, one pipeline over the three nodes
    assert report.held_lock and report.errors == 0
    assert set(report.targets) == set(TARGETS)
    assert all(isinstance(result, TargetTick) and result.admitted == 2 for result in report.targets.values())

    for target in TARGETS:
        admitted = room.status(target, "1", tickets[target, 1])
        assert admitted.status == "ADMITTED"
        assert room.status(target, "3", tickets[target, 3]).status == "ADMITTED"  # user 2 left: no slot wasted
        token = admitted.entry_token
        origin.answers = [(503, {"error": "try again"})]
        assert purchase(gate, token, target).status == 503  # consumed, then restored
        assert purchase(gate, token, target).status == 201
        with pytest.raises(EntryTokenUsed):
            purchase(gate, token, target)
        assert room.stats(target)["admittedCount"] == 2

    assert all(store.breaker_of(t).fail_counter == 0 for t in TARGETS), "a Redis call failed (and failed open)"
    assert '"RedisDegraded"' not in capsys.readouterr().out
    assert not [line for line in redis_errors() if "CROSSSLOT" in line.upper()]


def test_idle_targets_are_forgotten_through_the_cluster_pipeline(on_cluster):
    room, store = on_cluster.room, on_cluster.store
    for target in TARGETS[:10]:
        room.leave(target, "1", room.enter(target, "1").queue_ticket)
    report = on_cluster.pump.tick()
    assert report.errors == 0 and all(report.targets[t].idle for t in TARGETS[:10])
    assert store.registered_targets() == {}


def test_the_pump_reloads_scripts_every_node_lost(on_cluster):
    room = on_cluster.room
    for target in TARGETS:
        room.enter(target, "1")
    on_cluster.client.script_flush()  # on every primary, as after a restart or failover
    report = on_cluster.pump.tick()
    assert report.errors == 0 and sum(result.admitted for result in report.targets.values()) == len(TARGETS)
    assert room.enter(TARGETS[0], "2").status == "WAITING"  # the client-facing scripts reload too


def test_a_script_given_keys_of_two_targets_is_refused(on_cluster):
    """The control: the cluster does refuse a script whose keys span two slots, so the tests above would see one."""
    store = on_cluster.store
    two = [store.keys(TARGETS[0]).waiting, store.keys(TARGETS[1]).waiting]
    assert key_slot(two[0].encode()) != key_slot(two[1].encode())
    with pytest.raises((RedisClusterException, redis.ResponseError)):
        on_cluster.client.eval("return redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])", 2, *two)


# --- nodes failing: the same fail-open promise as on one server ---


@pytest.fixture
def own_cluster():
    cluster = ValkeyCluster()
    yield cluster
    cluster.stop()


def test_an_unreachable_cluster_at_cold_start_fails_open(env):
    settings = load_settings()
    breakers = Breakers(fail_max=3, reset_timeout=0.3, per_slot=True)
    # A Lambda container starting while the cluster is down: building the client must not need the cluster.
    parts = Parts(f"redis://127.0.0.1:{free_port()}", "cold", settings, breakers)
    started = time.monotonic()
    entry = parts.room.enter(TARGETS[0], "1")
    assert entry.status == "DIRECT_ADMITTED" and time.monotonic() - started < 2.0
    assert parts.pump.tick().errors == 1  # the pump counts the failure and goes on


def test_a_cluster_that_hangs_at_cold_start_fails_open_and_queueing_starts_once_it_answers(own_cluster, env):
    for server in own_cluster.servers:
        os.kill(server._process.pid, signal.SIGSTOP)
    try:
        parts = Parts(own_cluster.url, "hung", load_settings(), Breakers(fail_max=3, reset_timeout=0.3, per_slot=True))
        started = time.monotonic()
        assert parts.room.enter(TARGETS[0], "1").status == "DIRECT_ADMITTED"
        assert time.monotonic() - started < 2.0
        assert parts.pump.tick().errors == 1
    finally:
        for server in own_cluster.servers:
            os.kill(server._process.pid, signal.SIGCONT)
    time.sleep(0.4)  # the breaker's cool-down
    assert parts.room.enter(TARGETS[0], "2").status == "WAITING"
    assert parts.pump.tick().errors == 0


def test_a_paused_node_fails_open_for_its_targets_alone_and_the_cluster_resumes(own_cluster, env):
    """A node without a replica that stops answering is down for its targets, which fail open; the breakers are
    per slot, so its targets' open breakers fail no other node's target open."""
    settings = load_settings()
    parts = Parts(own_cluster.url, "paused", settings, Breakers(fail_max=3, reset_timeout=0.3, per_slot=True))
    room = parts.room
    tickets = {target: room.enter(target, "1").queue_ticket for target in TARGETS}
    victim = own_cluster.servers[1]
    on_victim = [t for t in TARGETS if nodes_of(parts.client, [parts.store.keys(t).waiting]) == {victim.port}]
    elsewhere = [t for t in TARGETS if t not in on_victim]
    assert on_victim

    os.kill(victim._process.pid, signal.SIGSTOP)
    try:
        for target in on_victim[:5]:
            started = time.monotonic()
            assert room.enter(target, "2").status == "DIRECT_ADMITTED"
            # A ticket holder this container never saw polling cannot be reckoned: told to poll again, not let in.
            with pytest.raises(QueueUnavailable):
                room.status(target, "1", tickets[target])
            assert time.monotonic() - started < 2.0
        room.enter(on_victim[0], "3")  # its third failure in a row
        assert parts.store.breaker_of(on_victim[0]).current_state == "open"
        assert {room.enter(target, "2").status for target in elsewhere} == {"WAITING"}
    finally:
        os.kill(victim._process.pid, signal.SIGCONT)

    deadline = time.monotonic() + 10
    while True:
        try:
            if room.status(on_victim[0], "1", tickets[on_victim[0]]).status == "WAITING":
                break
        except QueueUnavailable:
            pass  # the breaker's cool-down
        assert time.monotonic() < deadline, "the cluster client did not resume"
        time.sleep(0.1)
    assert all(room.status(t, "1", tickets[t]).position == 1 for t in TARGETS)


def test_every_target_s_three_sub_lines_lie_on_the_three_nodes(on_cluster):
    # The slots are split evenly over the three nodes: each sub-line's tag is chosen in a third of its own.
    for target in TARGETS[:30]:
        sub_lines = [on_cluster.store.keys(target, shard, 3).waiting for shard in range(3)]
        assert len(nodes_of(on_cluster.client, sub_lines)) == 3, target


def test_a_sharded_line_s_users_land_on_different_nodes_and_each_call_touches_one_slot(on_cluster, origin):
    room, gate, store = on_cluster.room, on_cluster.gate, on_cluster.store
    target = TARGETS[0]
    room.configure(target, TargetConfig(shards=3))
    slots_touched = []
    for script in (store._enter, store._status, store._leave, store._consume, store._restore, store._observe_purchase):
        run = script.run
        script.run = lambda keys, args, run=run: (
            slots_touched.append({key_slot(k.encode()) for k in keys}) or run(keys, args)
        )
    users = [f"spread-{n}" for n in range(12)]
    tickets = {user: room.enter(target, user).queue_ticket for user in users}
    assert all(tickets.values())  # a CROSSSLOT would have failed open: no ticket
    homes = {u: nodes_of(on_cluster.client, [store.keys(target, shard_of(u, 3), 3).waiting]).pop() for u in users}
    assert len(set(homes.values())) == 3
    assert all(room.status(target, user, tickets[user]).status == "WAITING" for user in users)
    room.leave(target, users[0], tickets[users[0]])
    buyer = users[1]
    k = store.keys(target, shard_of(buyer, 3), 3)
    on_cluster.client.set(k.mark, int(on_cluster.client.zscore(k.waiting, buyer)))
    token = room.status(target, buyer, tickets[buyer]).entry_token
    assert purchase(gate, token, target).status == 201
    assert room.stats(target)["waitingCount"] == len(users) - 2
    assert slots_touched and all(len(slots) == 1 for slots in slots_touched)
