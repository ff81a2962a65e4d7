"""The purchase gate's eye on the shop: each forwarded purchase is noted in queue state (one round trip after
the shop answered) for the pump to follow the shop's health (shop_health.py), and the shop's
`X-Queue-Sold-Out: true` marks the target sold out."""

from __future__ import annotations

import time
from collections.abc import Callable

from chalicelib.errors import OriginUnavailable
from chalicelib.observability import count, logger
from chalicelib.origin import OriginAnswer
from chalicelib.redis_connection import StoreUnavailable
from chalicelib.shop_health import Purchase
from chalicelib.store import QueueStore
from chalicelib.targets import Target
from chalicelib.tokens import EntryToken


class ShopWatch:
    """Times each call to the shop and notes how it went."""

    def __init__(self, store: QueueStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    def forward(
        self, target: Target, call: Callable[[], OriginAnswer], token: EntryToken | None = None
    ) -> OriginAnswer:
        """Run `call` (the POST to the shop with entry `token`, if any), note how it went (a PurchaseCompleted or
        PurchaseFailed event with a token), and answer (or raise) what the shop did."""
        sent = self.clock()
        try:
            answer = call()
        except OriginUnavailable:
            self._note(target, sent, ok=False, accepted=False, sold_out=False, token=token, status=0)
            raise
        self._note(
            target,
            sent,
            ok=answer.status < 500,
            accepted=200 <= answer.status < 300,
            sold_out=answer.sold_out,
            token=token,
            status=answer.status,
        )
        return answer

    def _note(
        self,
        target: Target,
        sent: float,
        ok: bool,
        accepted: bool,
        sold_out: bool,
        token: EntryToken | None,
        status: int,
    ) -> None:
        purchase = Purchase(int(sent * 1000), max(0, round((self.clock() - sent) * 1000)), ok)
        try:
            noted = self.store.observe_purchase(target, purchase, accepted, sold_out, token, status)
        except StoreUnavailable as err:
            # The purchase stands; the pump misses one sample (and a sold-out word: the shop's next answer repeats it).
            logger.warning("purchase not noted", extra={"target": str(target), "reason": str(err)})
            return
        if noted == 2:
            count("SoldOutByShop", target)
            logger.info("the shop says the target is sold out", extra={"target": str(target)})
