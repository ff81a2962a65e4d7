"""The queue's state in Redis, declared once: every key and every field of its hashes, with its type, its TTL rule,
the scripts (and Python modules) that write and read it, and the guarantee it serves.

Nothing reads this on a request. It is the contract the scripts are held to: tests/test_script_contracts.py parses
every `redis.call` of lua/*.lua and fails on a hash field this model does not declare, on a script that writes or
reads a key or field the model does not say it does, and on a declared field no script or module uses; key names
are built from it (queue_keys.py), and docs/architecture.md's state tables are rendered from it
(`.venv/bin/python -m chalicelib.data_model` prints them; tests/test_data_model.py compares).

Writers and readers are file names: `enter.lua` for lua/enter.lua (`budget.lua` and `outbox.lua` are the preludes
that scripts.py puts before the scripts that admit and report), `store.py` for chalicelib/store.py. A field name
in angle brackets names a family (`eta_error:<bucket>`: one field per histogram bucket).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

# How long a key lives. Every key a script writes expires; the operator's configuration and the flag do not.
IDLE = "idle, slid"
IDLE_ON_WRITE = "idle"
LEGEND = (
    "TTL: *idle* is `VQ_QUEUE_IDLE_TTL_S` (30 minutes) from the last write, *slid*: renewed at every pump tick "
    "(admit.lua). Written and read by: the scripts of `lua/` (`budget.lua` and `outbox.lua` run inside the scripts "
    "that admit and report), and the modules of `chalicelib/`."
)


@dataclass(frozen=True)
class Field:
    """One field of a hash: what it holds, and which files write and read it."""

    name: str
    holds: str
    writers: tuple[str, ...]
    readers: tuple[str, ...]


@dataclass(frozen=True)
class Key:
    """One key of the queue's state.

    `name` is what follows the target's hash tag (`vq:{limited-drop:42}:<name>`), or the prefix (`vq:<name>`) for a
    key outside the targets' slots; `per` names what a key is kept per (`token:<user id>`). `slid` says whether
    the pump's tick slides its TTL (admit.lua's keep_alive). `serves` names the section of docs/guarantees.md the
    key is for (None: figures for operators only)."""

    name: str
    type: str
    holds: str
    ttl: str
    writers: tuple[str, ...]
    readers: tuple[str, ...]
    serves: str | None
    fields: tuple[Field, ...] = ()
    per: str | None = None
    slid: bool = False
    in_target: bool = True

    @property
    def spelt(self) -> str:
        """How the key is written in the docs: `token:<user id>`."""
        return f"{self.name}:<{self.per}>" if self.per else self.name


def _f(name: str, holds: str, writers: str, readers: str = "") -> Field:
    return Field(name, holds, tuple(writers.split()), tuple(readers.split()))


# The operator's settings (chalicelib/target_config.py's TargetConfig, field for field): configure.lua writes them
# from its settings list; these scripts read them by name.
_SETTING_READERS = {
    "batch": "enter.lua status.lua admit.lua adjust_rate.lua line.lua front.lua",
    "tick_ms": "enter.lua status.lua admit.lua adjust_rate.lua leave.lua line.lua front.lua",
    "max_waiting": "enter.lua admit.lua",
    "max_active": "enter.lua admit.lua restore.lua front.lua",
    "opens_at_ms": "enter.lua status.lua admit.lua configure.lua line.lua front.lua",
    "closes_at_ms": "enter.lua consume.lua line.lua",
    "display_name": "",
    "image_url": "",
    "paused": "enter.lua status.lua admit.lua consume.lua configure.lua line.lua front.lua",
    "sold_out": "enter.lua status.lua admit.lua consume.lua configure.lua line.lua front.lua",
    "invite_only": "enter.lua",
    "safety_net": "enter.lua admit.lua",
    "slo_p95_ms": "admit.lua adjust_rate.lua front.lua",
    "slo_error_rate": "admit.lua adjust_rate.lua front.lua",
    "shards": "enter.lua status.lua leave.lua consume.lua admit.lua line.lua front.lua store.py",
}
SETTINGS: tuple[Field, ...] = tuple(
    _f(
        name,
        "the operator's setting (docs/api.md: the configuration)",
        # The pump copies a sold out one sub-line's purchase set to the others; the store writes a given-up
        # sub-line's count (docs/sharding.md).
        "configure.lua" + {"sold_out": " observe_purchase.lua store.py", "shards": " store.py"}.get(name, ""),
        readers + " target_config.py",
    )
    for name, readers in _SETTING_READERS.items()
)

_COUNTERS = (
    _f("admitted", "users the pump admitted", "admit.lua", "store.py"),
    _f("passed_through", "newcomers the safety net admitted as they entered", "enter.lua", "store.py"),
    _f("left", "users who left the line", "leave.lua", "store.py"),
    _f(
        "eta_left",
        "...of which the ETA's range counts as departures: after a tick in line, one per user in ten minutes",
        "leave.lua",
        "enter.lua status.lua",
    ),
    _f("evicted", "users evicted for not polling", "evict.lua", "enter.lua status.lua store.py"),
    _f(
        "waiting_user_ms",
        "users waiting times each tick's length, summed: the time departures are a rate of (docs/waits.md)",
        "admit.lua",
        "enter.lua status.lua",
    ),
    _f("wait_count", "users who collected their token", "status.lua"),
    _f("wait_ms", "their waits, summed", "status.lua", "store.py"),
    _f("eta_samples", "admissions whose entry was told an estimate", "status.lua", "store.py"),
    _f("eta_inside", "...of which the wait lay inside the range told", "status.lua", "store.py"),
    _f("eta_error:<bucket>", "...by the bucket of etaSeconds' error (buckets as `waits`')", "status.lua", "store.py"),
    _f("restored", "places put back from their tickets after a failover", "status.lua", "store.py"),
    _f("fences", "failovers the pump fenced", "admit.lua", "store.py"),
    _f("sold_out_released", "places released by a sold out", "enter.lua status.lua", "store.py"),
    _f("not_invited", "enters an invite-only target refused", "enter.lua", "store.py"),
    _f("orders", "purchases the shop accepted", "observe_purchase.lua", "store.py"),
    _f("not_restored", "tokens kept used, as restoring them would pass maxActive", "restore.lua"),
    _f(
        "events_dropped",
        "events the outbox's cap pushed out unpublished, until the publisher reports them",
        "outbox.lua store.py",
        "store.py",
    ),
)

TARGET_KEYS: tuple[Key, ...] = (
    Key(
        "waiting",
        "sorted set",
        "user id -> seq: the fixed place in line (admitted users stay until they collect their token)",
        IDLE + ", at each registration and on an emptied line (enter.lua), with the mark at a restore (status.lua)",
        ("enter.lua", "status.lua", "leave.lua", "admit.lua", "evict.lua"),
        (
            "enter.lua",
            "status.lua",
            "leave.lua",
            "admit.lua",
            "evict.lua",
            "restore.lua",
            "stats.lua",
            "line.lua",
            "front.lua",
        ),
        "FIFO",
        slid=True,
    ),
    Key(
        "heartbeat",
        "sorted set",
        "user id -> last poll (ms), a pre-queued user's the opening, or when the place crossed into the presence "
        "window if later: the pump evicts users inside the window silent past the heartbeat timeout",
        IDLE + ", at each registration and on an emptied line (enter.lua), with the mark at a restore (status.lua)",
        ("enter.lua", "status.lua", "leave.lua", "evict.lua", "line.lua"),
        ("evict.lua",),
        "No wasted slots",
        slid=True,
    ),
    Key(
        "seq",
        "string",
        "the last seq handed out: a new one is above it and never below the server clock in microseconds",
        IDLE,
        ("enter.lua", "admit.lua"),
        ("enter.lua", "admit.lua"),
        "FIFO",
        slid=True,
    ),
    Key(
        "mark",
        "string",
        "the admitted mark: a user whose seq <= mark is admitted; a new line's starts just below its first seq",
        IDLE,
        ("enter.lua", "admit.lua", "raise_mark.lua"),
        (
            "enter.lua",
            "status.lua",
            "admit.lua",
            "raise_mark.lua",
            "restore.lua",
            "stats.lua",
            "leave.lua",
            "line.lua",
            "front.lua",
        ),
        "Rate",
        slid=True,
    ),
    Key(
        "tick",
        "string",
        "the start (ms) of the last applied tick: each tick applies once",
        IDLE,
        ("admit.lua", "raise_mark.lua"),
        ("admit.lua", "raise_mark.lua", "stats.lua", "front.lua"),
        "Rate",
    ),
    Key(
        "passed",
        "sorted set",
        "user id -> server time (ms) of the safety net's last pass for them: one pass per user in ten minutes",
        "ten minutes from its last write",
        ("enter.lua",),
        ("enter.lua",),
        "Rate",
    ),
    Key(
        "departed",
        "sorted set",
        "user id -> server time (ms) of their last leave the ETA's range counted (docs/waits.md)",
        "ten minutes from its last write",
        ("leave.lua",),
        ("leave.lua",),
        None,
    ),
    Key(
        "budget",
        "hash",
        "the admissions counted against the current tick, the safety net's and the pump's (docs/safety-net.md)",
        IDLE_ON_WRITE,
        ("budget.lua", "admit.lua"),
        ("budget.lua",),
        "Rate",
        fields=(
            _f("tick", "the start (ms) of the tick `used` counts", "budget.lua", "budget.lua"),
            _f("used", "admissions counted against that tick", "budget.lua", "budget.lua"),
            _f("pumped", "the start (ms) of the last tick the pump applied", "budget.lua", "budget.lua"),
            _f(
                "unsettled",
                "the net's admissions in ticks after `pumped`: the pump's next tick admits that many fewer",
                "budget.lua",
                "budget.lua",
            ),
            _f("allowed", "users per tick the shop's health allows, while below the batch", "budget.lua", "budget.lua"),
        ),
    ),
    Key(
        "pace",
        "hash",
        "how fast the line moves: the measured admission rate and what it is measured from",
        IDLE,
        ("admit.lua",),
        ("enter.lua", "status.lua", "admit.lua", "stats.lua", "line.lua"),
        "Rate",
        fields=(
            _f(
                "rate",
                "admissions per second over the last minute's ticks that left users waiting",
                "admit.lua",
                "enter.lua status.lua stats.lua line.lua",
            ),
            _f("rate_admitted", "...the admissions of those ticks", "admit.lua", "admit.lua"),
            _f("rate_ticks", "...and the ticks they cover", "admit.lua", "admit.lua"),
            _f("carry", "below the batch, the fraction of a user a tick admits later", "admit.lua", "admit.lua"),
        ),
        slid=True,
    ),
    Key(
        "window",
        "string",
        "the presence window's edge: the highest seq inside it; a silent user beyond it keeps the place",
        IDLE + ", at each tick",
        ("line.lua",),
        ("line.lua", "evict.lua"),
        "No wasted slots",
    ),
    Key(
        "line",
        "string",
        "the line's public state, JSON: the answer of GET .../line (docs/api.md); a sharded line's is sub-line 0's, "
        "merged from every sub-line's by the pump",
        IDLE + ", at each tick",
        ("line.lua", "store.py"),
        ("store.py",),
        "Capacity",
    ),
    Key(
        "plan",
        "hash",
        "a sharded line's last tick plan, on sub-line 0 (docs/sharding.md): recorded once per tick, applied by every "
        "sub-line",
        IDLE + ", at each tick",
        ("plan.lua",),
        ("front.lua", "plan.lua"),
        "Rate",
        fields=(
            _f("tick_ms", "the plan's tick (its start, ms)", "plan.lua", "plan.lua sharding.py"),
            _f("cutoff", "the highest seq any plan admitted: the line's mark", "plan.lua", "sharding.py"),
            _f("carry", "below the batch, the fraction of a user a tick admits later", "plan.lua", "sharding.py"),
            _f("shares", "per sub-line, comma-separated, the users this tick admits there", "plan.lua", "sharding.py"),
            _f("throughs", "...and the highest seq each share reaches", "plan.lua", "sharding.py"),
        ),
    ),
    Key(
        "fence",
        "hash",
        "the last failover the pump fenced (docs/failover.md#the-fences)",
        IDLE,
        ("admit.lua", "status.lua"),
        ("admit.lua", "status.lua", "stats.lua"),
        "What a Redis failover costs today",
        fields=(
            _f(
                "lost_from",
                "the seqs the node may have lost: above this...",
                "admit.lua",
                "admit.lua status.lua store.py",
            ),
            _f("lost_to", "...up to this", "admit.lua", "status.lua store.py"),
            _f(
                "until_ms",
                "until when a lost place the mark passed is restored admitted",
                "admit.lua",
                "admit.lua status.lua",
            ),
            _f("mark", "the mark the fence raised the node to", "admit.lua", "status.lua"),
            _f(
                "overdraft",
                "places restored admitted above that mark, past the batch: the pump's next ticks admit that many fewer",
                "admit.lua status.lua",
                "admit.lua",
            ),
        ),
        slid=True,
    ),
    Key(
        "token",
        "string",
        "the user's entry token grant, `<entry number> <expiry>.<token id>`",
        "the token's",
        ("enter.lua", "status.lua", "leave.lua"),
        ("enter.lua", "status.lua", "leave.lua"),
        "One purchase per token",
        per="user id",
    ),
    Key(
        "active",
        "sorted set",
        "user id -> expiry of an issued, unused token (for `maxActive`)",
        IDLE + ", and at least a restored token's life (restore.lua)",
        ("enter.lua", "status.lua", "leave.lua", "consume.lua", "restore.lua", "admit.lua"),
        ("enter.lua", "admit.lua", "restore.lua", "stats.lua", "front.lua"),
        "Capacity",
        slid=True,
    ),
    Key(
        "consumed",
        "string",
        "the token's one-time marker: the id of the consumption holding it, or `unknown`",
        "the token's life and the clock-skew margin",
        ("consume.lua", "restore.lua", "store.py"),
        ("consume.lua", "restore.lua"),
        "One purchase per token",
        per="token id",
    ),
    Key(
        "revoked",
        "sorted set",
        "token id -> until when it stays refused: the tokens given up by leaving",
        "until its latest revocation ends",
        ("leave.lua",),
        ("consume.lua", "restore.lua"),
        "One purchase per token",
    ),
    Key(
        "ended",
        "sorted set",
        "user id -> seq of their last entry that ended on purpose (left, evicted): its ticket restores nothing",
        IDLE + ", at each departure, with the mark at a restore (status.lua)",
        ("leave.lua", "evict.lua", "status.lua", "admit.lua"),
        ("status.lua",),
        "What a Redis failover costs today",
        slid=True,
    ),
    Key(
        "config",
        "hash",
        "the target's own settings; its version (the config routes' ETag) is the SHA-1 of the operator's fields",
        "none: the operator's, kept until replaced",
        ("configure.lua", "enter.lua", "observe_purchase.lua", "admit.lua", "store.py"),
        (
            "enter.lua",
            "status.lua",
            "admit.lua",
            "adjust_rate.lua",
            "configure.lua",
            "consume.lua",
            "restore.lua",
            "observe_purchase.lua",
            "stats.lua",
            "leave.lua",
            "line.lua",
            "front.lua",
        ),
        "Capacity",
        fields=(
            *SETTINGS,
            _f(
                "known_since_ms",
                "when an operator opened the target (or a first enter, where targets open on first use)",
                "configure.lua enter.lua",
                "configure.lua enter.lua status.lua consume.lua observe_purchase.lua store.py",
            ),
            _f(
                "flag_version",
                "the switch's mark: the version of the flag configuration flag_sync stored last",
                "configure.lua store.py",
                "configure.lua enter.lua status.lua",
            ),
            _f(
                "draw_seed",
                "the next opening's committed seed, until the opening reveals it",
                "configure.lua admit.lua",
                "configure.lua enter.lua admit.lua store.py",
            ),
            _f(
                "draw_commitment",
                "...and its SHA-256, published",
                "configure.lua admit.lua",
                "configure.lua enter.lua admit.lua store.py",
            ),
            _f(
                "draw_block",
                "a sharded line's pre-queue block of seqs, 'first last', the same on every sub-line (docs/sharding.md)",
                "configure.lua",
                "configure.lua enter.lua store.py",
            ),
        ),
    ),
    Key(
        "prequeue",
        "sorted set",
        "user id -> drawn seq, before the opening (the opening renames it the line)",
        IDLE + ", at each registration and on an emptied line (enter.lua), with the mark at a restore (status.lua)",
        ("enter.lua", "status.lua", "leave.lua", "evict.lua", "admit.lua"),
        ("enter.lua", "status.lua", "leave.lua", "evict.lua", "admit.lua", "stats.lua"),
        "The opening draw",
        slid=True,
    ),
    Key(
        "draw",
        "hash",
        "the opening draw's record: the pre-queue's block of seqs, then what the opening revealed",
        IDLE + ", from the first pre-queue entry",
        ("enter.lua", "admit.lua"),
        ("enter.lua", "status.lua", "admit.lua", "stats.lua", "line.lua", "front.lua"),
        "The opening draw",
        fields=(
            _f(
                "opens_at_ms",
                "the opening it records",
                "admit.lua",
                "enter.lua status.lua admit.lua line.lua front.lua",
            ),
            _f(
                "first",
                "the lowest seq of the block the pre-queue's places are drawn in...",
                "enter.lua",
                "enter.lua queue.py",
            ),
            _f("last", "...and the highest (the seq counter jumps to it)", "enter.lua", "enter.lua queue.py"),
            _f(
                "inner_key",
                "the seed's text as HMAC-SHA1's inner padded key, made once for the block",
                "enter.lua",
                "enter.lua",
            ),
            _f("outer_key", "...and as its outer padded key", "enter.lua", "enter.lua"),
            _f(
                "state",
                "`done` once the opening made the pre-queue the line",
                "admit.lua",
                "enter.lua status.lua admit.lua queue.py line.lua front.lua",
            ),
            _f("seed", "its seed, revealed at the opening", "admit.lua", "queue.py"),
            _f(
                "commitment",
                "the SHA-256 of the seed the block belongs to, published",
                "enter.lua admit.lua",
                "enter.lua admit.lua queue.py",
            ),
            _f("placed", "users the pre-queue held at the opening", "admit.lua", "admit.lua queue.py"),
            _f("drawn_at_ms", "when the line opened", "admit.lua", "queue.py"),
        ),
        slid=True,
    ),
    Key(
        "stats",
        "hash",
        "counters, for operators (`GET .../stats`) and the ETA's departures (docs/waits.md)",
        IDLE,
        (
            "enter.lua",
            "status.lua",
            "leave.lua",
            "evict.lua",
            "admit.lua",
            "restore.lua",
            "observe_purchase.lua",
            "outbox.lua",
            "store.py",
        ),
        ("enter.lua", "status.lua", "stats.lua"),
        None,
        fields=_COUNTERS,
        slid=True,
    ),
    Key(
        "waits",
        "hash",
        "the wait-time histogram, for operators (docs/waits.md)",
        IDLE,
        ("status.lua",),
        ("stats.lua",),
        None,
        fields=(_f("<bucket>", "users admitted with a wait in the bucket (chalicelib/waits.py)", "status.lua"),),
        slid=True,
    ),
    Key(
        "admissions",
        "list",
        "`<tick start>:<admitted>:<ticks covered>` of the last minute's ticks that left users waiting",
        IDLE,
        ("admit.lua",),
        ("admit.lua",),
        "Rate",
        slid=True,
    ),
    Key(
        "health",
        "hash",
        "the rate the shop's health allows, with an originSlo (docs/origin-slo.md)",
        IDLE_ON_WRITE + " (each tick's adjustment)",
        ("adjust_rate.lua",),
        ("adjust_rate.lua", "admit.lua", "stats.lua", "front.lua"),
        "Rate",
        fields=(
            _f(
                "allowed",
                "users per tick the shop's health allows",
                "adjust_rate.lua",
                "adjust_rate.lua admit.lua store.py front.lua",
            ),
            _f("tick", "the start (ms) of the tick last adjusted", "adjust_rate.lua", "adjust_rate.lua"),
            _f("changed_at", "the last change (ms)", "adjust_rate.lua", "adjust_rate.lua"),
            _f("cut_at", "the last cut (ms)", "adjust_rate.lua", "adjust_rate.lua"),
            _f("capacity", "the shop's throughput per tick at the last cut", "adjust_rate.lua", "adjust_rate.lua"),
        ),
    ),
    Key(
        "purchases",
        "list",
        "`<sent at>:<latency>:<ok>` of the latest forwarded purchases, newest first",
        "`PURCHASES_TTL_MS` from the latest (chalicelib/shop_health.py)",
        ("observe_purchase.lua",),
        ("adjust_rate.lua", "stats.lua"),
        "Rate",
    ),
    Key(
        "events",
        "stream",
        "the outbox: state changes not yet published (docs/events.md)",
        "a day from its last event",
        ("outbox.lua", "store.py"),
        ("outbox.lua", "evict.lua", "store.py"),
        "Events",
    ),
    Key(
        "registered",
        "string",
        "present while the pump knows the target",
        "the registration refresh (60 s)",
        ("enter.lua", "evict.lua", "observe_purchase.lua"),
        (),
        "Nothing on sale, nothing ticking",
    ),
)

GLOBAL_KEYS: tuple[Key, ...] = (
    Key(
        "targets",
        "sorted set",
        "target -> nonce of its latest registration: the targets the pump visits",
        "idle, renewed by the pump and at each registration",
        ("store.py", "forget_target.lua"),
        ("store.py", "forget_target.lua"),
        "Nothing on sale, nothing ticking",
        in_target=False,
    ),
    Key(
        "open",
        "sorted set",
        "target -> its opening (ms): the targets operators opened, which keep the scheduled pump awake",
        "until 30 minutes after the latest opening",
        ("store.py",),
        ("store.py",),
        "Nothing on sale, nothing ticking",
        in_target=False,
    ),
    Key(
        "pump-lock",
        "string",
        "the pump lock's owner token (redis-py's Lock): one pump at a time, for efficiency only",
        "the lease",
        ("store.py",),
        ("store.py",),
        None,
        in_target=False,
    ),
    Key(
        "flag",
        "string",
        "the flag configuration flag_sync stored last, with its version (JSON)",
        "none: replaced at each flag deployment",
        ("store.py",),
        ("store.py",),
        "The switch",
        in_target=False,
    ),
)

KEYS: dict[str, Key] = {key.name: key for key in (*TARGET_KEYS, *GLOBAL_KEYS)}


def _anchor(title: str) -> str:
    """The anchor a Markdown renderer gives a section titled `title`."""
    return "".join(c for c in title.lower() if c.isalnum() or c in " -").replace(" ", "-")


def _cell(names: tuple[str, ...]) -> str:
    return ", ".join(f"`{name}`" for name in names) or "-"


def tables() -> str:
    """docs/architecture.md's state tables: the keys, then the fields of each hash."""
    lines = [
        LEGEND,
        "",
        "| key | type | holds | TTL | written by | read by | serves |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in (*TARGET_KEYS, *GLOBAL_KEYS):
        spelt = f"`{key.spelt}`" if key.in_target else f"`vq:{key.spelt}` (no hash tag)"
        serves = f"[{key.serves}](guarantees.md#{_anchor(key.serves)})" if key.serves else "-"
        lines.append(
            f"| {spelt} | {key.type} | {key.holds} | {key.ttl} | {_cell(key.writers)} | {_cell(key.readers)} | "
            f"{serves} |"
        )
    lines += ["", "| hash | field | holds | written by | read by |", "|---|---|---|---|---|"]
    for key in TARGET_KEYS:
        for field in key.fields:
            lines.append(
                f"| `{key.name}` | `{field.name}` | {field.holds} | {_cell(field.writers)} | {_cell(field.readers)} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(tables())
