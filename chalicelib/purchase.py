"""The purchase gate: an entry token buys once, and a purchase the downstream fails gives the token back.

Knows nothing of Chalice or of Redis keys: verification is `gate.check_entry`, the one-time marker is
`QueueStore.consume` / `restore`, the downstream call is `origin.forward`.
"""

from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NoReturn

from chalicelib.config import Settings
from chalicelib.errors import (
    EntryTokenUsed, OriginNotConfigured, OriginUnavailable, QueueBypassDenied, QueueUnavailable,
)
from chalicelib.flags import QueueSwitch
from chalicelib.gate import caller_id, check_entry, context_agrees, purchase_path, route_target
from chalicelib.observability import count, logger
from chalicelib.origin import OriginAnswer, forward
from chalicelib.store import QueueStore, StoreUnavailable
from chalicelib.targets import Target
from chalicelib.tokens import EntryToken, TokenSigner


@dataclass(frozen=True)
class PurchaseRequest:
    """A purchase as it reached a route. The strings come from the client and are judged here, not trusted."""

    target_type: str
    target_id: str
    entry_token: str | None
    user_id: str | None
    # The authorizer's context when API Gateway ran `purchase_authorizer`; None locally.
    authorizer: Mapping[str, Any] | None
    body: bytes
    content_type: str | None
    request_id: str | None = None


class PurchaseGate:
    """Lets a purchase through to the downstream once per entry token."""

    def __init__(
        self, store: QueueStore, signer: TokenSigner, settings: Settings, switch: QueueSwitch,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.signer = signer
        self.settings = settings
        self.switch = switch
        self.clock = clock
        self.origins = {
            "limited-drop": settings.origin_limited_drop_url,
            "ticketing-event": settings.origin_ticketing_url,
        }
        self.timeout_s = settings.origin_timeout_ms / 1000

    def purchase(self, request: PurchaseRequest) -> OriginAnswer:
        """Verify the entry token, use it up, forward the purchase, and answer what the downstream answered.

        Raises QueueBypassDenied (no valid token for this target and user), EntryTokenUsed (already bought),
        OriginNotConfigured, OriginUnavailable, QueueUnavailable (Redis down and VQ_FAIL_MODE=closed).
        A downstream 5xx or silence gives the token back. While the queue is switched off for the caller,
        a purchase without a valid token goes straight through.
        """
        now = self.clock()
        target = route_target(request.target_type, request.target_id)
        token = None if target is None else check_entry(self.signer, target, request.entry_token, request.user_id, now)
        if token is None:
            user_id = caller_id(request.user_id)
            if target is not None and not self.switch.queue_enabled(target, user_id):
                return self._forward(target, request, user_id)
            self._deny(target)
        # Defence in depth: an authorizer's Allow must describe this very token, user and target.
        if request.authorizer is not None and not context_agrees(request.authorizer, token):
            self._deny(target)
        self._origin(target)  # before consuming, so a missing downstream leaves the token unused
        consumption_id = secrets.token_urlsafe(16)
        recorded = self._consume(token, consumption_id, now)
        try:
            answer = self._forward(target, request, token.user_id)
        except OriginUnavailable:
            if recorded:
                self._restore(token, consumption_id)
            raise
        if answer.status >= 500 and recorded:
            self._restore(token, consumption_id)
        return answer

    def _deny(self, target: Target | None) -> NoReturn:
        count("BypassDenied", target)
        logger.info("purchase denied", extra={"target": str(target) if target else None})
        raise QueueBypassDenied("a valid entry token for this target and user is required")

    def _origin(self, target: Target) -> str:
        origin = self.origins[target.type]
        if origin is None:
            raise OriginNotConfigured(f"no downstream is configured for {target.type} purchases")
        return origin

    def _forward(self, target: Target, request: PurchaseRequest, user_id: int | None) -> OriginAnswer:
        headers = {"X-Request-Id": request.request_id or uuid.uuid4().hex}
        if user_id is not None:
            headers["X-User-Id"] = str(user_id)
        if request.content_type:
            headers["Content-Type"] = request.content_type
        return forward(self._origin(target) + purchase_path(target), request.body, headers, self.timeout_s)

    def _consume(self, token: EntryToken, consumption_id: str, now: float) -> bool:
        """True once the token is marked used; False if Redis cannot answer and the signature alone must do."""
        try:
            # The marker lives exactly as long as the token, so it never outlives the need for it.
            first_use = self.store.consume(token, consumption_id, int(now * 1000))
        except StoreUnavailable as err:
            count("RedisDegraded", token.target)
            logger.warning("queue state unavailable at purchase",
                           extra={"target": str(token.target), "reason": str(err)})
            if not self.settings.fail_open:
                raise QueueUnavailable(self.settings.retry_after_s) from None
            return False
        if not first_use:
            raise EntryTokenUsed("this entry token has already bought once")
        count("TokensConsumed", token.target)
        return True

    def _restore(self, token: EntryToken, consumption_id: str) -> None:
        try:
            restored = self.store.restore(token, consumption_id)
        except StoreUnavailable as err:
            count("RedisDegraded", token.target)
            logger.warning("entry token not given back", extra={"target": str(token.target), "reason": str(err)})
            return
        if restored:
            count("TokensRestored", token.target)
