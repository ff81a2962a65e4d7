"""What ElastiCache Serverless (CacheMode serverless) asks of the queue beyond a TLS cluster, checked on a Valkey
of the test's own as far as this machine allows (docs/deploy.md: nodes or serverless). TLS only and cluster mode
are tests/test_tls_cluster.py's.

- A script may touch only the keys its call passes in KEYS: serverless refuses any other, even one in the same
  slot. Here every script call runs as a user whose ACL allows exactly the keys that call passes (the union, for
  a pipeline of scripts), through a journey that calls every script; Valkey checks ACL key permissions on every
  command a script runs, so a key a script built or read from elsewhere would fail the call.
- The commands the queue sends are pinned: a new one fails here until it is checked against AWS's list of the
  commands serverless caches support (the ElastiCache developer guide, "Supported and restricted Valkey,
  Memcached, and Redis OSS commands").
- Serverless is reported to answer EVALSHA `NOSCRIPT` now and then, for a script it ran a moment before: a server
  that never holds a script (a proxy answering every EVALSHA so) is served from the scripts' text, never taken
  for Redis down.
"""

import base64
import json
import threading
import time

import pytest
import redis

from chalicelib import runtime
from chalicelib.events import FileSink, Publisher
from chalicelib.flag_sync import sync as sync_flag
from chalicelib.pump import Pump
from chalicelib.purchase import PurchaseGate, PurchaseRequest
from chalicelib.queue import WaitingRoom
from chalicelib.scripts import CONTRACTS, load_script
from chalicelib.store import QueueStore
from chalicelib.target_config import iso_time, parse_config
from chalicelib.targets import Target
from tests.support.buying import request_for
from tests.support.redis_servers import ForgetfulProxy

DROP, SHOW, GONE = Target("limited-drop", 42), Target("ticketing-event", 7), Target("limited-drop", 43)
SHARDED = Target("limited-drop", 44)  # its line over two sub-lines: the pump reads their fronts and records a plan
SCRIPTING = {"EVALSHA", "EVAL", "SCRIPT"}
# What the journey below sends besides scripts, as the server names them (redis-py's Lock included).
QUEUE_COMMANDS = {
    *("EVALSHA", "EVAL", "SCRIPT"),  # the scripts: by SHA, by their text where the server lacks them
    *("GET", "SET", "HGET", "HSET", "HGETALL", "HSETNX", "SCAN", "PEXPIRE"),  # the flag, configuration, the lock
    *("ZADD", "ZCARD", "ZCOUNT", "ZRANGE", "ZREMRANGEBYSCORE"),  # the registry and the open targets
    *("XRANGE", "XDEL"),  # the outbox
    *("HELLO", "CLIENT"),  # redis-py's greeting (CLIENT SETINFO; its refusal is ignored)
}


class StrictKeys:
    """The journey's client: logs in as a user the ACL narrows, before each script call, to the keys it passes."""

    def __init__(self, url, admin):
        self.admin = admin
        self.sent = set()  # every command name sent
        self.scripts = set()  # every script SHA called
        admin.execute_command("ACL", "SETUSER", "journey", "on", ">journey-password", "allkeys", "+@all")
        strict = self

        class Connection(redis.Connection):
            def pack_commands(self, commands):  # a pipeline
                strict.before(commands)
                return super().pack_commands(commands)

            def send_command(self, *args, **kwargs):  # one command
                strict.before([args])
                return super().send_command(*args, **kwargs)

        self.client = redis.Redis.from_url(
            url, username="journey", password="journey-password", decode_responses=True, connection_class=Connection
        )
        self.lock = threading.Lock()

    def before(self, commands):
        commands = list(commands)
        names = [str(args[0]).upper().split()[0] for args in commands]
        self.sent.update(names)
        if any(name not in SCRIPTING for name in names):
            keys = None  # a pipeline with other commands: not narrowed
        else:
            keys = set()
            for args in commands:
                if str(args[0]).upper() in ("EVALSHA", "EVAL"):
                    self.scripts.add(args[1])
                    keys.update(str(key) for key in args[3 : 3 + int(args[2])])
        rule = ["allkeys"] if keys is None else ["resetkeys", *(f"~{key}" for key in sorted(keys))]
        with self.lock:
            self.admin.execute_command("ACL", "SETUSER", "journey", *rule)


@pytest.fixture
def strict(own_redis):
    admin = redis.Redis.from_url(own_redis.url, decode_responses=True)
    return StrictKeys(own_redis.url, admin)


def test_every_script_touches_only_the_keys_its_call_passes(env, own_redis, strict, origin, tmp_path):
    env(REDIS_URL=own_redis.url, VQ_TICK_MS=100, VQ_BATCH_SIZE=2, VQ_EVENTS_FILE=str(tmp_path / "events.jsonl"))
    settings = runtime.settings()
    store = QueueStore(strict.client, settings.key_prefix, outbox_cap=settings.events_cap)
    room = WaitingRoom(store, runtime.signer(), settings, runtime.switch())
    gate = PurchaseGate(store, runtime.signer(), settings, runtime.switch())
    pump = Pump(store, settings)

    opening = int(time.time() * 1000) + 300
    room.configure(SHOW, parse_config(json.dumps({"opensAt": iso_time(opening)}).encode()))
    pre_queued = [room.enter(SHOW, str(user)).queue_ticket for user in (1, 2, 3)]
    tickets = {user: room.enter(DROP, str(user)).queue_ticket for user in (1, 2, 3, 4)}
    room.leave(GONE, "1", room.enter(GONE, "1").queue_ticket)  # an idle target, for the pump to forget
    room.configure(SHARDED, parse_config(b'{"shards": 2}'))
    for user in (1, 2, 3, 4):
        room.enter(SHARDED, str(user))
    time.sleep(0.4)
    for _ in range(3):
        pump.tick()  # the opening draw, evictions, the shop-following rate, admissions
        time.sleep(0.11)
    admitted = room.status(DROP, "1", tickets[1])
    assert admitted.status == "ADMITTED", admitted
    room.status(SHOW, "1", pre_queued[0])
    origin.answers = [(503, {"error": "try again"}), (201, {"ok": True})]
    for _ in range(2):  # consumed, given back (restore), consumed again; each outcome noted (observe_purchase)
        gate.purchase(
            PurchaseRequest(
                target_type=DROP.type,
                target_id=str(DROP.id),
                entry_token=admitted.entry_token.text,
                user_id="1",
                authorizer=None,
                body=b"{}",
                content_type="application/json",
            )
        )
    # The turns a container reckoned while Redis could not be asked, written back (dead reckoning).
    store.raise_mark(DROP, runtime.signer().read_ticket(tickets[2]).seq, 100, settings.queue_idle_ttl_s * 1000)
    room.leave(DROP, "4", tickets[4])
    room.stats(DROP)
    room.config(DROP)
    flags = base64.b64encode(json.dumps({"virtual_queue_enabled": {"default": True}}).encode()).decode()
    assert sync_flag({"Content": flags}, lambda: store, dict)["published"]
    room.configure(GONE, parse_config(b"{}"))  # opened after a flip: marked with the flag's version
    Publisher(store, FileSink(tmp_path / "events.jsonl")).drain(list(store.registered_targets()))  # the outbox
    assert store.pump_has_work(int(time.time() * 1000))  # what a scheduled run asks first
    pump.run(ticks=1)  # and lets go of the lock

    every = {load_script(strict.client, name).sha for name in CONTRACTS}
    assert every - strict.scripts == set(), "a script was not called: extend the journey so each one is checked"
    assert strict.sent <= QUEUE_COMMANDS, strict.sent - QUEUE_COMMANDS
    assert store.breaker_of(DROP).fail_counter == 0  # no call was refused (a refused one would have failed open)


@pytest.fixture
def forgetful(own_redis):
    proxy = ForgetfulProxy(own_redis.port)
    yield proxy
    proxy.close()


def test_a_server_that_answers_noscript_to_every_evalsha_is_served_from_the_scripts_text(
    env, origin, forgetful, capsys
):
    env(REDIS_URL=forgetful.url, VQ_TICK_MS=100, VQ_BATCH_SIZE=1)
    room, gate = runtime.waiting_room(), runtime.purchase_gate()
    tickets = {user: room.enter(DROP, str(user)).queue_ticket for user in (1, 2, 3)}
    assert [room.status(DROP, str(user), ticket).position for user, ticket in tickets.items()] == [1, 2, 3]
    room.leave(DROP, "2", tickets[2])
    assert Pump(runtime.store(), runtime.settings()).run(ticks=1).admitted == 1  # the lock's scripts, the tick's
    admitted = room.status(DROP, "1", tickets[1])
    assert admitted.status == "ADMITTED"
    assert gate.purchase(request_for(admitted.entry_token, DROP, "1")).status == 201
    assert room.stats(DROP)["waitingCount"] == 1

    assert forgetful.noscript >= 10 and forgetful.evals == forgetful.noscript  # every script call, by its text
    assert runtime.store().breaker_of(DROP).fail_counter == 0
    out = capsys.readouterr().out
    assert '"RedisDegraded"' not in out and '"DirectAdmitted"' not in out


def test_the_check_refuses_a_script_that_builds_a_key_name(strict):
    """The control: a script reading a key its call did not pass is refused, as serverless would refuse it."""
    with pytest.raises(redis.ResponseError, match="No permissions to access a key"):
        strict.client.eval("return redis.call('GET', KEYS[1] .. ':other')", 1, "vq:{limited-drop:1}:waiting")
    assert strict.client.eval("return redis.call('GET', KEYS[1])", 1, "vq:{limited-drop:1}:waiting") is None
