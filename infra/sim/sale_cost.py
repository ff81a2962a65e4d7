"""What the stack costs on AWS at list prices, idle and per sale: the one place that writes those prices down.

The simulator (infra/sim/simulate.py) counts a sale's requests and how long it took; this turns them into
dollars, for the paced polls it measured and for the same crowd polling every few seconds. `python
infra/sim/sale_cost.py` prints what the stack costs a month with no sale at all (docs/deploy.md).
Prices: US East (N. Virginia), on demand, without free tier or savings plans.
"""

from __future__ import annotations

from dataclasses import dataclass

HOURS_PER_MONTH = 730
# The pump runs all the time: EventBridge starts it every minute and it ticks for most of it (chalicelib/pump.py's
# RUN_WINDOW_MS), idle or not.
PUMP_SECONDS_PER_MINUTE = 58

# USD. API Gateway REST APIs: per million requests (first 333 million a month; HTTP APIs are $1.00).
API_GATEWAY_REST_PER_MILLION = 3.50
# Lambda (x86): per million invocations, and per GB-second of billed duration (rounded up to the millisecond).
LAMBDA_PER_MILLION = 0.20
LAMBDA_PER_GB_SECOND = 0.0000166667
# ElastiCache for Valkey, node-based: per node-hour of the template's default node type. UNCONFIRMED: no
# stored copy of the ElastiCache price list gave this node type's on-demand rate when searched (December 2026),
# and the figure was written down without a source. Check it before relying on it; at two nodes it is cents
# for a sale of minutes, beside dollars of gateway fees.
CACHE_NODE_HOUR = {"cache.r7g.large": 0.175}
# AWS WAF (the same in every region): a web ACL and each of its rules a month, and per million requests it
# inspects, allowed or blocked, on every route of the stage (infra/edge.yaml: one ACL, two rules).
WAF_WEB_ACL_PER_MONTH = 5.00
WAF_RULE_PER_MONTH = 1.00
WAF_PER_MILLION = 0.60


@dataclass(frozen=True)
class Deployment:
    """What the stack runs the sale on (infra/settings.yaml and cache.yaml defaults)."""

    memory_mb: int = 1024
    cache_node_type: str = "cache.r7g.large"
    cache_nodes: int = 2  # one shard, one replica
    waf_rules: int = 2  # the web ACL's rate rules (infra/edge.yaml); 0: no web ACL (EnterLimitPerIp 0)


@dataclass(frozen=True)
class SaleLoad:
    """A sale's traffic: requests through the gateway, the authorizer's calls, the handler's time, the length."""

    api_requests: int
    authorizer_calls: int  # one per purchase request
    handler_seconds: float  # billed duration of every API request together
    duration_s: float


def sale_cost(load: SaleLoad, deployment: Deployment = Deployment()) -> dict:
    """The sale's cost in USD, by item, and the total."""
    gb = deployment.memory_mb / 1024
    invocations = load.api_requests + load.authorizer_calls + load.duration_s / 60  # the pump: one run a minute
    # The pump runs the whole sale through; the authorizer verifies an HMAC in about a millisecond.
    gb_seconds = gb * (load.handler_seconds + load.authorizer_calls * 0.001 + load.duration_s)
    items = {
        "api_gateway": load.api_requests / 1e6 * API_GATEWAY_REST_PER_MILLION,
        "lambda_requests": invocations / 1e6 * LAMBDA_PER_MILLION,
        "lambda_gb_seconds": gb_seconds * LAMBDA_PER_GB_SECOND,
        "cache": deployment.cache_nodes * CACHE_NODE_HOUR[deployment.cache_node_type] * load.duration_s / 3600,
        "waf": load.api_requests / 1e6 * WAF_PER_MILLION if deployment.waf_rules else 0.0,
    }
    return {**{name: round(usd, 4) for name, usd in items.items()}, "total": round(sum(items.values()), 4)}


def idle_cost(deployment: Deployment = Deployment()) -> dict:
    """What the stack costs a month with no sale, in USD, by item: the cache's nodes, the pump and the web ACL,
    which run whether or not anyone waits. Left out: secrets, the dashboard, alarms and logs (a few dollars, much of it
    within the free tier), and the network the stack runs in (a NAT gateway or VPC endpoints)."""
    gb = deployment.memory_mb / 1024
    pump_runs = HOURS_PER_MONTH * 60
    items = {
        "cache": deployment.cache_nodes * CACHE_NODE_HOUR[deployment.cache_node_type] * HOURS_PER_MONTH,
        "pump_lambda": pump_runs / 1e6 * LAMBDA_PER_MILLION
        + gb * pump_runs * PUMP_SECONDS_PER_MINUTE * LAMBDA_PER_GB_SECOND,
        "waf": WAF_WEB_ACL_PER_MONTH + deployment.waf_rules * WAF_RULE_PER_MONTH if deployment.waf_rules else 0.0,
    }
    return {**{name: round(usd, 2) for name, usd in items.items()}, "total": round(sum(items.values()), 2)}


if __name__ == "__main__":
    deployment = Deployment()
    print(
        f"Idle, a month ({deployment.cache_nodes} x {deployment.cache_node_type}, {deployment.memory_mb} MB functions):"
    )
    for item, usd in idle_cost(deployment).items():
        print(f"  {item:12} ${usd:,.2f}")
