"""What a client may name: a target (type and id) and a user id. Strict: anything else is refused."""

from __future__ import annotations

import re
from dataclasses import dataclass

from chalicelib.errors import InvalidArgument, UnknownTargetType

TARGET_TYPES = ("limited-drop", "ticketing-event")

# Positive integers as 1-18 ASCII digits: fits in a Redis score and a Lua number exactly.
_POSITIVE_ID = re.compile(r"[1-9][0-9]{0,17}")


@dataclass(frozen=True, order=True)
class Target:
    """One queue: a limited drop or a ticketing event."""

    type: str
    id: int

    def __str__(self) -> str:
        return f"{self.type}:{self.id}"


def parse_positive_id(text: str | None, what: str) -> int:
    """`text` as a positive integer, or InvalidArgument naming `what`."""
    if text is None or not _POSITIVE_ID.fullmatch(text):
        raise InvalidArgument(f"{what} must be a positive integer of 1 to 18 ASCII digits")
    return int(text)


def parse_target(type_: str, target_id: str) -> Target:
    """The target named by a route's `{type}` and `{targetId}`."""
    if type_ not in TARGET_TYPES:
        raise UnknownTargetType(f"unknown queue type; expected one of {', '.join(TARGET_TYPES)}")
    return Target(type_, parse_positive_id(target_id, "targetId"))


def parse_user_id(header: str | None) -> int:
    """The caller's user id from the `X-User-Id` header."""
    return parse_positive_id(header, "X-User-Id")
