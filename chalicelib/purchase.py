"""The purchase gate: an entry token buys once, and the shop holds exactly one order per token.

Every forwarded purchase carries an `Idempotency-Key` naming the token's id (see origin.py for the contract with
origins).
The token is given back only when the shop certainly did not take the order: nothing was sent, or the shop
said so (`X-Queue-Not-Taken`). After a timeout or a 5xx the outcome is unknown: the token stays used, and a
retry with it while it is valid is forwarded again under the same key, so the shop answers the first outcome.

Knows nothing of Chalice or of Redis keys: verification is `gate.check_entry`, the one-time marker is
`QueueStore.consume` / `restore` / `mark_unknown`, the downstream call is `origin.forward`.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from chalicelib import media_types
from chalicelib.answers import Consumption
from chalicelib.config import Settings
from chalicelib.errors import (
    EntryTokenUsed,
    OriginNotConfigured,
    OriginUnavailable,
    PayloadTooLarge,
    QueueBypassDenied,
    QueueUnavailable,
    UnknownTarget,
)
from chalicelib.flags import QueueSwitch
from chalicelib.gate import check_entry, context_agrees, purchase_path, route_target
from chalicelib.observability import count, logger
from chalicelib.origin import OriginAnswer, forward, idempotency_key
from chalicelib.outage import OutageLedger
from chalicelib.redis_connection import StoreMoving, StoreRefused, StoreUnavailable
from chalicelib.shop_watch import ShopWatch
from chalicelib.store import QueueStore
from chalicelib.targets import Target, parse_user_id
from chalicelib.tokens import EntryToken, TokenSigner

# A token minted while Redis could not be asked, refused at the purchase by the target's state it could not know.
_OUTAGE_TOKEN = "this entry token was handed out while the queue could not be asked, and "
_HELD = {
    Consumption.PAUSED: _OUTAGE_TOKEN + "the sale is paused: poll your queue ticket again",
    Consumption.SOLD_OUT: _OUTAGE_TOKEN + "the sale is sold out",
    Consumption.CLOSED: _OUTAGE_TOKEN + "the line had closed to newcomers",
}


@dataclass(frozen=True)
class PurchaseRequest:
    """A purchase as it reached a route. The strings come from the client and are judged here, not trusted."""

    target_type: str
    target_id: str
    entry_token: str | None
    user_id: str | None  # the caller as identity.py verified it
    # The authorizer's context when API Gateway ran `purchase_authorizer`; None locally.
    authorizer: Mapping[str, Any] | None
    body: bytes
    content_type: str | None
    request_id: str | None = None


@dataclass(frozen=True)
class _Use:
    """One purchase's use of a token: `retry` takes over an earlier use of unknown outcome; `recorded` in Redis,
    else in this container's outage ledger."""

    token: EntryToken
    consumption_id: str
    retry: bool
    recorded: bool


class PurchaseGate:
    """Lets a purchase through to the downstream once per entry token."""

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
        self.origins = settings.origins
        self.timeout_s = settings.origin_timeout_ms / 1000
        self.outage = OutageLedger()
        self.shop = ShopWatch(store, clock)

    def purchase(self, request: PurchaseRequest) -> OriginAnswer:
        """Verify the entry token, use it up, forward the purchase, and answer what the downstream answered.

        Raises InvalidArgument (a malformed user id or Content-Type), PayloadTooLarge (a body over
        VQ_MAX_PURCHASE_BODY_BYTES), UnsupportedMediaType (no Content-Type, or not application/json),
        QueueBypassDenied (no valid token for this target and user, or one revoked by leaving), EntryTokenUsed
        (already bought), OriginNotConfigured, OriginUnavailable, QueueUnavailable (Redis out of memory, or down
        and VQ_FAIL_MODE=closed). While the queue is switched off for the caller, a purchase without a valid token
        goes straight through.
        """
        now = self.clock()
        # Bad input is refused before anything is used up.
        if len(request.body or b"") > self.settings.max_purchase_body_bytes:
            raise PayloadTooLarge(f"a purchase body is at most {self.settings.max_purchase_body_bytes} bytes")
        user_id = parse_user_id(request.user_id if isinstance(request.user_id, str) else None, "the user id")
        media_types.require(request.content_type)
        target = route_target(request.target_type, request.target_id)
        if target is None:
            self._deny(None)
        token = check_entry(self.signer, target, request.entry_token, user_id, now)
        if token is None:
            if not self.switch.queue_enabled(target, user_id):
                return self._forward(target, request, user_id, None)
            self._deny(target)
        # Defence in depth: an authorizer's Allow must describe this very token, user and target.
        if request.authorizer is not None and not context_agrees(request.authorizer, token):
            self._deny(target)
        self._origin(target)  # before consuming, so a missing downstream leaves the token unused
        use = self._use(token, now)
        try:
            answer = self._forward(target, request, token.user_id, token)
        except OriginUnavailable as err:
            self._settle(use, not_taken=not err.sent)
            raise
        if answer.not_taken or answer.status >= 500:
            self._settle(use, not_taken=answer.not_taken)
        return answer

    def _deny(
        self, target: Target | None, detail: str = "a valid entry token for this target and user is required"
    ) -> NoReturn:
        # For the whole service only: the target is the caller's word, and each target would be a metric to pay for.
        count("BypassDenied")
        logger.info("purchase denied", extra={"target": str(target) if target else None})
        raise QueueBypassDenied(detail)

    def _origin(self, target: Target) -> str:
        origin = self.origins[target.type]
        if origin is None:
            raise OriginNotConfigured(f"no downstream is configured for {target.type} purchases")
        return origin

    def _forward(
        self, target: Target, request: PurchaseRequest, user_id: str, token: EntryToken | None
    ) -> OriginAnswer:
        headers = {"X-Request-Id": request.request_id or uuid.uuid4().hex, "X-User-Id": user_id}
        if token is not None:
            headers["Idempotency-Key"] = idempotency_key(token.token_id, self.settings.idempotency_key_string)
        if request.content_type:
            headers["Content-Type"] = request.content_type
        url = self._origin(target) + purchase_path(target)
        return self.shop.forward(target, lambda: forward(url, request.body, headers, self.timeout_s), token)

    def _use(self, token: EntryToken, now: float) -> _Use:
        """Mark `token` used (or take over a use of unknown outcome); in the outage ledger if Redis cannot answer."""
        consumption_id = secrets.token_urlsafe(16)
        if self.outage.holds(token):
            raise EntryTokenUsed("this entry token has already bought once")
        try:
            consumption = self.store.consume(
                token, consumption_id, int(now * 1000), self.settings.targets_open_on_first_use
            )
        except StoreRefused as err:
            # Full or moving is not down: without a marker there is no purchase. (Redis could not say whether the
            # target is known: counted for the whole service, as every count made without Redis.)
            reason = {"target": str(token.target), "reason": str(err)[:200]}
            if isinstance(err, StoreMoving):
                count("RedisSlotMoving")
                logger.warning("the target's slot is moving at purchase", extra=reason)
            else:
                count("RedisOutOfMemory")
                logger.error("queue state is out of memory at purchase", extra=reason)
            raise QueueUnavailable(self.settings.retry_after_s) from None
        except StoreUnavailable as err:
            return self._use_unrecorded(token, consumption_id, now, err)
        if consumption == Consumption.UNKNOWN_TARGET:
            raise UnknownTarget("no such queue: an operator opens one with PUT .../config")
        if consumption in _HELD:
            self._deny(token.target, _HELD[consumption])
        if consumption == Consumption.REVOKED:
            self._deny(token.target, "this entry token was given up when its holder left the queue")
        if consumption == Consumption.USED:
            raise EntryTokenUsed("this entry token has already bought once")
        if consumption == Consumption.FIRST:
            count("TokensConsumed", token.target)
        self._write_back(now)
        return _Use(token, consumption_id, retry=consumption == Consumption.RETRY, recorded=True)

    def _use_unrecorded(self, token: EntryToken, consumption_id: str, now: float, err: StoreUnavailable) -> _Use:
        count("RedisDegraded")
        logger.warning("queue state unavailable at purchase", extra={"target": str(token.target), "reason": str(err)})
        if not self.settings.fail_open:
            raise QueueUnavailable(self.settings.retry_after_s) from None
        if not self.outage.take(token, now):
            raise EntryTokenUsed("this entry token has already bought once")
        count("PurchaseUnrecorded")
        # The token id names the purchase (it is the Idempotency-Key the shop got); the token itself is never logged.
        logger.warning(
            "purchase not recorded in queue state; written back when Redis answers",
            extra={"target": str(token.target), "token_id": token.token_id},
        )
        return _Use(token, consumption_id, retry=False, recorded=False)

    def _write_back(self, now: float) -> None:
        """Redis answers again: record the purchases this container let through without it."""
        uses = self.outage.unrecorded()
        if not uses:
            return
        try:
            self.store.write_back(uses, int(now * 1000))
        except StoreUnavailable as err:
            logger.warning("outage purchases not written back yet", extra={"count": len(uses), "reason": str(err)})
            return
        self.outage.recorded(uses)
        logger.info("outage purchases written back", extra={"token_ids": [token.token_id for token, _ in uses]})

    def _settle(self, use: _Use, not_taken: bool) -> None:
        """The purchase got no answer the token can stand by: give the token back if the shop certainly did not
        take the order (a retry goes back to unknown), else record the outcome as unknown."""
        give_back = not_taken and not use.retry
        if not use.recorded:
            if give_back:
                self.outage.give_back(use.token)
            else:
                self.outage.outcome_unknown(use.token)
            return
        try:
            if give_back:
                settled = self.store.restore(use.token, use.consumption_id)
            else:
                settled = self.store.mark_unknown(use.token, use.consumption_id)
        except StoreUnavailable as err:
            count("RedisDegraded")
            logger.warning("purchase outcome not recorded", extra={"target": str(use.token.target), "reason": str(err)})
            return
        if settled and give_back:
            count("TokensRestored", use.token.target)
        elif settled:
            count("PurchaseOutcomeUnknown", use.token.target)
