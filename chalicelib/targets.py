"""What a client may name: a target (type and id) and a user id. Strict: anything else is refused."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeGuard

from chalicelib.errors import InvalidArgument, UnknownTargetType

_PATH_PARAMETER = re.compile(r"\{(\w+)\}")
# As routes, key names (queue_keys.py) and the events' schema spell a type.
_TYPE_NAME = re.compile(r"[a-z]+(-[a-z]+)*")


@dataclass(frozen=True)
class TargetType:
    """A kind of sale the queue guards. Everything that differs between kinds is here: the routes, the gate, the
    downstreams, the token format, the pages, the local stack and the load test derive from TARGET_TYPES, and the
    OpenAPI spec and the events' schema are written from it (`python -m infra.target_types`), so a new kind is one
    entry below (docs/architecture.md#target-types)."""

    name: str  # as the queue's routes spell it: /virtual-queues/{name}/{targetId}/...
    purchase_path: str  # the purchase route the gate guards, with the target id as its one parameter
    origin_variable: str  # the environment variable naming the downstream that serves `purchase_path`
    labels: Mapping[str, str]  # the waiting-room page's name of the kind, per language
    # The purchase route's operationId and summary in infra/openapi.yaml (default: purchase<Name>, and a summary
    # from the English label).
    operation_id: str = ""
    summary: str = ""

    def __post_init__(self) -> None:
        if not _TYPE_NAME.fullmatch(self.name):
            raise ValueError(f"{self.name!r}: a type's name is lower-case words joined by hyphens")
        if len(_PATH_PARAMETER.findall(self.purchase_path)) != 1:
            raise ValueError(f"{self.purchase_path} must have one parameter: the target id")

    @property
    def id_parameter(self) -> str:
        """The name of the target id's parameter in `purchase_path`."""
        return _PATH_PARAMETER.findall(self.purchase_path)[0]

    def purchase_path_of(self, target_id: int) -> str:
        """`purchase_path` with `target_id` in place, e.g. /limited-drops/42/orders."""
        return self.purchase_path.replace("{" + self.id_parameter + "}", str(target_id))


TARGET_TYPES: dict[str, TargetType] = {
    kind.name: kind
    for kind in (
        TargetType(
            name="limited-drop",
            purchase_path="/limited-drops/{drop_id}/orders",
            origin_variable="VQ_ORIGIN_LIMITED_DROP_URL",
            labels={"en": "Limited drop", "ko": "한정판 발매"},
            operation_id="orderLimitedDrop",
            summary="Order from a limited drop; forwarded once per entry token to the limited-drop downstream.",
        ),
        TargetType(
            name="ticketing-event",
            purchase_path="/events/{event_id}/seats/select",
            origin_variable="VQ_ORIGIN_TICKETING_URL",
            labels={"en": "Ticketed event", "ko": "티켓 예매"},
            operation_id="selectSeats",
            summary="Select seats of a ticketing event; forwarded once per entry token to the ticketing downstream.",
        ),
    )
}

# Positive integers as 1-18 ASCII digits: fits in a Redis score and a Lua number exactly.
_POSITIVE_ID = re.compile(r"[1-9][0-9]{0,17}")


@dataclass(frozen=True, order=True)
class Target:
    """One queue: a target of one of the TARGET_TYPES, e.g. limited drop 42."""

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


# User ids are opaque: 1 to 128 visible ASCII characters (printable, no space), so an OIDC subject such as
# `auth0|abc123` or a UUID works as it is. No space: HTTP trims a header's ends, and an id must survive the trip.
_USER_ID = re.compile(r"[\x21-\x7e]{1,128}")


def valid_user_id(text: object) -> TypeGuard[str]:
    """Whether `text` is a user id (docs/identity.md: user ids)."""
    return isinstance(text, str) and _USER_ID.fullmatch(text) is not None


def parse_user_id(text: str | None, what: str = "X-User-Id") -> str:
    """The user id `text` spells, or InvalidArgument naming `what` (the header it came from)."""
    if not valid_user_id(text):
        raise InvalidArgument(f"{what} must be 1 to 128 printable ASCII characters without spaces")
    return text
