"""TLS to a cluster, as deployed: a TLS-only redis-server cluster on loopback (Debian's binary, built with TLS),
with certificates made by the test that name a host name and no address, and nodes that announce that name. The
functions' own client settings (connect(), REDIS_URL rediss://, VQ_REDIS_CLUSTER=true, nothing else) queue and
admit across its nodes with hostname verification on; a client pointed at an address, or a cluster announcing
addresses, is refused, and the queue fails open rather than trusting it. The store's suites run over the same
cluster with `pytest --redis-tls-cluster` (`make test-reliability`)."""

import pytest

from chalicelib import runtime
from chalicelib.pump import Pump
from chalicelib.targets import Target

pytestmark = pytest.mark.cluster

TARGETS = [Target("limited-drop", n) for n in range(1, 13)]  # spread over the three nodes' slots


def test_the_deployed_client_settings_queue_and_admit_over_tls_on_every_node(env, tls_cluster):
    env(REDIS_URL=tls_cluster.url, VQ_REDIS_CLUSTER="true", VQ_TICK_MS=100, VQ_BATCH_SIZE=1)
    room = runtime.waiting_room()
    entries = {target: room.enter(target, "1") for target in TARGETS}
    assert {entry.status for entry in entries.values()} == {"WAITING"}  # never DIRECT_ADMITTED (fail-open)
    tickets = {target: entry.queue_ticket for target, entry in entries.items()}

    report = Pump(runtime.store(), runtime.settings()).tick()

    assert report.errors == 0 and sum(result.admitted for result in report.targets.values()) == len(TARGETS)
    assert {room.status(t, "1", tickets[t]).status for t in TARGETS} == {"ADMITTED"}
    client = runtime.store().client
    nodes = {client.get_node_from_key(runtime.store().keys(t).waiting).port for t in TARGETS}
    assert nodes == set(tls_cluster.ports)
    assert {node.host for node in client.get_nodes()} == {tls_cluster.hostname}  # as the nodes announced


def test_a_client_that_names_an_address_the_certificate_does_not_is_refused(env, tls_cluster):
    env(REDIS_URL=f"rediss://127.0.0.1:{tls_cluster.ports[0]}", VQ_REDIS_CLUSTER="true")
    assert runtime.waiting_room().enter(TARGETS[0], "2").status == "DIRECT_ADMITTED"  # fail-open, never trusted


def test_a_cluster_announcing_addresses_fails_verification_so_the_announced_names_matter(env, tls_cluster):
    admins = [tls_cluster.admin(port) for port in tls_cluster.ports]
    for admin in admins:
        admin.config_set("cluster-preferred-endpoint-type", "ip")
    try:
        env(REDIS_URL=tls_cluster.url, VQ_REDIS_CLUSTER="true")
        assert runtime.waiting_room().enter(TARGETS[0], "3").status == "DIRECT_ADMITTED"
    finally:
        for admin in admins:
            admin.config_set("cluster-preferred-endpoint-type", "hostname")
            admin.close()
