"""A cluster's topology changing mid-sale is not an outage (docs/architecture.md#when-redis-fails).

The pump stalled for every target while its client's default node was down: redis-py's cluster pipeline asked
that node for the keys of every script it sent.
"""

from __future__ import annotations

import time

import pytest
from redis.crc import key_slot

from chalicelib import runtime
from chalicelib.answers import TargetTick
from chalicelib.pump import Pump
from chalicelib.redis_connection import connect
from chalicelib.store import QueueStore
from chalicelib.targets import Target
from tests.support.redis_servers import ValkeyCluster

pytestmark = [pytest.mark.cluster, pytest.mark.faults]

CANDIDATES = [Target(kind, n) for kind in ("limited-drop", "ticketing-event") for n in range(1, 100)]


def slot_of(target: Target, prefix: str) -> int:
    return key_slot(f"{prefix}:{{{target}}}".encode())


@pytest.fixture
def replicated_cluster():
    """3 primaries with a replica each, failing a dead primary over within about 2 s (node timeout 1 s)."""
    nodes = ValkeyCluster(replicas=1, config={"cluster-node-timeout": "1000"})
    yield nodes
    nodes.stop()


def on_cluster(env, cluster: ValkeyCluster, prefix: str, **settings) -> None:
    env(REDIS_URL=cluster.url, VQ_REDIS_CLUSTER="true", VQ_KEY_PREFIX=prefix, **settings)


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
