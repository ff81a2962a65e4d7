"""Purchases made while Redis was unreachable (fail-open): remembered in this container, written back later.

Without Redis the one-time marker cannot be written, so the signature alone lets a purchase through. This
ledger bounds that to one purchase per token per container, and keeps each such use until Redis answers
again, when `PurchaseGate` writes it back as the token's marker: the token cannot buy after recovery.
"""

from __future__ import annotations

import threading

from chalicelib.store import CLOCK_SKEW_MARGIN_MS
from chalicelib.tokens import EntryToken


class OutageLedger:
    """Entry tokens used here while their use could not be recorded, by token id. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # token id -> (token, whether the purchase's outcome is known)
        self._used: dict[str, tuple[EntryToken, bool]] = {}

    def take(self, token: EntryToken, now: float) -> bool:
        """Use `token` here; False if it was already used here. Uses whose token has expired are dropped."""
        with self._lock:
            expired = [
                tid for tid, (used, _) in self._used.items() if used.expires_at + CLOCK_SKEW_MARGIN_MS / 1000 <= now
            ]
            for tid in expired:
                del self._used[tid]
            if token.token_id in self._used:
                return False
            self._used[token.token_id] = (token, True)
            return True

    def holds(self, token: EntryToken) -> bool:
        """Whether `token` was used here and its use is not yet written back."""
        with self._lock:
            return token.token_id in self._used

    def give_back(self, token: EntryToken) -> None:
        """The shop certainly did not take the order: the token is whole again."""
        with self._lock:
            self._used.pop(token.token_id, None)

    def outcome_unknown(self, token: EntryToken) -> None:
        with self._lock:
            if token.token_id in self._used:
                self._used[token.token_id] = (token, False)

    def unrecorded(self) -> list[tuple[EntryToken, bool]]:
        """Every use not yet written back, as (token, outcome known)."""
        with self._lock:
            return list(self._used.values())

    def recorded(self, uses: list[tuple[EntryToken, bool]]) -> None:
        """`uses` (from `unrecorded`) are written back: forget them."""
        with self._lock:
            for token, _ in uses:
                self._used.pop(token.token_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._used)
