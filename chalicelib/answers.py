"""What queue state answers, in the queue's words: a user's place (enter, status), a token's use (consume),
a target's figures (stats), and what one pump tick did to a target."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chalicelib import shop_health
from chalicelib.eta import Departures
from chalicelib.target_config import TargetConfig


# A place is made on every enter and poll: not frozen, as a frozen dataclass's __init__ sets each field through
# object.__setattr__, two to three times the cost of the whole object here.
@dataclass
class Waiting:
    """In line: `ahead` users not yet admitted have a smaller seq; the line moves at `rate` users per second, and
    loses users to `departures` (the ETA's range, chalicelib/eta.py)."""

    seq: int
    ahead: int
    rate: float  # measured by the pump while users wait, else the target's configured rate
    paused: bool = False
    created: bool = False
    # A poll's answer (status.lua) also tells what reckoning the line without Redis needs (chalicelib/reckoning.py):
    mark: int | None = None  # the admitted mark
    batch: int = 0  # the batch and tick length in force
    tick_ms: int = 0
    drawn: int = 0  # -1 while an opening is pending: the line's numbers are not settled
    departures: Departures | None = None


@dataclass
class PreQueued:
    """Waiting for the opening at `opens_at_ms`, to be placed in line by the opening draw."""

    arrival: int
    opens_at_ms: int | None
    created: bool = False


@dataclass
class Admitted:
    """Holds the entry token of `grant` (as queue state spells it) for their entry numbered `entry`; `issued_now`:
    this very call admitted the user; not `queued`: the safety net admitted them as they entered, past no line."""

    grant: str
    issued_now: bool
    entry: int = 0
    queued: bool = True


class Due:
    """The mark has passed the entry, but the poll brought no grant to admit it with: nothing was admitted."""


class Full:
    """The line is at capacity."""


class Closed:
    """The target's line is closed to newcomers (past its closesAt)."""


class NotInvited:
    """The target is invite-only and the caller's invites do not name it: nothing was written but the count."""


class Gone:
    """Neither in line nor holding a live token."""


class OtherEntry:
    """The ticket is of an earlier entry of this user, not of their current one."""


class SoldOut:
    """The target is sold out: the user's place, if they had one, was released."""


class Unknown:
    """No operator opened the target: nothing was written."""


class SwitchedOff:
    """The queue is off for this user (the caller's decision, checked against the target's flag version)."""


@dataclass(frozen=True)
class FlagChanged:
    """The target is marked with flag version `version`, not the one the caller decided by: nothing changed."""

    version: str


Place = (
    Waiting
    | PreQueued
    | Admitted
    | Due
    | Full
    | Closed
    | NotInvited
    | Gone
    | OtherEntry
    | SoldOut
    | Unknown
    | SwitchedOff
    | FlagChanged
)


class Consumption:
    """What consume.lua made of a purchase's use of a token."""

    FIRST = "FIRST"  # this purchase used the token
    RETRY = "RETRY"  # an earlier purchase's outcome was unknown: this one forwards it again, under the same key
    USED = "USED"
    REVOKED = "REVOKED"  # its holder left the queue
    UNKNOWN_TARGET = "UNKNOWN_TARGET"  # no operator opened the token's target: nothing was written
    # A token minted without Redis, refused by the target's state it could not know (nothing was written):
    PAUSED = "PAUSED"
    SOLD_OUT = "SOLD_OUT"
    CLOSED = "CLOSED"  # a newcomer's token, minted after the line closed


@dataclass(frozen=True)
class QueueFigures:
    """Counters of one target's line, as kept in Redis."""

    waiting: int  # in line, not yet admitted
    admitted: int  # admitted by the pump since the queue started
    left: int
    evicted: int
    wait_ms: int  # total wait of the users who collected their token
    wait_histogram: dict[int, int]  # bucket (see waits.py) -> users
    measured_rate: float | None
    pre_queued: int  # waiting for the opening draw
    active: int  # admitted and not done: still collecting, or holding a live unused token
    config: TargetConfig
    draw: dict[str, str]  # the opening draw's record: opens_at_ms, seed, commitment, state, placed, drawn_at_ms
    commitment: str | None  # the commitment to the next opening's seed, drawn but not yet used (None: none)
    known: bool  # an operator opened the target (or a first enter did, where targets open on first use)
    sold_out_released: int  # users told SOLD_OUT whose place was released
    orders: int  # purchases the shop accepted (2xx)
    not_invited: int  # enters refused by an invite-only target
    allowed_batch: float | None  # users per tick the shop's health allows (originSlo), if adjusted
    purchases: list[shop_health.Purchase]  # the latest forwarded purchases, newest first
    last_tick_ms: int | None = None  # start of the last tick the pump applied to the target (None: none yet)
    restored: int = 0  # places restored from their signed tickets (status.lua)
    fences: int = 0  # failovers the pump fenced (admit.lua)
    lost_seqs: tuple[int, int] | None = None  # the last fence's seqs that may have been lost, (from, to]
    eta_samples: int = 0  # admissions whose entry was told an estimate, and how many waited within its range
    eta_inside: int = 0
    eta_errors: dict[int, int] | None = None  # bucket (see waits.py) -> admissions with such an etaSeconds error
    passed_through: int = 0  # admitted by the safety net as they entered, without queueing


@dataclass(frozen=True)
class TargetTick:
    """What one pump tick did to one target."""

    applied_tick: int | None  # None: this tick had already been applied (a duplicate pump)
    admitted: int
    mark: int
    waiting: int  # not yet admitted, after this tick
    evicted: int
    idle: bool  # nobody left in line: the target's registration was dropped
    server_ms: int  # Redis TIME when the tick ran
    needs_draw: bool  # the target has opened and is still moving its pre-queue into the line (admit.lua)
    tick_ms: int  # the target's configuration in force: tick length, batch,
    batch: int
    max_waiting: int | None  # ...and its own capacity and max-active, if set
    max_active: int | None
    paused: bool = False
    sold_out: bool = False
    per_tick: float = 0.0  # users per tick in force: the batch, less while the shop is unhealthy; 0 paused or sold out
    fenced: tuple[int, int] | None = None  # a failover fenced by this tick: the seqs it may have lost, (from, to]
    # The sub-lines the target's line spans (docs/sharding.md), and for a sharded one each sub-line's applied tick
    # (its start, ms) and own mark after this tick: what the pump saw applied there (the failover fence's).
    shards: int = 1
    sub_lines: tuple[tuple[int, int], ...] = ()


# How to read enter.lua's and status.lua's answers (by tag, then by the field names of chalicelib/scripts.py).
# A poll never makes a new entry: status.lua's answers have no `created`.
_PLACES: dict[str, Callable[[Any], Place]] = {
    "WAITING": lambda r: Waiting(
        seq=int(r.seq),
        ahead=int(r.ahead),
        rate=float(r.rate),
        paused=r.paused == 1,
        created=getattr(r, "created", 0) == 1,
        mark=int(r.mark) if hasattr(r, "mark") else None,
        batch=int(getattr(r, "batch", 0)),
        tick_ms=int(getattr(r, "tick_ms", 0)),
        drawn=int(getattr(r, "drawn", 0)),
        departures=Departures.from_script([r.left, r.evicted, r.waiting_user_ms]),
    ),
    "PRE_QUEUE": lambda r: PreQueued(
        arrival=int(r.arrival),
        opens_at_ms=int(r.opens_at_ms) if r.opens_at_ms else None,
        created=getattr(r, "created", 0) == 1,
    ),
    "ADMITTED": lambda r: _admitted(r.held, r.issued_now == 1),
    "PASSED": lambda r: _admitted(r.held, True, queued=False),
    "FLAG": lambda r: FlagChanged(r.target_version),
    "DUE": lambda _: Due(),
    "FULL": lambda _: Full(),
    "CLOSED": lambda _: Closed(),
    "NOT_INVITED": lambda _: NotInvited(),
    "OTHER_ENTRY": lambda _: OtherEntry(),
    "SOLD_OUT": lambda _: SoldOut(),
    "UNKNOWN_TARGET": lambda _: Unknown(),
    "OFF": lambda _: SwitchedOff(),
    "NOT_IN_QUEUE": lambda _: Gone(),
}


def _admitted(held: str, issued_now: bool, queued: bool = True) -> Admitted:
    entry, _, grant = held.rpartition(" ")  # '<entry number> <grant>'
    return Admitted(grant=grant, issued_now=issued_now, entry=int(entry) if entry.isdigit() else 0, queued=queued)


def place_of(reply: Any, shards: int = 1) -> Place:
    """What enter.lua or status.lua answered (read by name: `Script.read`) on a sub-line of a line of `shards`,
    as a place in the whole line."""
    place = _PLACES[reply.tag](reply)
    if shards > 1 and isinstance(place, Waiting):
        _whole_line(place, shards)
    return place


def _whole_line(place: Waiting, shards: int) -> None:
    """Scale a sub-line's count ahead and rate to the whole line's (docs/sharding.md: how accurate).

    Users spread over the sub-lines at random (crc32 of their ids), so of the A users ahead in the whole line each
    stands on this sub-line with chance 1/N: N times the count here is A on average, off by sqrt(A(N-1)) (one
    standard deviation). A sub-line admits its share of the line's rate, so N times its rate is the line's, and the
    time to one's turn, the count over the rate, is the sub-line's own.
    """
    place.ahead *= shards
    place.rate *= shards
