"""The waiting room's operations: enter, status, leave. Knows nothing of HTTP or of Redis keys."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Callable

from chalicelib.config import Settings
from chalicelib.errors import InvalidQueueTicket, NotInQueue, QueueFull
from chalicelib.store import Admitted, Full, Place, QueueStore, Waiting
from chalicelib.targets import Target
from chalicelib.tokens import EntryToken, TokenSigner


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
    """Puts users in line per target and hands admitted ones a signed entry token."""

    def __init__(
        self, store: QueueStore, signer: TokenSigner, settings: Settings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.signer = signer
        self.settings = settings
        self.clock = clock

    def enter(self, target: Target, user_id: int) -> QueueEntry:
        """Join the line (idempotent); the first entry also answers the queue ticket."""
        now = self.clock()
        s = self.settings
        place = self.store.enter(
            target, user_id, int(now * 1000), s.max_waiting, s.queue_idle_ttl_s * 1000,
            self._candidate_token(target, user_id, now), s.token_ttl_s * 1000,
        )
        if isinstance(place, Full):
            raise QueueFull(retry_after_s=max(1, math.ceil(s.tick_ms / 1000)))
        entry = self._answer(target, user_id, place, now)
        if isinstance(place, Waiting) and place.created:
            ticket = self.signer.issue_ticket(target, user_id, place.seq, int(now * 1000))
            return replace(entry, queue_ticket=ticket.text)
        return entry

    def status(self, target: Target, user_id: int, ticket: str | None) -> QueueEntry:
        """Where the ticket holder stands; this poll is also their heartbeat."""
        self._check_ticket(target, user_id, ticket)
        now = self.clock()
        place = self.store.status(
            target, user_id, int(now * 1000),
            self._candidate_token(target, user_id, now), self.settings.token_ttl_s * 1000,
        )
        return self._answer(target, user_id, place, now)

    def leave(self, target: Target, user_id: int, ticket: str | None) -> None:
        """Give up one's place (and any entry token). Leaving twice is fine."""
        self._check_ticket(target, user_id, ticket)
        self.store.leave(target, user_id)

    def _check_ticket(self, target: Target, user_id: int, text: str | None) -> None:
        ticket = self.signer.read_ticket(text)
        if ticket is None or ticket.target != target or ticket.user_id != user_id:
            raise InvalidQueueTicket("X-Queue-Ticket is missing or was not issued to this user for this queue")

    def _candidate_token(self, target: Target, user_id: int, now: float) -> str:
        # Minted before the script runs so that admission stays one round trip; kept only if it admits.
        return self.signer.mint_entry_token(target, user_id, now, self.settings.token_ttl_s).text

    def _answer(self, target: Target, user_id: int, place: Place, now: float) -> QueueEntry:
        if isinstance(place, Admitted):
            token = self.signer.read_entry_token(place.token, now)
            if token is not None:
                return QueueEntry("ADMITTED", entry_token=token)
            # Stored with the token's own TTL, so only a key rotation makes it unreadable: a stale hold.
            raise NotInQueue("the entry token issued to this user is no longer valid; enter again")
        if isinstance(place, Waiting):
            eta = math.ceil(place.ahead / self.settings.admissions_per_second)
            return QueueEntry("WAITING", ahead_count=place.ahead, position=place.ahead + 1, eta_seconds=eta)
        raise NotInQueue("not in this queue; enter again")
