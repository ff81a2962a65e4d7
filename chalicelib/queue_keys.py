"""Key names of one target's queue state. Every key of one target shares the hash tag `{type:id}`, so each
script runs in one cluster slot."""

from __future__ import annotations

from chalicelib.targets import Target


class QueueKeys:
    """Key names of one target's queue state."""

    def __init__(self, prefix: str, target: Target) -> None:
        self.base = f"{prefix}:{{{target}}}"
        self.waiting = f"{self.base}:waiting"
        self.heartbeat = f"{self.base}:heartbeat"
        self.seq = f"{self.base}:seq"
        self.mark = f"{self.base}:mark"
        self.registered = f"{self.base}:registered"
        self.tick = f"{self.base}:tick"
        self.config = f"{self.base}:config"
        self.prequeue = f"{self.base}:prequeue"
        self.draw = f"{self.base}:draw"
        self.active = f"{self.base}:active"
        self.stats = f"{self.base}:stats"
        self.waits = f"{self.base}:waits"
        self.admissions = f"{self.base}:admissions"
        self.revoked = f"{self.base}:revoked"
        self.ended = f"{self.base}:ended"
        self.health = f"{self.base}:health"
        self.purchases = f"{self.base}:purchases"
        self.events = f"{self.base}:events"
        self.budget = f"{self.base}:budget"

    def token(self, user_id: str) -> str:
        # After the target's hash tag: a brace in a user id cannot move the key to another slot.
        return f"{self.base}:token:{user_id}"

    def consumed(self, token_id: str) -> str:
        return f"{self.base}:consumed:{token_id}"
