"""infra/sim/sale_cost.py prices the stack: idle, what runs whatever the traffic; per sale, what the sale sends."""

import pytest

from chalicelib.pump import RUN_WINDOW_MS
from infra.sim.sale_cost import (
    CACHE_NODE_HOUR,
    HOURS_PER_MONTH,
    LAMBDA_PER_GB_SECOND,
    LAMBDA_PER_MILLION,
    PUMP_SECONDS_PER_MINUTE,
    WAF_PER_MILLION,
    WAF_RULE_PER_MONTH,
    WAF_WEB_ACL_PER_MONTH,
    Deployment,
    SaleLoad,
    idle_cost,
    sale_cost,
)


def test_the_idle_pump_is_priced_for_the_run_window_the_pump_keeps():
    assert PUMP_SECONDS_PER_MINUTE * 1000 == RUN_WINDOW_MS


def test_idle_cost_is_the_cache_nodes_a_pump_run_every_minute_around_the_clock_and_the_web_acl():
    cost = idle_cost(Deployment(memory_mb=2048, cache_nodes=3))
    runs = HOURS_PER_MONTH * 60
    assert cost["cache"] == round(3 * CACHE_NODE_HOUR["cache.r7g.large"] * HOURS_PER_MONTH, 2)
    assert cost["pump_lambda"] == round(runs / 1e6 * LAMBDA_PER_MILLION + 2 * runs * 58 * LAMBDA_PER_GB_SECOND, 2)
    assert cost["waf"] == WAF_WEB_ACL_PER_MONTH + 2 * WAF_RULE_PER_MONTH
    assert cost["total"] == round(cost["cache"] + cost["pump_lambda"] + cost["waf"], 2)
    assert idle_cost(Deployment(waf_rules=0))["waf"] == 0


def test_the_web_acl_adds_its_price_for_every_request_of_a_sale():
    load = SaleLoad(api_requests=6_000_000, authorizer_calls=100_000, handler_seconds=90_000, duration_s=2000)
    with_waf, without = sale_cost(load), sale_cost(load, Deployment(waf_rules=0))
    assert with_waf["waf"] == pytest.approx(6 * WAF_PER_MILLION) and without["waf"] == 0
    assert with_waf["total"] == pytest.approx(without["total"] + 6 * WAF_PER_MILLION)
