"""The REQUEST authorizer of the purchase routes, invoked as API Gateway would, with REQUEST-shaped events."""

import json
import time

import pytest

from chalicelib import runtime
from chalicelib.config import Keyring
from chalicelib.gate import target_from_method_arn
from chalicelib.targets import Target
from chalicelib.tokens import TokenSigner
from tests.conftest import TEST_KEYS
from tests.support.observed import counted

ARN_HEAD = "arn:aws:execute-api:eu-west-1:123456789012:a1b2c3d4e5/api"
DROP_ARN = f"{ARN_HEAD}/POST/limited-drops/42/orders"
SEAT_ARN = f"{ARN_HEAD}/POST/events/42/seats/select"
DROP = Target("limited-drop", 42)
USER = 7

# An Allow emits no metric, so log_metrics flushes nothing; observability.py silences that warning at import,
# which pytest's per-test warning capture undoes.
pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")


def mint(target=DROP, user=USER, now=None, ttl_s=300, signer=None):
    signer = signer or runtime.signer()
    return signer.mint_entry_token(target, str(user), time.time() if now is None else now, ttl_s).text


def event(method_arn=DROP_ARN, headers=None):
    """A REQUEST authorizer event as API Gateway (REST) sends it."""
    return {
        "type": "REQUEST",
        "methodArn": method_arn,
        "resource": "/limited-drops/{drop_id}/orders",
        "path": "/limited-drops/42/orders",
        "httpMethod": "POST",
        "headers": headers,
        "multiValueHeaders": {name: [value] for name, value in headers.items()} if isinstance(headers, dict) else None,
        "pathParameters": {"drop_id": "42"},
        "requestContext": {"requestId": "req-1", "stage": "api"},
    }


def authorize(api, evt):
    return api.lambda_.invoke("purchase_authorizer", evt).payload


def statement(policy):
    (only,) = policy["policyDocument"]["Statement"]
    return only


def assert_denied(policy, method_arn):
    assert statement(policy) == {"Action": "execute-api:Invoke", "Effect": "Deny", "Resource": method_arn}
    assert policy["context"] == {}


def test_valid_token_is_allowed_for_exactly_this_method_arn_with_its_claims(api):
    token = runtime.signer().read_entry_token(mint(), time.time())
    policy = authorize(api, event(headers={"X-Entry-Token": token.text, "X-User-Id": "7"}))
    assert statement(policy) == {"Action": "execute-api:Invoke", "Effect": "Allow", "Resource": DROP_ARN}
    assert policy["principalId"] == "7"
    assert policy["context"] == {
        "userId": "7",
        "targetType": "limited-drop",
        "targetId": "42",
        "tokenId": token.token_id,
    }
    assert all(isinstance(value, str) for value in policy["context"].values())
    assert token.text not in json.dumps(policy)


@pytest.mark.parametrize(
    "token_name, user_name",
    [
        ("x-entry-token", "x-user-id"),
        ("X-ENTRY-TOKEN", "X-USER-ID"),
        ("x-Entry-token", "X-user-Id"),
    ],
)
def test_header_names_match_whatever_their_case(api, token_name, user_name):
    policy = authorize(api, event(headers={token_name: mint(), user_name: "7"}))
    assert statement(policy)["Effect"] == "Allow"


def test_seat_route_allows_a_ticketing_token(api):
    token = mint(Target("ticketing-event", 42))
    policy = authorize(api, event(SEAT_ARN, {"X-Entry-Token": token, "X-User-Id": "7"}))
    assert statement(policy)["Resource"] == SEAT_ARN and statement(policy)["Effect"] == "Allow"
    assert policy["context"]["targetType"] == "ticketing-event"


def other_keyring(secret):
    return Keyring.from_json(json.dumps({"k1": secret}), None)


def forged():
    text = mint()
    payload, signature = text.split(".")
    return payload + "." + ("A" if signature[0] != "A" else "B") + signature[1:]


DENIED_HEADERS = {
    "forged signature": lambda: {"X-Entry-Token": forged(), "X-User-Id": "7"},
    "signed by an unknown key": lambda: {
        "X-Entry-Token": mint(signer=TokenSigner(other_keyring("another-secret-0123456789abcdefghijklmnopq"))),
        "X-User-Id": "7",
    },
    "expired": lambda: {"X-Entry-Token": mint(now=time.time() - 301), "X-User-Id": "7"},
    "another target id": lambda: {"X-Entry-Token": mint(Target("limited-drop", 43)), "X-User-Id": "7"},
    "another target type": lambda: {"X-Entry-Token": mint(Target("ticketing-event", 42)), "X-User-Id": "7"},
    "another user": lambda: {"X-Entry-Token": mint(), "X-User-Id": "9"},
    "user 8's token claimed by user 7": lambda: {"X-Entry-Token": mint(user=8), "X-User-Id": "7"},
    "no token header": lambda: {"X-User-Id": "7"},
    "no user header": lambda: {"X-Entry-Token": mint()},
    "no headers at all": lambda: None,
    "headers not a map": lambda: ["X-Entry-Token", mint()],
    "empty token": lambda: {"X-Entry-Token": "", "X-User-Id": "7"},
    "junk token": lambda: {"X-Entry-Token": "not.a-token", "X-User-Id": "7"},
    "junk user": lambda: {"X-Entry-Token": mint(), "X-User-Id": "seven"},
    "user id with a leading zero": lambda: {"X-Entry-Token": mint(), "X-User-Id": "07"},
    "10 KB token": lambda: {"X-Entry-Token": mint() + "A" * 10_240, "X-User-Id": "7"},
    "10 KB user": lambda: {"X-Entry-Token": mint(), "X-User-Id": "7" * 10_240},
    "non-ASCII token": lambda: {"X-Entry-Token": mint()[:-2] + "é€", "X-User-Id": "7"},
    "non-ASCII user": lambda: {"X-Entry-Token": mint(), "X-User-Id": "٧"},
    "token not a string": lambda: {"X-Entry-Token": None, "X-User-Id": "7"},
    "two spellings of the user header disagree": lambda: {"X-Entry-Token": mint(), "X-User-Id": "7", "x-user-id": "8"},
    "queue ticket instead of a token": lambda: {
        "X-Entry-Token": runtime.signer().issue_ticket(DROP, str(USER), 1, 1).text,
        "X-User-Id": "7",
    },
}


@pytest.mark.parametrize("case", sorted(DENIED_HEADERS))
def test_anything_but_a_valid_token_of_this_target_and_user_is_denied(api, capsys, case):
    policy = authorize(api, event(headers=DENIED_HEADERS[case]()))
    assert_denied(policy, DROP_ARN)
    # For the whole service only: the target is the caller's word, and each target would be a metric to pay for.
    assert counted(capsys.readouterr().out, "BypassDenied") == [{"service": "virtual-queue"}]


def test_drop_token_on_the_seat_route_is_denied(api):
    policy = authorize(api, event(SEAT_ARN, {"X-Entry-Token": mint(), "X-User-Id": "7"}))
    assert_denied(policy, SEAT_ARN)


UNKNOWN_ARNS = [
    f"{ARN_HEAD}/GET/limited-drops/42/orders",
    f"{ARN_HEAD}/POST/limited-drops/42/orders/",
    f"{ARN_HEAD}/POST/limited-drops/42/orders/extra",
    f"{ARN_HEAD}/POST/limited-drops/42",
    f"{ARN_HEAD}/POST/limited-drops/042/orders",
    f"{ARN_HEAD}/POST/limited-drops/0/orders",
    f"{ARN_HEAD}/POST/limited-drops/x/orders",
    f"{ARN_HEAD}/POST/limited-drops/{'9' * 19}/orders",
    f"{ARN_HEAD}/POST/events/42/seats",
    f"{ARN_HEAD}/POST/virtual-queues/limited-drop/42/entries",
    f"{ARN_HEAD}/*/limited-drops/42/orders",
    f"{ARN_HEAD}/POST/*",
    "arn:aws:execute-api:eu-west-1:123456789012:a1b2c3d4e5/POST/limited-drops/42/orders",
    "arn:aws:lambda:eu-west-1:123456789012:function:x/api/POST/limited-drops/42/orders",
    "",
    "é" * 10_240,
]


@pytest.mark.parametrize("method_arn", UNKNOWN_ARNS)
def test_anything_but_a_purchase_route_in_the_method_arn_is_denied(api, method_arn):
    policy = authorize(api, event(method_arn, {"X-Entry-Token": mint(), "X-User-Id": "7"}))
    assert_denied(policy, method_arn)


@pytest.mark.parametrize("evt", [None, "junk", 42, [], {}, {"methodArn": None}, {"methodArn": ["x"], "headers": {}}])
def test_malformed_events_are_denied_not_raised(api, capsys, evt):
    policy = authorize(api, evt)
    assert statement(policy)["Effect"] == "Deny"
    assert counted(capsys.readouterr().out, "BypassDenied") == [{"service": "virtual-queue"}]


def test_method_arn_of_either_purchase_route_names_its_target():
    assert target_from_method_arn(DROP_ARN) == DROP
    assert target_from_method_arn(SEAT_ARN) == Target("ticketing-event", 42)
    assert target_from_method_arn(
        "arn:aws-cn:execute-api:cn-north-1:123456789012:abc/prod-2/POST/events/7/seats/select"
    ) == Target("ticketing-event", 7)


def test_a_denial_logs_request_id_and_target_and_nothing_logs_the_token(api, capsys, log_lines):
    token = mint()
    authorize(api, event(headers={"X-Entry-Token": token, "X-User-Id": "7"}))
    assert log_lines() == []
    authorize(api, event(headers={"X-Entry-Token": token, "X-User-Id": "8"}))
    (denied,) = log_lines()
    assert denied["message"] == "purchase denied" and denied["level"] == "INFO"
    assert denied["correlation_id"] == "req-1" and denied["target"] == "limited-drop:42"
    assert denied["function_name"] == "purchase_authorizer"
    out = capsys.readouterr()
    for text in (json.dumps(log_lines()), out.out, out.err):
        assert token not in text and token.split(".")[1] not in text


def test_a_token_of_the_previous_key_passes_while_listed_and_fails_once_removed(api, env):
    env(VQ_TOKEN_ACTIVE_KID="k0")
    old = mint()
    env(VQ_TOKEN_ACTIVE_KID="k1")
    assert runtime.settings().keyring.active_kid == "k1"
    headers = {"X-Entry-Token": old, "X-User-Id": "7"}
    assert statement(authorize(api, event(headers=headers)))["Effect"] == "Allow"

    env(VQ_TOKEN_KEYS=json.dumps({"k1": TEST_KEYS["k1"]}), VQ_TOKEN_ACTIVE_KID="k1")
    assert statement(authorize(api, event(headers=headers)))["Effect"] == "Deny"
    assert statement(authorize(api, event(headers={"X-Entry-Token": mint(), "X-User-Id": "7"})))["Effect"] == "Allow"


def test_a_purchase_without_any_header_reaches_the_function_and_is_denied_and_counted(api, capsys):
    # Deployed, the authorizer has no identity source (infra/authorizer.yaml): a request without the headers
    # still runs it, with no headers at all.
    policy = authorize(api, event(headers=None))
    assert_denied(policy, DROP_ARN)
    assert counted(capsys.readouterr().out, "BypassDenied") == [{"service": "virtual-queue"}]


def test_a_purchase_without_a_token_passes_while_the_queue_is_off(api, env, tmp_path):
    flags = tmp_path / "off.json"
    flags.write_text(json.dumps({"virtual_queue_enabled": {"default": False}}))
    env(VQ_FLAGS_FILE=flags)
    assert statement(authorize(api, event(headers={"X-User-Id": "7"})))["Effect"] == "Allow"
