"""The opening draw: everyone in the pre-queue stands in line in a uniformly random order, fixed before they entered.

Each pre-queued user's seq is drawn as they enter (lua/enter.lua), from a 256-bit seed drawn with `secrets` when an
opensAt is configured (commit-reveal, docs/guarantees.md#the-opening-draw): the HMAC-SHA1 of the user id keyed with
the seed's text, its first 52 bits as a fraction of the pre-queue's block of seqs, which the first entry fixes above
every seq handed out before and the counter jumps over, so the whole pre-queue stands ahead of everyone who enters
after the opening. Only the seed's commitment, the SHA-256 of its text, is published until the opening, then the
seed: nobody could choose it after seeing who entered, and anyone given it can recompute every place with
`drawn_seq`. The opening itself only makes the pre-queue the line (lua/admit.lua), whatever its size.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable

FRACTION_BITS = 52  # of the HMAC: the most a Lua number (a double) holds exactly


def new_seed() -> tuple[str, str]:
    """A fresh seed (64 lowercase hex digits: its published text) and its commitment."""
    seed = secrets.token_hex(32)
    return seed, commitment(seed)


def commitment(seed: str) -> str:
    """The commitment to a seed: lowercase hex of the SHA-256 of its published text, UTF-8."""
    return hashlib.sha256(seed.encode("utf-8")).hexdigest()


def drawn_seq(seed: str, user_id: str, first: int, last: int) -> int:
    """The seq the draw gives `user_id` in the block first..last: the same arithmetic as enter.lua's, in doubles."""
    digest = hmac.new(seed.encode(), user_id.encode(), hashlib.sha1).hexdigest()
    fraction = int(digest[: FRACTION_BITS // 4], 16) / 2**FRACTION_BITS
    return first + int(fraction * float(last - first + 1))


def draw_order(seed: str, users: Iterable[str], first: int, last: int) -> list[tuple[str, int]]:
    """(user id, seq) for each user, in line order: by drawn seq, then by user id (as Redis orders equal seqs)."""
    drawn = ((user, drawn_seq(seed, user, first, last)) for user in users)
    return sorted(drawn, key=lambda placed: (placed[1], placed[0].encode()))
