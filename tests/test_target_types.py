"""The target types are declared once (chalicelib/targets.py's TARGET_TYPES): the routes, the gate, the downstreams,
the token format, the pages, the demo shop, the local stack and the load test derive from it; the contracts that
live outside the code (the OpenAPI spec, the event schema) are written from it (infra/target_types.py), and the
deployment template is checked against it. Adding a type is one entry, as a copy of the contracts shows."""

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import jsonschema
import pytest
import yaml
from chalice import CustomAuthorizer
from openapi_spec_validator import validate

from chalicelib import gate, page
from chalicelib.config import Keyring
from chalicelib.targets import TARGET_TYPES, Target, TargetType
from chalicelib.tokens import TokenSigner
from infra import target_types
from tests.conftest import TEST_KEYS
from tests.support.openapi_lint import lint

ROOT = Path(__file__).resolve().parent.parent
GIFT_CARD = TargetType(
    name="gift-card",
    purchase_path="/gift-cards/{card_id}/redeem",
    origin_variable="VQ_ORIGIN_GIFT_CARD_URL",
    labels={"en": "Gift card", "ko": "기프트 카드"},
)


def test_each_type_has_one_guarded_purchase_route_and_no_other_route_is_guarded():
    from app import app

    guarded = {
        path: list(methods)
        for path, methods in app.routes.items()
        if any(isinstance(entry.authorizer, CustomAuthorizer) for entry in methods.values())
    }
    assert guarded == {kind.purchase_path: ["POST"] for kind in TARGET_TYPES.values()}


def test_the_gate_reads_each_type_s_purchase_path_back_into_its_target():
    for kind in TARGET_TYPES.values():
        path = gate.purchase_path(Target(kind.name, 42))
        assert path == kind.purchase_path.replace("{" + kind.id_parameter + "}", "42")
        arn = f"arn:aws:execute-api:eu-west-1:123456789012:a1b2c3d4e5/api/POST{path}"
        assert gate.target_from_method_arn(arn) == Target(kind.name, 42)


def test_tokens_and_tickets_carry_every_type():
    signer = TokenSigner(Keyring.from_json(json.dumps(TEST_KEYS), "k1"))
    for kind in TARGET_TYPES:
        token = signer.mint_entry_token(Target(kind, 7), "5", 1_000, 300)
        assert signer.read_entry_token(token.text, 1_001).target == Target(kind, 7)
        ticket = signer.issue_ticket(Target(kind, 7), "5", 3, 1_000_000)
        assert signer.read_ticket(ticket.text).target == Target(kind, 7)


def test_every_type_has_a_name_in_every_language_of_the_page():
    assert all(set(kind.labels) == set(page.LANGUAGES) for kind in TARGET_TYPES.values())


def openapi_problems(text: str, types: Mapping[str, TargetType]) -> list[str]:
    """How the OpenAPI spec `text` fails `types`: a type it does not name, a purchase route it lacks; and as a
    spec, whether it is valid and lints clean."""
    spec = yaml.safe_load(text)
    enums = type_enums(spec)
    problems = [f"{place} names {listed}" for place, listed in enums if listed != list(types)]
    if len(enums) < 2:
        problems.append(f"the spec names the types in {len(enums)} enums, not in the queue type's and the list's")
    for kind in types.values():
        route = spec["paths"].get(kind.purchase_path, {})
        if "post" not in route or [p["name"] for p in route["parameters"]] != [kind.id_parameter]:
            problems.append(f"no purchase route {kind.purchase_path} with its parameter {kind.id_parameter}")
    validate(spec)
    return problems + lint(spec)


def type_enums(node: object, place: str = "spec") -> list[tuple[str, list]]:
    """Every enum of target types in the spec (an enum naming a type), by where it is."""
    if isinstance(node, list):
        return [found for i, item in enumerate(node) for found in type_enums(item, f"{place}[{i}]")]
    if not isinstance(node, dict):
        return []
    enum = node.get("enum")
    own = [(place, enum)] if isinstance(enum, list) and set(enum) & {"limited-drop", "ticketing-event"} else []
    return own + [found for key, value in node.items() for found in type_enums(value, f"{place}.{key}")]


def schema_problems(text: str, types: Mapping[str, TargetType]) -> list[str]:
    """How the events' schema `text` fails `types`: a target type it does not take, an event id it refuses."""
    schema = json.loads(text)
    problems = []
    if schema["$defs"]["target"]["properties"]["type"]["enum"] != list(types):
        problems.append("the schema's target types are not the registry's")
    for name in types:
        if not re.fullmatch(schema["$defs"]["eventId"]["pattern"], f"{name}:7/1700000000000-0"):
            problems.append(f"the schema refuses an event id of a {name}")
    return problems


def test_the_openapi_spec_names_every_type_and_its_purchase_route_as_written_from_the_registry():
    text = target_types.OPENAPI.read_text()
    assert text == target_types.openapi(text, TARGET_TYPES), "run: .venv/bin/python -m infra.target_types"
    assert openapi_problems(text, TARGET_TYPES) == []


def test_the_event_schema_names_every_type_as_written_from_the_registry():
    text = target_types.EVENTS_SCHEMA.read_text()
    assert text == target_types.events_schema(text, TARGET_TYPES), "run: .venv/bin/python -m infra.target_types"
    assert schema_problems(text, TARGET_TYPES) == []
    jsonschema.Draft202012Validator.check_schema(json.loads(text))


def test_a_third_type_added_in_one_place_reaches_the_contracts_the_stack_and_the_load_test(tmp_path, monkeypatch):
    # The type checks fail on the contracts as they are, until the generator writes them (in a copy here).
    monkeypatch.setitem(TARGET_TYPES, GIFT_CARD.name, GIFT_CARD)
    spec, schema = tmp_path / "openapi.yaml", tmp_path / "events.schema.json"
    shutil.copy(target_types.OPENAPI, spec)
    shutil.copy(target_types.EVENTS_SCHEMA, schema)
    assert openapi_problems(spec.read_text(), TARGET_TYPES) and schema_problems(schema.read_text(), TARGET_TYPES)
    target_types.write(TARGET_TYPES, spec, schema)
    assert openapi_problems(spec.read_text(), TARGET_TYPES) == []
    assert schema_problems(schema.read_text(), TARGET_TYPES) == []
    # The local stack gives every type the demo shop; it names no type's downstream itself.
    stack = (ROOT / "infra" / "local" / "stack.py").read_text()
    assert not [kind.origin_variable for kind in TARGET_TYPES.values() if kind.origin_variable in stack]
    # The load test buys at the type's purchase route (Locust is not a dependency: a stand-in, as imported).
    load_test = subprocess.run(
        [sys.executable, "-c", LOAD_TEST],
        cwd=tmp_path,
        env={**os.environ, "VQ_LOAD_TARGET": "gift-card:7"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert load_test.returncode == 0, load_test.stderr[-2000:]
    assert load_test.stdout.split() == ["/virtual-queues/gift-card/7/entries", "/gift-cards/7/redeem"]


# infra/sim/locustfile.py imported with the type added and a stand-in for `locust`.
LOAD_TEST = f"""
import runpy, sys, types
sys.path.insert(0, {str(ROOT)!r})
from chalicelib import targets
targets.TARGET_TYPES["gift-card"] = targets.TargetType(
    name="gift-card", purchase_path="/gift-cards/{{card_id}}/redeem", origin_variable="VQ_ORIGIN_GIFT_CARD_URL",
    labels={{"en": "Gift card", "ko": "gift card"}},
)
locust = types.ModuleType("locust")
locust.HttpUser, locust.task = object, lambda function: function
locust.events = types.SimpleNamespace(test_stop=types.SimpleNamespace(add_listener=lambda function: function))
sys.modules["locust"] = locust
loaded = runpy.run_path({str(ROOT / "infra" / "sim" / "locustfile.py")!r})
print(loaded["ENTRIES"], loaded["PURCHASE"])
"""


@pytest.mark.parametrize("name", ["Gift-Card", "gift_card", "gift--card", "-gift", "gift card"])
def test_a_type_is_named_in_lower_case_words_and_hyphens(name):
    with pytest.raises(ValueError, match="lower-case"):
        TargetType(name=name, purchase_path="/x/{x_id}", origin_variable="VQ_X", labels={})


def test_the_deployed_api_gets_a_downstream_for_every_type():
    settings = yaml.safe_load((ROOT / "infra" / "settings.yaml").read_text())
    variables = settings["Resources"]["APIHandler"]["Properties"]["Environment"]["Variables"]
    assert {name for name in variables if name.startswith("VQ_ORIGIN_")} == {
        kind.origin_variable for kind in TARGET_TYPES.values()
    }


def test_the_demo_shop_serves_every_type_s_purchase_route():
    from infra.local.demo_shop import ITEM_PATH

    assert all(ITEM_PATH.fullmatch(gate.purchase_path(Target(kind, 42))) for kind in TARGET_TYPES)
    assert not ITEM_PATH.fullmatch("/limited-drops/42/refunds")


# A type added in the one place, before anything imports the registry: the whole journey then works for it.
THIRD_TYPE = """
import json, sys, time
from chalicelib import targets
targets.TARGET_TYPES["gift-card"] = targets.TargetType(
    name="gift-card", purchase_path="/gift-cards/{card_id}/redeem", origin_variable="VQ_ORIGIN_GIFT_CARD_URL",
    labels={"en": "Gift card", "ko": "기프트 카드"},
)
from chalice.test import Client
from app import app
from chalicelib import gate, runtime
from chalicelib.pump import Pump

seen = {}
with Client(app) as client:
    entered = client.http.post("/virtual-queues/gift-card/7/entries", headers={"X-User-Id": "5"}).json_body
    seen["entered"] = entered["status"]
    Pump(runtime.store(), runtime.settings()).run(ticks=1)
    ticket = {"X-User-Id": "5", "X-Queue-Ticket": entered["queueTicket"]}
    admitted = client.http.get("/virtual-queues/gift-card/7/entries/me", headers=ticket).json_body
    seen["admitted"] = admitted["status"]
    token = admitted["entryToken"]
    arn = "arn:aws:execute-api:eu-west-1:123456789012:a1b2c3d4e5/api/POST/gift-cards/7/redeem"
    event = {"methodArn": arn, "headers": {"X-Entry-Token": token, "X-User-Id": "5"}}
    seen["authorizer"] = client.lambda_.invoke("purchase_authorizer", event).payload["policyDocument"]
    bought = client.http.post("/gift-cards/7/redeem", headers={"X-Entry-Token": token, "X-User-Id": "5",
                                                               "Content-Type": "application/json"}, body="{}")
    seen["bought"] = bought.status_code
    seen["page"] = "Gift card #7" in client.http.get("/waiting-room/gift-card/7").body.decode()
    seen["console"] = '"gift-card"' in client.http.get("/console").body.decode()
print(json.dumps(seen))
"""


def test_a_third_type_added_in_one_place_queues_admits_and_buys(env, origin):
    environment = {**os.environ, "VQ_ORIGIN_GIFT_CARD_URL": origin.url}
    run = subprocess.run(
        [sys.executable, "-c", THIRD_TYPE], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.splitlines()[-1])
    assert seen["entered"] == "WAITING" and seen["admitted"] == "ADMITTED"
    assert seen["authorizer"]["Statement"][0]["Effect"] == "Allow"
    assert seen["bought"] == 201 and seen["page"] and seen["console"]
    assert [r["path"] for r in origin.requests] == ["/gift-cards/7/redeem"]
    assert origin.requests[0]["headers"]["Idempotency-Key"]
