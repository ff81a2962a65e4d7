"""A cold start that cannot read its signing keys (Secrets Manager out of reach, the secret missing or malformed)
answers 503 QUEUE_UNAVAILABLE with Retry-After and counts SigningKeysUnavailable, the authorizer denies rather
than failing, operators keep their routes, and the first request after Retry-After reads the keys again: never
a crash loop. Secrets Manager is played by moto."""

import json
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from chalicelib import aws, runtime
from chalicelib.config import load_keyring
from chalicelib.gate import authorize
from chalicelib.targets import Target
from chalicelib.tokens import TokenSigner

ROOT = Path(__file__).resolve().parent.parent
ENTRIES = "/virtual-queues/limited-drop/42/entries"
ARN = "arn:aws:execute-api:eu-west-1:123456789012:a1b2c3d4e5/api/POST/limited-drops/42/orders"
KEYS = {"activeKid": "k1", "k1": "s" * 64}

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")


@pytest.fixture
def secrets_manager(env):
    """moto's Secrets Manager, the functions pointed at a signing key secret that does not exist yet."""
    with mock_aws():
        aws.reset()
        env(VQ_TOKEN_KEYS_SECRET_ID="vq/signing-keys", VQ_TICK_MS=100)  # Retry-After: one tick, at least 1 s
        runtime.settings()  # now, before the test client patches in .chalice/config.json's VQ_TICK_MS
        yield boto3.client("secretsmanager", region_name="us-east-1")
        aws.reset()


def metric_lines(capsys, name):
    return [line for line in capsys.readouterr().out.splitlines() if f'"{name}"' in line]


def test_a_cold_start_without_its_keys_answers_503_and_reads_them_at_the_first_request_after_retry_after(
    secrets_manager, api, capsys
):
    answer = api.http.post(ENTRIES, headers={"X-User-Id": "1"})

    assert answer.status_code == 503
    assert answer.json_body["code"] == "QUEUE_UNAVAILABLE"
    assert answer.headers["Retry-After"] == "1"
    assert len(metric_lines(capsys, "SigningKeysUnavailable")) == 1
    # Within Retry-After the container does not ask again (no second metric); operators are still served.
    assert api.http.post(ENTRIES, headers={"X-User-Id": "1"}).status_code == 503
    assert api.http.get("/virtual-queues").status_code == 200
    assert metric_lines(capsys, "SigningKeysUnavailable") == []

    secrets_manager.create_secret(Name="vq/signing-keys", SecretString=json.dumps(KEYS))
    time.sleep(1.05)
    entered = api.http.post(ENTRIES, headers={"X-User-Id": "1"})
    assert entered.status_code == 200 and entered.json_body["status"] == "WAITING"
    assert entered.json_body["queueTicket"]  # the place was given only once it could come with its ticket


def test_a_place_is_never_given_without_its_ticket(secrets_manager, api, store):
    assert api.http.post(ENTRIES, headers={"X-User-Id": "1"}).status_code == 503
    assert store.registered_targets() == {}  # nothing was written


def test_a_malformed_secret_is_unavailable_keys_too(secrets_manager, api, capsys):
    secrets_manager.create_secret(Name="vq/signing-keys", SecretString="not json")
    assert api.http.post(ENTRIES, headers={"X-User-Id": "1"}).status_code == 503
    assert metric_lines(capsys, "SigningKeysUnavailable")


def test_the_authorizer_denies_without_its_keys_and_never_fails(secrets_manager, api, capsys):
    genuine = TokenSigner(load_keyring({"VQ_TOKEN_KEYS": json.dumps({"k1": KEYS["k1"]})}))
    token = genuine.mint_entry_token(Target("limited-drop", 42), "7", time.time(), 300).text
    event = {"type": "REQUEST", "methodArn": ARN, "headers": {"X-Entry-Token": token, "X-User-Id": "7"}}

    policy = api.lambda_.invoke("purchase_authorizer", event).payload

    assert policy["policyDocument"]["Statement"][0]["Effect"] == "Deny"
    out = capsys.readouterr().out
    assert '"SigningKeysUnavailable"' in out and '"BypassDenied"' not in out  # not the caller's doing


def test_a_switched_off_queue_still_lets_purchases_through_without_keys(secrets_manager):
    event = {"type": "REQUEST", "methodArn": ARN, "headers": {"X-User-Id": "7"}}
    verdict = authorize(runtime.signer(), runtime.identity(), event, time.time(), lambda target, user: False)
    assert verdict.allowed


def test_the_functions_start_without_reaching_secrets_manager():
    # An endpoint nothing listens on: importing the app (a cold start's init) must not try it.
    code = "import time; t = time.monotonic(); import app; print(round(time.monotonic() - t, 1))"
    env = {
        "PATH": "/usr/bin:/bin",
        "POWERTOOLS_TRACE_DISABLED": "1",
        "VQ_TOKEN_KEYS_SECRET_ID": "vq/signing-keys",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_SECRETS_MANAGER": "http://127.0.0.1:9",
    }
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
