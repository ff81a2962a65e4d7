"""The target types are declared once (chalicelib/targets.py's TARGET_TYPES): the routes, the gate, the downstreams,
the token format, the pages and the demo shop derive from it, and the contracts that live outside the code (the
OpenAPI spec, the event schema, the deployment template) are checked against it. Adding a type is one entry."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from chalice import CustomAuthorizer

from chalicelib import gate, page
from chalicelib.config import Keyring
from chalicelib.targets import TARGET_TYPES, Target
from chalicelib.tokens import TokenSigner
from tests.conftest import TEST_KEYS

ROOT = Path(__file__).resolve().parent.parent


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


def test_the_openapi_spec_names_every_type_and_its_purchase_route():
    spec = yaml.safe_load((ROOT / "infra" / "openapi.yaml").read_text())
    assert spec["components"]["parameters"]["QueueType"]["schema"]["enum"] == list(TARGET_TYPES)
    for kind in TARGET_TYPES.values():
        assert "post" in spec["paths"][kind.purchase_path]
        assert [p["name"] for p in spec["paths"][kind.purchase_path]["parameters"]] == [kind.id_parameter]


def test_the_event_schema_names_every_type():
    schema = json.loads((ROOT / "infra" / "events.schema.json").read_text())
    assert schema["$defs"]["target"]["properties"]["type"]["enum"] == list(TARGET_TYPES)


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
