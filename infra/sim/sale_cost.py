"""What the stack costs on AWS at list prices, idle and per sale: the one place that writes those prices down.

The simulator (infra/sim/simulate.py) and the pacing model count a sale's requests and how long it took; this
turns them into dollars. `python infra/sim/sale_cost.py` prints, for each choice of cache (CacheMode), what the
stack costs a month with no sale at all and what a 100,000-user sale adds (docs/deploy.md: what it costs).
Prices: US East (N. Virginia), on demand, without free tier or savings plans; the sources are named by each.
"""

from __future__ import annotations

from dataclasses import dataclass

HOURS_PER_MONTH = 730
MINUTES_PER_MONTH = HOURS_PER_MONTH * 60

# USD. API Gateway REST APIs: per million requests (first 333 million a month; HTTP APIs are $1.00). Source: the
# API Gateway pricing page.
API_GATEWAY_REST_PER_MILLION = 3.50
# Lambda (arm64, the functions' architecture; x86_64's GB-second is $0.0000166667): per million invocations, and
# per GB-second of billed duration. Source: the Lambda pricing page.
LAMBDA_PER_MILLION = 0.20
LAMBDA_PER_GB_SECOND = 0.0000133334
# ElastiCache for Valkey, node-based: per node-hour of the template's default node type and of the one it replaced
# (docs/deploy.md: sizing the cache). UNCONFIRMED: no stored copy of the price list gave these on-demand rates
# (December 2026); each is Redis OSS's ($0.158, $0.219) less the 20% AWS announced for Valkey nodes. Check them
# before relying on them.
CACHE_NODE_HOUR = {"cache.m7g.large": 0.126, "cache.r7g.large": 0.175}
# ElastiCache Serverless for Valkey: per GB-hour stored (at least 100 MB a cache) and per million ECPUs (1 ECPU a
# KB moved; commands that take more vCPU time, such as a script, proportionally more). Sources: the ElastiCache
# pricing page (Valkey 33% below Redis OSS, the 100 MB floor) and the AWS Database Blog's "Unlock on-demand,
# cost-optimized performance with Amazon ElastiCache Serverless" (Redis OSS's $0.125 and $0.0034).
SERVERLESS_GB_HOUR = 0.084
SERVERLESS_MIN_GB = 0.1
SERVERLESS_PER_MILLION_ECPU = 0.0023
# A request's script as ECPUs: 8 to 17 commands inside it, 12 to 40 times a GET's server CPU, 15 to 20 times a ZADD's
# instructions (docs/deploy.md: ElastiCache Serverless, measured by tests/perf/script_commands.py and
# bench_scripts.py). An estimate from a local server; a load test of the stage settles it.
ECPUS_PER_REQUEST = 20
BYTES_PER_WAITING_USER = 250  # the performance target (docs/benchmarks.md); 208 measured
# CloudWatch: logs ingested per GB; a standard alarm per metric it reads, a month; a dashboard beyond the free
# three, a month. Source: the CloudWatch pricing page.
LOGS_PER_GB = 0.50
ALARM_METRIC_MONTH = 0.10
DASHBOARD_MONTH = 3.00
# Lambda's START, END and REPORT lines and the API's access log line, per request (about 330 and 400 bytes).
LOG_BYTES_PER_REQUEST = 700
# EventBridge custom events, per million (the pump's PutEvents; docs/events.md): about 3 a user (entered,
# admitted, and left, evicted or purchased). Scheduled rules are not charged. Source: the EventBridge pricing page.
EVENTS_PER_MILLION = 1.00
EVENTS_PER_USER = 3
# Secrets Manager: per secret a month (the signing keys, the AUTH token, the edge's origin secret). Source: the
# Secrets Manager pricing page.
SECRET_MONTH = 0.40
SECRETS = 3
# The network the stack needs when the VPC has neither: a NAT gateway, or an interface endpoint per service and
# availability zone (secretsmanager, appconfigdata, events; two zones). Per hour, before data. Source: the VPC
# pricing page.
NAT_GATEWAY_HOUR = 0.045
ENDPOINT_AZ_HOUR = 0.01
ENDPOINT_SERVICES = ("secretsmanager", "appconfigdata", "events")
AVAILABILITY_ZONES = 2

# AWS WAF (the same in every region): a web ACL and each of its rules a month, and per million requests it
# inspects, allowed or blocked, on every route of the stage (infra/edge.yaml: one ACL, three rules).
WAF_WEB_ACL_PER_MONTH = 5.00
WAF_RULE_PER_MONTH = 1.00
WAF_PER_MILLION = 0.60

# CloudFront, pay as you go, at its edge locations in the United States, Mexico and Canada: per 10,000 HTTPS requests
# (HTTP costs $0.0075; Europe's HTTPS $0.0120), and per GB to the internet, the first 10 TB a month (the same in
# Europe; the next 40 TB $0.080, so beyond 10 TB this over-states). Fetches from an AWS origin are free. The always
# free tier (10 million requests, 1 TB a month) is not counted. Source: the CloudFront pricing page, read 2026-12-06.
CLOUDFRONT_HTTPS_PER_10K = 0.0100
CLOUDFRONT_OUT_PER_GB = 0.085
# Without a distribution, API Gateway's answers leave at EC2's price to the internet, the first 10 TB a month.
# Source: the API Gateway pricing page (data out "at the EC2 data transfer rates") and the EC2 on-demand pricing
# page, read 2026-12-06.
INTERNET_OUT_PER_GB = 0.09

# The alarms' metrics, per cache choice (infra/*.yaml; tests/test_sale_cost.py counts them in the template).
ALARM_METRICS = {"nodes": 49, "serverless": 33}
# A scheduled pump run with nothing on sale: one round trip to Redis and back, billed at about 50 ms.
IDLE_PUMP_RUN_S = 0.05


@dataclass(frozen=True)
class Deployment:
    """What the stack runs the sale on (infra/settings.yaml and cache.yaml defaults)."""

    memory_mb: int = 1024
    cache: str = "nodes"  # CacheMode: nodes or serverless
    cache_node_type: str = "cache.m7g.large"
    cache_nodes: int = 2  # one shard, one replica
    waf_rules: int = 3  # the web ACL's rules (infra/edge.yaml); 0: no web ACL (EnterLimitPerIp 0)
    waf_at_edge: bool = False  # the web ACL on the distribution (scope CLOUDFRONT): it inspects the edge's answers too


@dataclass(frozen=True)
class SaleLoad:
    """A sale's traffic: requests through the gateway, the authorizer's calls, the handler's time, the length."""

    api_requests: int
    authorizer_calls: int  # one per purchase request
    handler_seconds: float  # billed duration of every API request together
    duration_s: float
    users: int = 0  # in line at once at most (the serverless cache's storage); 0: the authorizer's calls
    # Behind the CloudFront distribution (issue 39's edge line) every request passes the edge: those it answers from
    # its cache (`edge_requests`) never reach the gateway, the rest pass through to it.
    behind_edge: bool = False
    edge_requests: int = 0
    bytes_out: float = 0  # every answer to the shoppers, headers included: the edge's, or the gateway's without one


# A whole sale of 100,000 users admitted at 50 a second, every poll at the origin, as the pacing model replays it
# (`python infra/sim/pacing_model.py --users 100000 --arrival-s 2`, 2026-12-02 and again 2026-12-06): 60.1
# requests per admitted user, 2,001 s, 15 ms billed per request.
HUNDRED_THOUSAND = SaleLoad(6_010_000, 100_000, 6_010_000 * 0.015, 2001, users=100_000)


def cache_for(load: SaleLoad, deployment: Deployment) -> float:
    """What the cache costs over the sale: its nodes' hours, or the serverless cache's requests and storage."""
    hours = load.duration_s / 3600
    if deployment.cache == "serverless":
        stored_gb = max(SERVERLESS_MIN_GB, (load.users or load.authorizer_calls) * BYTES_PER_WAITING_USER / 1e9)
        ecpus = load.api_requests * ECPUS_PER_REQUEST
        return ecpus / 1e6 * SERVERLESS_PER_MILLION_ECPU + stored_gb * SERVERLESS_GB_HOUR * hours
    return deployment.cache_nodes * CACHE_NODE_HOUR[deployment.cache_node_type] * hours


def sale_cost(load: SaleLoad, deployment: Deployment = Deployment()) -> dict:
    """The sale's cost in USD, by item, and the total."""
    gb = deployment.memory_mb / 1024
    invocations = load.api_requests + load.authorizer_calls + load.duration_s / 60  # the pump: one run a minute
    viewer_requests = load.api_requests + load.edge_requests if load.behind_edge else 0
    inspected = viewer_requests if deployment.waf_at_edge and load.behind_edge else load.api_requests
    out_per_gb = CLOUDFRONT_OUT_PER_GB if load.behind_edge else INTERNET_OUT_PER_GB
    # The pump runs the whole sale through; the authorizer verifies an HMAC in about a millisecond.
    gb_seconds = gb * (load.handler_seconds + load.authorizer_calls * 0.001 + load.duration_s)
    items = {
        "api_gateway": load.api_requests / 1e6 * API_GATEWAY_REST_PER_MILLION,
        "lambda_requests": invocations / 1e6 * LAMBDA_PER_MILLION,
        "lambda_gb_seconds": gb_seconds * LAMBDA_PER_GB_SECOND,
        "cache": cache_for(load, deployment),
        "logs": load.api_requests * LOG_BYTES_PER_REQUEST / 1e9 * LOGS_PER_GB,
        "events": (load.users or load.authorizer_calls) * EVENTS_PER_USER / 1e6 * EVENTS_PER_MILLION,
        "waf": inspected / 1e6 * WAF_PER_MILLION if deployment.waf_rules else 0.0,
        "cloudfront_requests": viewer_requests / 1e4 * CLOUDFRONT_HTTPS_PER_10K,
        "data_out": load.bytes_out / 1e9 * out_per_gb,
    }
    return {**{name: round(usd, 4) for name, usd in items.items()}, "total": round(sum(items.values()), 4)}


def idle_cost(deployment: Deployment = Deployment()) -> dict:
    """What the stack costs a month with no sale, in USD, by item: the cache (its nodes, or the serverless
    cache's storage floor), the pump's scheduled runs (each returns at once), the web ACL, the secrets, the alarms
    and the dashboard. The network (network_cost) comes on top unless the VPC already has it."""
    gb = deployment.memory_mb / 1024
    if deployment.cache == "serverless":
        cache = SERVERLESS_MIN_GB * SERVERLESS_GB_HOUR * HOURS_PER_MONTH
    else:
        cache = deployment.cache_nodes * CACHE_NODE_HOUR[deployment.cache_node_type] * HOURS_PER_MONTH
    items = {
        "cache": cache,
        "pump_lambda": MINUTES_PER_MONTH / 1e6 * LAMBDA_PER_MILLION
        + gb * MINUTES_PER_MONTH * IDLE_PUMP_RUN_S * LAMBDA_PER_GB_SECOND,
        "waf": WAF_WEB_ACL_PER_MONTH + deployment.waf_rules * WAF_RULE_PER_MONTH if deployment.waf_rules else 0.0,
        "secrets": SECRETS * SECRET_MONTH,
        "alarms": ALARM_METRICS[deployment.cache] * ALARM_METRIC_MONTH,
        "dashboard": DASHBOARD_MONTH,
    }
    return {**{name: round(usd, 2) for name, usd in items.items()}, "total": round(sum(items.values()), 2)}


def network_cost() -> dict:
    """A month of the network the functions need, when the VPC has none yet, before data: a NAT gateway (one zone's,
    which the other zone's functions then depend on), one per zone (infra/network.yaml makes two), or the three
    VPC endpoints in two zones (which reach AWS only, not the identity provider's keys)."""
    return {
        "nat_gateway": round(NAT_GATEWAY_HOUR * HOURS_PER_MONTH, 2),
        "nat_gateway_per_zone": round(AVAILABILITY_ZONES * NAT_GATEWAY_HOUR * HOURS_PER_MONTH, 2),
        "vpc_endpoints": round(len(ENDPOINT_SERVICES) * AVAILABILITY_ZONES * ENDPOINT_AZ_HOUR * HOURS_PER_MONTH, 2),
    }


if __name__ == "__main__":
    for choice in (Deployment(), Deployment(cache="serverless")):
        cache = f"{choice.cache_nodes} x {choice.cache_node_type}" if choice.cache == "nodes" else "serverless Valkey"
        print(f"CacheMode {choice.cache} ({cache}, {choice.memory_mb} MB functions)")
        idle, sale = idle_cost(choice), sale_cost(HUNDRED_THOUSAND, choice)
        print("  idle, a month:            " + ", ".join(f"{item} ${usd:,.2f}" for item, usd in idle.items()))
        print("  a 100,000-user sale adds: " + ", ".join(f"{item} ${usd:,.2f}" for item, usd in sale.items()))
    network = network_cost()
    print(f"Network, a month, unless the VPC has it: a NAT gateway ${network['nat_gateway']:,.2f}, one per zone")
    print(f"  ${network['nat_gateway_per_zone']:,.2f}, VPC endpoints for {', '.join(ENDPOINT_SERVICES)} in")
    print(f"  {AVAILABILITY_ZONES} zones ${network['vpc_endpoints']:,.2f}")
