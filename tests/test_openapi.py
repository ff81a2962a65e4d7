"""infra/openapi.yaml, the public API's contract: checked against app.py's routes so the two cannot drift, and
Schemathesis runs it against the app served by `chalice local`'s server (real HTTP on a free loopback port,
with this test's environment and Redis), in both identity modes: no 5xx, every answer matches the spec, nothing
from the request comes back in a response header.

To reach more than the refusals (a forged ticket or token is all a generator can make), a hook swaps, in half
of the well-formed cases, the caller and target for known ones (see KNOWN_USERS) with a genuine ticket or
entry token: the answers then also cover WAITING, ADMITTED, PRE_QUEUE, NOT_IN_QUEUE, 204, 409 QUEUE_CLOSED,
429 QUEUE_FULL, a purchase passed to the downstream, and ENTRY_TOKEN_USED. In jwt mode that caller comes with a
JWT of the test's identity provider (tests/support/jwts.py); the other cases, without one, hear 401.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import schemathesis
import yaml
from chalice.config import Config
from chalice.local import LocalDevServer
from hypothesis import HealthCheck, settings
from openapi_spec_validator import validate
from schemathesis.specs.openapi.checks import ignored_auth, positive_data_acceptance

from chalicelib import errors, runtime
from chalicelib.pump import Pump
from chalicelib.target_config import TargetConfig
from chalicelib.targets import TARGET_TYPES, Target
from tests.support import jwts
from tests.support.openapi_lint import lint

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "infra" / "openapi.yaml"
METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}

# Per operation; with the coverage phase's own cases, a few hundred requests in all.
MAX_EXAMPLES = 50
# After the fixture: on target 42 of each type, user 1 is admitted and users 2 to 4 wait in a full line (5 is
# refused); limited-drop 43 is closed, ticketing-event 43 opens in an hour (newcomers wait in the pre-queue).
KNOWN_TARGET_IDS = ("42", "42", "43")
KNOWN_USERS = ("1", "2", "3", "4", "5")
# Request values shorter than this could turn up in a response header by chance ("1" in Retry-After, a
# year in Date); longer ones there were copied from the request, unless they are the media types the app
# answers with anyway.
MIN_REFLECTED_CHARS = 6
OWN_HEADER_TEXT = ("application/json; charset=utf-8", "text/html; charset=utf-8")
REQUESTS = Counter()


def spec() -> dict:
    return yaml.safe_load(SPEC.read_text())


def spec_operations() -> dict[tuple[str, str], list[str]]:
    """(path, METHOD) -> the names of its path parameters, from the spec."""
    document = spec()
    shared = document["components"]["parameters"]
    found = {}
    for path, item in document["paths"].items():
        for method in set(item) & METHODS:
            parameters = [
                shared[p["$ref"].rsplit("/", 1)[1]] if "$ref" in p else p
                for p in item.get("parameters", []) + item[method].get("parameters", [])
            ]
            found[path, method.upper()] = sorted(p["name"] for p in parameters if p["in"] == "path")
    return found


def app_operations() -> dict[tuple[str, str], list[str]]:
    """(path, METHOD) -> the names of its path parameters, from app.py's Chalice routes."""
    from app import app

    return {
        (path, method): sorted(entry.view_args)
        for path, entries in app.routes.items()
        for method, entry in entries.items()
    }


# --- the spec and the app cannot drift ---


def test_every_route_of_the_app_is_in_the_spec_with_its_methods_and_nothing_else():
    assert sorted(spec_operations()) == sorted(app_operations())


def test_path_parameters_are_named_as_in_the_app():
    assert spec_operations() == app_operations()


def test_every_error_code_the_app_can_answer_is_in_the_spec():
    codes = {cls.code for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, errors.QueueError)}
    text = SPEC.read_text()
    assert [code for code in sorted(codes) if code not in text] == []


def test_the_spec_names_the_target_types_the_app_knows():
    assert spec()["components"]["parameters"]["QueueType"]["schema"]["enum"] == list(TARGET_TYPES)


# --- the spec serves client generators ---


def test_the_spec_is_valid_openapi():
    validate(spec())  # openapi-spec-validator: the OpenAPI 3.0 schema and its own semantic checks


def test_the_spec_passes_the_lint_rules_generators_rely_on():
    assert lint(spec()) == []


def test_the_server_is_the_deployed_stage():
    stages = json.loads((ROOT / ".chalice" / "config.json").read_text())["stages"]
    assert {stage["api_gateway_stage"] for stage in stages.values()} == {"api"}
    assert [server["url"] for server in spec()["servers"]] == ["/api"]


def test_the_purchase_routes_declare_the_entry_token_as_their_security_scheme():
    document = spec()
    scheme = document["components"]["securitySchemes"]["entryToken"]
    assert (scheme["type"], scheme["in"], scheme["name"]) == ("apiKey", "header", "X-Entry-Token")
    for path in (kind.purchase_path for kind in TARGET_TYPES.values()):
        # Header mode: the token alone (X-User-Id names the caller); jwt mode: the token and the bearer JWT.
        assert document["paths"][path]["post"]["security"] == [{"entryToken": []}, {"entryToken": [], "shopperJwt": []}]
    jwt = document["components"]["securitySchemes"]["shopperJwt"]
    assert (jwt["type"], jwt["scheme"], jwt["bearerFormat"]) == ("http", "bearer", "JWT")


def config_disagreements(field, values):
    """The values of a TargetConfig `field` that the spec's pattern and the app judge differently."""
    import re

    from chalicelib.errors import InvalidArgument
    from chalicelib.target_config import parse_config

    pattern = re.compile(spec()["components"]["schemas"]["TargetConfig"]["properties"][field]["pattern"])

    def app_takes(value):
        try:
            parse_config(json.dumps({field: value}).encode())
            return True
        except InvalidArgument:
            return False

    return [value for value in values if bool(pattern.fullmatch(value)) != app_takes(value)]


def test_the_time_pattern_takes_exactly_the_times_the_app_takes():
    """opensAt and closesAt: every day of 1999 to 2100 (and days 0, 29 to 32 of every month), at times and zones
    at and past their bounds: the spec's pattern and the app agree on each."""
    from datetime import date, timedelta

    days = [date(1999, 1, 1) + timedelta(n) for n in range((date(2101, 1, 1) - date(1999, 1, 1)).days)]
    texts = [f"{day.isoformat()}T12:00:00Z" for day in days]
    texts += [
        f"{y}-{m:02d}-{d:02d}T12:00:00Z"
        for y in (1999, 2000, 2023, 2024, 2099, 2100)
        for m in range(0, 14)
        for d in (0, 29, 30, 31, 32)
    ]
    texts += [
        f"2026-12-01T{t}{zone}"
        for t in ("00:00:00", "23:59:59.999999", "24:00:00", "12:60:00", "12:00:60", "12:00:00.1234567", "12:00:00.")
        for zone in ("Z", "+00:00", "-23:59", "+24:00", "+05:60", "z", "")
    ]
    texts += ["2000-01-01T00:30:00+01:00", "2099-12-31T23:30:00-01:00", "0000-00-00T00:00:00Z"]
    assert config_disagreements("opensAt", texts) == []


def test_the_image_url_pattern_takes_exactly_the_urls_the_app_takes():
    urls = [
        "https://img.example/a.png?w=200&h=200#x",
        "https://img.example",
        "https://img.example:8443/a",
        "https://",
        "https://:80/",
        "https://a:b/",
        "HTTPS://img.example/",
        "http://img.example/",
        "https://u:p@img.example/",
        "https://[::1]/a.png",
        "https://[::1/a.png",
        "https://img.example/a b",
        'https://img.example/a".png',
        "https://img.example/%20[x]@y",
        "https://img.example?",
        "https://img.example/" + "a" * 480,
        "javascript:x",
    ]
    assert config_disagreements("imageUrl", urls) == []


def test_the_precondition_headers_take_exactly_what_the_app_takes():
    import re

    from chalicelib.errors import InvalidArgument
    from chalicelib.target_config import Precondition

    parameters = spec()["components"]["parameters"]
    if_match = re.compile(parameters["IfMatch"]["schema"]["pattern"])
    if_none_match = parameters["IfNoneMatch"]["schema"]["enum"]

    def app_takes(**headers):
        try:
            Precondition.parse(headers.get("if_match"), headers.get("if_none_match"))
            return True
        except InvalidArgument:
            return False

    etag = '"' + "3f" * 20 + '"'
    values = ["*", " * ", etag, f"W/{etag}", f"{etag}, W/{etag},{etag}", '""', '"a,b"', f"{etag},", "**", "0", ""]
    values += ['"a b"', '"a\\b"', 'w/"a"', f"{etag} {etag}", f" {etag} , {etag} "]
    assert [v for v in values if bool(if_match.fullmatch(v)) != app_takes(if_match=v)] == []
    assert [v for v in ("*", "0", '"*"', "") if (v in if_none_match) != app_takes(if_none_match=v)] == []
    # Both at once: taken (and never met: 412), not refused as malformed.
    assert app_takes(if_match=etag, if_none_match="*")


def test_the_linter_finds_what_it_looks_for():
    document = spec()
    del document["servers"]
    del document["paths"]["/limited-drops/{drop_id}/orders"]["post"]["responses"]["201"]  # both routes': one anchor
    del document["paths"]["/virtual-queues/{queue_type}/{target_id}/stats"]["get"]["security"]
    document["paths"]["/events/{event_id}/seats/select"]["post"]["security"] = [{"bearer": []}]
    document["components"]["schemas"]["Orphan"] = {"type": "string"}
    rules = sorted(problem.split(":")[0] for problem in lint(document))
    assert rules == [
        "no-empty-servers",
        "no-unused-components",
        "operation-2xx-response",
        "operation-2xx-response",
        "security-defined",
        "security-defined",
    ]


# --- Schemathesis against the running app ---

schema = schemathesis.openapi.from_path(SPEC)
schema.config.generation.update(max_examples=MAX_EXAMPLES, database="none", with_security_parameters=False)
# Methods a route does not declare never reach the app: API Gateway answers them itself (403 Missing
# Authentication Token), and chalice local's server 405 or 501.
schema.config.phases.coverage.unexpected_methods = set()
tokens: dict[tuple[str, str], str] = {}  # (target, user) -> the one entry token minted for them
turns = itertools.count()
identity_mode = {"jwt": False}  # the mode of the app local_api serves


@schema.hook
def map_case(context, case):
    """In half of the well-formed cases, a known caller with their genuine ticket or entry token."""
    if case.meta is None or not case.meta.generation.mode.is_positive or not case.headers:
        return case
    turn = next(turns)
    if "X-User-Id" not in case.headers or turn % 2:
        return case
    user = KNOWN_USERS[turn // 2 % len(KNOWN_USERS)]
    target_id = KNOWN_TARGET_IDS[turn // 2 % len(KNOWN_TARGET_IDS)]
    case.headers["X-User-Id"] = user
    if identity_mode["jwt"]:
        case.headers["Authorization"] = f"Bearer {jwts.token(user)}"
    params = case.path_parameters
    if "queue_type" in params:
        target = Target(params["queue_type"], int(target_id))
        params["target_id"] = target_id
    else:
        (name,) = params
        target = Target("limited-drop" if name == "drop_id" else "ticketing-event", int(target_id))
        params[name] = target_id
    signer = runtime.signer()
    if "X-Queue-Ticket" in case.headers:
        # Known users entered in order (see local_api): each one's seq is their id.
        case.headers["X-Queue-Ticket"] = signer.issue_ticket(
            target, str(int(user)), int(user), int(time.time() * 1000)
        ).text
    if "X-Entry-Token" in case.headers:
        key = (str(target), user)
        if key not in tokens:
            tokens[key] = signer.mint_entry_token(target, str(int(user)), time.time(), 300).text
        case.headers["X-Entry-Token"] = tokens[key]
    return case


def no_request_data_in_response_headers(ctx, response, case):
    """Nothing the client sent (path parameters, headers, query, body) comes back in a response header."""
    sent = [str(v) for v in (case.path_parameters or {}).values()]
    sent += [str(v) for v in (case.headers or {}).values()]
    sent += [str(v) for v in (case.query or {}).values()]
    if isinstance(case.body, (dict, list)):
        sent += _leaves(case.body)
    elif isinstance(case.body, str):
        sent.append(case.body)
    sent = [
        value
        for value in sent
        if len(value) >= MIN_REFLECTED_CHARS and not any(value in own for own in OWN_HEADER_TEXT)
    ]
    for name, values in response.headers.items():
        for text in [name, *values]:
            copied = [value for value in sent if value in text]
            assert not copied, f"response header {name!r} carries request data {copied[0]!r}"


def _leaves(value) -> list[str]:
    if isinstance(value, dict):
        return [leaf for key, item in value.items() for leaf in [str(key), *_leaves(item)]]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [json.dumps(value)]


@pytest.fixture(params=["header", "jwt"])
def local_api(request, env, origin):
    """The app served by chalice local's HTTP server on a free port, in this process: same environment, same
    Redis prefix, with the known users and targets of KNOWN_USERS and KNOWN_TARGET_IDS; in each identity mode."""
    from app import app

    env(VQ_MAX_WAITING=3, VQ_BATCH_SIZE=1, VQ_TICK_MS=100, **(jwts.jwt_env() if request.param == "jwt" else {}))
    identity_mode["jwt"] = request.param == "jwt"
    tokens.clear()
    room = runtime.waiting_room()
    known = [Target(queue_type, 42) for queue_type in TARGET_TYPES]
    for target in known:
        for user in (1, 2, 3):
            room.enter(target, str(user))
    Pump(runtime.store(), runtime.settings()).run(ticks=1)
    for target in known:
        room.enter(target, "4")
    now_ms = int(time.time() * 1000)
    room.configure(Target("limited-drop", 43), TargetConfig(closes_at_ms=now_ms - 60_000))
    room.configure(Target("ticketing-event", 43), TargetConfig(opens_at_ms=now_ms + 3_600_000))

    server = LocalDevServer(app, Config.create(chalice_stage="dev", project_dir=str(ROOT)), "127.0.0.1", 0)
    thread = threading.Thread(target=server.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server.server_address[1]}"
    server.shutdown()
    server.server.server_close()
    thread.join()


@pytest.fixture(scope="module", autouse=True)
def report_requests():
    yield
    if REQUESTS:
        print(f"\nschemathesis: {sum(REQUESTS.values())} requests, by status {dict(sorted(REQUESTS.items()))}")


@pytest.mark.slow
@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
@pytest.mark.filterwarnings("ignore:IAMAuthorizer is not a supported in local mode")
def test_the_app_answers_as_the_spec_says(case, local_api):
    response = case.call(base_url=local_api, timeout=10)
    REQUESTS[response.status_code] += 1
    case.validate_response(
        response,
        # positive_data_acceptance: a well-formed ticket or token is still refused unless genuine (403/404).
        # ignored_auth: IAM (sigv4) is API Gateway's to check; chalice local lets every request through.
        excluded_checks=[positive_data_acceptance, ignored_auth],
        additional_checks=[no_request_data_in_response_headers],
    )
