"""Buying with one entry token from many threads at once: what exactly-once purchase tests race."""

import threading

from chalicelib.errors import EntryTokenUsed, QueueBypassDenied
from chalicelib.purchase import PurchaseGate, PurchaseRequest


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
