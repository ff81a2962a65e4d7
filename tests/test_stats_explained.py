"""Stats that explain themselves: the line's state as operators name it, the shop's recent window named with its
length, and how many waits the wait figures are made of."""

import time

from chalicelib.pump import Pump
from chalicelib.target_config import TargetConfig
from chalicelib.targets import Target

DROP = Target("limited-drop", 42)


def tick(room):
    Pump(room.store, room.settings).run(ticks=1)


def test_a_line_is_idle_then_waiting_until_the_pump_ticks_then_admitting(room):
    room.configure(DROP, TargetConfig(batch=1, tick_ms=1000))
    assert room.stats(DROP)["state"] == "IDLE"
    for user in (1, 2):
        room.enter(DROP, str(user))
    assert room.stats(DROP)["state"] == "WAITING"  # no tick has ever been applied: the pump is not running
    tick(room)
    assert room.stats(DROP)["state"] == "ADMITTING"
    # No tick for longer than three tick lengths and 10 s: the line is not moving.
    now = time.time()
    room.clock = lambda: now + 11
    assert room.stats(DROP)["state"] == "WAITING"


def test_the_operators_settings_name_the_state_first(room):
    now_ms = int(time.time() * 1000)
    room.enter(DROP, "1")
    for config, state in [
        (TargetConfig(sold_out=True, paused=True), "SOLD_OUT"),
        (TargetConfig(paused=True), "PAUSED"),
        (TargetConfig(opens_at_ms=now_ms + 3_600_000), "SCHEDULED"),
        (TargetConfig(closes_at_ms=now_ms - 1000), "CLOSED"),
    ]:
        room.configure(DROP, config)
        assert room.stats(DROP)["state"] == state


def test_wait_figures_say_how_many_waits_they_are_made_of(room):
    room.configure(DROP, TargetConfig(batch=5))
    ticket = room.enter(DROP, "1").queue_ticket
    tick(room)
    stats = room.stats(DROP)
    # Admitted, but the wait is measured when the user hears of it.
    assert (stats["admittedCount"], stats["waitsMeasured"], stats["avgWaitSeconds"]) == (1, 0, None)
    assert room.status(DROP, "1", ticket).status == "ADMITTED"
    stats = room.stats(DROP)
    assert stats["waitsMeasured"] == 1 and stats["avgWaitSeconds"] is not None and stats["p95WaitSeconds"] == 1.0


def test_the_shops_recent_figures_name_their_window(room):
    room.configure(DROP, TargetConfig())
    assert room.stats(DROP)["recentShop"] == {"windowSeconds": 3.0, "purchases": 0, "p95Ms": None, "errorRate": None}
