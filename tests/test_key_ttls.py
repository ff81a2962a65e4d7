"""Every key the scripts write expires, apart from the operator's `config`: each journey (enter, admit, buy, fail
and restore, leave, evict, pre-queue, draw, forget) runs against a real Redis and pump, and after each one every
key under the test's prefix is checked for a TTL. A key without one would outlive its queue for good."""

import time

import pytest

from chalicelib import runtime
from chalicelib.pump import Pump
from chalicelib.purchase import PurchaseRequest
from chalicelib.target_config import TargetConfig
from chalicelib.targets import Target

DROP = Target("limited-drop", 42)
SHOW = Target("ticketing-event", 7)


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
    assert len(scanned) == 9


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

    def forget():
        for user in (1, 2, 3):
            room.leave(SHOW, str(user), tickets[SHOW, user])
        tick(2)
        assert runtime.store().registered_targets() == {}
        room.leave(DROP, "1", tickets[1])  # a departure after the pump forgot the target

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
    ]:
        journey(name, steps)
