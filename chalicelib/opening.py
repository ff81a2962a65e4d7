"""The opening draw: at opensAt, everyone in the pre-queue gets a place in line in a uniformly random order.

The order is HMAC-SHA256(seed, user id), ascending, with a 256-bit seed from `secrets` drawn when an opensAt is
configured (commit-reveal, docs/guarantees.md#the-opening-draw): only its commitment, the SHA-256 of its text, is
published until the draw, then the seed. Nobody can predict the order before the opening, the seed was fixed
before anyone entered the pre-queue, and anyone given the seed and the pre-queue can check the order
afterwards. The drawn users take the arrival numbers the pre-queue handed out (a block of seqs nobody else
holds), so they all land ahead of everyone who entered after the opening.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence

from chalicelib.observability import logger
from chalicelib.store import QueueStore
from chalicelib.targets import Target

PLACEMENTS_PER_CALL = 1000  # bounds how long one script holds Redis


def new_seed() -> tuple[str, str]:
    """A fresh seed (64 lowercase hex digits: its published text) and its commitment."""
    seed = secrets.token_hex(32)
    return seed, commitment(seed)


def commitment(seed: str) -> str:
    """The commitment to a seed: lowercase hex of the SHA-256 of its published text, UTF-8."""
    return hashlib.sha256(seed.encode("utf-8")).hexdigest()


def draw_order(seed: bytes, entrants: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """(user id, seq) for each (user id, arrival number) entrant: the arrival numbers, dealt in the seed's order."""
    numbers = sorted(number for _, number in entrants)
    shuffled = sorted(
        (user for user, _ in entrants), key=lambda user: hmac.new(seed, user.encode(), hashlib.sha256).digest()
    )
    return list(zip(shuffled, numbers, strict=True))


def open_target(store: QueueStore, target: Target, now_ms: int) -> int:
    """Place the target's pre-queue in line by the draw; returns how many were placed.

    Safe to repeat or to run twice at once: a draw that was begun keeps its seed, so every run deals the
    same order, and placing a user is idempotent. The draw uses the seed committed when the opening was
    configured (a fresh one only for a target configured before seeds were committed).
    """
    seed, done = store.begin_draw(target, new_seed()[0])
    if done:
        return 0
    placements = draw_order(bytes.fromhex(seed), store.pre_queue(target))
    for start in range(0, len(placements), PLACEMENTS_PER_CALL):
        store.place_drawn(target, placements[start : start + PLACEMENTS_PER_CALL], now_ms)
    store.finish_draw(target, len(placements), now_ms)
    # The seed is published once it can no longer help anyone: the draw is done.
    logger.info("opening draw", extra={"target": str(target), "seed": seed, "placed": len(placements)})
    return len(placements)
