"""Operations: the feature flag, metrics and logs, stats, signing keys from Secrets Manager."""

import io
import json
import random
import time

import boto3
import pytest
from moto import mock_aws

from chalicelib import aws, flags, runtime, waits
from chalicelib.config import ConfigError, load_keyring, load_settings
from chalicelib.errors import QueueFull
from chalicelib.observability import logger
from chalicelib.targets import Target
from tests.conftest import TEST_KEYS
from tests.support.ticks import admit_through

DROP = Target("limited-drop", 42)
OTHER = Target("limited-drop", 43)


def write_flags(path, default=True, rules=None):
    path.write_text(json.dumps({"virtual_queue_enabled": {"default": default, "rules": rules or {}}}))


@pytest.fixture
def flags_file(tmp_path):
    path = tmp_path / "flags.json"
    write_flags(path)
    return path


@pytest.fixture
def logged():
    """What the Powertools logger writes during the test (its handler holds the stream it started with)."""
    stream = io.StringIO()
    previous = logger.registered_handler.setStream(stream)
    yield stream
    logger.registered_handler.setStream(previous)


def emf_lines(out):
    return [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"_aws"' in line]


def test_shipped_flag_file_is_valid_and_keeps_the_queue_on(room):
    assert room.switch.queue_enabled(DROP, "7") is True
    assert room.enter(DROP, "7").status == "WAITING"


def test_flag_off_admits_directly_and_on_again_queues_within_seconds(make_room, flags_file):
    room = make_room(VQ_FLAGS_FILE=flags_file)
    ticket = room.enter(DROP, "1").queue_ticket

    write_flags(flags_file, default=False)
    start = time.monotonic()
    while room.enter(DROP, "2").status != "DIRECT_ADMITTED":
        assert time.monotonic() - start < 3, "the flag did not take effect within 3 s"
        time.sleep(0.05)
    direct = room.enter(DROP, "2")
    assert direct.entry_token.grants(DROP, "2") and direct.to_body()["tokenExpiresAt"]
    assert room.status(DROP, "1", ticket).status == "DIRECT_ADMITTED"

    write_flags(flags_file, default=True)
    start = time.monotonic()
    while room.enter(DROP, "3").status != "WAITING":
        assert time.monotonic() - start < 3
        time.sleep(0.05)
    assert room.status(DROP, "1", ticket).position == 1  # the line survived the switch


def test_per_target_override_switches_one_target_off(make_room, flags_file):
    write_flags(
        flags_file,
        rules={
            "drop 42 off": {
                "when_match": False,
                "conditions": [{"action": "KEY_IN_VALUE", "key": "target", "value": [str(DROP)]}],
            }
        },
    )
    room = make_room(VQ_FLAGS_FILE=flags_file)
    assert room.enter(DROP, "1").status == "DIRECT_ADMITTED"
    assert room.enter(OTHER, "1").status == "WAITING"


def test_rules_of_the_target_alone_are_evaluated_once_per_target_and_configuration(make_room, flags_file, monkeypatch):
    write_flags(
        flags_file,
        rules={
            "drop 42 off": {
                "when_match": False,
                "conditions": [{"action": "KEY_IN_VALUE", "key": "target", "value": [str(DROP)]}],
            }
        },
    )
    switch = make_room(VQ_FLAGS_FILE=flags_file).switch
    evaluated = []
    evaluate = switch._flags.evaluate
    monkeypatch.setattr(
        switch._flags, "evaluate", lambda **kw: evaluated.append(kw["context"]["target"]) or evaluate(**kw)
    )
    assert [switch.queue_enabled(target, str(user)) for target in (DROP, OTHER) for user in range(1, 50)] == [
        False
    ] * 49 + [True] * 49
    assert evaluated == [str(DROP), str(OTHER)]

    write_flags(flags_file, default=False)  # a new configuration decides afresh
    assert not switch.queue_enabled(OTHER, "1") and not switch.queue_enabled(OTHER, "2")
    assert evaluated == [str(DROP), str(OTHER), str(OTHER)]


def test_decisions_kept_per_target_are_bounded_whatever_targets_callers_name(make_room, flags_file, monkeypatch):
    write_flags(
        flags_file,
        rules={
            "drop 42 off": {
                "when_match": False,
                "conditions": [{"action": "KEY_IN_VALUE", "key": "target", "value": [str(DROP)]}],
            }
        },
    )
    monkeypatch.setattr(flags, "DECISIONS_KEPT", 10)
    switch = make_room(VQ_FLAGS_FILE=flags_file).switch
    assert not switch.queue_enabled(DROP, "1")
    assert all(switch.queue_enabled(Target("limited-drop", n)) for n in range(1000, 1100))
    assert len(switch._in_effect.decided) <= 10
    assert not switch.queue_enabled(DROP, "2")  # still decided by the rules after the flood


def test_percentage_rollout_queues_about_the_share_and_each_user_always_the_same_way(make_room, flags_file):
    write_flags(
        flags_file,
        default=False,
        rules={
            "30 percent": {
                "when_match": True,
                "conditions": [
                    {"action": "MODULO_RANGE", "key": "user_id", "value": {"BASE": 100, "START": 0, "END": 29}}
                ],
            }
        },
    )
    room = make_room(VQ_FLAGS_FILE=flags_file)
    users = random.Random(7).sample(range(1, 10**12), 2000)
    queued = {user: room.switch.queue_enabled(DROP, str(user)) for user in users}
    share = sum(queued.values()) / len(users)
    assert 0.26 < share < 0.34
    assert all(room.switch.queue_enabled(DROP, str(user)) == queued[user] for user in users[:200])


@pytest.mark.parametrize("content", ["{not json", json.dumps({"virtual_queue_enabled": {"default": "yes"}})])
@pytest.mark.parametrize("default", ["true", "false"])
def test_unreadable_flag_falls_back_to_the_documented_default(make_room, tmp_path, content, default):
    broken = tmp_path / "flags.json"
    broken.write_text(content)
    room = make_room(VQ_FLAGS_FILE=broken, VQ_QUEUE_ENABLED_DEFAULT=default)
    assert room.switch.queue_enabled(DROP, "1") is (default == "true")
    missing = make_room(VQ_FLAGS_FILE=tmp_path / "absent.json", VQ_QUEUE_ENABLED_DEFAULT=default)
    assert missing.switch.queue_enabled(DROP, "1") is (default == "true")


def test_appconfig_unreachable_falls_back_to_the_default(make_room, monkeypatch):
    # A closed local port stands in for AppConfig: the fetch fails fast, the flag answers its default.
    monkeypatch.setenv("AWS_ENDPOINT_URL_APPCONFIGDATA", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    room = make_room(
        VQ_APPCONFIG_APPLICATION="virtual-queue",
        VQ_APPCONFIG_ENVIRONMENT="prod",
        VQ_APPCONFIG_PROFILE="flags",
        VQ_QUEUE_ENABLED_DEFAULT="false",
    )
    assert type(room.switch.source).__name__ == "AppConfigSession"
    assert room.enter(DROP, "1").status == "DIRECT_ADMITTED"


def test_metrics_are_emf_with_the_target_dimension(make_room, capsys):
    room = make_room(VQ_MAX_WAITING=1)
    ticket = room.enter(DROP, "1").queue_ticket
    with pytest.raises(QueueFull):
        room.enter(DROP, "2")
    admit_through(room.store, DROP, "1")
    room.status(DROP, "1", ticket)

    emitted = {}
    for line in emf_lines(capsys.readouterr().out):
        directive = line["_aws"]["CloudWatchMetrics"][0]
        assert directive["Namespace"] == "VirtualQueue"
        assert ["target"] in [sorted(d) for d in directive["Dimensions"]] or any(
            "target" in d for d in directive["Dimensions"]
        )
        for metric in directive["Metrics"]:
            value = line[metric["Name"]]
            emitted[metric["Name"]] = (value[0] if isinstance(value, list) else value, metric["Unit"], line["target"])
    assert emitted["EnterRejectedFull"] == (1.0, "Count", "limited-drop:42")
    assert emitted["TokensIssued"] == (1.0, "Count", "limited-drop:42")
    value, unit, target = emitted["WaitSeconds"]
    assert unit == "Seconds" and 0 <= value < 5 and target == "limited-drop:42"


def test_no_log_line_carries_a_token_a_ticket_or_a_key(api, env, redis_url, capsys, logged):
    env(REDIS_URL="redis://127.0.0.1:9")  # an outage makes the app log warnings too
    entered = api.http.post("/virtual-queues/limited-drop/42/entries", headers={"X-User-Id": "1"}).json_body
    env(REDIS_URL=redis_url)
    first = api.http.post("/virtual-queues/limited-drop/42/entries", headers={"X-User-Id": "2"}).json_body
    me = {"X-User-Id": "2", "X-Queue-Ticket": first["queueTicket"]}
    api.http.get("/virtual-queues/limited-drop/42/entries/me", headers=me)
    api.http.get("/virtual-queues/limited-drop/42/entries/me", headers={**me, "X-Queue-Ticket": "forged.ticket"})
    out = capsys.readouterr()
    written = logged.getvalue() + out.out + out.err
    assert '"level"' in written  # there are log lines to look at
    secrets = [entered["entryToken"], first["queueTicket"], *TEST_KEYS.values()]
    for secret in secrets:
        for part in secret.split("."):
            assert part not in written


def test_log_lines_carry_the_request_id_target_and_user(env, logged):
    """Through the Lambda entry point with an API Gateway event, as deployed."""
    from chalice.local import LambdaContext

    from app import app
    from chalicelib.observability import logger

    logger.clear_state()  # what other Lambda functions left in this process's logger
    env(REDIS_URL="redis://127.0.0.1:9")  # the outage warning is the line to look at
    event = {
        "resource": "/virtual-queues/{queue_type}/{target_id}/entries",
        "httpMethod": "POST",
        "path": "/virtual-queues/limited-drop/42/entries",
        "headers": {"X-User-Id": "7"},
        "multiValueHeaders": {"X-User-Id": ["7"]},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "stageVariables": None,
        "body": None,
        "isBase64Encoded": False,
        "pathParameters": {"queue_type": "limited-drop", "target_id": "42"},
        "requestContext": {
            "requestId": "req-4711",
            "resourcePath": "/virtual-queues/{queue_type}/{target_id}/entries",
            "httpMethod": "POST",
            "stage": "api",
        },
    }
    answer = app(event, LambdaContext("api_handler", 256))
    assert answer["statusCode"] == 200 and json.loads(answer["body"])["status"] == "DIRECT_ADMITTED"
    records = [json.loads(line) for line in logged.getvalue().splitlines()]
    warning = next(r for r in records if r["message"] == "queue state unavailable")
    assert warning["service"] == "virtual-queue" and warning["correlation_id"] == "req-4711"
    assert warning["target"] == "limited-drop:42" and warning["user_id"] == "7"
    logger.info("after the request")  # the request's keys stay with its own lines
    after = json.loads(logged.getvalue().splitlines()[-1])
    assert after["message"] == "after the request" and not {"correlation_id", "target", "user_id"} & set(after)


def test_stats_p95_is_right_within_the_histograms_resolution(room):
    room.enter(DROP, "1")
    rng = random.Random(3)
    waits_s = [rng.expovariate(1 / 40) for _ in range(2000)]  # a long-tailed spread of waits
    pipe = room.store.client.pipeline()
    keys = room.store.keys(DROP)
    for wait in waits_s:
        pipe.hincrby(keys.waits, waits.bucket_of(wait), 1)
    pipe.hset(keys.stats, mapping={"wait_count": len(waits_s), "wait_ms": int(sum(waits_s) * 1000)})
    pipe.execute()

    stats = room.stats(DROP)
    true_p95 = sorted(waits_s)[int(0.95 * len(waits_s)) - 1]
    assert true_p95 <= stats["p95WaitSeconds"] <= true_p95 * waits.GROWTH * 1.001
    assert stats["avgWaitSeconds"] == pytest.approx(sum(waits_s) / len(waits_s), rel=1e-3)


def test_stats_of_a_live_queue(room):
    tickets = {user: room.enter(DROP, str(user)).queue_ticket for user in range(1, 6)}
    room.leave(DROP, "5", tickets[5])
    admit_through(room.store, DROP, "2")
    room.status(DROP, "1", tickets[1])
    stats = room.stats(DROP)
    assert stats["waitingCount"] == 2 and stats["leftCount"] == 1
    assert stats["avgWaitSeconds"] is not None and stats["p95WaitSeconds"] == 1.0  # waited under a second


def test_stats_over_http(api):
    api.http.post("/virtual-queues/limited-drop/42/entries", headers={"X-User-Id": "1"})
    answer = api.http.get("/virtual-queues/limited-drop/42/stats")
    assert answer.status_code == 200
    body = answer.json_body
    assert {"waitingCount", "admittedCount", "admissionRatePerSec", "avgWaitSeconds", "p95WaitSeconds"} <= set(body)
    assert body["waitingCount"] == 1
    assert api.http.get("/virtual-queues/limited-drop/0/stats").status_code == 400


@mock_aws
def test_signing_keys_come_from_secrets_manager(monkeypatch):
    aws.reset()
    client = boto3.client("secretsmanager", region_name="us-east-1")
    keys = {"activeKid": "k2", "keys": {"k1": "s" * 40, "k2": "t" * 40}}
    client.create_secret(Name="vq/signing-keys", SecretString=json.dumps(keys))
    env = {"VQ_TOKEN_KEYS_SECRET_ID": "vq/signing-keys"}
    keyring = load_keyring(env)
    assert keyring.active_kid == "k2" and keyring.secrets["k1"] == b"s" * 40
    assert "sss" not in repr(keyring)

    with pytest.raises(ConfigError, match="vq/absent"):
        load_keyring({"VQ_TOKEN_KEYS_SECRET_ID": "vq/absent"})
    client.put_secret_value(SecretId="vq/signing-keys", SecretString="not json")
    aws.reset()
    with pytest.raises(ConfigError, match="activeKid"):
        load_keyring(env)
    assert load_settings(env).keyring is None  # never read at start-up: the signer reads it on first use


@mock_aws
def test_rotated_secret_reaches_a_running_signer(monkeypatch):
    aws.reset()
    client = boto3.client("secretsmanager", region_name="us-east-1")
    client.create_secret(Name="vq/keys", SecretString=json.dumps({"activeKid": "k1", "keys": {"k1": "s" * 40}}))
    monkeypatch.setenv("VQ_TOKEN_KEYS_SECRET_ID", "vq/keys")
    monkeypatch.setenv("VQ_KEYS_MAX_AGE_S", "1")
    runtime.reset()
    signer = runtime.signer()
    old = signer.mint_entry_token(DROP, "1", time.time(), 300)

    client.put_secret_value(
        SecretId="vq/keys", SecretString=json.dumps({"activeKid": "k2", "keys": {"k1": "s" * 40, "k2": "t" * 40}})
    )
    time.sleep(1.1)
    signer.mint_entry_token(DROP, "1", time.time(), 300)  # due: starts the refresh in the background
    signer.refreshing.wait(10)
    new = signer.mint_entry_token(DROP, "1", time.time(), 300)
    assert signer.keyring.active_kid == "k2"
    assert signer.read_entry_token(old.text, time.time()) and signer.read_entry_token(new.text, time.time())
    runtime.reset()


def test_measured_rate_feeds_stats_and_eta_only_from_ticks_that_left_users_waiting(make_room):
    from chalicelib.pump import Pump

    room = make_room(VQ_BATCH_SIZE=4, VQ_TICK_MS=100)  # configured: 40 admissions per second
    pump = Pump(room.store, room.settings)
    tickets = [room.enter(DROP, str(user)).queue_ticket for user in range(1, 11)]
    assert room.stats(DROP)["admissionRatePerSec"] == 0.0  # nothing measured yet

    run = pump.run(ticks=2)  # 8 admitted over two ticks that each left users waiting
    assert run.admitted == 8
    measured = room.stats(DROP)["admissionRatePerSec"]
    assert measured == pytest.approx(40, rel=0.01)

    # The rate measured is what the ETA uses: fake a slower line and the ETA grows with it.
    room.store.client.hset(room.store.keys(DROP).pace, "rate", "0.5")
    last = room.status(DROP, "10", tickets[-1])
    assert (last.ahead_count, last.eta_seconds) == (1, 2)

    time.sleep(0.11)  # into the next tick
    pump.run(ticks=1)  # admits the last 2 and leaves nobody waiting: a demand-bound tick
    stats = room.stats(DROP)
    assert stats["admittedCount"] == 10 and stats["waitingCount"] == 0
    assert stats["admissionRatePerSec"] == pytest.approx(40, rel=0.01)  # not dragged down by the short tick
