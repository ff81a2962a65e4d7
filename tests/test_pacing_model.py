"""infra/sim/pacing_model.py: a sale replayed by the clients' pacing rules alone, today's protocol (every poll at the
origin) beside issue 39's edge line; counting the far line's capped events gives what walking every event gives."""

import math

import numpy as np
import pytest

from chalicelib import polling
from chalicelib.target_config import MAX_SHARDS
from chalicelib.targets import Target
from infra.sim.pacing_model import (
    EDGE_LINE,
    ENTER_US,
    LINE_MAX_AGE_S,
    SALE_TARGET,
    SHARD_HEADROOM,
    TODAY,
    WAITING_BYTES,
    Protocol,
    Sale,
    advice_s,
    busiest_node,
    model,
    shard_plan,
)


@pytest.mark.parametrize("newcomer", [False, True])
def test_the_models_advice_is_chalicelib_pollings_rule(newcomer):
    rng = np.random.default_rng(1)
    etas, rands = rng.uniform(0, 5000, 2000), rng.random(2000)
    longest = polling.longest_interval_ms(60)
    ours = advice_s(etas, longest, rands, newcomer)
    theirs = [
        polling.waiting_poll_after_ms(eta, 60, lambda r=r: r, newcomer) / 1000
        for eta, r in zip(etas, rands, strict=True)
    ]
    assert ours.tolist() == pytest.approx(theirs, abs=1e-9)


@pytest.mark.parametrize("protocol", [TODAY, EDGE_LINE, Protocol(edge=True, line_cap_s=20)], ids=lambda p: p.name)
@pytest.mark.parametrize("arrival_s", [None, 2.0], ids=["arrivals at the stage's rate", "a 2 s burst"])
def test_counting_the_far_lines_capped_events_agrees_with_walking_every_one(protocol, arrival_s):
    # Against a walk of other random draws: they differ as much as two walks do.
    sale = Sale(100_000, arrival_s=arrival_s)
    counted, walked = model(sale, protocol), model(sale, protocol, exact=True, seed=8)
    assert counted["events_walked"] < walked["events_walked"]
    for figure in ("origin_requests", "edge_requests"):
        assert counted[figure] == pytest.approx(walked[figure], rel=0.005)
    for figure in ("origin_peak_per_s", "origin_peak_per_s_in_line", "edge_peak_per_s"):
        assert counted[figure] == pytest.approx(walked[figure], rel=0.05)
    assert counted["notice_p50_p95_s"] == pytest.approx(walked["notice_p50_p95_s"], abs=0.05)
    far = counted["sold_out_heard_p50_p95_max_s"]["far back"], walked["sold_out_heard_p50_p95_max_s"]["far back"]
    assert far[0][1:] == pytest.approx(far[1][1:], rel=0.1)


def test_the_edge_line_keeps_the_origins_load_flat_where_today_it_grows_with_the_line():
    small, large = Sale(10_000), Sale(200_000)
    today = {sale.users: model(sale, TODAY) for sale in (small, large)}
    edge = {sale.users: model(sale, EDGE_LINE) for sale in (small, large)}
    # The same arrivals a second; what waiting asks of the origin no longer grows with the line.
    assert edge[200_000]["origin_peak_per_s"] <= 1.2 * edge[10_000]["origin_peak_per_s"]
    assert today[200_000]["origin_peak_per_s_in_line"] > 5 * today[10_000]["origin_peak_per_s_in_line"]
    # At most 1/20 of a fixed 2.5 s poll's requests per admitted user (today about 0.15), and the far line at the edge.
    assert edge[200_000]["share_of_fixed_poll"] <= 1 / 20 < today[200_000]["share_of_fixed_poll"]
    assert edge[200_000]["edge_requests"] > 0 == today[200_000]["edge_requests"]
    # Near the front clients poll the origin as today: they hear of their turn as soon.
    assert edge[200_000]["notice_p50_p95_s"][1] <= 1.0 and today[200_000]["notice_p50_p95_s"][1] <= 1.0
    assert edge[200_000]["cost_usd"]["total"] < today[200_000]["cost_usd"]["total"] / 2


@pytest.mark.parametrize("cap_s", [30, 120])
def test_a_far_back_shopper_hears_of_a_sold_out_within_the_cap_and_the_edges_staleness(cap_s):
    figures = model(Sale(100_000), Protocol(edge=True, line_cap_s=cap_s))
    _, p95, worst = figures["sold_out_heard_p50_p95_max_s"]["far back"]
    assert 0.8 * cap_s < p95 <= worst <= cap_s + 0.5 + LINE_MAX_AGE_S  # a tick, then the edge's max-age
    _, _, inside = figures["sold_out_heard_p50_p95_max_s"]["inside the window"]
    assert inside <= polling.longest_interval_ms(60) / 1000


def test_a_longer_cap_costs_less_at_the_edge_and_nothing_at_the_origin():
    short, long = (model(Sale(100_000), Protocol(edge=True, line_cap_s=cap)) for cap in (30, 300))
    assert long["edge_requests"] < short["edge_requests"] / 4
    assert long["cost_usd"]["cloudfront_requests"] < short["cost_usd"]["cloudfront_requests"]
    assert long["origin_requests"] == pytest.approx(short["origin_requests"], rel=0.01)


@pytest.mark.parametrize("users", [1_000_000, 10_000_000])
@pytest.mark.parametrize("arrival_s", [1, 10, 100, 1000])
def test_a_target_gets_as_many_sub_lines_as_its_arrivals_need_and_no_more(users, arrival_s):
    plan = shard_plan(users, arrival_s)
    arrivals = users / arrival_s
    # Each node's core enters at most the headroom; one sub-line fewer would take some past it.
    assert plan["node_core_share_entering"] <= SHARD_HEADROOM
    if plan["shards"] > 1:
        assert arrivals / (plan["shards"] - 1) * ENTER_US / 1e6 > SHARD_HEADROOM
    assert plan["node_enters_per_s"] == pytest.approx(arrivals / plan["shards"], abs=1)
    assert plan["node_memory_mb"] == pytest.approx([users / plan["shards"] * b / 1e6 for b in WAITING_BYTES], abs=0.1)
    assert plan["within_max_shards"] == (plan["shards"] <= MAX_SHARDS)


def test_the_shard_count_follows_the_arrivals_not_the_crowd():
    # 1,000,000 in 10 s: 100,000 enters a second at 50 us are 5 cores; at most 60 % each, 9 sub-lines.
    assert shard_plan(1_000_000, 10)["shards"] == 9
    assert shard_plan(10_000_000, 100)["shards"] == 9
    assert shard_plan(10_000_000, 10)["shards"] == 84
    assert shard_plan(1_000_000, 1000)["shards"] == 1
    assert shard_plan(1_000_000, 10, enter_us=25)["shards"] == 5


def test_a_sharded_lines_polls_spread_over_its_nodes():
    figures = model(Sale(100_000, arrival_s=1.0), EDGE_LINE)
    plan = shard_plan(100_000, 1.0, figures["origin_peak_per_s_in_line"])
    assert plan["shards"] == 9
    assert plan["node_in_line_peak_per_s"] == round(figures["origin_peak_per_s_in_line"] / 9)


def test_on_evenly_split_slots_each_sub_line_has_a_node_of_its_own_and_the_plan_says_its_load():
    assert busiest_node(SALE_TARGET, 1, 3) == 1 and busiest_node(SALE_TARGET, 64, 1) == 64
    # As many nodes as sub-lines, or a multiple: one sub-line a node, whatever the target.
    targets = [Target("limited-drop", n) for n in range(1, 201)]
    assert all(busiest_node(target, 9, nodes) == 1 for target in targets for nodes in (9, 18, 27))
    # Fewer: the even share, the sub-lines lying about a window apart.
    assert all(
        max(busiest_node(target, 9, nodes) for target in targets) == math.ceil(9 / nodes) for nodes in range(1, 9)
    )
    plan = shard_plan(1_000_000, 10)
    assert plan["even_slots_busiest_node"] == 1
    assert plan["even_slots_busiest_core_entering"] == round(100_000 / 9 * ENTER_US / 1e6, 3) < SHARD_HEADROOM
