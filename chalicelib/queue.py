"""The waiting room's operations: enter, status, leave, stats. Knows nothing of HTTP or of Redis keys."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from aws_lambda_powertools.metrics import MetricUnit

from chalicelib import eta, opening, polling, shop_health, waits
from chalicelib.answers import (
    Admitted,
    Closed,
    Due,
    FlagChanged,
    Full,
    NotInvited,
    OtherEntry,
    Place,
    PreQueued,
    QueueFigures,
    SoldOut,
    SwitchedOff,
    Unknown,
    Waiting,
)
from chalicelib.config import Settings
from chalicelib.errors import (
    AlreadyAdmitted,
    ConfigChanged,
    InvalidQueueTicket,
    LineNotPublished,
    NotInQueue,
    QueueClosed,
    QueueFull,
    QueueInviteOnly,
    QueueSoldOut,
    QueueUnavailable,
    ShardsInUse,
    UnknownTarget,
)
from chalicelib.flags import Decision, QueueSwitch
from chalicelib.observability import Tally, count, logger
from chalicelib.reckoning import Reckoner
from chalicelib.redis_connection import StoreMoving, StoreRefused, StoreUnavailable
from chalicelib.store import Defaults, QueueStore
from chalicelib.target_config import UNCONDITIONAL, Precondition, TargetConfig, iso_time, merge_patch
from chalicelib.targets import Target
from chalicelib.tokens import EntryGrant, EntryToken, Minted, QueueTicket, TokenSigner

# Polls that found their user still waiting: beside the pump's ticks, what tells a stalled pump from an idle one
# (the PumpStalledAlarm, docs/alarms.md).
WAITING_POLLS = Tally("WaitingPolls", every_s=30)
# Users wait and the pump has applied no tick to their line for this many tick lengths (at least MIN_STALL_MS):
# the line is not moving. The pump's runs start a minute apart, each ticking until shortly before its end.
STALLED_TICKS = 3
MIN_STALL_MS = 10_000
# How often a PATCH reads and merges again when others keep changing the configuration between its read and its write:
# among N writers at once, one loses at most N - 1 times.
PATCH_ATTEMPTS = 10


@dataclass(frozen=True)
class ConfigAnswer:
    """A target's configuration as the config routes answer it: `body` (own and effective) and its version `etag`."""

    body: dict
    etag: str


@dataclass  # not frozen: made on every request (see chalicelib/answers.py's places)
class QueueEntry:
    """A user's standing in one line, as the client sees it (`QueueEntryResponse`)."""

    status: str
    ahead_count: int = 0
    position: int | None = None
    eta_seconds: int | None = None
    eta_range: tuple[int, int] | None = None  # etaLowSeconds, etaHighSeconds (chalicelib/eta.py)
    entry_token: EntryToken | None = None
    queue_ticket: str | None = None
    opens_at_ms: int | None = None
    poll_after_ms: int | None = None  # PRE_QUEUE and WAITING: when to poll next (chalicelib/polling.py)
    seq: int | None = None  # WAITING: the entry's place, which /line places it by
    line_after_ms: int | None = None  # WAITING beyond the presence window: when to read /line instead of polling
    paused: bool = False
    queued: bool | None = None  # ADMITTED: False when the safety net admitted the user as they entered

    def to_body(self) -> dict:
        if self.status == "PRE_QUEUE":
            # No place yet: the opening draw gives one.
            body: dict = {"status": self.status}
            if self.opens_at_ms is not None:
                body["opensAt"] = iso_time(self.opens_at_ms)
        elif self.status == "SOLD_OUT":
            body = {"status": self.status}
        else:
            body = {"status": self.status, "aheadCount": self.ahead_count}
        if self.position is not None:
            body["position"] = self.position
            body["etaSeconds"] = self.eta_seconds
            body["etaLowSeconds"], body["etaHighSeconds"] = self.eta_range or (None, None)
            body["paused"] = self.paused
        if self.poll_after_ms is not None:
            body["pollAfterMs"] = self.poll_after_ms
        if self.seq is not None:
            body["seq"] = str(self.seq)  # 16 digits: beyond what some JSON readers keep exact
        if self.line_after_ms is not None:
            body["lineAfterMs"] = self.line_after_ms
        if self.entry_token is not None:
            body["entryToken"] = self.entry_token.text
            expires = datetime.fromtimestamp(self.entry_token.expires_at, UTC)
            body["tokenExpiresAt"] = expires.isoformat().replace("+00:00", "Z")
        if self.queue_ticket is not None:
            body["queueTicket"] = self.queue_ticket
        if self.queued is not None:
            body["queued"] = self.queued
        return body


class WaitingRoom:
    """Puts users in line per target and hands admitted ones a signed entry token.

    When the queue is switched off for a user, users are let in directly: DIRECT_ADMITTED. When Redis cannot answer
    (fail-open), newcomers are let in directly with a short-lived token, and ticket holders in turn, by dead
    reckoning from what this container last saw of their line (chalicelib/reckoning.py).
    """

    def __init__(
        self,
        store: QueueStore,
        signer: TokenSigner,
        settings: Settings,
        switch: QueueSwitch,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.signer = signer
        self.settings = settings
        self.switch = switch
        self.clock = clock
        # A verified caller who enters again gets their ticket back (another device, lost storage), or their entry
        # token; a caller the queue takes at their word (X-User-Id) gets neither: knowing someone's id must not hand
        # over their place.
        self.recovers_tickets = settings.jwt is not None
        self.reckoner = Reckoner()
        self.defaults = Defaults(
            max_waiting=settings.max_waiting,
            batch=settings.batch_size,
            tick_ms=settings.tick_ms,
            idle_ttl_ms=settings.queue_idle_ttl_s * 1000,
            open_on_first_use=settings.targets_open_on_first_use,
        )

    def enter(self, target: Target, user_id: str, invited: bool = False) -> QueueEntry:
        """Join the line (idempotent); the first entry also answers the queue ticket, and so does every entry of a
        verified caller (VQ_IDENTITY=jwt: the owner gets their ticket back). In header mode an admitted user's
        entry token goes only to the ticket's holder: entering again once admitted is AlreadyAdmitted. An
        invite-only target takes only callers `invited` to it."""
        self.signer.ready()  # a place given without its ticket could never be polled
        now = self.clock()
        # Only the terms, not a signed token: most enters do not admit, and signing is most of a token's cost.
        terms = self.signer.grant_terms(target, user_id, now, self.settings.token_ttl_s)
        try:
            place = self._switched(
                target,
                user_id,
                lambda decision: self.store.enter(
                    target,
                    user_id,
                    int(now * 1000),
                    terms,
                    self.defaults,
                    decision,
                    invited,
                ),
            )
        except StoreRefused as err:
            raise self._refused(target, err) from None
        except StoreUnavailable as err:
            return self._degraded(target, user_id, now, err)
        if isinstance(place, SwitchedOff):
            return self._direct(target, user_id, now)
        if isinstance(place, Full):
            count("EnterRejectedFull", target)
            raise QueueFull(retry_after_s=self.settings.retry_after_s)
        if isinstance(place, Closed):
            raise QueueClosed("this queue is closed to newcomers")
        if isinstance(place, NotInvited):
            count("EnterRejectedNotInvited", target)
            raise QueueInviteOnly("this sale is by invitation, and your invitations do not name it")
        if isinstance(place, SoldOut):
            raise QueueSoldOut("sold out: this queue admits nobody any more")
        passed = isinstance(place, Admitted) and not place.queued
        if isinstance(place, Admitted) and not passed and not self.recovers_tickets:
            raise AlreadyAdmitted("admitted already: the entry token is answered to a poll with your queue ticket")
        entry = self._answer(target, user_id, place, now)
        if passed:
            count("PassedThrough", target)
            count("TokensIssued", target)
        fresh = passed or getattr(place, "created", False)
        number = _entry_number(place) if self.recovers_tickets or fresh else None
        if number:
            # A recovered ticket times the wait from now, against what this answer tells: the entry's first moment
            # and estimate are not kept.
            told = (
                eta.Estimate(entry.eta_seconds, *entry.eta_range)
                if entry.eta_seconds is not None and entry.eta_range is not None
                else None
            )
            ticket = self.signer.issue_ticket(target, user_id, number, int(now * 1000), told)
            return replace(entry, queue_ticket=ticket.text)
        return entry

    def status(self, target: Target, user_id: str, ticket_text: str | None) -> QueueEntry:
        """Where the ticket holder stands; this poll is also their heartbeat."""
        ticket = self._check_ticket(target, user_id, ticket_text)
        now = self.clock()

        def poll(grant: EntryGrant | None) -> Place:
            return self._switched(
                target,
                user_id,
                lambda decision: self.store.status(
                    target, user_id, int(now * 1000), grant, ticket, self.defaults, decision
                ),
            )

        # The grant is drawn before the script runs, so that admission stays one round trip, but only for a poll
        # that may admit (the reckoner's view of the line): drawing it is most of a waiting poll's own cost. A poll
        # the mark passed unforeseen hears Due and asks again with one.
        try:
            place = poll(self._grant(ticket, now) if self.reckoner.near_turn(target, ticket.seq, now) else None)
            if isinstance(place, Due):
                place = poll(self._grant(ticket, now))
        except StoreRefused as err:
            raise self._refused(target, err) from None
        except StoreUnavailable as err:
            return self._reckoned(ticket, now, err)
        if isinstance(place, SwitchedOff):
            return self._direct(target, user_id, now)
        if isinstance(place, OtherEntry):
            raise _other_entry()
        if isinstance(place, Waiting):
            owed = self.reckoner.saw(target, place, now)
            if owed is not None:
                self._write_back_turns(target, owed, place.tick_ms)
            if self.reckoner.reckoned_in(target, place.seq):
                # Someone behind them was let in here while Redis could not be asked: their turn has come too (the
                # written-back mark admits them from Redis at their next poll, under the same token id).
                return self._turn(ticket, now)
            WAITING_POLLS.add()
        elif isinstance(place, PreQueued):
            WAITING_POLLS.add()
        elif isinstance(place, SoldOut):
            self.reckoner.forget(target)
        elif isinstance(place, Admitted):
            self.reckoner.saw_admitted(target, place.entry)
            if place.issued_now:
                count("TokensIssued", target)
                count("WaitSeconds", target, max(0.0, now - ticket.entered_at_ms / 1000), MetricUnit.Seconds)
        return self._answer(target, user_id, place, now)

    def leave(self, target: Target, user_id: str, ticket_text: str | None) -> None:
        """Give up one's place, and revoke an entry token held unused. Leaving twice is fine."""
        ticket = self._check_ticket(target, user_id, ticket_text)
        try:
            left = self.store.leave(
                target, user_id, ticket.seq, int(self.clock() * 1000), self.defaults.idle_ttl_ms, self.defaults.tick_ms
            )
        except StoreUnavailable as err:
            raise self._unavailable(target, err) from None
        if isinstance(left, OtherEntry):
            raise _other_entry()

    def line(self, target: Target) -> str:
        """The line's public state (`GET .../line`) as the pump last wrote it: the same JSON text for everyone."""
        try:
            text = self.store.line(target)
            if text is None:
                raise LineNotPublished() if self.store.known(target) else _unknown()
        except StoreUnavailable as err:
            raise self._unavailable(target, err) from None
        return text

    def stats(self, target: Target) -> dict:
        """Live figures of one line for operators (`GET .../stats`), beside the configuration in force."""
        now_ms = int(self.clock() * 1000)
        try:
            figures = self.store.stats(target, now_ms)
        except StoreUnavailable as err:
            raise self._unavailable(target, err) from None
        if not figures.known:
            raise _unknown()
        histogram = figures.wait_histogram
        waited = sum(histogram.values())
        body = {
            "state": self._state(figures, now_ms),
            "waitingCount": figures.waiting,
            "preQueuedCount": figures.pre_queued,
            "admittedCount": figures.admitted,
            "activeCount": figures.active,
            "admissionRatePerSec": round(figures.measured_rate or 0.0, 3),
            "avgWaitSeconds": round(figures.wait_ms / waited / 1000, 3) if waited else None,
            "p95WaitSeconds": _rounded(waits.percentile(histogram, 0.95)),
            "waitsMeasured": waited,
            "leftCount": figures.left,
            "evictedCount": figures.evicted,
            "soldOutReleasedCount": figures.sold_out_released,
            "ordersCount": figures.orders,
            "notInvitedCount": figures.not_invited,
            "restoredCount": figures.restored,
            "failovers": _failovers(figures),
            "passedThroughCount": figures.passed_through,
            "entryMode": self._entry_mode(figures, now_ms),
            "configuredRatePerSec": _rounded(self._batch(figures.config) * 1000 / self._tick_ms(figures.config)),
            "effectiveRatePerSec": _rounded(self._effective_rate(figures)),
            "etaAccuracy": _eta_accuracy(figures),
            "recentShop": shop_health.health(figures.purchases, now_ms),
            "config": self._effective(figures.config),
        }
        draw = figures.draw
        if figures.commitment is not None:
            # The next opening's seed is drawn: only its commitment is published until the draw.
            body["openingDraw"] = {"commitment": figures.commitment}
        elif draw.get("state") == "done":
            # The seed is published once the line is open, so anyone can check it and recompute every drawn place
            # in the block of seqs the pre-queue was drawn in (chalicelib/opening.py's draw_order).
            opened: dict = {name: draw[name] for name in ("commitment", "seed") if name in draw}
            if "first" in draw:
                opened |= {"firstSeq": int(draw["first"]), "lastSeq": int(draw["last"])}
            opened |= {"placed": int(draw["placed"]), "drawnAt": iso_time(int(draw["drawn_at_ms"]))}
            body["openingDraw"] = opened
        return body

    def config(self, target: Target) -> ConfigAnswer:
        """The target's own configuration and the one in force (own fields over the global defaults)."""
        own, etag = self._own_config(target)
        return ConfigAnswer(self._config_body(own), etag)

    def display(self, target: Target) -> dict[str, str]:
        """What the waiting-room page shows of the target (`displayName`, `imageUrl`, and the `openingCommitment`
        of its next opening's draw), as far as set. Empty when Redis cannot answer: the page must load all the
        same, as the queue fails open."""
        try:
            stored = self.store.shown(target)
        except StoreUnavailable:
            return {}
        if stored is None:
            return {}
        own, commitment = stored
        return own.display() | ({"openingCommitment": commitment} if commitment else {})

    def targets(self) -> list[Target]:
        """The targets the pump visits (users in line or in a pre-queue), for the operator console."""
        try:
            return self.store.targets()
        except StoreUnavailable as err:
            raise QueueUnavailable(self.settings.retry_after_s) from err

    def configure(
        self, target: Target, config: TargetConfig, precondition: Precondition = UNCONDITIONAL
    ) -> ConfigAnswer:
        """Replace the target's own configuration (opening the target) if its version meets `precondition`; the
        pump applies it from its next tick."""
        try:
            outcome, etag = self.store.configure(
                target, config, int(self.clock() * 1000), precondition, fresh_seed=opening.new_seed()
            )
        except StoreUnavailable as err:
            raise self._unavailable(target, err) from None
        if outcome == "UNKNOWN_TARGET":
            raise _unknown()
        if outcome == "ALREADY_OPEN":
            raise ConfigChanged("the target is already open: change its settings with PATCH", etag)
        if outcome == "CHANGED":
            raise ConfigChanged("the configuration changed since you read it: read it again (GET .../config)", etag)
        if outcome == "IN_USE":
            raise ShardsInUse(
                "shards changes only while nobody waits, nobody is pre-queued and no entry token is live: "
                "let the line empty (or sell out and let the tokens expire) first"
            )
        logger.info("target configured", extra={"target": str(target), "config": config.to_body()})
        return ConfigAnswer(self._config_body(config), etag or "")

    def patch_config(self, target: Target, patch: dict, precondition: Precondition = UNCONDITIONAL) -> ConfigAnswer:
        """Merge `patch` (a JSON Merge Patch, target_config.parse_patch) into the open target's own configuration.

        Read, merge and write again as long as others change the configuration in between (the write names the
        version the merge started from), so concurrent PATCHes and PUTs never lose each other's fields; with a
        `precondition` the first version read must meet it, and a change in between is the caller's 412.
        """
        for _ in range(PATCH_ATTEMPTS):
            own, etag = self._own_config(target)
            if not precondition.allows(etag):
                raise ConfigChanged("the configuration changed since you read it: read it again (GET .../config)", etag)
            merged = merge_patch(own, patch)
            try:
                return self.configure(target, merged, Precondition(etags=(etag,), given=True))
            except ConfigChanged:
                if precondition.given:
                    raise
        raise ConfigChanged(
            f"others changed the configuration {PATCH_ATTEMPTS} times while this PATCH was merged: send it again",
            None,
            status=409,
        )

    def _own_config(self, target: Target) -> tuple[TargetConfig, str]:
        try:
            stored = self.store.config(target)
        except StoreUnavailable as err:
            raise self._unavailable(target, err) from None
        if stored is None:
            raise _unknown()
        return stored

    def _config_body(self, own: TargetConfig) -> dict:
        return {"config": own.to_body(), "effective": self._effective(own)}

    def _effective(self, own: TargetConfig) -> dict:
        # Own fields over the defaults; fields without a default (times, caps, display) as the target has them.
        return replace(
            own,
            batch=self._batch(own),
            tick_ms=self._tick_ms(own),
            max_waiting=own.max_waiting or self.defaults.max_waiting,
        ).to_body(all_flags=True)

    def _batch(self, own: TargetConfig) -> int:
        return own.batch or self.defaults.batch

    def _tick_ms(self, own: TargetConfig) -> int:
        return own.tick_ms or self.defaults.tick_ms

    def _state(self, figures: QueueFigures, now_ms: int) -> str:
        """The line's state as operators name it (docs/operations.md#the-states-of-a-line): the first that holds of
        SOLD_OUT, PAUSED, SCHEDULED (before opensAt), CLOSED (past closesAt), IDLE (nobody waiting), ADMITTING
        (the pump applied a tick lately), WAITING (users wait and no tick came: is the pump running?)."""
        own = figures.config
        if own.sold_out:
            return "SOLD_OUT"
        if own.paused:
            return "PAUSED"
        if own.opens_at_ms is not None and now_ms < own.opens_at_ms:
            return "SCHEDULED"
        if own.closes_at_ms is not None and now_ms >= own.closes_at_ms:
            return "CLOSED"
        if figures.waiting + figures.pre_queued == 0:
            return "IDLE"
        quiet_ms = max(STALLED_TICKS * self._tick_ms(own), MIN_STALL_MS)
        ticking = figures.last_tick_ms is not None and now_ms - figures.last_tick_ms <= quiet_ms
        return "ADMITTING" if ticking else "WAITING"

    def _entry_mode(self, figures: QueueFigures, now_ms: int) -> str:
        """How a newcomer gets in now: PASSING_THROUGH (the safety net is on and nobody waits: admitted as they
        enter, while the tick's budget lasts) or QUEUEING (in line, admitted by the pump)."""
        own = figures.config
        drawn = own.opens_at_ms is None or (
            figures.draw.get("opens_at_ms") == str(own.opens_at_ms) and figures.draw.get("state") == "done"
        )
        passing = own.safety_net and drawn and self._state(figures, now_ms) == "IDLE"
        return "PASSING_THROUGH" if passing else "QUEUEING"

    def _effective_rate(self, figures) -> float:
        """Admissions per second the pump is held to now: none paused or sold out, less than configured while the
        shop misses its originSlo."""
        own = figures.config
        if own.paused or own.sold_out:
            return 0.0
        batch = self._batch(own)
        if own.follows_origin and figures.allowed_batch is not None:
            batch = min(batch, figures.allowed_batch)
        return batch * 1000 / self._tick_ms(own)

    def _check_ticket(self, target: Target, user_id: str, text: str | None) -> QueueTicket:
        ticket = self.signer.read_ticket(text)
        if ticket is None or ticket.target != target or ticket.user_id != user_id:
            raise InvalidQueueTicket("X-Queue-Ticket is missing or was not issued to this user for this queue")
        return ticket

    def _switched(self, target: Target, user_id: str, call: Callable[[Decision], Place]) -> Place:
        """`call` (the one script call of enter or status) under the switch's decision for the user.

        A target marked with another flag version (flag_sync) answers FlagChanged before changing anything:
        the switch then adopts the stored configuration, once per container and flip, and the call is made
        again, taking the target's version as current should it have moved once more meanwhile. With Redis
        down, a user the queue is off for is let in all the same; else the outage rule applies (the caller).
        """
        decision = self.switch.decide(target, user_id)
        try:
            place = call(decision)
            if isinstance(place, FlagChanged):
                stored = self.store.flag()
                if stored is not None:
                    self.switch.adopt(*stored)
                decision = replace(self.switch.decide(target, user_id), flag_version="*")
                place = call(decision)
        except StoreUnavailable:
            if not decision.queued:
                return SwitchedOff()
            raise
        return place

    def _direct(self, target: Target, user_id: str, now: float, outage: bool = False) -> QueueEntry:
        if outage:
            # Short-lived, and checked against the target's state when it buys (consume.lua): Redis could not say.
            ttl_s, minted = self.settings.outage_token_ttl_s, Minted.DIRECT
        else:
            ttl_s, minted = self.settings.token_ttl_s, Minted.QUEUE
        token = self.signer.mint_entry_token(target, user_id, now, ttl_s, minted=minted)
        # For the whole service: with Redis down (or skipped) nobody can say whether the target is known.
        count("DirectAdmitted")
        return QueueEntry("DIRECT_ADMITTED", entry_token=token)

    def _degraded(self, target: Target, user_id: str, now: float, err: StoreUnavailable) -> QueueEntry:
        """A newcomer while Redis cannot answer: VQ_FAIL_MODE decides."""
        if not self.settings.fail_open:
            raise self._unavailable(target, err)
        self._record_degraded(target, err)
        return self._direct(target, user_id, now, outage=True)

    def _reckoned(self, ticket: QueueTicket, now: float, err: StoreUnavailable) -> QueueEntry:
        """A ticket holder's poll while Redis cannot answer (fail-open): admitted when their turn has come by dead
        reckoning, never sooner; told to poll again otherwise."""
        target = ticket.target
        if not self.settings.fail_open:
            raise self._unavailable(target, err)
        self._record_degraded(target, err)
        turn = self.reckoner.turn(target, ticket.seq, now)
        if turn is None:
            count("OutagePollsUnplaced")
            raise QueueUnavailable(self.settings.retry_after_s)
        if turn.admitted:
            return self._turn(ticket, now)
        return QueueEntry(
            "WAITING",
            ahead_count=turn.ahead,
            position=turn.ahead + 1,
            eta_seconds=None if turn.due_s is None else math.ceil(turn.due_s),
            paused=turn.paused,
            poll_after_ms=polling.waiting_poll_after_ms(turn.due_s, self.settings.heartbeat_timeout_s),
        )

    def _grant(self, ticket: QueueTicket, now: float) -> EntryGrant:
        """The grant of the token a poll of `ticket`'s entry admits with, if it does. Only a grant, not a signed
        token: signing is most of a token's cost, and the token is sealed only when the answer hands it out."""
        return self.signer.grant(ticket.target, ticket.user_id, ticket.seq, now, self.settings.token_ttl_s)

    def _turn(self, ticket: QueueTicket, now: float) -> QueueEntry:
        """A ticket holder admitted by dead reckoning: a short-lived token with their entry's id."""
        token = self.signer.mint_entry_token(
            ticket.target, ticket.user_id, now, self.settings.outage_token_ttl_s, entry=ticket.seq, minted=Minted.TURN
        )
        self.reckoner.admitted(ticket.target, ticket.seq)
        count("OutageAdmitted")
        return QueueEntry("ADMITTED", entry_token=token)

    def _write_back_turns(self, target: Target, seq: int, tick_ms: int) -> None:
        """Redis answers again: move the mark past the turns this container reckoned without it, and the pump past
        the ticks the reckoning stood in for."""
        try:
            self.store.raise_mark(target, seq, tick_ms, self.defaults.idle_ttl_ms)
        except StoreUnavailable as err:
            self.reckoner.admitted(target, seq)
            logger.warning("reckoned turns not written back yet", extra={"target": str(target), "reason": str(err)})
            return
        logger.info("reckoned turns written back", extra={"target": str(target), "mark": seq})

    def _record_degraded(self, target: Target, err: StoreUnavailable) -> None:
        count("RedisDegraded")
        logger.warning("queue state unavailable", extra={"target": str(target), "reason": str(err)})

    def _refused(self, target: Target, err: StoreRefused) -> QueueUnavailable:
        """Redis is out of memory, or the target's slot is moving: refuse, never let in (and the breaker does not
        count it as an outage)."""
        if isinstance(err, StoreMoving):
            count("RedisSlotMoving")
            logger.warning("the target's slot is moving; refusing", extra={"target": str(target), "reason": str(err)})
        else:
            count("RedisOutOfMemory")
            logger.error(
                "queue state is out of memory; refusing", extra={"target": str(target), "reason": str(err)[:200]}
            )
        return QueueUnavailable(self.settings.retry_after_s)

    def _unavailable(self, target: Target, err: StoreUnavailable) -> QueueUnavailable:
        """Record the outage and answer the 503 for a call that cannot fail open."""
        if isinstance(err, StoreRefused):
            return self._refused(target, err)
        self._record_degraded(target, err)
        return QueueUnavailable(self.settings.retry_after_s)

    def _answer(self, target: Target, user_id: str, place: Place, now: float) -> QueueEntry:
        if isinstance(place, Admitted):
            grant = EntryGrant.parse(place.grant)
            if grant is not None and grant.expires_at > now:
                token = self.signer.seal_entry_token(target, user_id, grant)
                return QueueEntry("ADMITTED", entry_token=token, queued=place.queued)
            # Stored with the token's own TTL, so only a hold in another format (an older release's) gets here.
            raise NotInQueue("the entry token issued to this user is no longer valid; enter again")
        heartbeat_s = self.settings.heartbeat_timeout_s
        if isinstance(place, Waiting):
            # Paused, the line does not move: no time can be promised.
            moving = place.rate > 0 and not place.paused
            # The target's tick and batch when the answer tells them (a poll's), else the global ones (enter's).
            tick_ms = place.tick_ms or self.defaults.tick_ms
            configured_rate = (place.batch or self.defaults.batch) * 1000 / tick_ms
            told = (
                eta.estimate(
                    place.ahead, place.rate, place.departures or eta.Departures(), tick_ms / 1000, configured_rate
                )
                if moving
                else None
            )
            # Beyond the presence window the client reads /line (the edge's) instead: no heartbeat is needed there.
            far = (
                polling.line_after_ms(
                    place.ahead / place.rate,
                    self.settings.presence_window_s,
                    self.settings.line_read_cap_s,
                    newcomer=place.created,
                )
                if moving
                else None
            )
            return QueueEntry(
                "WAITING",
                ahead_count=place.ahead,
                position=place.ahead + 1,
                eta_seconds=None if told is None else told.eta_s,
                eta_range=None if told is None else (told.low_s, told.high_s),
                paused=place.paused,
                poll_after_ms=far
                or polling.waiting_poll_after_ms(
                    place.ahead / place.rate if moving else None, heartbeat_s, newcomer=place.created
                ),
                seq=place.seq,
                line_after_ms=far,
            )
        if isinstance(place, PreQueued):
            opens_in_ms = None if place.opens_at_ms is None else place.opens_at_ms - int(now * 1000)
            return QueueEntry(
                "PRE_QUEUE",
                opens_at_ms=place.opens_at_ms,
                poll_after_ms=polling.pre_queue_poll_after_ms(opens_in_ms, heartbeat_s),
            )
        if isinstance(place, SoldOut):
            return QueueEntry("SOLD_OUT")
        if isinstance(place, Unknown):
            raise _unknown()
        raise NotInQueue("not in this queue; enter again")


def _entry_number(place: Place) -> int | None:
    """The number a ticket of this place carries: its seq, pre-queue arrival, or admitted entry's number."""
    if isinstance(place, Waiting):
        return place.seq
    if isinstance(place, PreQueued):
        return place.arrival
    if isinstance(place, Admitted):
        return place.entry or None
    return None


def _other_entry() -> InvalidQueueTicket:
    return InvalidQueueTicket("this queue ticket is of an earlier entry; use the ticket of your latest entry")


def _unknown() -> UnknownTarget:
    return UnknownTarget("no such queue: an operator opens one with PUT .../config (vq open)")


def _failovers(figures: QueueFigures) -> dict:
    """The failovers the pump fenced, and the range of seqs the last one may have lost (docs/failover.md)."""
    body: dict = {"fenced": figures.fences}
    if figures.lost_seqs is not None:
        body["lostSeqsFrom"], body["lostSeqsTo"] = figures.lost_seqs
    return body


def _eta_accuracy(figures: QueueFigures) -> dict:
    """How the estimates users were first told held, measured at their admission (chalicelib/eta.py)."""
    samples = figures.eta_samples
    return {
        "samples": samples,
        "insideRangeShare": round(figures.eta_inside / samples, 3) if samples else None,
        "medianAbsErrorSeconds": _rounded(waits.percentile(figures.eta_errors or {}, 0.5)),
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
