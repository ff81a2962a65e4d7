"""VQ_IDENTITY=jwt against a real Redis: every shopper route takes a verified bearer JWT of the shop's identity
provider, a place belongs to the verified user, invite-only targets admit only invited users, and the purchase path
is bound to the same identity. The provider is tests/support/jwts.py; the JWKS comes inline or from a local server."""

import http.server
import json
import os
import select
import signal
import threading
import time

import hypothesis
import pytest
from hypothesis import strategies as st

from chalicelib import runtime
from chalicelib.config import ConfigError, load_settings
from chalicelib.identity import UNKNOWN_KEY_REFETCH_S, JwtIdentity
from chalicelib.targets import Target
from tests.support import jwts
from tests.support.ticks import admit_through

BASE = "/virtual-queues/limited-drop/42"
ENTRIES = BASE + "/entries"
ORDERS = "/limited-drops/42/orders"
ARN = "arn:aws:execute-api:eu-west-1:123456789012:a1b2c3d4e5/api/POST/limited-drops/42/orders"


def body(response):
    return json.loads(response.body)


def redis_keys():
    store = runtime.store()
    return sorted(store.client.scan_iter(match=f"{store.prefix}:*"))


@pytest.fixture
def jwt_api(env, api):
    env(**jwts.jwt_env())
    return api


def enter(api, headers):
    return api.http.post(ENTRIES, headers=headers)


def admit():
    """Everyone in line for limited drop 42 is admitted (the pump's mark moved past them)."""
    store = runtime.store()
    admit_through(store, Target("limited-drop", 42))


def buy(api, headers, token, payload=b'{"quantity": 1}', content_type="application/json"):
    return api.http.post(
        ORDERS, headers={**headers, "X-Entry-Token": token, "Content-Type": content_type}, body=payload
    )


def assert_401(response):
    assert response.status_code == 401, response.body
    assert body(response)["code"] == "UNAUTHENTICATED"
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


# --- every 401, on every shopper route, writing nothing ---

NOW = int(time.time())
REFUSED = {
    "missing": lambda: {},
    "not bearer": lambda: {"Authorization": f"Basic {jwts.token()}"},
    "malformed": lambda: {"Authorization": "Bearer not.a.jwt"},
    "junk": lambda: {"Authorization": "Bearer " + "x" * 9000},
    "expired": lambda: {"Authorization": "Bearer " + jwts.sign(jwts.claims(exp=NOW - 120))},
    "wrong issuer": lambda: {"Authorization": "Bearer " + jwts.sign(jwts.claims(iss="https://evil.example/"))},
    "wrong audience": lambda: {"Authorization": "Bearer " + jwts.sign(jwts.claims(aud="another-app"))},
    "no expiry": lambda: {
        "Authorization": "Bearer " + jwts.sign({k: v for k, v in jwts.claims().items() if k != "exp"})
    },
    "unknown key": lambda: {"Authorization": "Bearer " + jwts.sign(jwts.claims(), kid="rsa-9")},
    "forged with the kid of a real key": lambda: {
        "Authorization": "Bearer " + jwts.sign(jwts.claims(), kid="rsa-1", key=jwts.other_rsa_key())
    },
    "alg none": lambda: {
        "Authorization": "Bearer " + jwts.hand_signed({"alg": "none", "kid": "rsa-1"}, jwts.claims(), None)
    },
    "HS256 signed with the RSA public key": lambda: {
        "Authorization": "Bearer "
        + jwts.hand_signed({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}, jwts.claims(), jwts.public_pem())
    },
    "RS256 header on the HMAC key": lambda: {
        "Authorization": "Bearer " + jwts.sign(jwts.claims(), alg="RS256", kid="hs-1")
    },
    "no user in the claim": lambda: {"Authorization": "Bearer " + jwts.sign(jwts.claims(user="has space"))},
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_every_refused_jwt_is_401_with_www_authenticate_and_writes_nothing(jwt_api, case):
    place = jwts.bearer("auth0|someone")
    ticket = body(enter(jwt_api, place))["queueTicket"]
    before = redis_keys()
    headers = REFUSED[case]()
    for response in (
        enter(jwt_api, headers),
        jwt_api.http.get(ENTRIES + "/me", headers={**headers, "X-Queue-Ticket": ticket}),
        jwt_api.http.delete(ENTRIES + "/me", headers={**headers, "X-Queue-Ticket": ticket}),
        buy(jwt_api, headers, "anything"),
    ):
        assert_401(response)
    assert redis_keys() == before
    assert body(jwt_api.http.get(ENTRIES + "/me", headers={**place, "X-Queue-Ticket": ticket}))["status"] == "WAITING"


# What each 401 says, in the queue's words: never the JWT library's names for its exceptions.
DETAILS = {
    "missing": "Authorization: Bearer <JWT> is required",
    "not bearer": "Authorization must be Bearer and a JWT",
    "malformed": "the bearer token is not a JWT",
    "junk": "Authorization must be Bearer and a JWT",
    "expired": "the JWT has expired",
    "wrong issuer": "the JWT was issued by another issuer than VQ_JWT_ISSUER",
    "wrong audience": "the JWT is for another audience than VQ_JWT_AUDIENCE",
    "no expiry": "the JWT has no exp claim",
    "unknown key": "the JWT is signed by no key of the issuer",
    "forged with the kid of a real key": "the JWT's signature does not verify",
    "alg none": "the JWT is signed with another algorithm than its key's",
    "HS256 signed with the RSA public key": "the JWT is signed with another algorithm than its key's",
    "RS256 header on the HMAC key": "the JWT is signed with another algorithm than its key's",
    "no user in the claim": "the JWT's sub claim is not a user id (1 to 128 printable ASCII)",
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_every_401_says_what_is_wrong_in_the_queues_words(jwt_api, case):
    refused = enter(jwt_api, REFUSED[case]())
    assert_401(refused)
    assert body(refused)["detail"] == DETAILS[case]


@pytest.mark.parametrize(
    "claims, detail",
    [
        ({"nbf": NOW + 600}, "the JWT is not valid yet: its nbf or iat is ahead of now"),
        ({"iat": "yesterday"}, "the JWT's iat claim is not a time"),
        ({"exp": "never"}, "the JWT is malformed: its payload, or an exp or nbf that is not a number"),
        ({"aud": None}, "the JWT has no aud claim"),
    ],
)
def test_a_jwt_with_a_bad_time_or_claim_is_told_so(jwt_api, claims, detail):
    payload = {k: v for k, v in {**jwts.claims(), **claims}.items() if v is not None}
    refused = enter(jwt_api, {"Authorization": "Bearer " + jwts.sign(payload)})
    assert_401(refused)
    assert body(refused)["detail"] == detail


def test_a_request_without_a_token_is_told_the_scheme_and_a_refused_token_the_error(jwt_api):
    assert enter(jwt_api, {}).headers["WWW-Authenticate"] == 'Bearer realm="virtual-queue"'
    refused = enter(jwt_api, {"Authorization": "Bearer a.b.c"})
    assert refused.headers["WWW-Authenticate"] == 'Bearer realm="virtual-queue", error="invalid_token"'


@pytest.mark.parametrize("alg, kid", [("RS256", "rsa-1"), ("ES256", "ec-1"), ("HS256", "hs-1"), ("RS256", None)])
def test_each_key_type_verifies_its_own_algorithm(env, api, alg, kid):
    # A token without kid is taken only from an issuer with one key.
    env(**jwts.jwt_env(**({"VQ_JWKS": json.dumps(jwts.jwks(ec_too=False, secret_too=False))} if kid is None else {})))
    headers = {"Authorization": "Bearer " + jwts.sign(jwts.claims("google-oauth2|1029"), alg=alg, kid=kid)}
    entered = enter(api, headers)
    assert entered.status_code == 200 and body(entered)["status"] == "WAITING"
    assert runtime.signer().read_ticket(body(entered)["queueTicket"]).user_id == "google-oauth2|1029"


def test_the_x_user_id_header_is_ignored(jwt_api):
    entered = body(enter(jwt_api, {**jwts.bearer("auth0|alice"), "X-User-Id": "bob"}))
    assert runtime.signer().read_ticket(entered["queueTicket"]).user_id == "auth0|alice"
    assert_401(enter(jwt_api, {"X-User-Id": "bob"}))


def test_the_user_claim_is_configurable(env, api):
    env(**jwts.jwt_env(VQ_JWT_USER_CLAIM="https://shop.example/customer"))
    headers = {"Authorization": "Bearer " + jwts.sign(jwts.claims(**{"https://shop.example/customer": 4242}))}
    entered = body(enter(api, headers))
    assert runtime.signer().read_ticket(entered["queueTicket"]).user_id == "4242"


@pytest.mark.parametrize("claim", ["sub", "customer_id"])
def test_a_numeric_user_claim_is_the_user_id_written_in_decimal(env, api, claim):
    env(**jwts.jwt_env(VQ_JWT_USER_CLAIM=claim))
    # A numeric sub beside a custom user claim is no reason to refuse either.
    payload = jwts.claims(sub=12345678901234567890) | {claim: 12345678901234567890}
    entered = enter(api, {"Authorization": "Bearer " + jwts.sign(payload)})
    assert entered.status_code == 200, entered.body
    assert runtime.signer().read_ticket(body(entered)["queueTicket"]).user_id == "12345678901234567890"


# --- the verified owner gets their ticket back; nobody else can use it ---


def test_entering_again_gives_the_verified_owner_a_ticket_for_the_same_place(jwt_api):
    enter(jwt_api, jwts.bearer("auth0|first"))
    alice = jwts.bearer("auth0|alice")
    first = body(enter(jwt_api, alice))
    # Another device, storage lost: a fresh JWT of the same user, and the same place.
    again = body(enter(jwt_api, jwts.bearer("auth0|alice", jti="other-device")))
    assert again["position"] == first["position"] == 2
    recovered = runtime.signer().read_ticket(again["queueTicket"])
    assert recovered.seq == runtime.signer().read_ticket(first["queueTicket"]).seq
    polled = jwt_api.http.get(ENTRIES + "/me", headers={**alice, "X-Queue-Ticket": again["queueTicket"]})
    assert body(polled)["status"] == "WAITING" and body(polled)["position"] == 2
    # Once admitted, entering again hands back the token and a ticket for the entry.
    admit()
    admitted = body(jwt_api.http.get(ENTRIES + "/me", headers={**alice, "X-Queue-Ticket": again["queueTicket"]}))
    back = body(enter(jwt_api, alice))
    assert back["status"] == "ADMITTED" and back["entryToken"] == admitted["entryToken"]
    assert runtime.signer().read_ticket(back["queueTicket"]).seq == recovered.seq


def test_in_header_mode_entering_again_gives_no_ticket(api):
    api.http.post(ENTRIES, headers={"X-User-Id": "alice"})
    assert "queueTicket" not in body(api.http.post(ENTRIES, headers={"X-User-Id": "alice"}))


def test_in_header_mode_entering_again_by_id_never_hands_over_the_entry_token(api):
    alice = {"X-User-Id": "alice"}
    ticket = body(api.http.post(ENTRIES, headers=alice))["queueTicket"]
    admit()
    # Before the owner polled (the mark has passed them), then after (the token is held): knowing the id is not enough.
    for _ in range(2):
        again = api.http.post(ENTRIES, headers=alice)
        assert again.status_code == 409 and body(again)["code"] == "ALREADY_ADMITTED"
        assert "entryToken" not in body(again) and "queueTicket" not in body(again)
        polled = body(api.http.get(ENTRIES + "/me", headers={**alice, "X-Queue-Ticket": ticket}))
        assert polled["status"] == "ADMITTED" and polled["entryToken"]


def test_nobody_polls_leaves_or_buys_with_someone_elses_ticket_or_token(jwt_api, origin):
    alice, mallory = jwts.bearer("auth0|alice"), jwts.bearer("auth0|mallory")
    ticket = body(enter(jwt_api, alice))["queueTicket"]
    before = redis_keys()
    stolen = {**mallory, "X-Queue-Ticket": ticket}
    for response in (
        jwt_api.http.get(ENTRIES + "/me", headers=stolen),
        jwt_api.http.delete(ENTRIES + "/me", headers=stolen),
    ):
        assert response.status_code == 403 and body(response)["code"] == "INVALID_QUEUE_TICKET"
    assert redis_keys() == before
    admit()
    token = body(jwt_api.http.get(ENTRIES + "/me", headers={**alice, "X-Queue-Ticket": ticket}))["entryToken"]
    refused = buy(jwt_api, mallory, token)
    assert refused.status_code == 403 and body(refused)["code"] == "QUEUE_BYPASS_DENIED"
    assert origin.requests == []
    bought = buy(jwt_api, alice, token)
    assert bought.status_code == 201
    assert origin.requests[0]["headers"]["X-User-Id"] == "auth0|alice"


# --- invite-only ---


def test_an_invite_only_target_admits_only_users_whose_jwt_invites_them(jwt_api):
    config = jwt_api.http.put(
        BASE + "/config", body=json.dumps({"inviteOnly": True}), headers={"Content-Type": "application/json"}
    )
    assert body(config)["config"] == {"inviteOnly": True}
    before = redis_keys()
    for uninvited in (
        jwts.bearer("auth0|nobody"),
        jwts.bearer("auth0|elsewhere", vq_invites=["limited-drop:43", "ticketing-event:42"]),
        jwts.bearer("auth0|malformed", vq_invites="limited-drop:42"),
    ):
        refused = enter(jwt_api, uninvited)
        assert refused.status_code == 403 and body(refused)["code"] == "NOT_INVITED"
    stats = body(jwt_api.http.get(BASE + "/stats"))
    assert stats["notInvitedCount"] == 3 and stats["waitingCount"] == 0
    assert set(redis_keys()) - set(before) <= {f"{runtime.store().prefix}:{{limited-drop:42}}:stats"}
    invited = enter(jwt_api, jwts.bearer("auth0|guest", vq_invites=["limited-drop:42"]))
    assert invited.status_code == 200 and body(invited)["status"] == "WAITING"


def test_in_header_mode_an_invite_only_target_admits_nobody(api):
    api.http.put(BASE + "/config", body=json.dumps({"inviteOnly": True}), headers={"Content-Type": "application/json"})
    refused = api.http.post(ENTRIES, headers={"X-User-Id": "7"})
    assert refused.status_code == 403 and body(refused)["code"] == "NOT_INVITED"


# --- the purchase path ---


def test_a_body_over_the_limit_is_413_before_the_token_is_used(jwt_api, origin, env):
    alice = jwts.bearer("auth0|alice")
    ticket = body(enter(jwt_api, alice))["queueTicket"]
    admit()
    token = body(jwt_api.http.get(ENTRIES + "/me", headers={**alice, "X-Queue-Ticket": ticket}))["entryToken"]
    big = buy(jwt_api, alice, token, payload=b'{"note": "' + b"x" * 16_400 + b'"}')
    assert big.status_code == 413 and body(big)["code"] == "PAYLOAD_TOO_LARGE"
    assert origin.requests == []
    assert buy(jwt_api, alice, token).status_code == 201


@pytest.mark.parametrize(
    "content_type, status",
    [("text/plain;application/json", 400), ('text/plain; x="application/json"', 415), ("application/jsonx", 415)],
)
def test_the_media_type_is_parsed_whole_before_the_token_is_used(api, origin, content_type, status):
    api.http.post(ENTRIES, headers={"X-User-Id": "7"})
    token = runtime.signer().mint_entry_token(Target("limited-drop", 42), "7", time.time(), 300).text
    refused = buy(api, {"X-User-Id": "7"}, token, content_type=content_type)
    assert refused.status_code == status
    assert origin.requests == []
    assert buy(api, {"X-User-Id": "7"}, token, content_type="Application/JSON; charset=utf-8").status_code == 201


def authorize(api, headers):
    event = {"type": "REQUEST", "methodArn": ARN, "headers": headers}
    return api.lambda_.invoke("purchase_authorizer", event)


def test_the_authorizer_binds_the_token_to_the_jwt_s_user(jwt_api):
    token = runtime.signer().mint_entry_token(Target("limited-drop", 42), "auth0|alice", time.time(), 300).text
    allowed = authorize(jwt_api, {**jwts.bearer("auth0|alice"), "X-Entry-Token": token, "X-User-Id": "bob"}).payload
    assert allowed["policyDocument"]["Statement"][0]["Effect"] == "Allow"
    assert allowed["context"]["userId"] == "auth0|alice"
    denied = authorize(jwt_api, {**jwts.bearer("auth0|mallory"), "X-Entry-Token": token}).payload
    assert denied["policyDocument"]["Statement"][0]["Effect"] == "Deny"
    # No JWT the provider vouches for, whatever the X-User-Id says: through to the route, which answers 401 (a raise
    # would count as the authorizer's error and alarm), as nobody: the policy names no user and the token is unused.
    for headers in (
        {"X-Entry-Token": token, "X-User-Id": "auth0|alice"},
        {"X-Entry-Token": token, "Authorization": "Bearer " + jwts.sign(jwts.claims("auth0|alice", exp=NOW - 100))},
    ):
        unverified = authorize(jwt_api, headers).payload
        assert unverified["policyDocument"]["Statement"][0] == {
            "Action": "execute-api:Invoke",
            "Effect": "Allow",
            "Resource": ARN,
        }
        assert unverified["principalId"] == "anonymous" and unverified["context"] == {"identity": "unverified"}
        assert_401(buy(jwt_api, {k: v for k, v in headers.items() if k != "X-Entry-Token"}, token))


# --- the keys at a URL ---


class JwksServer:
    """The provider's JWKS over HTTP on 127.0.0.1; counts fetches; can be made to fail, or to hold its first answer
    until `release` is set (`asked` is set once that fetch has arrived)."""

    def __init__(self, document, hold_first=False):
        self.document, self.fetches, self.failing = document, 0, False
        self.asked, self.release = threading.Event(), threading.Event()
        if not hold_first:
            self.release.set()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.fetches += 1
                if outer.fetches == 1:
                    outer.asked.set()
                    outer.release.wait(30)
                status, raw = (503, b"{}") if outer.failing else (200, json.dumps(outer.document).encode())
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/.well-known/jwks.json"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def jwks_server():
    server = JwksServer({"keys": [jwts.public_jwk("rsa-1")]})
    yield server
    server.close()


def identity_at(url, clock=None):
    settings = load_settings(
        {**jwts.jwt_env(VQ_JWKS_URL=url), "VQ_JWKS": "", "VQ_TOKEN_KEYS": '{"k": "' + "s" * 40 + '"}'}
    )
    monotonic = clock or time.monotonic
    return JwtIdentity(settings.jwt, retry_after_s=2, monotonic=monotonic)


def test_an_unknown_kid_fetches_the_keys_again_at_most_once_a_minute(jwks_server):
    now = [1000.0]
    identity = identity_at(jwks_server.url, clock=lambda: now[0])
    assert identity.caller({"authorization": "Bearer " + jwts.token("auth0|a")}).user_id == "auth0|a"
    assert jwks_server.fetches == 1
    rotated = jwts.sign(jwts.claims("auth0|b"), kid="rsa-2", key=jwts.other_rsa_key())
    with pytest.raises(Exception, match="no key of the issuer"):
        identity.caller({"authorization": "Bearer " + rotated})
    assert jwks_server.fetches == 2
    for _ in range(20):  # a flood of unknown kids within the minute fetches nothing more
        with pytest.raises(Exception, match="no key of the issuer"):
            identity.caller({"authorization": "Bearer " + rotated})
    assert jwks_server.fetches == 2
    # The provider rotates in its new key; a minute later the unknown kid is fetched again, and it verifies.
    jwks_server.document = {"keys": [jwts.public_jwk("rsa-1"), jwts.public_jwk("rsa-2", jwts.other_rsa_key())]}
    now[0] += UNKNOWN_KEY_REFETCH_S
    assert identity.caller({"authorization": "Bearer " + rotated}).user_id == "auth0|b"
    assert jwks_server.fetches == 3


@pytest.mark.slow
def test_keys_that_cannot_be_fetched_answer_503_with_retry_after_not_401(env, api, jwks_server, hung_endpoint):
    jwks_server.failing = True
    env(**jwts.jwt_env(VQ_JWKS="", VQ_JWKS_URL=jwks_server.url))
    answer = enter(api, jwts.bearer())
    assert answer.status_code == 503 and body(answer)["code"] == "QUEUE_UNAVAILABLE"
    assert int(answer.headers["Retry-After"]) >= 1
    assert redis_keys() == []
    # An endpoint that never answers costs a request at most the fetch's bounded wait.
    env(**jwts.jwt_env(VQ_JWKS="", VQ_JWKS_URL=hung_endpoint + "/jwks.json"))
    started = time.monotonic()
    assert enter(api, jwts.bearer()).status_code == 503
    assert time.monotonic() - started < 4
    # The provider answers again: the keys are fetched within a minute and tokens verify.
    jwks_server.failing = False
    env(**jwts.jwt_env(VQ_JWKS="", VQ_JWKS_URL=jwks_server.url))
    assert enter(api, jwts.bearer()).status_code == 200


def test_a_worker_forked_mid_fetch_fetches_the_keys_itself_and_verifies():
    """A pre-fork server (infra/local/api.py, gunicorn) forks after the app is loaded, while the first fetch of the
    keys may still be on its way: the child has the fetch's lock but not its thread, and must not wait for it."""
    server = JwksServer({"keys": [jwts.public_jwk("rsa-1")]}, hold_first=True)
    try:
        identity = identity_at(server.url)  # its first fetch starts now, and the provider holds it
        assert server.asked.wait(10)
        reading, writing = os.pipe()
        child = os.fork()
        if child == 0:  # the worker: answer a request, report, and leave without running pytest's teardown
            try:
                told = identity.caller({"authorization": "Bearer " + jwts.token("auth0|w")}).user_id
            except Exception as err:
                told = f"{type(err).__name__}: {err}"
            os.write(writing, told.encode())
            os._exit(0)
        os.close(writing)
        try:
            ready, _, _ = select.select([reading], [], [], 20)
            told = os.read(reading, 1000).decode() if ready else "no answer within 20 s"
        finally:
            server.release.set()
            os.close(reading)
            if not ready:
                os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
        assert told == "auth0|w"
        assert server.fetches == 2  # the parent's, held, and the child's own
    finally:
        server.release.set()
        server.close()


def test_a_verified_token_is_kept_until_it_expires_and_no_longer():
    settings = load_settings({**jwts.jwt_env(), "VQ_TOKEN_KEYS": '{"k": "' + "s" * 40 + '"}'})
    now = [time.time()]
    identity = JwtIdentity(settings.jwt, retry_after_s=2, clock=lambda: now[0])
    text = jwts.token("auth0|a", ttl_s=60)
    calls = []
    verify = identity._verify
    identity._verify = lambda token: calls.append(token) or verify(token)
    for _ in range(5):
        assert identity.verify(text).user_id == "auth0|a"
    assert len(calls) == 1
    # Past its expiry (and the leeway) the verdict is not used again: the token is verified afresh.
    now[0] += 60 + settings.jwt.leeway_s
    identity.verify(text)
    assert len(calls) == 2


@pytest.mark.parametrize(
    "settings, problem",
    [
        ({"VQ_JWT_ISSUER": ""}, "VQ_JWT_ISSUER"),
        ({"VQ_JWT_AUDIENCE": ""}, "VQ_JWT_AUDIENCE"),
        ({"VQ_JWKS": ""}, "VQ_JWKS"),
        ({"VQ_JWKS_URL": "https://login.example/jwks.json"}, "not both"),
        ({"VQ_JWKS": "[1]"}, "JWKS document"),
        ({"VQ_JWKS": '{"keys": [{"kty": "oct", "k": "c2hvcnQ"}]}'}, "no usable signing key"),
        ({"VQ_JWKS": "", "VQ_JWKS_URL": "http://login.example/jwks.json"}, "https"),
        ({"VQ_IDENTITY": "oidc"}, "VQ_IDENTITY"),
    ],
)
def test_jwt_mode_refuses_to_start_without_what_it_needs(settings, problem):
    env = {**jwts.jwt_env(), "VQ_TOKEN_KEYS": '{"k": "' + "s" * 40 + '"}', **settings}
    with pytest.raises(ConfigError, match=problem):
        JwtIdentity(load_settings(env).jwt, retry_after_s=1)


def test_a_rollout_sorts_users_by_a_hash_of_the_verified_id(env, api, tmp_path):
    """MODULO_RANGE needs an integer: the flag gets the bucket of the verified id, the same every time, whatever
    X-User-Id says. A user in the queue-off share of a 50 % rollout enters directly; one outside it queues."""
    from chalicelib.flags import bucket

    flags = tmp_path / "flags.json"
    rule = {"action": "MODULO_RANGE", "key": "user_id", "value": {"BASE": 2, "START": 0, "END": 0}}
    flags.write_text(
        json.dumps(
            {"virtual_queue_enabled": {"default": True, "rules": {"half": {"when_match": False, "conditions": [rule]}}}}
        )
    )
    env(VQ_FLAGS_FILE=flags, **jwts.jwt_env())
    users = [f"auth0|{i}" for i in range(40)]
    off = [u for u in users if bucket(u) % 2 == 0]
    assert 0 < len(off) < len(users) and bucket("42") == bucket("42") != 42
    for user in users:
        status = body(enter(api, {**jwts.bearer(user), "X-User-Id": "0"}))["status"]
        assert status == ("DIRECT_ADMITTED" if user in off else "WAITING"), user


@hypothesis.settings(
    max_examples=150, deadline=None, suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture]
)
@hypothesis.given(
    authorization=st.one_of(
        st.text(max_size=200),
        st.builds(lambda t: "Bearer " + t, st.text(alphabet="ABCxyz019-_.=+/~ ", max_size=300)),
        st.builds(
            lambda h, p, sig: "Bearer " + ".".join(jwts.b64(x.encode()) for x in (h, p)) + "." + sig,
            st.sampled_from(['{"alg":"RS256","kid":"rsa-1"}', '{"alg":"none"}', '{"alg":"HS256","kid":"hs-1"}', "[]"]),
            st.one_of(st.just(json.dumps(jwts.claims())), st.text(max_size=50)),
            st.text(alphabet="ABCxyz019-_", max_size=50),
        ),
    )
)
def test_fuzz_authorization_headers_are_401_never_500_and_write_nothing(jwt_api, authorization):
    before = redis_keys()
    try:
        answer = enter(jwt_api, {"Authorization": authorization})
    except UnicodeEncodeError:  # the test client cannot send it; neither can a browser
        return
    assert answer.status_code == 401 and body(answer)["code"] == "UNAUTHENTICATED"
    assert redis_keys() == before
