"""originSlo: the purchase gate notes each purchase, and the pump's rate follows the shop's health: a
multiplicative decrease over the objective, an additive increase back to the configured rate, never above it."""

import time

import pytest

from chalicelib import runtime
from chalicelib.pump import Pump
from chalicelib.shop_health import FollowRules, Purchase, health
from chalicelib.target_config import TargetConfig, parse_config
from chalicelib.targets import Target
from tests.observed import emitted
from tests.test_pump import server_ms, wait_for_next_tick

DROP = Target("limited-drop", 42)
TICK_MS = 100


@pytest.fixture
def room(make_room):
    room = make_room(VQ_BATCH_SIZE=10, VQ_TICK_MS=TICK_MS)
    for user in range(1, 200):
        room.enter(DROP, user)
    # A first tick loads the pump's scripts on this server (a script the server lacks is sent again after the
    # others, which would put this tick's admission before its adjustment).
    room.pump = Pump(room.store, room.settings)
    room.pump.tick()
    return room


def note(room, client, latency_ms, n, ok=True, over_ms=4000):
    """`n` purchases sent evenly over the last `over_ms` (a shop getting through n per `over_ms`)."""
    now = server_ms(client)
    for i in range(n):
        sent = now - over_ms + over_ms * i // n
        room.store.observe_purchase(DROP, Purchase(sent, latency_ms, ok), accepted=ok, sold_out=False)


def tick(room, client):
    """One pump tick (the room's own pump, which keeps the lock from tick to tick)."""
    wait_for_next_tick(client, TICK_MS)
    return room.pump.tick().targets[DROP]


def allowed(room, client):
    return float(client.hget(room.store.keys(DROP).health, "batch"))


def test_slow_purchases_cut_the_rate_by_how_far_over_the_objective_they_are(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=100))
    note(room, client, latency_ms=400, n=10)
    result = tick(room, client)
    assert allowed(room, client) == 5  # 100/400 is past the deepest cut, a half
    assert result.per_tick == 5  # what this tick (and any it made up for) admitted at
    stats = room.stats(DROP)
    assert (stats["configuredRatePerSec"], stats["effectiveRatePerSec"]) == (100, 50)
    assert stats["shop"] == {"purchases": 10, "p95Ms": 400, "errorRate": 0.0}


def test_a_little_over_the_objective_is_a_gentle_cut(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=100))
    note(room, client, latency_ms=105, n=10)
    tick(room, client)
    assert allowed(room, client) == pytest.approx(9)  # the gentlest cut, a tenth


def test_failing_purchases_cut_the_rate(room, client):
    room.configure(DROP, TargetConfig(slo_error_rate=0.1))
    note(room, client, latency_ms=10, n=6, ok=True)
    note(room, client, latency_ms=10, n=4, ok=False)
    tick(room, client)
    assert allowed(room, client) == pytest.approx(6)  # 40 % failed: 1 - 0.4


def test_a_cut_keeps_most_of_what_the_shop_gets_through(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=100))
    # Slow, but 500 done within the last 5 s (2 s to spare for a slow machine): 10 per 100 ms tick.
    note(room, client, latency_ms=2000, n=500, over_ms=5000)
    tick(room, client)
    # 9 per tick kept of the 10 done (a little less, as the tick comes a little after the last purchase), not the
    # half the latency alone would cut to.
    assert 7.5 < allowed(room, client) <= 9


def test_after_a_cut_only_later_purchases_count_and_the_next_cut_waits(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=100))
    note(room, client, latency_ms=400, n=10)
    tick(room, client)
    note(room, client, latency_ms=400, n=10, over_ms=50)  # slow still, but within the hold after the cut
    tick(room, client)
    assert allowed(room, client) == 5


def test_healthy_purchases_add_back_a_share_per_second_up_to_the_configured_batch_never_above(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=100))
    client.hset(room.store.keys(DROP).health, mapping={"batch": 5, "decreased_at": 0})
    note(room, client, latency_ms=20, n=10)
    tick(room, client)
    step = 10 * FollowRules().increase_per_s * TICK_MS / 1000
    assert allowed(room, client) == pytest.approx(5 + step)
    client.hset(room.store.keys(DROP).health, "batch", 10 - step / 2)
    note(room, client, latency_ms=20, n=10)
    tick(room, client)
    assert allowed(room, client) == 10


def test_a_fractional_rate_carries_over_so_ticks_admit_it_on_average(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=100))
    # Just cut: no purchases to judge, so the rate holds for a window.
    client.hset(room.store.keys(DROP).health, mapping={"batch": 2.5, "decreased_at": server_ms(client)})
    results = [tick(room, client) for _ in range(5)]
    # Over the ticks after the first (a loaded machine may skip one: the next makes up for it), 2.5 a tick,
    # give or take the fraction carried at either end.
    covered = results[-1].applied_tick - results[0].applied_tick
    assert abs(sum(r.admitted for r in results[1:]) - 2.5 * covered) < 1


def test_without_an_origin_slo_the_configured_rate_applies(room, client):
    client.hset(room.store.keys(DROP).health, mapping={"batch": 1, "decreased_at": server_ms(client)})
    note(room, client, latency_ms=5000, n=10)
    result = tick(room, client)
    assert result.per_tick == 10  # the configured batch (times any tick made up for) whatever the shop did
    assert not client.exists(room.store.keys(DROP).health)


def test_the_pump_reports_the_effective_rate_beside_the_configured_one(room, client, capsys, monkeypatch):
    import chalicelib.observability as observability

    monkeypatch.setattr(observability, "_METRICS_DISABLED", False)
    room.configure(DROP, TargetConfig(slo_p95_ms=100))
    note(room, client, latency_ms=400, n=10)
    capsys.readouterr()
    tick(room, client)
    gauges = {name: value for name, value in _values(capsys.readouterr().out)}
    assert gauges["ConfiguredRatePerSec"] == 100 and gauges["EffectiveRatePerSec"] == 50
    assert gauges["TargetRatePerSec"] == 50  # what the stalled-pump alarm holds the pump to


def _values(stdout):
    import json

    for line in stdout.splitlines():
        if line.startswith("{") and "_aws" in line:
            record = json.loads(line)
            for directive in record["_aws"]["CloudWatchMetrics"]:
                for metric in directive["Metrics"]:
                    value = record[metric["Name"]]
                    yield metric["Name"], value[0] if isinstance(value, list) else value


def test_the_gate_notes_latency_outcome_and_orders(make_room, origin, client):
    from tests.test_purchase import mint, request_for

    room = make_room()
    room.enter(DROP, 1)
    origin.delay_s = 0.05
    origin.answers = [(201, {}), (503, {}), (409, {"code": "SOLD_OUT"})]
    for user in (7, 8, 9):
        runtime.purchase_gate().purchase(request_for(mint(runtime.signer(), user=user), user=str(user)))
    notes = [Purchase.parse(text) for text in client.lrange(room.store.keys(DROP).purchases, 0, -1)]
    assert [p.ok for p in notes] == [True, False, True]  # newest first: a 5xx is an error, a 409 is not
    assert all(p.latency_ms >= 50 for p in notes)
    stats = room.stats(DROP)
    assert stats["ordersCount"] == 1 and stats["shop"]["purchases"] == 3 and stats["shop"]["errorRate"] == 0.333


def test_health_judges_only_the_window():
    now = 100_000
    purchases = [Purchase(now - 1000, 30, True), Purchase(now - 2000, 900, False), Purchase(now - 60_000, 5000, False)]
    assert health(purchases, now) == {"purchases": 2, "p95Ms": 900, "errorRate": 0.5}
    assert health([], now) == {"purchases": 0, "p95Ms": None, "errorRate": None}


@pytest.mark.parametrize("body", [
    b'{"originSlo": {}}', b'{"originSlo": {"p95Ms": 0}}', b'{"originSlo": {"p95Ms": 1.5}}',
    b'{"originSlo": {"errorRate": 1.5}}', b'{"originSlo": {"errorRate": "0.1"}}', b'{"originSlo": {"p99Ms": 5}}',
    b'{"originSlo": 5}', b'{"paused": 1}', b'{"soldOut": "true"}', b'{"originSlo": {"errorRate": NaN}}',
])
def test_bad_sale_controls_are_refused(body):
    from chalicelib.errors import InvalidArgument

    with pytest.raises(InvalidArgument):
        parse_config(body)


def test_sale_controls_round_trip():
    config = parse_config(b'{"paused": true, "soldOut": false, "originSlo": {"p95Ms": 800, "errorRate": 0.05}}')
    assert config.to_body() == {"paused": True, "originSlo": {"p95Ms": 800, "errorRate": 0.05}}
    assert TargetConfig.from_redis({k: str(v) for k, v in config.to_redis().items()}) == config
