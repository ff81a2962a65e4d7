"""originSlo: the purchase gate notes each purchase, and the pump's rate follows the shop's health: a sale opens at
half the configured rate, a multiplicative decrease past the headroom (before the objective is missed), back at once
to a plateau under the capacity the shop last showed, a small probe past it, an additive increase beyond, never above
the configured rate."""

import time

import pytest

from chalicelib import runtime
from chalicelib.pump import Pump
from chalicelib.queue_keys import shard_of
from chalicelib.shop_health import FollowRules, Purchase, health
from chalicelib.target_config import TargetConfig, parse_config
from chalicelib.targets import Target
from chalicelib.tokens import EntryToken
from tests.support.ticks import server_ms, wait_for_next_tick

DROP = Target("limited-drop", 42)
TICK_MS = 100


@pytest.fixture
def room(make_room):
    room = make_room(VQ_BATCH_SIZE=10, VQ_TICK_MS=TICK_MS)
    for user in range(1, 200):
        room.enter(DROP, str(user))
    # A first tick loads the pump's scripts on this server (a script the server lacks is sent again after the
    # others, which would put this tick's admission before its adjustment).
    room.pump = Pump(room.store, room.settings)
    room.pump.tick()
    return room


def note(room, client, latency_ms, n, ok=True, over_ms=2500, sent_after_ms=None):
    """`n` purchases the shop answered evenly over the last `over_ms`, each after `latency_ms` (a shop completing
    n per window, FollowRules.window_ms); or, with `sent_after_ms`, all sent that long ago."""
    now = server_ms(client)
    for i in range(n):
        sent = now - over_ms + over_ms * i // n - latency_ms if sent_after_ms is None else now - sent_after_ms
        room.store.observe_purchase(DROP, Purchase(sent, latency_ms, ok), accepted=ok, sold_out=False)


def tick(room, client):
    """One pump tick (the room's own pump, which keeps the lock from tick to tick)."""
    wait_for_next_tick(client, TICK_MS)
    return room.pump.tick().targets[DROP]


def allowed(room, client):
    return float(client.hget(room.store.keys(DROP).health, "allowed"))


# 250 purchases answered over the last 2.5 s: a shop completing 10 per 100 ms tick, the configured batch.
AT_THE_RATE = 250


def cut_to(share, n=AT_THE_RATE):
    """`share` of the throughput of `n` purchases answered over the last 2.5 s, as the pump judges it: over the time
    they span until its tick, which a loaded machine delays, up to the whole 3 s window (10 a tick, down to 8.3)."""
    return pytest.approx(share * n * TICK_MS / 2750, rel=250 / 2750)


def running_at(room, client, batch, capacity=0, changed_at=0, cut_at=0):
    """The target's rate as the pump last set it: `batch` a tick, `capacity` as the shop last showed it (0: not
    seen), by default its last change and cut long enough ago that every purchase noted counts."""
    client.hset(
        room.store.keys(DROP).health,
        mapping={"allowed": batch, "changed_at": changed_at, "capacity": capacity, "cut_at": cut_at},
    )


def test_a_sale_opens_at_half_the_configured_rate(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=500))
    result = tick(room, client)
    assert allowed(room, client) == 10 * FollowRules().opening == result.per_tick


def test_slow_purchases_cut_the_rate_by_how_far_over_the_objective_they_are(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=500))
    running_at(room, client, 10)
    note(room, client, latency_ms=2500, n=AT_THE_RATE)
    result = tick(room, client)
    # 2.1 s past the headroom (400 ms): past the deepest cut, half the throughput.
    assert allowed(room, client) == cut_to(0.5)
    assert result.per_tick == pytest.approx(allowed(room, client))  # what this tick (and any made up for) admitted at
    stats = room.stats(DROP)
    assert stats["configuredRatePerSec"] == 100 and stats["effectiveRatePerSec"] / 10 == cut_to(0.5)
    assert stats["recentShop"] == {"windowSeconds": 3.0, "purchases": AT_THE_RATE, "p95Ms": 2500, "errorRate": 0.0}


def test_past_the_headroom_the_rate_is_cut_before_the_objective_is_missed(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=500))
    running_at(room, client, 10)
    note(room, client, latency_ms=450, n=AT_THE_RATE)  # within 500 ms, past 80 % of it
    tick(room, client)
    assert allowed(room, client) == cut_to(0.95)  # 50 ms past: the gentlest cut


def test_the_cut_drains_the_excess_delay_over_the_headroom_in_time(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=500))
    running_at(room, client, 10)
    note(room, client, latency_ms=700, n=AT_THE_RATE)
    tick(room, client)
    assert allowed(room, client) == cut_to(0.7)  # 300 ms past 400: 1 - 0.3 s / 1 s (FollowRules.drain_ms)


def test_failing_purchases_cut_the_rate(room, client):
    room.configure(DROP, TargetConfig(slo_error_rate=0.1))
    running_at(room, client, 10)
    note(room, client, latency_ms=10, n=AT_THE_RATE, ok=True)
    note(room, client, latency_ms=10, n=AT_THE_RATE * 2 // 3, ok=False)
    tick(room, client)
    assert allowed(room, client) == cut_to(0.6)  # 40 % failed: 60 % of what it completed


def test_an_overloaded_shop_is_cut_below_what_it_completes_not_below_what_was_sent(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=500))
    running_at(room, client, 10)
    note(room, client, latency_ms=450, n=AT_THE_RATE // 2)  # 5 a tick done of the 10 admitted
    tick(room, client)
    # 95 % of the 5 it completes, not of the 10 sent (which would leave it overloaded).
    assert allowed(room, client) == cut_to(0.95, AT_THE_RATE // 2)
    # What it completed is its capacity as last seen.
    capacity = float(client.hget(room.store.keys(DROP).health, "capacity"))
    assert capacity == cut_to(1, AT_THE_RATE // 2)


def test_a_cut_measures_the_shop_while_it_was_behind_not_while_it_kept_up(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=500))
    running_at(room, client, 10)
    note(room, client, latency_ms=50, n=100)  # 4 a tick over the window: all it was sent
    note(room, client, latency_ms=600, n=80, over_ms=400)  # then a rush: sent over the last second, 600 ms each
    tick(room, client)
    # Since the first late purchase was sent (1 s before): the rush's 80 and 40 quick ones, 12 a tick; over the
    # window, 180 would say 6.5.
    capacity = float(client.hget(room.store.keys(DROP).health, "capacity"))
    assert capacity == pytest.approx(120 * TICK_MS / 1050, rel=0.1)
    assert allowed(room, client) == pytest.approx(0.8 * capacity)  # 200 ms past the headroom


def test_a_cut_after_a_stall_measures_the_shop_over_the_window(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=500))
    running_at(room, client, 10)
    now = server_ms(client)
    for i in range(150):  # 10 a tick, answered from 2.5 s to 1 s ago
        answered = now - 2500 + 10 * i
        room.store.observe_purchase(DROP, Purchase(answered - 100, 100, True), accepted=True, sold_out=False)
    note(room, client, latency_ms=600, n=10, over_ms=500)  # then a stall: 10 slow ones in the last 0.5 s
    tick(room, client)
    # Since the first late one was sent (1.1 s before), 20: under 2 a tick. Over the window, 160 in 2.5 s (to the
    # tick, which a loaded machine delays): the shop's pace before the stall, which it showed it keeps.
    capacity = float(client.hget(room.store.keys(DROP).health, "capacity"))
    assert capacity == pytest.approx(160 * TICK_MS / 2750, rel=250 / 2750)


def test_a_cut_holds_until_purchases_sent_after_it_reached_the_shop_come_back(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=500))
    running_at(room, client, 10)
    note(room, client, latency_ms=2500, n=AT_THE_RATE)
    tick(room, client)
    cut = allowed(room, client)
    # Slow still, but sent right after the cut: by users admitted before it, so they cannot judge it.
    note(room, client, latency_ms=3000, n=100, sent_after_ms=0)
    tick(room, client)
    assert allowed(room, client) == cut
    # Sent once the cut reached the shop, and slow: the backlog is still there, and a further cut is judged, of the
    # shop's throughput (which still drains it), not of the rate: no deeper than the first.
    cut_at = int(client.hget(room.store.keys(DROP).health, "changed_at"))
    earlier = cut_at - FollowRules().reach_ms - 100
    client.hset(room.store.keys(DROP).health, mapping={"changed_at": earlier, "cut_at": earlier})
    tick(room, client)
    assert allowed(room, client) == cut
    assert int(client.hget(room.store.keys(DROP).health, "changed_at")) > cut_at


def test_slow_purchases_sent_before_the_last_increase_still_count(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=500))
    now, reach = server_ms(client), FollowRules().reach_ms
    running_at(room, client, 8, capacity=8, changed_at=now - reach - 600, cut_at=now - 10_000)
    note(room, client, latency_ms=100, n=30, sent_after_ms=500)  # sent after the increase reached the shop
    # Sent before it, answered within the window: the shop was behind already. Counting only what was sent after
    # the increase would judge the fast ones (the slow ones of that time still on their way) and grow again.
    note(room, client, latency_ms=2000, n=30, sent_after_ms=2500)
    tick(room, client)
    assert allowed(room, client) < 8


def test_past_the_capacity_last_seen_the_rate_grows_only_long_after_the_last_cut(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=100))  # headroom: 80 ms
    rules, now = FollowRules(), server_ms(client)
    running_at(room, client, 8.2, capacity=8, cut_at=now - rules.hold_ms + 5000)  # past it, cut not long ago
    note(room, client, latency_ms=60, n=30)  # healthy, but the shop near its capacity
    tick(room, client)
    assert allowed(room, client) == 8.2
    running_at(room, client, 7.85, capacity=8, cut_at=now - rules.hold_ms + 5000)  # under it: probes up to it
    tick(room, client)
    assert allowed(room, client) == pytest.approx(7.85 + 10 * rules.probe)
    running_at(room, client, 7.95, capacity=8, cut_at=now - rules.hold_ms + 5000)
    tick(room, client)
    assert allowed(room, client) == 8
    client.hset(room.store.keys(DROP).health, "changed_at", 0)
    tick(room, client)
    assert allowed(room, client) == 8
    # Long after the cut, past it: a probe, and the next only once a whole window was sent at that one.
    running_at(room, client, 8.2, capacity=8, cut_at=now - rules.hold_ms - 1)
    tick(room, client)
    assert allowed(room, client) == pytest.approx(8.2 + 10 * rules.probe)
    client.hset(room.store.keys(DROP).health, "changed_at", server_ms(client) - rules.reach_ms - 500)
    note(room, client, latency_ms=60, n=30, sent_after_ms=200)
    tick(room, client)
    assert allowed(room, client) == pytest.approx(8.2 + 10 * rules.probe)


def test_a_shop_far_from_its_capacity_lets_the_rate_past_it_before_the_hold_ends(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=100))
    rules = FollowRules()
    # Cut not long ago, but the p95 under half the headroom: the capacity seen then was a dip.
    running_at(room, client, 8.2, capacity=8, cut_at=server_ms(client) - 5000)
    note(room, client, latency_ms=30, n=30)
    tick(room, client)
    assert allowed(room, client) == pytest.approx(8.2 + 10 * rules.probe)


def test_healthy_purchases_add_back_a_share_up_to_the_configured_batch_never_above(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=100))
    running_at(room, client, 5)
    note(room, client, latency_ms=0, n=30)  # the whole headroom free: the whole step
    tick(room, client)
    step = 10 * FollowRules().increase
    assert allowed(room, client) == pytest.approx(5 + step)
    # The next step waits for purchases sent after this one reached the shop.
    tick(room, client)
    assert allowed(room, client) == pytest.approx(5 + step)
    running_at(room, client, 10 - step / 2)
    note(room, client, latency_ms=0, n=30)
    tick(room, client)
    assert allowed(room, client) == 10


@pytest.mark.parametrize("latency_ms, share_of_the_step", [(20, 0.75), (60, 0.25)])
def test_the_nearer_the_headroom_the_smaller_the_step(room, client, latency_ms, share_of_the_step):
    room.configure(DROP, TargetConfig(slo_p95_ms=100))  # headroom: 80 ms
    running_at(room, client, 5)
    note(room, client, latency_ms=latency_ms, n=30)
    tick(room, client)
    assert allowed(room, client) == pytest.approx(5 + 10 * FollowRules().increase * share_of_the_step)


def test_the_step_never_shrinks_below_the_probe(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=100))
    running_at(room, client, 5)
    note(room, client, latency_ms=79, n=30)  # a step of 1/80th: less than the probe
    tick(room, client)
    assert allowed(room, client) == pytest.approx(5 + 10 * FollowRules().probe)


def test_healthy_again_the_rate_comes_back_at_once_to_the_plateau_under_the_capacity_last_seen(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=100))
    capacity = 250 / 26.59  # as measured: cut to 2 a tick while the shop, past its headroom, completed this many
    running_at(room, client, 2, capacity=capacity)
    note(room, client, latency_ms=20, n=30)
    tick(room, client)
    plateau = FollowRules().gentlest * capacity
    assert allowed(room, client) == pytest.approx(plateau)
    # Healthy on the plateau: the next judgement probes past it (the plateau is kept in full, not rounded below it).
    client.hset(room.store.keys(DROP).health, "changed_at", 0)
    note(room, client, latency_ms=20, n=30)
    tick(room, client)
    assert allowed(room, client) == pytest.approx(plateau + 10 * FollowRules().probe)


@pytest.mark.parametrize(
    "rate, growth",
    [
        (7.6, "probe"),  # on the plateau
        (8.7, "probe"),  # past the capacity, by less than a tenth
        (8.9, "increase"),  # a tenth past it: the shop handles more than it showed
        (3, "increase"),  # no capacity seen
    ],
)
def test_from_the_plateau_to_a_tenth_past_the_capacity_the_rate_grows_only_by_a_probe(room, client, rate, growth):
    room.configure(DROP, TargetConfig(slo_p95_ms=100))
    running_at(room, client, rate, capacity=8 if rate > 3 else 0)
    note(room, client, latency_ms=0, n=30)
    tick(room, client)
    assert allowed(room, client) == pytest.approx(rate + 10 * getattr(FollowRules(), growth))


def test_past_the_headroom_but_within_the_objective_the_plateau_holds(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=100))
    running_at(room, client, 7.6, capacity=8)  # the plateau: 95 % of the capacity last seen
    note(room, client, latency_ms=90, n=30)  # within 100 ms, past 80 % of it: at this rate, the shop's own pace
    tick(room, client)
    assert allowed(room, client) == 7.6
    running_at(room, client, 7.7, capacity=8)  # above the plateau: a backlog in the making
    tick(room, client)
    assert allowed(room, client) < 7.6


def test_a_fractional_rate_carries_over_so_ticks_admit_it_on_average(room, client):
    room.configure(DROP, TargetConfig(slo_p95_ms=100))
    # Just cut: no purchases to judge, so the rate holds for a window.
    client.hset(room.store.keys(DROP).health, mapping={"allowed": 2.5, "changed_at": server_ms(client)})
    results = [tick(room, client) for _ in range(5)]
    # Over the ticks after the first (a loaded machine may skip one: the next makes up for it), 2.5 a tick,
    # give or take the fraction carried at either end.
    covered = results[-1].applied_tick - results[0].applied_tick
    assert abs(sum(r.admitted for r in results[1:]) - 2.5 * covered) < 1


def test_without_an_origin_slo_the_configured_rate_applies(room, client):
    client.hset(room.store.keys(DROP).health, mapping={"allowed": 1, "changed_at": server_ms(client)})
    note(room, client, latency_ms=5000, n=10)
    result = tick(room, client)
    assert result.per_tick == 10  # the configured batch (times any tick made up for) whatever the shop did
    assert not client.exists(room.store.keys(DROP).health)


def test_the_pump_reports_the_effective_rate_beside_the_configured_one(room, client, capsys, monkeypatch):
    import chalicelib.observability as observability

    monkeypatch.setattr(observability, "_METRICS_DISABLED", False)
    room.configure(DROP, TargetConfig(slo_p95_ms=500))
    running_at(room, client, 10)
    note(room, client, latency_ms=2500, n=AT_THE_RATE)
    capsys.readouterr()
    tick(room, client)
    gauges = dict(_values(capsys.readouterr().out))
    assert gauges["ConfiguredRatePerSec"] == 100 and gauges["EffectiveRatePerSec"] / 10 == cut_to(0.5)
    # What the stalled-pump alarm holds the pump to.
    assert gauges["TargetRatePerSec"] == gauges["EffectiveRatePerSec"]


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
    from tests.support.buying import mint, request_for

    room = make_room()
    room.enter(DROP, "1")
    origin.delay_s = 0.05
    origin.answers = [(201, {}), (503, {}), (409, {"code": "SOLD_OUT"})]
    for user in (7, 8, 9):
        runtime.purchase_gate().purchase(request_for(mint(runtime.signer(), user=user), user=str(user)))
    notes = [Purchase.parse(text) for text in client.lrange(room.store.keys(DROP).purchases, 0, -1)]
    assert [p.ok for p in notes] == [True, False, True]  # newest first: a 5xx is an error, a 409 is not
    assert all(p.latency_ms >= 50 for p in notes)
    stats = room.stats(DROP)
    shop = stats["recentShop"]
    assert stats["ordersCount"] == 1 and shop["purchases"] == 3 and shop["errorRate"] == 0.333


def test_health_judges_only_the_window():
    now = 100_000
    # Judged by when the shop answered: sent 4 s ago but answered 1 s ago is recent.
    purchases = [Purchase(now - 1000, 30, True), Purchase(now - 4000, 3000, False), Purchase(now - 60_000, 5000, False)]
    assert health(purchases, now) == {"windowSeconds": 3.0, "purchases": 2, "p95Ms": 3000, "errorRate": 0.5}
    assert health([], now) == {"windowSeconds": 3.0, "purchases": 0, "p95Ms": None, "errorRate": None}


@pytest.mark.parametrize(
    "body",
    [
        b'{"originSlo": {}}',
        b'{"originSlo": {"p95Ms": 0}}',
        b'{"originSlo": {"p95Ms": 1.5}}',
        b'{"originSlo": {"errorRate": 1.5}}',
        b'{"originSlo": {"errorRate": "0.1"}}',
        b'{"originSlo": {"p99Ms": 5}}',
        b'{"originSlo": 5}',
        b'{"paused": 1}',
        b'{"soldOut": "true"}',
        b'{"originSlo": {"errorRate": NaN}}',
    ],
)
def test_bad_sale_controls_are_refused(body):
    from chalicelib.errors import InvalidArgument

    with pytest.raises(InvalidArgument):
        parse_config(body)


def test_sale_controls_round_trip():
    config = parse_config(b'{"paused": true, "soldOut": false, "originSlo": {"p95Ms": 800, "errorRate": 0.05}}')
    assert config.to_body() == {"paused": True, "originSlo": {"p95Ms": 800, "errorRate": 0.05}}
    assert TargetConfig.from_redis({k: str(v) for k, v in config.to_redis().items()}) == config


def test_a_sharded_line_follows_the_shop_over_every_purchase_of_every_sub_line(make_room, client):
    # Purchases come through tokens of users on all three sub-lines; the shop's health counts them all, so the cut
    # follows the shop's whole throughput, as on one line (counted on the buyers' own sub-lines, sub-line 0 would see
    # a third of it, and cut the line to a third of what the shop completes).
    room = make_room(VQ_BATCH_SIZE=10, VQ_TICK_MS=TICK_MS)
    room.configure(DROP, TargetConfig(shards=3, slo_p95_ms=500))
    for user in range(1, 200):
        room.enter(DROP, str(user))
    room.pump = Pump(room.store, room.settings)
    room.pump.tick()
    running_at(room, client, 10)
    now = server_ms(client)
    buyers = [str(user) for user in range(1, AT_THE_RATE + 1)]
    assert {shard_of(user, 3) for user in buyers} == {0, 1, 2}
    for i, user in enumerate(buyers):
        token = EntryToken("unused", DROP, user, int(time.time()) + 60, f"t{i}")
        sent = now - 2500 + 2500 * i // AT_THE_RATE - 2500
        room.store.observe_purchase(DROP, Purchase(sent, 2500, True), accepted=True, sold_out=False, token=token)
    result = tick(room, client)
    assert allowed(room, client) == cut_to(0.5)
    assert result.per_tick == pytest.approx(allowed(room, client))
