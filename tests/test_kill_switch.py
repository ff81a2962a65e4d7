"""The queue's switch within AppConfig's limits: the AppConfig session polls honestly (botocore's Stubber plays
AppConfig Data, "Request too early" included), and flag deployments reach requests through the queue's store
(flag_sync) in the round trip enter and status make anyway."""

import base64
import io
import json
import time

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from chalicelib import runtime
from chalicelib.flag_sync import sync
from chalicelib.flags import AppConfigSession, flag_version
from chalicelib.redis_connection import connect
from chalicelib.store import QueueStore
from chalicelib.target_config import parse_config
from chalicelib.targets import Target

DROP = Target("limited-drop", 42)
OTHER = Target("ticketing-event", 7)
ON = {"virtual_queue_enabled": {"default": True}}
OFF = {"virtual_queue_enabled": {"default": False}}
SESSION = {"ApplicationIdentifier": "vq", "EnvironmentIdentifier": "live", "ConfigurationProfileIdentifier": "flags"}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def body(configuration):
    raw = json.dumps(configuration).encode() if configuration is not None else b""
    return StreamingBody(io.BytesIO(raw), len(raw))


@pytest.fixture
def appconfig():
    client = boto3.client("appconfigdata", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def expect_session(stubber, interval=15):
    stubber.add_response(
        "start_configuration_session",
        {"InitialConfigurationToken": "t0"},
        {**SESSION, "RequiredMinimumPollIntervalInSeconds": interval},
    )


def expect_poll(stubber, token, configuration, next_token, next_interval=15):
    stubber.add_response(
        "get_latest_configuration",
        {
            "NextPollConfigurationToken": next_token,
            "NextPollIntervalInSeconds": next_interval,
            "ContentType": "application/json",
            "Configuration": body(configuration),
        },
        {"ConfigurationToken": token},
    )


@pytest.fixture
def flags_on(tmp_path):
    """A local flag file saying on: a container's own source, behind the store route."""
    path = tmp_path / "on.json"
    path.write_text(json.dumps(ON))
    return path


def session_of(client, clock):
    return AppConfigSession("vq", "live", "flags", client, poll_interval_s=15, clock=clock)


# --- AppConfig, polled honestly ---


def test_the_session_sets_its_minimum_interval_and_never_polls_sooner(appconfig):
    client, stubber = appconfig
    clock = Clock()
    expect_session(stubber)
    expect_poll(stubber, "t0", OFF, "t1", next_interval=20)  # the service may ask for longer than the session's 15
    session = session_of(client, clock)
    assert session.get_configuration() == OFF  # the cold start waits for its first poll (briefly)

    for _ in range(19):  # every call within the 20 s the service asked for reads the configuration in hand
        clock.now += 1
        assert session.get_configuration() == OFF
    stubber.assert_no_pending_responses()  # and no call reached AppConfig (the Stubber would refuse one)

    expect_poll(stubber, "t1", None, "t2")  # empty: unchanged
    clock.now += 1
    session.get_configuration()
    session._refresh.wait(5)
    assert session.get_configuration() == OFF


def test_request_too_early_does_not_change_the_flag(appconfig, make_room):
    client, stubber = appconfig
    clock = Clock()
    expect_session(stubber)
    expect_poll(stubber, "t0", OFF, "t1")
    session = session_of(client, clock)
    session.poll()
    room = make_room(VQ_QUEUE_ENABLED_DEFAULT="true")
    room.switch.source = session
    assert room.enter(DROP, "1").status == "DIRECT_ADMITTED"

    # AppConfig's documented answer to a GetLatestConfiguration inside the session's minimum interval.
    stubber.add_client_error(
        "get_latest_configuration",
        service_error_code="BadRequestException",
        service_message="Request too early",
        http_status_code=400,
        expected_params={"ConfigurationToken": "t1"},
    )
    clock.now += 15
    session.poll()
    assert session.get_configuration() == OFF
    assert room.enter(DROP, "2").status == "DIRECT_ADMITTED"  # not the default (true): the flag holds

    # The session is started again, one whole interval after the refusal.
    clock.now += 14
    assert session.get_configuration() == OFF  # not due yet: no call
    expect_session(stubber)
    expect_poll(stubber, "t0", ON, "t1")
    clock.now += 1
    session.poll()
    assert room.enter(DROP, "3").status == "WAITING"


def test_a_cold_start_with_appconfig_silent_answers_the_default_after_a_short_wait(
    make_room, hung_endpoint, monkeypatch
):
    monkeypatch.setenv("AWS_ENDPOINT_URL_APPCONFIGDATA", hung_endpoint)
    room = make_room(
        VQ_APPCONFIG_APPLICATION="vq",
        VQ_APPCONFIG_ENVIRONMENT="live",
        VQ_APPCONFIG_PROFILE="flags",
        VQ_QUEUE_ENABLED_DEFAULT="false",
    )
    started = time.monotonic()
    assert room.enter(DROP, "1").status == "DIRECT_ADMITTED"
    assert time.monotonic() - started < 2  # the first fetch is waited for 0.1 s; loaded machines are slow


# --- the fast route: flag deployments through the queue's store ---


def extension_event(configuration):
    """What AppConfig hands an extension at PRE_START_DEPLOYMENT: the configuration, base64."""
    return {"Type": "PreStartDeployment", "Content": base64.b64encode(json.dumps(configuration).encode()).decode()}


def never_read():
    raise AssertionError("the deployed configuration was not to be read")


def test_a_deployment_switches_the_queue_off_and_on_at_the_next_request(make_room, flags_on):
    room = make_room(VQ_FLAGS_FILE=flags_on)  # a container whose own source still says on
    room.configure(DROP, parse_config(b'{"batch": 5}'))  # an opened target
    ticket = room.enter(DROP, "1").queue_ticket

    answer = sync(extension_event(OFF), lambda: room.store, never_read)
    assert answer == {"published": True, "version": flag_version(OFF), "targets": 1}
    assert room.enter(DROP, "2").status == "DIRECT_ADMITTED"
    assert room.status(DROP, "1", ticket).status == "DIRECT_ADMITTED"

    sync(extension_event(ON), lambda: room.store, never_read)
    assert room.status(DROP, "1", ticket).position == 1  # the line survived the switch
    assert room.enter(DROP, "3").status == "WAITING"

    # From flag_sync's start to the first request answered by the new configuration, off and on in turn.
    took = []
    for flip in range(10):
        configuration, expected = (OFF, "DIRECT_ADMITTED") if flip % 2 == 0 else (ON, "WAITING")
        started = time.perf_counter()
        sync(extension_event(configuration), lambda: room.store, never_read)
        assert room.enter(DROP, "3").status == expected
        took.append((time.perf_counter() - started) * 1000)
    took.sort()
    print(
        f"\nflag deployment to the first request answering by it: min {took[0]:.1f} ms, median "
        f"{(took[4] + took[5]) / 2:.1f} ms, max {took[-1]:.1f} ms (10 flips)"
    )


def test_the_stored_configuration_is_read_once_per_container_and_flip(make_room, flags_on, monkeypatch):
    room = make_room(VQ_FLAGS_FILE=flags_on)
    room.configure(DROP, parse_config(b'{"batch": 5}'))
    room.configure(OTHER, parse_config(b'{"batch": 5}'))
    sync(extension_event(OFF), lambda: room.store, never_read)
    reads = []
    read = room.store.flag
    monkeypatch.setattr(room.store, "flag", lambda: reads.append(1) or read())
    for user in range(1, 6):
        assert room.enter(DROP, str(user)).status == "DIRECT_ADMITTED"
        assert room.enter(OTHER, str(user)).status == "DIRECT_ADMITTED"
    assert len(reads) == 1


def test_per_target_rules_and_rollout_come_through_the_store_whole(make_room, flags_on):
    room = make_room(VQ_FLAGS_FILE=flags_on)
    room.configure(DROP, parse_config(b'{"batch": 5}'))
    room.configure(OTHER, parse_config(b'{"batch": 5}'))
    only_drop_off = {
        "virtual_queue_enabled": {
            "default": True,
            "rules": {
                "drop 42 off": {
                    "when_match": False,
                    "conditions": [{"action": "KEY_IN_VALUE", "key": "target", "value": [str(DROP)]}],
                }
            },
        }
    }
    sync(extension_event(only_drop_off), lambda: room.store, never_read)
    assert room.enter(OTHER, "1").status == "WAITING"
    assert room.enter(DROP, "1").status == "DIRECT_ADMITTED"


def test_an_operator_reconfiguring_a_target_keeps_its_flag_mark(make_room, flags_on):
    room = make_room(VQ_FLAGS_FILE=flags_on)
    room.configure(DROP, parse_config(b'{"batch": 5}'))
    sync(extension_event(OFF), lambda: room.store, never_read)
    room.configure(DROP, parse_config(b'{"batch": 7}'))
    assert room.config(DROP).body["config"] == {"batch": 7}
    assert room.enter(DROP, "1").status == "DIRECT_ADMITTED"


def test_a_target_opened_after_a_flip_follows_it_at_once(make_room, flags_on):
    room = make_room(VQ_FLAGS_FILE=flags_on)
    room.configure(DROP, parse_config(b'{"batch": 5}'))
    sync(extension_event(OFF), lambda: room.store, never_read)
    room.configure(OTHER, parse_config(b'{"batch": 5}'))  # opened after the flip
    fresh = make_room(VQ_FLAGS_FILE=flags_on)  # a container that has not met the flip yet
    assert fresh.enter(OTHER, "1").status == "DIRECT_ADMITTED"


def test_targets_in_line_are_marked_even_unconfigured(make_room, flags_on):
    room = make_room(VQ_FLAGS_FILE=flags_on)
    ticket = room.enter(DROP, "1").queue_ticket  # registered by the entry, never configured
    assert sync(extension_event(OFF), lambda: room.store, never_read)["targets"] == 1
    assert room.status(DROP, "1", ticket).status == "DIRECT_ADMITTED"


def test_a_rollback_publishes_the_configuration_appconfig_serves_again(make_room, flags_on):
    room = make_room(VQ_FLAGS_FILE=flags_on)
    room.configure(DROP, parse_config(b'{"batch": 5}'))
    sync(extension_event(OFF), lambda: room.store, never_read)
    answer = sync({"Type": "OnDeploymentRolledBack"}, lambda: room.store, lambda: ON)
    assert answer["version"] == flag_version(ON)
    assert room.enter(DROP, "1").status == "WAITING"


@pytest.mark.parametrize(
    "event", [extension_event(["not", "an", "object"]), {"Type": "PreStartDeployment", "Content": "%%%"}]
)
def test_a_bad_configuration_is_not_published_and_never_fails_the_deployment(make_room, flags_on, event):
    room = make_room(VQ_FLAGS_FILE=flags_on)
    room.configure(DROP, parse_config(b'{"batch": 5}'))
    assert sync(event, lambda: room.store, never_read) == {"published": False}
    assert room.enter(DROP, "1").status == "WAITING"


def test_redis_down_never_fails_the_deployment():
    dead = QueueStore(connect("redis://127.0.0.1:9"), "vq")
    assert sync(extension_event(OFF), lambda: dead, never_read) == {"published": False}


@pytest.mark.parametrize("fail_mode, expected", [("open", "DIRECT_ADMITTED"), ("closed", 503)])
def test_with_redis_down_the_queue_switched_off_still_lets_users_in_and_on_follows_the_outage_rule(
    api,
    env,
    flags_on,
    fail_mode,
    expected,
    tmp_path,
):
    off = tmp_path / "off.json"
    off.write_text(json.dumps(OFF))
    env(REDIS_URL="redis://127.0.0.1:9", VQ_FAIL_MODE=fail_mode, VQ_FLAGS_FILE=off)
    answer = api.http.post("/virtual-queues/limited-drop/42/entries", headers={"X-User-Id": "1"})
    assert answer.json_body["status"] == "DIRECT_ADMITTED"

    env(VQ_FLAGS_FILE=flags_on)
    answer = api.http.post("/virtual-queues/limited-drop/42/entries", headers={"X-User-Id": "1"})
    assert (answer.json_body["status"] if answer.status_code == 200 else answer.status_code) == expected


def test_the_flag_sync_entry_point_publishes_an_extension_event(api, env, flags_on):
    env(VQ_FLAGS_FILE=flags_on)
    runtime.waiting_room().configure(DROP, parse_config(b'{"batch": 5}'))
    answer = api.lambda_.invoke("flag_sync", extension_event(OFF))
    assert answer.payload["published"] is True
    assert runtime.waiting_room().enter(DROP, "1").status == "DIRECT_ADMITTED"
