"""infra/sim/sale_cost.py prices the stack: idle, what runs whatever the traffic; per sale, what the sale sends;
for each choice of cache."""

from dataclasses import replace

import pytest

from infra.sim.sale_cost import (
    ALARM_METRIC_MONTH,
    ALARM_METRICS,
    API_GATEWAY_REST_PER_MILLION,
    CACHE_NODE_HOUR,
    CLOUDFRONT_HTTPS_PER_10K,
    CLOUDFRONT_OUT_PER_GB,
    HOURS_PER_MONTH,
    HUNDRED_THOUSAND,
    IDLE_PUMP_RUN_S,
    INTERNET_OUT_PER_GB,
    LAMBDA_PER_GB_SECOND,
    LAMBDA_PER_MILLION,
    SERVERLESS_GB_HOUR,
    SERVERLESS_MIN_GB,
    WAF_PER_MILLION,
    WAF_RULE_PER_MONTH,
    WAF_WEB_ACL_PER_MONTH,
    Deployment,
    SaleLoad,
    idle_cost,
    network_cost,
    sale_cost,
)


def test_idle_cost_is_the_cache_and_a_pump_start_a_minute_that_returns_at_once():
    cost = idle_cost(Deployment(memory_mb=2048, cache_nodes=3))
    runs = HOURS_PER_MONTH * 60
    assert cost["cache"] == round(3 * CACHE_NODE_HOUR["cache.m7g.large"] * HOURS_PER_MONTH, 2)
    pump = runs / 1e6 * LAMBDA_PER_MILLION + 2 * runs * IDLE_PUMP_RUN_S * LAMBDA_PER_GB_SECOND
    assert cost["pump_lambda"] == round(pump, 2) < 0.25  # a few cents: no run ticks while nothing is on sale
    assert cost["total"] == round(sum(v for k, v in cost.items() if k != "total"), 2)


def test_the_web_acl_costs_its_fees_idle_and_its_price_for_every_request_of_a_sale():
    assert idle_cost()["waf"] == WAF_WEB_ACL_PER_MONTH + 3 * WAF_RULE_PER_MONTH
    assert idle_cost(Deployment(waf_rules=0))["waf"] == 0
    load = SaleLoad(api_requests=6_000_000, authorizer_calls=100_000, handler_seconds=90_000, duration_s=2000)
    with_waf, without = sale_cost(load), sale_cost(load, Deployment(waf_rules=0))
    assert with_waf["waf"] == pytest.approx(6 * WAF_PER_MILLION) and without["waf"] == 0
    assert with_waf["total"] == pytest.approx(without["total"] + 6 * WAF_PER_MILLION)


def test_behind_the_edge_cloudfront_bills_every_request_and_the_gateway_only_those_that_pass():
    # Issue 39's edge line: the edge answers 9 million reads of /line from its cache, 1 million requests reach the API.
    load = SaleLoad(
        api_requests=1_000_000,
        authorizer_calls=10_000,
        handler_seconds=15_000,
        duration_s=2000,
        behind_edge=True,
        edge_requests=9_000_000,
        bytes_out=20e9,
    )
    cost = sale_cost(load)
    assert cost["cloudfront_requests"] == pytest.approx(10_000_000 / 1e4 * CLOUDFRONT_HTTPS_PER_10K)
    assert cost["api_gateway"] == pytest.approx(API_GATEWAY_REST_PER_MILLION)
    assert cost["data_out"] == pytest.approx(20 * CLOUDFRONT_OUT_PER_GB)
    # Without the distribution the gateway answers the internet itself, at EC2's price.
    direct = sale_cost(replace(load, behind_edge=False, edge_requests=0))
    assert direct["cloudfront_requests"] == 0 and direct["data_out"] == pytest.approx(20 * INTERNET_OUT_PER_GB)
    # A web ACL on the stage inspects what reaches the gateway; on the distribution, the edge's answers too.
    assert cost["waf"] == pytest.approx(WAF_PER_MILLION)
    assert sale_cost(load, Deployment(waf_at_edge=True))["waf"] == pytest.approx(10 * WAF_PER_MILLION)


def test_the_serverless_cache_idles_at_its_storage_floor_and_a_sale_costs_about_the_same():
    nodes, serverless = Deployment(), Deployment(cache="serverless")
    assert idle_cost(serverless)["cache"] == round(SERVERLESS_MIN_GB * SERVERLESS_GB_HOUR * HOURS_PER_MONTH, 2)
    assert idle_cost(serverless)["total"] < 25 < 150 < idle_cost(nodes)["total"]
    a_sale = {choice.cache: sale_cost(HUNDRED_THOUSAND, choice) for choice in (nodes, serverless)}
    # Either way the gateway's $3.50 a million requests is most of a sale (WAF's $0.60 next).
    for cost in a_sale.values():
        assert cost["api_gateway"] / cost["total"] > 0.65
    # The nodes' hours of the sale, or the serverless cache's ECPUs (about 20 a request): cents either way.
    assert max(a_sale["serverless"]["cache"], a_sale["nodes"]["cache"]) < 1


def test_the_network_costs_more_than_the_serverless_stack_when_the_vpc_has_none():
    assert min(network_cost().values()) > idle_cost(Deployment(cache="serverless"))["total"]


@pytest.mark.slow
def test_the_alarms_priced_are_the_alarms_the_template_holds(resources):
    counted = {"nodes": 0, "serverless": 0}
    for resource in resources.values():
        if resource["Type"] != "AWS::CloudWatch::Alarm":
            continue
        metrics = sum("MetricStat" in query for query in resource["Properties"].get("Metrics", [])) or 1
        for choice, condition in (("nodes", "CacheOnNodes"), ("serverless", "CacheServerless")):
            if resource.get("Condition") in (None, condition):
                counted[choice] += metrics
    assert counted == ALARM_METRICS
    assert ALARM_METRIC_MONTH == 0.10
