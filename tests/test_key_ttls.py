"""Every key the scripts write expires, apart from the operator's `config`: each journey (enter, admit, buy, fail
and restore, leave, evict, pre-queue, draw, forget, a failover's restore, entering an emptied line) runs against a
real Redis and pump, and after each one every key under the test's prefix is checked for a TTL. A key without one
would outlive its queue for good."""

import time

import pytest

from chalicelib import runtime
from chalicelib.pump import Pump
from chalicelib.purchase import PurchaseRequest
from chalicelib.target_config import TargetConfig
from chalicelib.targets import Target
from tests.support.ticks import wait_for_next_tick

DROP = Target("limited-drop", 42)
SHOW = Target("ticketing-event", 7)
RESTOCK = Target("limited-drop", 43)
REFILL, PREVIEW = Target("limited-drop", 44), Target("ticketing-event", 8)


def keys_without_ttl(client, prefix):
    """Every key under `prefix` that never expires, apart from the operators' configurations."""
    return sorted(
        key
        for key in client.scan_iter(match=f"{prefix}:*", count=1000)
        if client.pttl(key) == -1 and not key.endswith(":config")
    )


def buy(gate, token):
    return gate.purchase(
        PurchaseRequest(
            target_type=token.target.type,
            target_id=str(token.target.id),
            entry_token=token.text,
            user_id=str(token.user_id),
            authorizer=None,
            body=b"{}",
            content_type="application/json",
        )
    )


@pytest.fixture
def journey(env, origin, client, prefix):
    """Runs one journey, then checks every key it left behind expires."""
    env(VQ_TICK_MS=100, VQ_BATCH_SIZE=2)
    scanned = []

    def run(name, steps):
        steps()
        scanned.append(name)
        assert keys_without_ttl(client, prefix) == [], f"after {name}"

    yield run
    assert len(scanned) == 11


def tick(times=1):
    pump = Pump(runtime.store(), runtime.settings())
    for _ in range(times):
        pump.tick()
        time.sleep(0.11)  # the next tick (100 ms)
    pump._release()


def test_every_key_the_scripts_write_expires(journey, origin, client):
    room, gate = runtime.waiting_room(), runtime.purchase_gate()
    tickets, tokens = {}, {}

    def enter():
        for user in range(1, 7):
            tickets[user] = room.enter(DROP, str(user)).queue_ticket

    def admit():
        tick()
        for user in (1, 2):
            tokens[user] = room.status(DROP, str(user), tickets[user]).entry_token

    def purchase():
        assert buy(gate, tokens[1]).status == 201

    def fail_and_restore():
        origin.answers = [(500, {})]
        assert buy(gate, tokens[2]).status == 500  # outcome unknown
        assert buy(gate, tokens[2]).status == 201  # the retry
        client.delete(runtime.store().keys(DROP).active)  # as if it had expired with a forgotten queue
        other = runtime.signer().mint_entry_token(DROP, "9", time.time(), 300)
        origin.answers = [(503, {}, {"not_taken": True})]
        assert buy(gate, other).status == 503  # not taken: given back, and `active` is written again

    def leave():
        tick()
        tokens[3] = room.status(DROP, "3", tickets[3]).entry_token
        room.leave(DROP, "3", tickets[3])  # revokes the token
        room.leave(DROP, "4", tickets[4])

    def evict():
        # Users 5 and 6 stopped polling long ago.
        client.zadd(runtime.store().keys(DROP).heartbeat, {"5": 0, "6": 0})
        tick()
        assert room.stats(DROP)["evictedCount"] == 2

    def pre_queue():
        room.configure(SHOW, TargetConfig(opens_at_ms=int(time.time() * 1000) + 3_600_000))
        for user in range(1, 5):
            tickets[SHOW, user] = room.enter(SHOW, str(user)).queue_ticket
        room.leave(SHOW, "4", tickets[SHOW, 4])

    def draw():
        room.configure(SHOW, TargetConfig(opens_at_ms=int(time.time() * 1000) - 1))  # opened early
        tick()  # the opening: the pre-queue becomes the line, the seed is revealed
        assert room.stats(SHOW)["openingDraw"]["placed"] == 3
        tick()
        assert room.status(SHOW, "2", tickets[SHOW, 2]).status in ("WAITING", "ADMITTED")

    def failover_restore():
        # A promoted replica that lagged (docs/failover.md): it holds the line's numbers as they were after the first
        # tick, and none of its places, counters or records. A token given back while maxActive is full stays used
        # (restore.lua), and tickets restore the places lost, admitted or waiting (status.lua).
        store, settings = runtime.store(), runtime.settings()
        keys, pump = store.keys(RESTOCK), Pump(store, settings)
        for user in (1, 2):
            tickets[RESTOCK, user] = room.enter(RESTOCK, str(user)).queue_ticket
        wait_for_next_tick(client, settings.tick_ms)
        pump.tick()  # admits users 1 and 2
        node = {key: (client.dump(key), client.pttl(key)) for key in (keys.tick, keys.mark, keys.seq)}
        token = room.status(RESTOCK, "1", tickets[RESTOCK, 1]).entry_token
        for user in (3, 4, 5):
            tickets[RESTOCK, user] = room.enter(RESTOCK, str(user)).queue_ticket
        room.leave(RESTOCK, "2", tickets[RESTOCK, 2])
        wait_for_next_tick(client, settings.tick_ms)
        pump.tick()  # admits users 3 and 4
        assert room.status(RESTOCK, "3", tickets[RESTOCK, 3]).status == "ADMITTED"
        assert store.consume(token, "purchase", int(time.time() * 1000)) == "FIRST"

        client.delete(keys.waiting, keys.heartbeat, keys.ended, keys.stats, keys.waits)
        for key, (value, ttl) in node.items():
            client.restore(key, ttl, value, replace=True)
        room.configure(RESTOCK, TargetConfig(max_active=1))
        assert store.restore(token, "purchase") is False  # user 3 holds maxActive's room: it stays used
        assert keys_without_ttl(client, store.prefix) == [], "after a token kept used"
        wait_for_next_tick(client, settings.tick_ms)
        assert pump.tick().targets[RESTOCK].fenced != (0, 0)
        assert room.status(RESTOCK, "4", tickets[RESTOCK, 4]).status == "ADMITTED"  # from its ticket
        assert room.status(RESTOCK, "5", tickets[RESTOCK, 5]).status == "WAITING"  # back at its seq
        pump._release()

    def forget():
        for user in (1, 2, 3):
            room.leave(SHOW, str(user), tickets[SHOW, user])
        tick(2)
        assert runtime.store().registered_targets() == {}
        room.leave(DROP, "1", tickets[1])  # a departure after the pump forgot the target

    def enter_an_emptied_line():
        # The line's keys went with its last user (a sorted set without members is no key); the registration is still
        # fresh, so the next newcomer's enter does not slide the keys' TTLs: it must give them one.
        first = room.enter(REFILL, "1").queue_ticket
        tick()
        assert room.status(REFILL, "1", first).status == "ADMITTED"
        assert room.enter(REFILL, "2").status == "WAITING"
        room.configure(PREVIEW, TargetConfig(opens_at_ms=int(time.time() * 1000) + 3_600_000))
        room.leave(PREVIEW, "1", room.enter(PREVIEW, "1").queue_ticket)
        assert room.enter(PREVIEW, "2").status == "PRE_QUEUE"

    for name, steps in [
        ("enter", enter),
        ("admit", admit),
        ("buy", purchase),
        ("fail and restore", fail_and_restore),
        ("leave", leave),
        ("evict", evict),
        ("pre-queue", pre_queue),
        ("draw", draw),
        ("forget", forget),
        ("failover restore", failover_restore),
        ("enter an emptied line", enter_an_emptied_line),
    ]:
        journey(name, steps)
