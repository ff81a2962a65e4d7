"""Buying in tests: entry tokens and purchase requests, and one token used from many threads at once (what
exactly-once purchase tests race)."""

import threading
import time

from chalicelib.errors import EntryTokenUsed, QueueBypassDenied
from chalicelib.purchase import PurchaseGate, PurchaseRequest
from chalicelib.targets import Target

DROP = Target("limited-drop", 42)


def mint(signer, target=DROP, user=7, now=None, ttl_s=300):
    """An entry token for `user` of `target`, as the waiting room would hand it out."""
    return signer.mint_entry_token(target, str(user), time.time() if now is None else now, ttl_s)


def request_for(token, target=DROP, user="7", authorizer=None):
    """A purchase with `token`, as a purchase route passes it to the gate."""
    return PurchaseRequest(
        target_type=target.type,
        target_id=str(target.id),
        entry_token=token.text,
        user_id=user,
        authorizer=authorizer,
        body=b'{"sku":"x"}',
        content_type="application/json",
    )


def buy_at_once(gate: PurchaseGate, request: PurchaseRequest, n: int) -> list:
    """Send `request` through `gate` from `n` threads released together at one barrier. Each outcome: the
    answer's status, 'used' (the token had bought already) or 'revoked' (denied: its holder left)."""
    start = threading.Barrier(n)
    outcomes = []

    def buy() -> None:
        start.wait()
        try:
            outcomes.append(gate.purchase(request).status)
        except EntryTokenUsed:
            outcomes.append("used")
        except QueueBypassDenied:
            outcomes.append("revoked")

    threads = [threading.Thread(target=buy) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes
