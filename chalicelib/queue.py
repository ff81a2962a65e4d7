"""The waiting room's operations: enter, status, leave, stats. Knows nothing of HTTP or of Redis keys."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Callable

from aws_lambda_powertools.metrics import MetricUnit

from chalicelib import waits
from chalicelib.config import Settings
from chalicelib.errors import InvalidQueueTicket, NotInQueue, QueueFull, QueueUnavailable
from chalicelib.flags import QueueSwitch
from chalicelib.observability import count, logger
from chalicelib.store import Admitted, Full, Place, QueueStore, StoreUnavailable, Waiting
from chalicelib.targets import Target
from chalicelib.tokens import EntryToken, QueueTicket, TokenSigner


@dataclass(frozen=True)
class QueueEntry:
    """A user's standing in one line, as the client sees it (`QueueEntryResponse`)."""

    status: str
    ahead_count: int = 0
    position: int | None = None
    eta_seconds: int | None = None
    entry_token: EntryToken | None = None
    queue_ticket: str | None = None

    def to_body(self) -> dict:
        body: dict = {"status": self.status, "aheadCount": self.ahead_count}
        if self.position is not None:
            body["position"] = self.position
            body["etaSeconds"] = self.eta_seconds
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

    def enter(self, target: Target, user_id: int) -> QueueEntry:
        """Join the line (idempotent); the first entry also answers the queue ticket."""
        now = self.clock()
        if not self.switch.queue_enabled(target, user_id):
            return self._direct(target, user_id, now)
        s = self.settings
        try:
            place = self.store.enter(
                target, user_id, int(now * 1000), s.max_waiting, s.queue_idle_ttl_s * 1000,
                self._candidate_token(target, user_id, now), s.token_ttl_s * 1000,
            )
        except StoreUnavailable as err:
            return self._degraded(target, user_id, now, err)
        if isinstance(place, Full):
            count("EnterRejectedFull", target)
            raise QueueFull(retry_after_s=self._retry_after_s())
        entry = self._answer(target, place, now)
        if isinstance(place, Waiting) and place.created:
            ticket = self.signer.issue_ticket(target, user_id, place.seq, int(now * 1000))
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
                target, user_id, int(now * 1000), self._candidate_token(target, user_id, now),
                self.settings.token_ttl_s * 1000, ticket.entered_at_ms,
            )
        except StoreUnavailable as err:
            return self._degraded(target, user_id, now, err)
        if isinstance(place, Admitted) and place.issued_now:
            count("TokensIssued", target)
            count("WaitSeconds", target, max(0.0, now - ticket.entered_at_ms / 1000), MetricUnit.Seconds)
        return self._answer(target, place, now)

    def leave(self, target: Target, user_id: int, ticket_text: str | None) -> None:
        """Give up one's place (and any entry token). Leaving twice is fine."""
        self._check_ticket(target, user_id, ticket_text)
        try:
            self.store.leave(target, user_id)
        except StoreUnavailable as err:
            self._record_degraded(target, err)
            raise QueueUnavailable(self._retry_after_s()) from None

    def stats(self, target: Target) -> dict:
        """Live figures of one line for operators (`GET .../stats`)."""
        try:
            figures = self.store.stats(target)
        except StoreUnavailable as err:
            self._record_degraded(target, err)
            raise QueueUnavailable(self._retry_after_s()) from None
        histogram = figures.wait_histogram
        waited = sum(histogram.values())
        return {
            "waitingCount": figures.waiting,
            "admittedCount": figures.admitted,
            "admissionRatePerSec": round(figures.measured_rate or 0.0, 3),
            "avgWaitSeconds": round(figures.wait_ms / waited / 1000, 3) if waited else None,
            "p95WaitSeconds": _rounded(waits.percentile(histogram, 0.95)),
            "leftCount": figures.left,
            "evictedCount": figures.evicted,
            "configuredRatePerSec": self.settings.admissions_per_second,
        }

    def _check_ticket(self, target: Target, user_id: int, text: str | None) -> QueueTicket:
        ticket = self.signer.read_ticket(text)
        if ticket is None or ticket.target != target or ticket.user_id != user_id:
            raise InvalidQueueTicket("X-Queue-Ticket is missing or was not issued to this user for this queue")
        return ticket

    def _candidate_token(self, target: Target, user_id: int, now: float) -> str:
        # Minted before the script runs so that admission stays one round trip; kept only if it admits.
        return self.signer.mint_entry_token(target, user_id, now, self.settings.token_ttl_s).text

    def _direct(self, target: Target, user_id: int, now: float) -> QueueEntry:
        token = self.signer.mint_entry_token(target, user_id, now, self.settings.token_ttl_s)
        count("DirectAdmitted", target)
        return QueueEntry("DIRECT_ADMITTED", entry_token=token)

    def _degraded(self, target: Target, user_id: int, now: float, err: StoreUnavailable) -> QueueEntry:
        self._record_degraded(target, err)
        if not self.settings.fail_open:
            raise QueueUnavailable(self._retry_after_s())
        return self._direct(target, user_id, now)

    def _record_degraded(self, target: Target, err: StoreUnavailable) -> None:
        count("RedisDegraded", target)
        logger.warning("queue state unavailable", extra={"target": str(target), "reason": str(err)})

    def _retry_after_s(self) -> int:
        return max(1, math.ceil(self.settings.tick_ms / 1000))

    def _answer(self, target: Target, place: Place, now: float) -> QueueEntry:
        if isinstance(place, Admitted):
            token = self.signer.read_entry_token(place.token, now)
            if token is not None:
                return QueueEntry("ADMITTED", entry_token=token)
            # Stored with the token's own TTL, so only a key rotation makes it unreadable: a stale hold.
            raise NotInQueue("the entry token issued to this user is no longer valid; enter again")
        if isinstance(place, Waiting):
            rate = place.measured_rate or self.settings.admissions_per_second
            eta = math.ceil(place.ahead / rate)
            return QueueEntry("WAITING", ahead_count=place.ahead, position=place.ahead + 1, eta_seconds=eta)
        raise NotInQueue("not in this queue; enter again")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
