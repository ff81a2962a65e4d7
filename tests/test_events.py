"""State-change events: written by the scripts in the same call as the change (the outbox), published to
EventBridge (moto's, with a rule to an SQS queue, as a consumer would have it) by the pump's publisher."""

import hashlib
import json
import time
from pathlib import Path

import boto3
import jsonschema
import pytest
from botocore.exceptions import EndpointConnectionError
from moto import mock_aws

from chalicelib import runtime
from chalicelib.events import EventBridgeSink, Publisher, read_event
from chalicelib.pump import Pump
from chalicelib.purchase import PurchaseRequest
from chalicelib.target_config import TargetConfig
from chalicelib.targets import Target

DROP = Target("limited-drop", 42)
SHOW = Target("ticketing-event", 7)
SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "infra" / "events.schema.json").read_text())
BUS = "virtual-queue-events"


@pytest.fixture
def aws(monkeypatch):
    """moto's EventBridge and SQS: a bus, and a rule sending every virtual-queue event to a queue."""
    for name, value in {
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        events, sqs = boto3.client("events"), boto3.client("sqs")
        events.create_event_bus(Name=BUS)
        queue_url = sqs.create_queue(QueueName="consumer")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        events.put_rule(Name="all", EventBusName=BUS, EventPattern=json.dumps({"source": ["virtual-queue"]}))
        events.put_targets(Rule="all", EventBusName=BUS, Targets=[{"Id": "consumer", "Arn": queue_arn}])

        def received():
            out = []
            while batch := sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", []):
                out += [json.loads(m["Body"]) for m in batch]
                sqs.delete_message_batch(
                    QueueUrl=queue_url,
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(batch)],
                )
            return out

        yield events, received


@pytest.fixture
def wired(env, origin, aws):
    """The waiting room, purchase gate and pump of this test's environment, publishing to moto's bus."""
    env(VQ_TICK_MS=100, VQ_BATCH_SIZE=2, VQ_EVENT_BUS=BUS)
    return runtime.waiting_room(), runtime.purchase_gate(), runtime.publisher()


def tick(publisher=None, times=1):
    pump = Pump(runtime.store(), runtime.settings(), publisher=publisher)
    for _ in range(times):
        pump.tick()
        time.sleep(0.11)  # the next tick (100 ms)
    pump._release()


def buy(gate, token):
    return gate.purchase(
        PurchaseRequest(
            target_type=token.target.type,
            target_id=str(token.target.id),
            entry_token=token.text,
            user_id=str(token.user_id),
            authorizer=None,
            body=b"{}",
            content_type="application/json",
        )
    )


def drain(publisher):
    return publisher.drain(sorted(runtime.store().registered_targets()))


def test_a_full_journey_reaches_a_rule_s_queue_as_the_schema_says(wired, aws, origin, client, prefix):
    room, gate, publisher = wired
    _, received = aws
    tickets = {user: room.enter(DROP, str(user)).queue_ticket for user in range(1, 6)}
    tick()
    tokens = {user: room.status(DROP, str(user), tickets[user]).entry_token for user in (1, 2)}
    assert buy(gate, tokens[1]).status == 201
    origin.answers = [(503, {}, {"not_taken": True})]
    assert buy(gate, tokens[2]).status == 503  # failed, and the token given back
    room.leave(DROP, "3", tickets[3])
    client.zadd(runtime.store().keys(DROP).heartbeat, {"4": 0})  # user 4 stopped polling long ago
    tick()
    room.configure(DROP, TargetConfig(paused=True, batch=5))
    room.configure(DROP, TargetConfig(sold_out=True, batch=5))
    room.configure(SHOW, TargetConfig(opens_at_ms=int(time.time() * 1000) + 3_600_000))
    show_ticket = room.enter(SHOW, "1").queue_ticket
    room.configure(SHOW, TargetConfig(opens_at_ms=int(time.time() * 1000) - 1))
    tick(times=2)  # the first tick finds the opening due, the draw runs; the second admits
    assert room.status(SHOW, "1", show_ticket).status == "ADMITTED"
    assert drain(publisher).published > 0

    delivered = received()
    for event in delivered:
        jsonschema.validate(event, SCHEMA)
    kinds = [(e["detail-type"], e["detail"]["target"]["id"], e["detail"].get("userId")) for e in delivered]
    assert sorted(kinds, key=str) == sorted(
        [
            ("UserAdmitted", "42", "1"),
            ("UserAdmitted", "42", "2"),
            ("PurchaseCompleted", "42", "1"),
            ("PurchaseFailed", "42", "2"),
            ("TokenRestored", "42", "2"),
            ("UserLeft", "42", "3"),
            ("UserEvicted", "42", "4"),
            ("UserAdmitted", "42", "5"),
            ("TargetConfigChanged", "42", None),
            ("TargetPaused", "42", None),
            ("TargetConfigChanged", "42", None),
            ("TargetResumed", "42", None),
            ("TargetSoldOut", "42", None),
            ("TargetConfigChanged", "7", None),
            ("TargetConfigChanged", "7", None),
            ("TargetOpened", "7", None),
            ("UserAdmitted", "7", "1"),
        ],
        key=str,
    )
    by_kind = {e["detail-type"]: e["detail"] for e in delivered}
    assert by_kind["PurchaseCompleted"]["tokenId"] == tokens[1].token_id
    assert by_kind["PurchaseCompleted"]["status"] == 201
    assert by_kind["PurchaseFailed"] == {**by_kind["PurchaseFailed"], "tokenId": tokens[2].token_id, "status": 503}
    assert by_kind["TargetSoldOut"]["by"] == "operator"
    assert by_kind["TargetOpened"]["seed"] == room.stats(SHOW)["openingDraw"]["seed"]
    # Both of SHOW's configurations announced the one commitment; the opening revealed the seed it commits to.
    announced = {e["detail"].get("commitment") for e in delivered if e["detail-type"] == "TargetConfigChanged"}
    seed = by_kind["TargetOpened"]["seed"]
    assert announced == {None, hashlib.sha256(seed.encode()).hexdigest()}
    assert by_kind["TargetOpened"]["commitment"] == hashlib.sha256(seed.encode()).hexdigest()
    assert {e["source"] for e in delivered} == {"virtual-queue"}
    assert len({e["detail"]["eventId"] for e in delivered}) == len(delivered)
    # No secret: neither an entry token nor a queue ticket appears in any event.
    text = json.dumps(delivered)
    assert not any(t.text in text for t in tokens.values())
    assert not any(ticket in text for ticket in tickets.values())
    # Published means gone from the outbox; the outbox expires like every other key.
    assert client.xlen(runtime.store().keys(DROP).events) == 0


def test_no_event_without_its_change(wired, client):
    room, _, _ = wired
    ticket = room.enter(DROP, "1").queue_ticket
    tick()
    tick()  # a tick with nobody left to admit
    room.leave(DROP, "2", room.enter(DROP, "2").queue_ticket)
    room.leave(DROP, "2", room.enter(DROP, "2").queue_ticket)  # an entry again, a departure again
    stream = runtime.store().keys(DROP).events
    kinds = [fields["type"] for _, fields in client.xrange(stream)]
    assert kinds == ["UserAdmitted", "UserLeft", "UserLeft"]
    assert room.status(DROP, "1", ticket).status == "ADMITTED"
    assert client.pttl(stream) > 0


def test_a_crash_between_put_events_and_the_outbox_delete_republishes_the_same_ids(wired, aws, monkeypatch):
    room, _, publisher = wired
    _, received = aws
    for user in (1, 2):
        room.enter(DROP, str(user))
    tick()
    store = runtime.store()
    deleted = store.events_published

    def crash(*args):
        raise ConnectionError("the pump died before moving its cursor")

    monkeypatch.setattr(store, "events_published", crash)
    with pytest.raises(ConnectionError):
        drain(publisher)
    first = [e["detail"]["eventId"] for e in received()]
    monkeypatch.setattr(store, "events_published", deleted)
    assert drain(publisher).published == 2
    again = [e["detail"]["eventId"] for e in received()]
    assert len(first) == 2 and sorted(again) == sorted(first)
    assert drain(publisher).published == 0


class FailingEvents:
    """An EventBridge client that is down, then refuses every other entry (as a throttled PutEvents does)."""

    def __init__(self, real):
        self.real = real
        self.down = True
        self.calls = []

    def put_events(self, Entries):
        self.calls.append(len(Entries))
        if self.down:
            raise EndpointConnectionError(endpoint_url="https://events.us-east-1.amazonaws.com")
        answer = self.real.put_events(Entries=Entries[0::2])
        refused = {"ErrorCode": "ThrottlingException", "ErrorMessage": "Rate exceeded"}
        entries = [answer["Entries"][i // 2] if i % 2 == 0 else refused for i in range(len(Entries))]
        return {"FailedEntryCount": len(Entries) // 2, "Entries": entries}


def test_eventbridge_failing_loses_nothing_until_the_cap(env, aws, client, prefix, capsys):
    events, received = aws
    env(VQ_TICK_MS=100, VQ_BATCH_SIZE=30, VQ_EVENT_BUS=BUS, VQ_EVENTS_CAP=25)
    room = runtime.waiting_room()
    store = runtime.store()
    failing = FailingEvents(events)
    publisher = Publisher(store, EventBridgeSink(failing, BUS))
    for user in range(1, 21):
        room.enter(DROP, str(user))
    tick()  # 20 admitted
    assert drain(publisher).failed == 20
    assert client.xlen(store.keys(DROP).events) == 20  # all waiting
    for user in range(21, 31):
        room.enter(DROP, str(user))
    time.sleep(0.11)
    tick()  # 10 more: 30 events, 5 past the cap
    capsys.readouterr()
    failing.down = False
    first = drain(publisher)
    assert (first.published, first.failed, first.dropped) == (13, 12, 5)
    assert '"EventsDropped":5' in capsys.readouterr().out.replace(" ", "")
    while drain(publisher).published:
        pass
    users = sorted(int(e["detail"]["userId"]) for e in received())
    assert users == list(range(6, 31))  # the 5 oldest went over the cap, nothing else was lost
    assert max(failing.calls) <= 10  # PutEvents' limit
    assert client.hget(store.keys(DROP).stats, "events_dropped") in (None, "0")


@pytest.mark.slow
def test_a_burst_of_5000_admissions_leaves_in_full_rounds_back_to_back(env, aws, client):
    # How fast is tests/perf/bench_events.py's to measure; here, that a burst takes the fewest rounds, each read full
    # and saying so (`more`, on which PublisherLoop goes again at once instead of waiting), and none is dropped.
    events, _ = aws
    # A bus without rules: moto's delivery to SQS takes a third of a second per PutEvents call, EventBridge does not.
    events.create_event_bus(Name="burst")
    env(VQ_TICK_MS=1000, VQ_BATCH_SIZE=5000, VQ_EVENT_BUS="burst")
    room, store = runtime.waiting_room(), runtime.store()
    for user in range(1, 5001):
        room.enter(DROP, str(user))
    assert Pump(store, runtime.settings()).run(ticks=1).admitted == 5000
    publisher = runtime.publisher()
    rounds = [drain(publisher) for _ in range(6)]
    assert [(r.published, r.dropped, r.more) for r in rounds] == [(1000, 0, True)] * 5 + [(0, 0, False)]
    assert client.xlen(store.keys(DROP).events) == 0


def test_the_local_file_gets_every_event_in_eventbridge_s_shape(env, tmp_path, client):
    path = tmp_path / "events.jsonl"
    env(VQ_TICK_MS=100, VQ_EVENTS_FILE=path)
    room = runtime.waiting_room()
    room.leave(DROP, "1", room.enter(DROP, "1").queue_ticket)
    assert drain(runtime.publisher()).published == 1
    (line,) = path.read_text().splitlines()
    event = json.loads(line)
    jsonschema.validate(event, SCHEMA)
    assert (event["detail-type"], event["detail"]["userId"], event["id"]) == (
        "UserLeft",
        "1",
        event["detail"]["eventId"],
    )


def test_without_a_publisher_the_scripts_write_no_events(env, client):
    room = runtime.waiting_room()
    room.leave(DROP, "1", room.enter(DROP, "1").queue_ticket)
    tick()
    assert runtime.publisher() is None
    assert not client.exists(runtime.store().keys(DROP).events)


def test_an_outbox_entry_reads_as_its_event():
    fields = {"type": "UserAdmitted", "user": "123456789012345678", "seq": "17", "queued": "0"}
    event = read_event(DROP, "1796074236280-3", dict(fields))
    assert event.detail == {
        "eventId": "limited-drop:42/1796074236280-3",
        "target": {"type": "limited-drop", "id": "42"},
        "serverTime": "2026-11-30T21:30:36.280Z",
        "userId": "123456789012345678",
        "seq": 17,
        "queued": False,
    }
    # One an earlier release wrote, before the safety net: every admission was the pump's.
    del fields["queued"]
    assert read_event(DROP, "1796074236280-3", fields).detail["queued"] is True
    entry = event.put_events_entry("default")
    assert (entry["Source"], entry["DetailType"], entry["EventBusName"]) == ("virtual-queue", "UserAdmitted", "default")


def test_a_burst_of_enter_and_leave_cannot_push_an_admission_out_of_the_outbox(env, aws, client):
    env(VQ_TICK_MS=100, VQ_BATCH_SIZE=2, VQ_EVENT_BUS=BUS, VQ_EVENTS_CAP=10)
    room, store = runtime.waiting_room(), runtime.store()
    room.enter(DROP, "1")
    tick()  # user 1 admitted: one UserAdmitted waiting to be published
    for _ in range(50):  # one user entering and leaving as fast as they can
        room.leave(DROP, "2", room.enter(DROP, "2").queue_ticket)
    kinds = [fields["type"] for _, fields in client.xrange(store.keys(DROP).events)]
    # User events fill half the cap; what they would add beyond is dropped, not the admission.
    assert kinds == ["UserAdmitted"] + ["UserLeft"] * 4
    assert client.hget(store.keys(DROP).stats, "events_dropped") == "46"
    for user in range(3, 13):
        room.enter(DROP, str(user))
    time.sleep(0.11)
    tick(times=5)  # 10 admissions: the outbox is full of admissions only now, and loses its oldest
    kinds = [fields["type"] for _, fields in client.xrange(store.keys(DROP).events)]
    assert kinds == ["UserAdmitted"] * 10
