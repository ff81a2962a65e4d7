"""The purchase routes: one purchase per entry token, given back when the downstream fails (real Redis, real HTTP)."""

import json
import threading
import time

import pytest
import redis

from chalicelib import runtime
from chalicelib.answers import Consumption
from chalicelib.config import load_settings
from chalicelib.errors import EntryTokenUsed, QueueBypassDenied
from chalicelib.purchase import PurchaseGate
from chalicelib.store import CLOCK_SKEW_MARGIN_MS, QueueStore
from chalicelib.targets import Target
from chalicelib.tokens import EntryToken
from infra.local.demo_shop import idempotency_key
from infra.local.stack import free_port
from tests.support.buying import DROP, buy_at_once, mint, request_for
from tests.support.observed import counted

SEATS = Target("ticketing-event", 9)
ORDER = {"sku": "sneaker-42", "size": 43}


@pytest.fixture
def gate(origin, store, signer):
    """The purchase logic over this test's Redis prefix, called directly (no HTTP in between)."""
    return PurchaseGate(store, signer, load_settings(), runtime.switch())


def buy(api, token, user="7", path="/limited-drops/42/orders", body=ORDER):
    headers = {"Content-Type": "application/json", "X-User-Id": user}
    if token is not None:
        headers["X-Entry-Token"] = token if isinstance(token, str) else token.text
    return api.http.post(path, headers=headers, body=json.dumps(body))


def code(response):
    return json.loads(response.body)["code"]


# --- over HTTP ---


def test_no_token_is_403_and_never_reaches_the_downstream(api, origin, capsys):
    denied = buy(api, None)
    assert denied.status_code == 403 and code(denied) == "QUEUE_BYPASS_DENIED"
    assert origin.requests == []
    # For the whole service only: the target is the caller's word.
    assert counted(capsys.readouterr().out, "BypassDenied") == [{"service": "virtual-queue"}]


@pytest.mark.parametrize(
    "path, user, target",
    [
        ("/limited-drops/43/orders", "7", DROP),  # another target id
        ("/events/42/seats/select", "7", DROP),  # a drop token on the seat route
        ("/limited-drops/42/orders", "8", DROP),  # another user
        ("/limited-drops/042/orders", "7", DROP),  # not the canonical id: denied as the authorizer would
        ("/limited-drops/x/orders", "7", DROP),
    ],
)
def test_token_of_another_target_or_user_is_denied(api, origin, signer, path, user, target):
    denied = buy(api, mint(signer, target), user=user, path=path)
    assert denied.status_code == 403 and code(denied) == "QUEUE_BYPASS_DENIED"
    assert origin.requests == []


def test_valid_token_buys_once_and_the_downstream_answer_is_passed_back(api, origin, signer, capsys, log_lines):
    token = mint(signer)
    bought = buy(api, token)
    assert bought.status_code == 201
    assert bought.headers["Content-Type"] == "application/json; charset=utf-8"
    assert json.loads(bought.body) == {"orderId": 1}

    (sent,) = origin.requests
    assert sent["path"] == "/limited-drops/42/orders"
    assert json.loads(sent["body"]) == ORDER
    headers = {name.lower(): value for name, value in sent["headers"].items()}
    assert headers["x-user-id"] == "7" and headers["content-type"] == "application/json"
    assert headers["x-request-id"]
    assert "x-entry-token" not in headers and token.text not in json.dumps(headers)

    again = buy(api, token)
    assert again.status_code == 403 and code(again) == "ENTRY_TOKEN_USED"
    assert len(origin.requests) == 1
    out = capsys.readouterr().out
    assert counted(out, "TokensConsumed") == [{"target": "limited-drop:42", "service": "virtual-queue"}]
    assert token.text not in out and token.text not in json.dumps(log_lines())


def test_seat_selection_goes_to_the_ticketing_downstream(api, origin, signer):
    bought = buy(api, mint(signer, SEATS), path="/events/9/seats/select", body={"seats": ["A1"]})
    assert bought.status_code == 201
    assert origin.requests[0]["path"] == "/events/9/seats/select"


def sent_keys(origin):
    """The keys the shop read (the draft's structured-field String, or the bare form)."""
    return [idempotency_key(request["headers"].get("Idempotency-Key")) for request in origin.requests]


def test_every_forwarded_purchase_carries_the_token_id_as_idempotency_key(api, origin, signer):
    token = mint(signer)
    assert buy(api, token).status_code == 201
    assert sent_keys(origin) == [token.token_id]


@pytest.mark.parametrize("setting, form", [(None, '"{}"'), ("string", '"{}"'), ("bare", "{}")])
def test_the_idempotency_key_is_the_drafts_structured_field_string_unless_set_bare(
    api, env, origin, signer, setting, form
):
    if setting is not None:
        env(VQ_IDEMPOTENCY_KEY_FORMAT=setting)
    token = mint(signer)
    assert buy(api, token).status_code == 201
    assert [request["headers"]["Idempotency-Key"] for request in origin.requests] == [form.format(token.token_id)]


def test_downstream_500_keeps_the_token_used_and_the_retry_goes_again_under_the_same_key(api, origin, signer, capsys):
    origin.answers = [(500, {"error": "stock service down"})]
    token = mint(signer)
    failed = buy(api, token)
    assert failed.status_code == 500 and json.loads(failed.body) == {"error": "stock service down"}
    assert buy(api, token).status_code == 201
    assert code(buy(api, token)) == "ENTRY_TOKEN_USED"
    assert sent_keys(origin) == [token.token_id] * 2
    assert origin.orders_per_key() == {token.token_id: 1}
    out = capsys.readouterr().out
    assert len(counted(out, "TokensConsumed")) == 1 and len(counted(out, "PurchaseOutcomeUnknown")) == 1
    assert counted(out, "TokensRestored") == []


def test_shop_that_commits_then_answers_500_holds_one_order_and_the_retry_gets_it(api, origin, signer):
    origin.answers = [(500, {"error": "crashed after the commit"}, {"commit": True})]
    token = mint(signer)
    assert buy(api, token).status_code == 500
    retried = buy(api, token)
    assert retried.status_code == 201 and json.loads(retried.body) == {"orderId": 1}
    assert origin.orders_per_key() == {token.token_id: 1}
    assert code(buy(api, token)) == "ENTRY_TOKEN_USED"


def test_shop_slower_than_the_timeout_holds_one_order_and_the_retry_gets_it(api, env, origin, signer):
    env(VQ_ORIGIN_TIMEOUT_MS=200)
    origin.delay_s = 2
    token = mint(signer)
    timed_out = buy(api, token)
    assert timed_out.status_code == 504 and code(timed_out) == "ORIGIN_UNAVAILABLE"
    origin.delay_s = 0
    retried = buy(api, token)
    assert retried.status_code == 201 and json.loads(retried.body) == {"orderId": 1}
    assert origin.orders_per_key() == {token.token_id: 1}
    assert sent_keys(origin) == [token.token_id] * 2


def test_concurrent_retries_of_an_unknown_outcome_are_forwarded_one_at_a_time(gate, origin, signer):
    origin.answers = [(503, {"error": "busy"})]
    token = mint(signer)
    assert gate.purchase(request_for(token)).status == 503
    origin.delay_s = 0.3
    outcomes = buy_at_once(gate, request_for(token), 10)
    assert sorted(outcomes, key=str) == [201] + ["used"] * 9
    assert len(origin.requests) == 2 and origin.orders_per_key() == {token.token_id: 1}


def test_shop_saying_not_taken_gives_the_token_back(api, origin, signer, capsys):
    origin.answers = [(503, {"error": "overloaded"}, {"not_taken": True})]
    token = mint(signer)
    assert buy(api, token).status_code == 503
    assert buy(api, token).status_code == 201
    assert origin.orders_per_key() == {token.token_id: 1}
    assert len(counted(capsys.readouterr().out, "TokensRestored")) == 1


def test_not_taken_on_a_2xx_is_ignored(gate, origin, signer):
    origin.answers = [(201, {"orderId": 9}, {"not_taken": True})]
    token = mint(signer)
    assert gate.purchase(request_for(token)).status == 201
    with pytest.raises(EntryTokenUsed):
        gate.purchase(request_for(token))


def test_downstream_4xx_is_an_answer_and_keeps_the_token_used(api, origin, signer):
    origin.answers = [(409, {"error": "sold out"})]
    token = mint(signer)
    assert buy(api, token).status_code == 409
    assert code(buy(api, token)) == "ENTRY_TOKEN_USED"


def test_unreachable_downstream_is_502_and_gives_the_token_back(api, env, origin, signer):
    env(VQ_ORIGIN_LIMITED_DROP_URL=f"http://127.0.0.1:{free_port()}")
    token = mint(signer)
    unreachable = buy(api, token)
    assert unreachable.status_code == 502 and code(unreachable) == "ORIGIN_UNAVAILABLE"
    env(VQ_ORIGIN_LIMITED_DROP_URL=origin.url)
    assert buy(api, token).status_code == 201


def test_no_downstream_configured_is_503_and_the_token_stays_usable(api, env, origin, signer):
    env(VQ_ORIGIN_LIMITED_DROP_URL="")
    token = mint(signer)
    unconfigured = buy(api, token)
    assert unconfigured.status_code == 503 and code(unconfigured) == "ORIGIN_NOT_CONFIGURED"
    env(VQ_ORIGIN_LIMITED_DROP_URL=origin.url)
    assert buy(api, token).status_code == 201


def test_redis_unreachable_lets_the_purchase_through_and_counts_it(api, env, origin, signer, capsys):
    env(REDIS_URL=f"redis://127.0.0.1:{free_port()}")
    bought = buy(api, mint(signer))
    assert bought.status_code == 201 and len(origin.requests) == 1
    # For the whole service only: without Redis nobody can say whether the token's target is known.
    assert counted(capsys.readouterr().out, "RedisDegraded") == [{"service": "virtual-queue"}]


def test_redis_unreachable_still_denies_a_bad_token(api, env, origin):
    env(REDIS_URL=f"redis://127.0.0.1:{free_port()}")
    assert code(buy(api, "junk")) == "QUEUE_BYPASS_DENIED"
    assert origin.requests == []


def test_redis_unreachable_with_fail_mode_closed_refuses_without_the_downstream(api, env, origin, signer):
    env(REDIS_URL=f"redis://127.0.0.1:{free_port()}", VQ_FAIL_MODE="closed")
    refused = buy(api, mint(signer))
    assert refused.status_code == 503 and code(refused) == "QUEUE_UNAVAILABLE"
    assert int(refused.headers["Retry-After"]) >= 1
    assert origin.requests == []


# --- the logic, called directly ---


def test_50_concurrent_purchases_with_one_token_reach_the_downstream_once(gate, origin, signer):
    token = mint(signer)
    outcomes = buy_at_once(gate, request_for(token), 50)
    assert sorted(outcomes, key=str) == [201] + ["used"] * 49
    assert len(origin.requests) == 1


def test_authorizer_context_must_describe_this_very_token(gate, origin, signer):
    token = mint(signer)
    other = mint(signer)
    context = {"userId": "7", "targetType": "limited-drop", "targetId": "42", "tokenId": other.token_id}
    with pytest.raises(QueueBypassDenied):
        gate.purchase(request_for(token, authorizer=context))
    with pytest.raises(QueueBypassDenied):
        gate.purchase(request_for(token, authorizer={**context, "tokenId": token.token_id, "userId": "8"}))
    assert origin.requests == []
    assert gate.purchase(request_for(token, authorizer={**context, "tokenId": token.token_id})).status == 201


def test_the_one_time_marker_outlives_the_token_by_the_clock_skew_margin(gate, origin, signer, store):
    token = mint(signer)
    gate.clock = lambda: token.expires_at - 0.2  # the token has 200 ms left when the purchase starts
    started = time.time()
    assert gate.purchase(request_for(token)).status == 201
    finished = time.time()
    # Absolute times: the marker was set sometime in between, to live 200 ms and the margin from then.
    expires_ms = store.client.pexpiretime(store.keys(DROP).consumed(token.token_id))
    assert started * 1000 - 2 <= expires_ms - CLOCK_SKEW_MARGIN_MS - 200 <= finished * 1000 + 2
    # A second purchase verified in time (by a clock a little behind) is still refused after the expiry.
    gate.clock = lambda: token.expires_at - 0.01
    with pytest.raises(EntryTokenUsed):
        gate.purchase(request_for(token))
    assert len(origin.requests) == 1


def token_of(token_id, user=7):
    """An entry token as the store sees it (its text plays no part there)."""
    return EntryToken("unused", DROP, user, int(time.time()) + 60, token_id)


def consume_with_ttl(store, token, consumption_id, ttl_ms):
    """Consume as if `ttl_ms` of the token's life were left (on a target open on first use, as in the local
    stack); True if this call used the token."""
    return store.consume(token, consumption_id, token.expires_at * 1000 - ttl_ms, True) == Consumption.FIRST


def test_stale_restore_never_frees_a_later_consumption(store):
    token = token_of("t1")
    assert consume_with_ttl(store, token, "c1", 60_000)
    assert store.restore(token, "c1")
    assert consume_with_ttl(store, token, "c2", 60_000)
    assert not store.restore(token, "c1")
    assert not consume_with_ttl(store, token, "c3", 60_000)


def test_store_restore_after_expiry_is_a_no_op(store):
    token = token_of("t1")
    assert consume_with_ttl(store, token, "c1", 100)
    store.client.pexpire(store.keys(DROP).consumed("t1"), 1)  # as if the token and the margin had passed
    deadline = time.monotonic() + 10
    while store.client.exists(store.keys(DROP).consumed("t1")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not store.restore(token, "c1")
    assert not store.client.exists(store.keys(DROP).consumed("t1"))


def race_restore_against_consumes(store, token):
    """Ten consumes of `token` (c0..c9) at once with two restores of its consume "first", one after the other:
    what the consumes and the restores returned."""
    start = threading.Barrier(11)
    consumed, restored = [], []

    def consume(n):
        start.wait()
        consumed.append(consume_with_ttl(store, token, f"c{n}", 60_000))

    def restore():
        start.wait()
        restored.append(store.restore(token, "first"))
        restored.append(store.restore(token, "first"))

    threads = [threading.Thread(target=consume, args=(n,)) for n in range(10)]
    threads.append(threading.Thread(target=restore))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return consumed, restored


def test_restore_racing_new_consumes_lets_at_most_one_through(store):
    for round_ in range(30):
        token = token_of(f"t{round_}")
        assert consume_with_ttl(store, token, "first", 60_000)
        consumed, restored = race_restore_against_consumes(store, token)
        assert restored == [True, False]
        assert sum(consumed) <= 1
        # Once the dust settles the token is used exactly once: by a racer, or else by the next comer.
        assert consume_with_ttl(store, token, "late", 60_000) == (sum(consumed) == 0)


def test_a_purchase_is_two_redis_round_trips_and_a_failed_one_three(origin, signer, redis_url, prefix):
    """The token used, the shop's answer noted (shop_watch.py); a failed one also gives the token back."""
    counter = RoundTrips(redis_url)
    gate = PurchaseGate(QueueStore(counter.client, prefix), signer, load_settings(), runtime.switch())
    # Warm up: redis-py loads each script on its first NOSCRIPT, once per server.
    origin.answers = [(500, {})]
    gate.purchase(request_for(mint(signer)))

    before = counter.snapshot()
    assert gate.purchase(request_for(mint(signer))).status == 201
    assert counter.since(before) == {"round_trips": 2, "evalsha": 2}

    origin.answers = [(500, {})]
    before = counter.snapshot()
    assert gate.purchase(request_for(mint(signer))).status == 500
    assert counter.since(before) == {"round_trips": 3, "evalsha": 3}

    token = mint(signer)
    gate.purchase(request_for(token))
    before = counter.snapshot()
    with pytest.raises(EntryTokenUsed):
        gate.purchase(request_for(token))
    assert counter.since(before) == {"round_trips": 1, "evalsha": 1}


class RoundTrips:
    """Counts what a client sends: each send is one round trip, and each EVALSHA one script call. Counted at the
    client, not in the server's INFO commandstats, which other clients of a shared Redis add to."""

    def __init__(self, url):
        sent = self.sent = {"round_trips": 0, "evalsha": 0}

        class CountingConnection(redis.Connection):
            def send_packed_command(self, command, check_health=True):
                sent["round_trips"] += 1
                return super().send_packed_command(command, check_health)

            def send_command(self, *args, **kwargs):
                sent["evalsha"] += args[0] == "EVALSHA"
                return super().send_command(*args, **kwargs)

        self.client = redis.Redis.from_url(url, decode_responses=True, connection_class=CountingConnection)

    def snapshot(self):
        return dict(self.sent)

    def since(self, before):
        return {name: self.sent[name] - before[name] for name in self.sent}


# --- the queue switched off (feature flag) ---


def flag_off_for(tmp_path, env, targets):
    flags = tmp_path / "flags.json"
    flags.write_text(
        json.dumps(
            {
                "virtual_queue_enabled": {
                    "default": True,
                    "rules": {
                        "off": {
                            "when_match": False,
                            "conditions": [{"action": "KEY_IN_VALUE", "key": "target", "value": targets}],
                        }
                    },
                }
            }
        )
    )
    env(VQ_FLAGS_FILE=flags)


def test_with_the_queue_off_a_purchase_without_token_goes_straight_through(api, origin, env, tmp_path, signer):
    flag_off_for(tmp_path, env, [str(DROP)])
    answer = buy(api, None)
    assert answer.status_code == 201
    assert len(origin.requests) == 1 and origin.requests[0]["headers"]["X-User-Id"] == "7"
    assert buy(api, None).status_code == 201  # nothing is used up
    # Other targets still need their token.
    assert code(buy(api, None, path="/events/9/seats/select")) == "QUEUE_BYPASS_DENIED"
    # A valid token is still honoured, and still buys once.
    token = mint(signer)
    assert buy(api, token).status_code == 201
    assert code(buy(api, token)) == "ENTRY_TOKEN_USED"


def test_with_the_queue_off_the_authorizer_allows_without_token(api, env, tmp_path):
    flag_off_for(tmp_path, env, [str(DROP)])
    arn = "arn:aws:execute-api:eu-west-1:123456789012:a1b2c3d4e5/api/POST/limited-drops/42/orders"
    policy = api.lambda_.invoke("purchase_authorizer", {"methodArn": arn, "headers": {"X-User-Id": "7"}}).payload
    assert policy["policyDocument"]["Statement"][0] == {
        "Action": "execute-api:Invoke",
        "Effect": "Allow",
        "Resource": arn,
    }
    assert policy["context"] == {"userId": "7", "targetType": "limited-drop", "targetId": "42", "tokenId": ""}
    other = arn.replace("limited-drops/42", "limited-drops/43")
    denied = api.lambda_.invoke("purchase_authorizer", {"methodArn": other, "headers": {"X-User-Id": "7"}}).payload
    assert denied["policyDocument"]["Statement"][0]["Effect"] == "Deny"
