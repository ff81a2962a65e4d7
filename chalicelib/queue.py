"""The waiting room's operations: enter, status, leave, stats. Knows nothing of HTTP or of Redis keys."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Callable

from aws_lambda_powertools.metrics import MetricUnit

from chalicelib import polling, waits
from chalicelib.config import Settings
from chalicelib.errors import InvalidQueueTicket, NotInQueue, QueueClosed, QueueFull, QueueUnavailable
from chalicelib.flags import QueueSwitch
from chalicelib.observability import count, logger
from chalicelib.store import (
    Admitted, Closed, Defaults, Full, OtherEntry, Place, PreQueued, QueueStore, StoreFull, StoreUnavailable, Waiting,
)
from chalicelib.target_config import TargetConfig, iso_time
from chalicelib.targets import Target
from chalicelib.tokens import EntryGrant, EntryToken, QueueTicket, TokenSigner


@dataclass(frozen=True)
class QueueEntry:
    """A user's standing in one line, as the client sees it (`QueueEntryResponse`)."""

    status: str
    ahead_count: int = 0
    position: int | None = None
    eta_seconds: int | None = None
    entry_token: EntryToken | None = None
    queue_ticket: str | None = None
    opens_at_ms: int | None = None
    poll_after_ms: int | None = None  # PRE_QUEUE and WAITING: when to poll next (chalicelib/polling.py)

    def to_body(self) -> dict:
        if self.status == "PRE_QUEUE":
            # No place yet: the opening draw gives one.
            body: dict = {"status": self.status}
            if self.opens_at_ms is not None:
                body["opensAt"] = iso_time(self.opens_at_ms)
        else:
            body = {"status": self.status, "aheadCount": self.ahead_count}
        if self.position is not None:
            body["position"] = self.position
            body["etaSeconds"] = self.eta_seconds
        if self.poll_after_ms is not None:
            body["pollAfterMs"] = self.poll_after_ms
        if self.entry_token is not None:
            body["entryToken"] = self.entry_token.text
            expires = datetime.fromtimestamp(self.entry_token.expires_at, timezone.utc)
            body["tokenExpiresAt"] = expires.isoformat().replace("+00:00", "Z")
        if self.queue_ticket is not None:
            body["queueTicket"] = self.queue_ticket
        return body


class WaitingRoom:
    """Puts users in line per target and hands admitted ones a signed entry token.

    When the queue is switched off for a user, or Redis cannot answer (fail-open), users are let in
    directly: DIRECT_ADMITTED with a token minted without Redis.
    """

    def __init__(
        self, store: QueueStore, signer: TokenSigner, settings: Settings, switch: QueueSwitch,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.signer = signer
        self.settings = settings
        self.switch = switch
        self.clock = clock
        self.defaults = Defaults(
            max_waiting=settings.max_waiting, batch=settings.batch_size, tick_ms=settings.tick_ms,
            idle_ttl_ms=settings.queue_idle_ttl_s * 1000,
        )

    def enter(self, target: Target, user_id: int) -> QueueEntry:
        """Join the line (idempotent); the first entry also answers the queue ticket."""
        now = self.clock()
        if not self.switch.queue_enabled(target, user_id):
            return self._direct(target, user_id, now)
        try:
            place = self.store.enter(target, user_id, int(now * 1000), self._grant(now), self.defaults)
        except StoreFull as err:
            raise self._full(target, err) from None
        except StoreUnavailable as err:
            return self._degraded(target, user_id, now, err)
        if isinstance(place, Full):
            count("EnterRejectedFull", target)
            raise QueueFull(retry_after_s=self.settings.retry_after_s)
        if isinstance(place, Closed):
            raise QueueClosed("this queue is closed to newcomers")
        entry = self._answer(target, user_id, place, now)
        if isinstance(place, (Waiting, PreQueued)) and place.created:
            number = place.seq if isinstance(place, Waiting) else place.arrival
            ticket = self.signer.issue_ticket(target, user_id, number, int(now * 1000))
            return replace(entry, queue_ticket=ticket.text)
        return entry

    def status(self, target: Target, user_id: int, ticket_text: str | None) -> QueueEntry:
        """Where the ticket holder stands; this poll is also their heartbeat."""
        ticket = self._check_ticket(target, user_id, ticket_text)
        now = self.clock()
        if not self.switch.queue_enabled(target, user_id):
            return self._direct(target, user_id, now)
        try:
            place = self.store.status(
                target, user_id, int(now * 1000), self._grant(now), ticket, self.defaults,
            )
        except StoreFull as err:
            raise self._full(target, err) from None
        except StoreUnavailable as err:
            return self._degraded(target, user_id, now, err)
        if isinstance(place, OtherEntry):
            raise _other_entry()
        if isinstance(place, Admitted) and place.issued_now:
            count("TokensIssued", target)
            count("WaitSeconds", target, max(0.0, now - ticket.entered_at_ms / 1000), MetricUnit.Seconds)
        return self._answer(target, user_id, place, now)

    def leave(self, target: Target, user_id: int, ticket_text: str | None) -> None:
        """Give up one's place, and revoke an entry token held unused. Leaving twice is fine."""
        ticket = self._check_ticket(target, user_id, ticket_text)
        try:
            left = self.store.leave(target, user_id, ticket.seq, int(self.clock() * 1000), self.defaults.idle_ttl_ms)
        except StoreUnavailable as err:
            raise self._unavailable(target, err) from None
        if isinstance(left, OtherEntry):
            raise _other_entry()

    def stats(self, target: Target) -> dict:
        """Live figures of one line for operators (`GET .../stats`), beside the configuration in force."""
        try:
            figures = self.store.stats(target, int(self.clock() * 1000))
        except StoreUnavailable as err:
            raise self._unavailable(target, err) from None
        histogram = figures.wait_histogram
        waited = sum(histogram.values())
        body = {
            "waitingCount": figures.waiting,
            "preQueuedCount": figures.pre_queued,
            "admittedCount": figures.admitted,
            "activeCount": figures.active,
            "admissionRatePerSec": round(figures.measured_rate or 0.0, 3),
            "avgWaitSeconds": round(figures.wait_ms / waited / 1000, 3) if waited else None,
            "p95WaitSeconds": _rounded(waits.percentile(histogram, 0.95)),
            "leftCount": figures.left,
            "evictedCount": figures.evicted,
            "config": self._effective(figures.config),
        }
        if figures.draw.get("state") == "done":
            # Published once the draw is over, so anyone can check the order it dealt.
            draw = figures.draw
            body["openingDraw"] = {"seed": draw["seed"], "placed": int(draw["placed"]),
                                   "drawnAt": iso_time(int(draw["drawn_at_ms"]))}
        return body

    def config(self, target: Target) -> dict:
        """The target's own configuration and the one in force (own fields over the global defaults)."""
        try:
            own = self.store.config(target)
        except StoreUnavailable as err:
            raise self._unavailable(target, err) from None
        return {"config": own.to_body(), "effective": self._effective(own)}

    def display(self, target: Target) -> dict[str, str]:
        """What the waiting-room page shows of the target (`displayName`, `imageUrl`), as far as set. Empty when
        Redis cannot answer: the page must load all the same, as the queue fails open."""
        try:
            return self.store.config(target).display()
        except StoreUnavailable:
            return {}

    def targets(self) -> list[Target]:
        """The targets the pump visits (users in line or in a pre-queue), for the operator console."""
        try:
            return self.store.targets()
        except StoreUnavailable as err:
            raise QueueUnavailable(self.settings.retry_after_s) from err

    def configure(self, target: Target, config: TargetConfig) -> dict:
        """Replace the target's own configuration; the pump applies it from its next tick."""
        try:
            self.store.configure(target, config)
        except StoreUnavailable as err:
            raise self._unavailable(target, err) from None
        logger.info("target configured", extra={"target": str(target), "config": config.to_body()})
        return {"config": config.to_body(), "effective": self._effective(config)}

    def _effective(self, own: TargetConfig) -> dict:
        d = self.defaults
        # Own fields over the defaults; fields without a default (times, caps, display) as the target has them.
        return replace(
            own, batch=own.batch or d.batch, tick_ms=own.tick_ms or d.tick_ms, max_waiting=own.max_waiting or d.max_waiting,
        ).to_body()

    def _check_ticket(self, target: Target, user_id: int, text: str | None) -> QueueTicket:
        ticket = self.signer.read_ticket(text)
        if ticket is None or ticket.target != target or ticket.user_id != user_id:
            raise InvalidQueueTicket("X-Queue-Ticket is missing or was not issued to this user for this queue")
        return ticket

    def _grant(self, now: float) -> EntryGrant:
        # Drawn before the script runs so that admission stays one round trip; kept only if it admits. Only a
        # grant, not a signed token: most polls do not admit, and signing is most of a token's cost.
        return self.signer.grant(now, self.settings.token_ttl_s)

    def _direct(self, target: Target, user_id: int, now: float) -> QueueEntry:
        token = self.signer.mint_entry_token(target, user_id, now, self.settings.token_ttl_s)
        count("DirectAdmitted", target)
        return QueueEntry("DIRECT_ADMITTED", entry_token=token)

    def _degraded(self, target: Target, user_id: int, now: float, err: StoreUnavailable) -> QueueEntry:
        if not self.settings.fail_open:
            raise self._unavailable(target, err)
        self._record_degraded(target, err)
        return self._direct(target, user_id, now)

    def _record_degraded(self, target: Target, err: StoreUnavailable) -> None:
        count("RedisDegraded", target)
        logger.warning("queue state unavailable", extra={"target": str(target), "reason": str(err)})

    def _full(self, target: Target, err: StoreFull) -> QueueUnavailable:
        """Redis is out of memory: refuse, never let in (and the breaker does not count it as an outage)."""
        count("RedisOutOfMemory", target)
        logger.error("queue state is out of memory; refusing", extra={"target": str(target), "reason": str(err)[:200]})
        return QueueUnavailable(self.settings.retry_after_s)

    def _unavailable(self, target: Target, err: StoreUnavailable) -> QueueUnavailable:
        """Record the outage and answer the 503 for a call that cannot fail open."""
        if isinstance(err, StoreFull):
            return self._full(target, err)
        self._record_degraded(target, err)
        return QueueUnavailable(self.settings.retry_after_s)

    def _answer(self, target: Target, user_id: int, place: Place, now: float) -> QueueEntry:
        if isinstance(place, Admitted):
            grant = EntryGrant.parse(place.grant)
            if grant is not None and grant.expires_at > now:
                return QueueEntry("ADMITTED", entry_token=self.signer.seal_entry_token(target, user_id, grant))
            # Stored with the token's own TTL, so only a hold in another format (an older release's) gets here.
            raise NotInQueue("the entry token issued to this user is no longer valid; enter again")
        heartbeat_s = self.settings.heartbeat_timeout_s
        if isinstance(place, Waiting):
            eta = place.ahead / place.rate if place.rate > 0 else None
            return QueueEntry(
                "WAITING", ahead_count=place.ahead, position=place.ahead + 1,
                eta_seconds=None if eta is None else math.ceil(eta),
                poll_after_ms=polling.waiting_poll_after_ms(eta, heartbeat_s),
            )
        if isinstance(place, PreQueued):
            opens_in_ms = None if place.opens_at_ms is None else place.opens_at_ms - int(now * 1000)
            return QueueEntry("PRE_QUEUE", opens_at_ms=place.opens_at_ms,
                              poll_after_ms=polling.pre_queue_poll_after_ms(opens_in_ms, heartbeat_s))
        raise NotInQueue("not in this queue; enter again")


def _other_entry() -> InvalidQueueTicket:
    return InvalidQueueTicket("this queue ticket is of an earlier entry; use the ticket of your latest entry")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
