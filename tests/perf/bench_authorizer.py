"""Benchmark: entry-token verifications per second, against a bare HMAC-SHA256 over the same token.

Run: .venv/bin/python tests/perf/bench_authorizer.py   (no Redis needed; the authorizer uses none)
Measures, in one run and one process, interleaved (each of 9 rounds gives every measure 20 turns, in alternation;
figures are calls per CPU second, the median and range of the rounds):
  - bare HMAC (the baseline): hmac.new(key, payload, hashlib.sha256).digest() over the token's signed payload bytes;
  - keyed HMAC: the MAC as the token module computes it (a copy of the key's HMAC, then update and digest);
  - read_entry_token: the token module's signature, encoding and expiry check alone;
  - check_entry: the verification the authorizer and the routes share;
  - gate.authorize: the handler's body (method ARN, headers, check_entry, policy) without Powertools;
  - the `purchase_authorizer` handler on a REQUEST event, with Powertools logging and metrics as deployed;
  - gate.authorize in jwt mode (an RS256 JWT of about 1 KB beside the token): with the per-container cache of
    verified tokens (as deployed), and verifying the JWT on every call.
Prints a table and writes build/bench_authorizer.json. Target: the handler at least 0.8x the rate of its body
(gate.authorize): the Lambda entry point adds at most a quarter to the judgement. The verification's rate against a
bare HMAC is shown without a target: the MAC is a fifth to a quarter of it. The rest is the strict reading the token
format asks for (base64url decoded and re-encoded so that one spelling verifies, every field matched, the signature
compared as its one canonical text), each step costing in CPython a sizeable share of an HMAC over ~100 bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SECRET = "bench-secret-0123456789abcdefghijklmnopqrstuv"
os.environ.update(
    {
        "VQ_TOKEN_KEYS": json.dumps({"k1": SECRET}),
        "VQ_TOKEN_ACTIVE_KID": "k1",
        "POWERTOOLS_SERVICE_NAME": "virtual-queue",
        "POWERTOOLS_LOG_LEVEL": "INFO",
        "POWERTOOLS_TRACE_DISABLED": "1",
    }
)

import benchlib  # noqa: E402  (beside this file)

from app import purchase_authorizer  # noqa: E402
from chalicelib import runtime  # noqa: E402
from chalicelib.gate import authorize, check_entry  # noqa: E402
from chalicelib.targets import Target  # noqa: E402

TARGET = Target("limited-drop", 42)
TARGET_HANDLER_X_AUTHORIZE = 0.8
METHOD_ARN = "arn:aws:execute-api:eu-west-1:123456789012:a1b2c3d4e5/api/POST/limited-drops/42/orders"


class LambdaContext:
    """The attributes of the Lambda runtime's context object that Powertools reads."""

    function_name = "virtual-queue-prod-purchase_authorizer"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:eu-west-1:123456789012:function:virtual-queue-prod-purchase_authorizer"
    memory_limit_in_mb = 512
    aws_request_id = str(uuid.uuid4())
    log_group_name = "/aws/lambda/virtual-queue-prod-purchase_authorizer"
    log_stream_name = "2026/01/01/[$LATEST]0123456789abcdef"


def rates(
    calls: dict,
    rounds: int = benchlib.scaled(9, 2),
    slices: int = benchlib.scaled(20, 2),
    seconds: float = benchlib.scaled(0.25, 0.01),
) -> tuple[dict[str, list[float]], list[float]]:
    """Calls per CPU second of each of `calls`, per round. A round gives each measure about `seconds` of CPU in
    `slices` turns, the measures taking turns slice by slice: a slow spell of the shared machine then meets every
    measure of the round alike, and time the process spends preempted is not counted."""
    clock = time.process_time
    batches = {}
    for name, call in calls.items():
        batch = 1
        while True:
            started = clock()
            for _ in range(batch):
                call()
            if clock() - started > seconds / slices:
                break
            batch *= 2
        batches[name] = batch
    found: dict[str, list[float]] = {name: [] for name in calls}
    loads = []
    for _ in range(rounds):
        loads.append(benchlib.load_average())
        spent = dict.fromkeys(calls, 0.0)
        for _ in range(slices):
            for name, call in calls.items():
                started = clock()
                for _ in range(batches[name]):
                    call()
                spent[name] += clock() - started
        for name in calls:
            found[name].append(batches[name] * slices / spent[name])
    return found, loads


def keyed_mac(mac: hmac.HMAC, payload: bytes) -> bytes:
    mac.update(payload)
    return mac.digest()


def main() -> None:
    now = time.time()
    token = runtime.signer().mint_entry_token(TARGET, "7", now, 300).text
    payload_text = token.split(".")[0]
    payload = base64.urlsafe_b64decode(payload_text + "=" * (-len(payload_text) % 4))
    key = SECRET.encode()
    keyed = hmac.new(key, digestmod=hashlib.sha256)
    signer = runtime.signer()
    event = {
        "type": "REQUEST",
        "methodArn": METHOD_ARN,
        "resource": "/limited-drops/{drop_id}/orders",
        "path": "/limited-drops/42/orders",
        "httpMethod": "POST",
        "headers": {
            "Accept": "application/json",
            "Content-Type": "application/json",
            "Host": "api.example.com",
            "User-Agent": "Mozilla/5.0",
            "X-Amzn-Trace-Id": "Root=1-00000000-000000000000000000000000",
            "X-Forwarded-For": "203.0.113.7",
            "X-Forwarded-Port": "443",
            "X-Forwarded-Proto": "https",
            "X-Entry-Token": token,
            "X-User-Id": "7",
        },
        "pathParameters": {"drop_id": "42"},
        "requestContext": {"requestId": str(uuid.uuid4()), "stage": "api", "httpMethod": "POST"},
    }
    context = LambdaContext()
    assert purchase_authorizer(event, context)["policyDocument"]["Statement"][0]["Effect"] == "Allow"
    # jwt mode: the same purchase with the shop's JWT of the token's user.
    from chalicelib.config import load_settings
    from chalicelib.identity import JwtIdentity
    from tests.support import jwts

    header_identity = runtime.identity()
    jwt_settings = load_settings({**os.environ, **jwts.jwt_env()}).jwt
    jwt_identity, uncached = JwtIdentity(jwt_settings, 2), JwtIdentity(jwt_settings, 2)
    uncached.verify = lambda text: uncached._verify(text)[0]
    jwt_token = runtime.signer().mint_entry_token(TARGET, "auth0|65f1c0d2e4b0a1b2c3d4e5f6", now, 300).text
    bearer = jwts.sign(jwts.realistic_claims())
    jwt_headers = {k: v for k, v in event["headers"].items() if k != "X-User-Id"}
    jwt_event = {**event, "headers": {**jwt_headers, "X-Entry-Token": jwt_token, "Authorization": f"Bearer {bearer}"}}
    assert authorize(signer, jwt_identity, jwt_event, now, lambda target, user_id: True).allowed
    assert check_entry(signer, TARGET, token, "7", now) is not None

    found, loads = rates(
        {
            "bare_hmac_sha256": lambda: hmac.new(key, payload, hashlib.sha256).digest(),
            "keyed_hmac": lambda: keyed_mac(keyed.copy(), payload),
            "read_entry_token": lambda: signer.read_entry_token(token, now),
            "check_entry": lambda: check_entry(signer, TARGET, token, "7", now),
            "gate_authorize": lambda: authorize(signer, header_identity, event, now, lambda target, user_id: True),
            "authorizer_handler": lambda: purchase_authorizer(event, context),
            "gate_authorize_jwt": lambda: authorize(signer, jwt_identity, jwt_event, now, lambda target, user_id: True),
            "gate_authorize_jwt_no_cache": lambda: authorize(
                signer, uncached, jwt_event, now, lambda target, user_id: True
            ),
        }
    )
    bare = found["bare_hmac_sha256"]
    results = {name: statistics.median(values) for name, values in found.items()}
    ratios = {name: benchlib.ratios(values, bare) for name, values in found.items()}
    report = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "token_chars": len(token),
        "baseline": "hmac.new(key, payload, hashlib.sha256).digest()",
        "rounds": len(bare),
        "per_second": {name: round(value) for name, value in results.items()},
        "microseconds_per_call": {name: round(1e6 / value, 2) for name, value in results.items()},
        "ratio_to_bare_hmac": ratios,
        "load_average": benchlib.loads(loads),
        "handler_x_authorize": benchlib.ratios(found["authorizer_handler"], found["gate_authorize"]),
        # Rates: the header mode's body over the jwt mode's is how many times longer a jwt judgement takes.
        "jwt_time_x_header": benchlib.ratios(found["gate_authorize"], found["gate_authorize_jwt"]),
        "jwt_no_cache_time_x_header": benchlib.ratios(found["gate_authorize"], found["gate_authorize_jwt_no_cache"]),
        "target_handler_x_authorize": TARGET_HANDLER_X_AUTHORIZE,
    }
    print(
        f"baseline: hmac.new(key, payload, hashlib.sha256).digest(); median [range] of {len(bare)} alternating "
        f"rounds, load average {min(loads)}-{max(loads)}"
    )
    print(f"{'measure':<22}{'per second':>14}{'us/call':>10}{'x bare HMAC':>26}")
    for name, value in results.items():
        print(f"{name:<22}{value:>14,.0f}{1e6 / value:>10.2f}{benchlib.shown(ratios[name], 'x', 3):>26}")
    verdict = benchlib.verdict(report["handler_x_authorize"], least=TARGET_HANDLER_X_AUTHORIZE)
    print(
        f"handler x gate.authorize: {benchlib.shown(report['handler_x_authorize'], 'x', 3)} "
        f"(target >= {TARGET_HANDLER_X_AUTHORIZE}x) {verdict}"
    )
    print(
        f"gate.authorize in jwt mode, time x header mode: {benchlib.shown(report['jwt_time_x_header'], 'x', 2)} "
        f"cached, {benchlib.shown(report['jwt_no_cache_time_x_header'], 'x', 2)} verifying every call"
    )
    out = benchlib.write_json("bench_authorizer.json", report)
    print(f"written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
