"""infra/sim/sale_cost.py prices the stack: idle, what runs whatever the traffic; per sale, what the sale sends."""

from chalicelib.pump import RUN_WINDOW_MS
from infra.sim.sale_cost import (
    CACHE_NODE_HOUR,
    HOURS_PER_MONTH,
    LAMBDA_PER_GB_SECOND,
    LAMBDA_PER_MILLION,
    PUMP_SECONDS_PER_MINUTE,
    Deployment,
    idle_cost,
)


def test_the_idle_pump_is_priced_for_the_run_window_the_pump_keeps():
    assert PUMP_SECONDS_PER_MINUTE * 1000 == RUN_WINDOW_MS


def test_idle_cost_is_the_cache_nodes_and_a_pump_run_every_minute_around_the_clock():
    cost = idle_cost(Deployment(memory_mb=2048, cache_nodes=3))
    runs = HOURS_PER_MONTH * 60
    assert cost["cache"] == round(3 * CACHE_NODE_HOUR["cache.r7g.large"] * HOURS_PER_MONTH, 2)
    assert cost["pump_lambda"] == round(runs / 1e6 * LAMBDA_PER_MILLION + 2 * runs * 58 * LAMBDA_PER_GB_SECOND, 2)
    assert cost["total"] == round(cost["cache"] + cost["pump_lambda"], 2)
