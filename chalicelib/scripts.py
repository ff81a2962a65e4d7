"""The Lua scripts (one file each in lua/): what each takes and answers, by name; loaded once and called by SHA,
alone or many in one pipeline.

Python and Lua agree by name, never by position: `CONTRACTS` declares each script's KEYS, ARGV and reply
fields in the order the script's header lists them (and its first lines bind them to locals of the same
names). A caller passes every key and argument by name and reads the reply by name;
tests/test_script_contracts.py checks every header and binding against this table.
"""

from __future__ import annotations

import hashlib
import keyword
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from redis.exceptions import NoScriptError

from chalicelib.redis_connection import REDIS_FAILURES, RedisClient, node_names

# Beside chalicelib/ in the repository, and at the package root when deployed (vendor/lua links to it).
LUA_DIR = Path(__file__).resolve().parent.parent / "lua"
# lua/outbox.lua's two arguments, which every script that reports a change of state takes.
OUTBOX_ARGS = ("outbox_cap", "outbox_ttl_ms")
# The switch's two arguments, in enter's and status's ARGV (chalicelib/flags.py).
SWITCH_ARGS = ("flag_version", "queued")
# The counters the ETA's range comes from (chalicelib/eta.py), in enter's and status's WAITING answers.
DEPARTURES = ("left", "evicted", "waiting_user_ms")
# What adjust_rate.lua follows the shop by: chalicelib/shop_health.py's FollowRules, field for field.
FOLLOW_ARGS = (
    "window_ms",
    "fewest",
    "increase",
    "reach_ms",
    "deepest",
    "gentlest",
    "floor",
    "headroom",
    "drain_ms",
    "opening",
    "probe",
    "band",
    "hold_ms",
)


@dataclass(frozen=True)
class Contract:
    """One script's interface: its KEYS and ARGV in order, and its reply's fields.

    `rest` names the ARGV that follow the named ones, a list of any length (field, value, ...).
    `admitting_keys` and `admitting_args` follow the others only in a call that may admit (status.lua): all of
    them or none. A reply is `reply` (a list of these fields; `may_be_empty`: or an empty list), or one of
    `replies` (a list led by a tag naming its fields), or, with neither, a single value.
    """

    keys: tuple[str, ...]
    args: tuple[str, ...] = ()
    rest: str | None = None
    admitting_keys: tuple[str, ...] = ()
    admitting_args: tuple[str, ...] = ()
    reporting: bool = False  # reports state changes: lua/outbox.lua goes before it, and it takes OUTBOX_ARGS
    budgeted: bool = False  # admits users against the per-tick budget: lua/budget.lua goes before it
    reply: tuple[str, ...] | None = None
    may_be_empty: bool = False
    replies: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def all_keys(self) -> tuple[str, ...]:
        """Every key the script may be passed, in order."""
        return (*self.keys, *self.admitting_keys)

    @property
    def all_args(self) -> tuple[str, ...]:
        """Every named argument the script may be passed, in order."""
        return (*self.args, *self.admitting_args)

    def __post_init__(self) -> None:
        names = [*self.all_keys, *self.all_args]
        if len(set(names)) != len(names):
            raise ValueError(f"a name is given twice: {names}")
        if self.reporting and not set(OUTBOX_ARGS) <= set(self.args):
            raise ValueError(f"a reporting script takes {OUTBOX_ARGS}")


# fmt: off
CONTRACTS: dict[str, Contract] = {
    "enter": Contract(
        keys=("waiting", "heartbeat", "seq", "mark", "token", "registered", "stats", "config", "prequeue", "draw",
              "active", "budget", "events", "pace", "passed"),
        args=("user_id", "now_ms", "default_max_waiting", "idle_ttl_ms", "entry_key", "grant_expires_s",
              "grant_ttl_ms", "grant_expires_ms", "registration_refresh_ms", "default_batch", "default_tick_ms",
              "open_on_first_use", "invited", *OUTBOX_ARGS, *SWITCH_ARGS, "pass_window_ms", "shards"),
        reporting=True,
        budgeted=True,
        replies={
            "ADMITTED": ("held", "issued_now"),
            "PASSED": ("held", "register"),
            "WAITING": ("seq", "ahead", "rate", "paused", "created", "register", *DEPARTURES),
            "PRE_QUEUE": ("arrival", "opens_at_ms", "created", "register"),
            "FULL": (), "CLOSED": (), "NOT_INVITED": (), "SOLD_OUT": (), "UNKNOWN_TARGET": (), "OFF": (),
            "FLAG": ("target_version",), "SHARDS": ("shards",),
        },
    ),
    "status": Contract(
        keys=("waiting", "heartbeat", "mark", "token", "stats", "pace", "config", "prequeue", "draw", "ended", "fence"),
        args=("user_id", "now_ms", "default_batch", "default_tick_ms", "ticket_entry", *SWITCH_ARGS, "shards"),
        admitting_keys=("waits", "active"),
        admitting_args=("grant", "grant_ttl_ms", "grant_expires_ms", "wait_ms", "wait_bucket", "told_inside",
                        "told_error_bucket", "idle_ttl_ms"),
        replies={
            "ADMITTED": ("held", "issued_now"),
            "DUE": (),
            "WAITING": ("seq", "ahead", "rate", "paused", "mark", "batch", "tick_ms", "drawn", *DEPARTURES),
            "PRE_QUEUE": ("arrival", "opens_at_ms"),
            "NOT_IN_QUEUE": (), "OTHER_ENTRY": (), "UNKNOWN_TARGET": (), "SOLD_OUT": (), "OFF": (),
            "FLAG": ("target_version",), "SHARDS": ("shards",),
        },
    ),
    "leave": Contract(
        keys=("waiting", "heartbeat", "token", "stats", "prequeue", "active", "revoked", "events", "ended", "mark",
              "config", "departed"),
        args=("user_id", "ticket_entry", "now_ms", "clock_skew_margin_ms", "idle_ttl_ms", *OUTBOX_ARGS,
              "default_tick_ms", "departure_window_ms", "shards"),
        reporting=True,
    ),
    "consume": Contract(
        keys=("consumed", "active", "revoked", "config"),
        args=("consumption_id", "marker_ttl_ms", "user_id", "token_id", "open_on_first_use", "minted", "now_ms",
              "shards"),
    ),
    "restore": Contract(
        keys=("consumed", "active", "events", "stats", "revoked", "config", "waiting", "mark"),
        args=("consumption_id", "user_id", "token_expires_ms", "outcome", "token_id", *OUTBOX_ARGS),
        reporting=True,
    ),
    "stats": Contract(
        keys=("waiting", "mark", "stats", "waits", "prequeue", "active", "config", "draw", "health", "purchases",
              "tick", "pace", "fence"),
        args=("now_ms",),
        reply=("waiting", "pre_queued", "active", "stats", "waits", "config", "draw", "health", "purchases",
               "last_tick_ms", "rate", "fence"),
    ),
    "configure": Contract(
        keys=("config", "events", "stats"),
        args=("now_ms", "expect", *OUTBOX_ARGS, "fresh_seed", "fresh_commitment", "line_seed", "draw_block"),
        rest="settings",
        reporting=True,
        replies={
            "WRITTEN": ("version",), "CHANGED": ("version",), "ALREADY_OPEN": ("version",), "UNKNOWN_TARGET": (),
        },
    ),
    "admit": Contract(
        keys=("waiting", "heartbeat", "seq", "mark", "tick", "stats", "waits", "admissions", "config", "prequeue",
              "draw", "active", "health", "events", "ended", "budget", "pace", "fence"),
        args=("default_tick_ms", "default_batch", "catchup_ticks", "idle_ttl_ms", *OUTBOX_ARGS, "seen_tick_ms",
              "seen_mark", "fence_margin_us", "fence_window_ms", "shards", "share", "through", "plan_tick_ms"),
        reporting=True,
        budgeted=True,
        reply=("applied_tick", "admitted", "mark", "waiting", "server_ms", "needs_draw", "tick_ms", "batch",
               "max_waiting", "max_active", "paused", "sold_out", "per_tick", "fenced_from", "fenced_to", "shards"),
    ),
    "evict": Contract(
        keys=("waiting", "heartbeat", "registered", "stats", "prequeue", "events", "ended", "window"),
        args=("heartbeat_timeout_ms", "max_evict", *OUTBOX_ARGS),
        reporting=True,
        reply=("evicted", "idle"),
    ),
    "line": Contract(
        keys=("waiting", "heartbeat", "mark", "window", "line", "config", "pace", "draw"),
        args=("default_batch", "default_tick_ms", "presence_window_s", "read_cap_s", "max_crossings", "points",
              "idle_ttl_ms", "publish"),
        reply=("edge", "crossed", "waiting", "state"),
    ),
    "front": Contract(
        keys=("waiting", "mark", "tick", "config", "active", "draw", "health", "plan"),
        args=("catchup_ticks", "default_tick_ms", "default_batch"),
        reply=("server_ms", "last_tick_ms", "mark", "waiting", "collecting", "active", "held", "opening", "shards",
               "tick_ms", "batch", "max_active", "per_tick", "seqs", "plan"),
    ),
    "plan": Contract(
        keys=("plan",),
        args=("tick_ms", "cutoff", "carry", "shares", "throughs", "idle_ttl_ms"),
    ),
    "forget_target": Contract(keys=("targets",), args=("target", "nonce")),
    "raise_mark": Contract(keys=("mark", "tick"), args=("seq", "tick_ms", "idle_ttl_ms")),
    "observe_purchase": Contract(
        keys=("config", "purchases", "stats", "events", "registered"),
        args=("sent_ms", "latency_ms", "ok", "accepted", "sold_out", "max_purchases", "purchases_ttl_ms", "token_id",
              "user_id", "status", *OUTBOX_ARGS, "registration_refresh_ms"),
        reporting=True,
        reply=("noted", "register"),
    ),
    "adjust_rate": Contract(
        keys=("config", "health", "purchases"),
        args=("default_tick_ms", "default_batch", "health_ttl_ms", *FOLLOW_ARGS),
        reply=("allowed", "p95_ms", "error_share", "judged"),
        may_be_empty=True,  # nothing to adjust this tick
    ),
}
# fmt: on


class Script:
    """One script of `client`'s, called by SHA as a raw EVALSHA, its keys and arguments passed by name; by its
    text (EVAL) where the server answers that it does not hold it.

    redis-py's Script adds to every call a check whether its client is a pipeline (an isinstance through
    typing's Protocol machinery) and two more wrappers.
    """

    def __init__(self, client: RedisClient, name: str, text: str, contract: Contract) -> None:
        self.client = client
        self.name = name
        self.script = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()
        self.contract = contract
        # The keys and arguments by name, answered as (keys, args) in the script's order; TypeError names a missing
        # or unknown one. Callers on a request's path call it with their keywords, which it binds without a dict.
        self.order = _binder(name, contract)
        self._replies: dict[str, Any] = {
            tag: namedtuple(tag, ("tag", *names)) for tag, names in contract.replies.items()
        }
        self._reply: Any = namedtuple(name, contract.reply) if contract.reply else None

    def __call__(self, rest: Sequence[Any] = (), /, **named: Any) -> Any:
        """The script's reply to a call with every key and argument `named` (and `rest`, the trailing list)."""
        return self.run(*self._arranged(rest, named))

    def bind(self, rest: Sequence[Any] = (), /, **named: Any) -> Call:
        """The same call, to send later (in a pipeline: run_pipelined)."""
        return Call(self, *self._arranged(rest, named))

    def _arranged(self, rest: Sequence[Any], named: dict[str, Any]) -> tuple[tuple, tuple]:
        keys, args = self.order(**named)
        if rest:
            if self.contract.rest is None:
                raise TypeError(f"{self.name}.lua takes no list after its arguments")
            args = (*args, *rest)
        return keys, args

    def run(self, keys: tuple, args: tuple) -> Any:
        """The script's reply. A server that does not hold the script (restarted, failed over, or ElastiCache
        Serverless answering NOSCRIPT now and then) runs it from its text, which also keeps it for the next calls:
        NOSCRIPT never counts as Redis down, however often it comes."""
        try:
            return self.client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return self.client.execute_command("EVAL", self.script, len(keys), *keys, *args)

    def read(self, reply: Any) -> Any:
        """`reply` with its fields by name: a tagged reply as a tuple led by `tag`. ValueError for a tag or a
        length the contract does not declare."""
        if self._reply is not None:
            if not reply and self.contract.may_be_empty:
                return None
            if len(reply) != len(self.contract.reply or ()):
                raise ValueError(f"{self.name}.lua answered {len(reply)} fields, not {self._reply._fields}")
            return self._reply._make(reply)
        shape = self._replies.get(reply[0])
        if shape is None or len(reply) != len(shape._fields):
            raise ValueError(f"{self.name}.lua answered {reply[0]!r} with {len(reply) - 1} fields")
        return shape._make(reply)


class Call(NamedTuple):
    """One script call, its keys and arguments in the script's order."""

    script: Script
    keys: tuple
    args: tuple


def _binder(name: str, contract: Contract) -> Callable[..., tuple[tuple, tuple]]:
    """A function of the contract's keys and arguments as keyword-only parameters, answering them as (keys, args)
    in the script's order. Python's own binding of keyword arguments then checks every name, at a fraction of
    the cost of looking each up in a dict: a client call binds two dozen. (namedtuple and dataclasses make
    methods the same way.) The admitting keys and arguments default to absent, and are sent only if all are given.
    """
    names = (*contract.all_keys, *contract.all_args)
    if not all(n.isidentifier() and not keyword.iskeyword(n) for n in names):
        raise ValueError(f"{name}.lua's contract names must be Python identifiers: {names}")
    required = ", ".join((*contract.keys, *contract.args))
    optional = "".join(f", {n}=_ABSENT" for n in (*contract.admitting_keys, *contract.admitting_args))
    source = f"def {name}_lua(*, {required}{optional}):\n"
    if optional:
        admitting = (*contract.admitting_keys, *contract.admitting_args)
        source += (
            f"    absent = ({''.join(n + ', ' for n in admitting)}).count(_ABSENT)\n"
            f"    if absent == 0:\n"
            f"        return {_tuples(contract.all_keys, contract.all_args)}\n"
            f"    if absent < {len(admitting)}:\n"
            f"        raise TypeError({f'{name}.lua takes all of {admitting} or none'!r})\n"
        )
    source += f"    return {_tuples(contract.keys, contract.args)}\n"
    namespace: dict[str, Any] = {"_ABSENT": _ABSENT}
    exec(source, namespace)
    return namespace[f"{name}_lua"]


def _tuples(keys: Sequence[str], args: Sequence[str]) -> str:
    return f"({''.join(n + ', ' for n in keys)}), ({''.join(n + ', ' for n in args)})"


# An admitting key or argument not given.
_ABSENT: Any = object()


def load_script(client: RedisClient, name: str) -> Script:
    """`lua/<name>.lua` (after `lua/outbox.lua` if it reports events, and `lua/budget.lua` if it admits against the
    budget), loaded on its first call and then called by SHA, with its contract."""
    contract = CONTRACTS[name]
    text = (LUA_DIR / f"{name}.lua").read_text()
    if contract.budgeted:
        text = (LUA_DIR / "budget.lua").read_text() + text
    if contract.reporting:
        text = (LUA_DIR / "outbox.lua").read_text() + text
    return Script(client, name, text, contract)


def run_pipelined(client: RedisClient, calls: list[Call]) -> list:
    """Script calls in one non-transactional pipeline (per node in a cluster); each answer or its error.

    Calls the server answered NOSCRIPT (it lost the script, or ElastiCache Serverless forgot it) are sent again
    by the scripts' text, and only those: every pump script is safe to repeat (a tick applies once, evicting and
    forgetting are idempotent). So is a node's share of the calls when a cluster pipeline failed as a whole.
    """
    replies = _send(client, calls)
    lost = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    for i, reply in zip(lost, _send(client, [calls[i] for i in lost], by_text=True), strict=True):
        replies[i] = reply
    return replies


def _send(client: RedisClient, calls: list[Call], by_text: bool = False) -> list:
    if not calls:
        return []
    try:
        return _pipelined(client, calls, by_text)
    except REDIS_FAILURES:
        # A cluster pipeline fails whole when one node cannot be reached (redis-py connects to every node before it
        # sends): send each node's calls on their own, so only that node's calls answer the error, and a node failing
        # over stops no other node's targets.
        nodes = node_names(client, [keys[0] for _, keys, _ in calls])
        if nodes is None or len(set(nodes)) < 2:
            raise
    replies: list = [None] * len(calls)
    for node in set(nodes):
        mine = [i for i, name in enumerate(nodes) if name == node]
        try:
            answers = _pipelined(client, [calls[i] for i in mine], by_text)
        except REDIS_FAILURES as err:
            answers = [err] * len(mine)
        for i, answer in zip(mine, answers, strict=True):
            replies[i] = answer
    return replies


def _pipelined(client: RedisClient, calls: list[Call], by_text: bool) -> list:
    pipe = client.pipeline(transaction=False)
    for script, keys, args in calls:
        # Raw EVALSHA and EVAL: a cluster pipeline refuses redis-py's `evalsha()` and `eval()`.
        command = ("EVAL", script.script) if by_text else ("EVALSHA", script.sha)
        pipe.execute_command(*command, len(keys), *keys, *args)
    return pipe.execute(raise_on_error=False)
