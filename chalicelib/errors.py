"""Answers the waiting room gives instead of a result, each with its HTTP status and stable code."""

from __future__ import annotations


class QueueError(Exception):
    """A refusal the client can act on: bad input, no place in line, a bad ticket."""

    status = 400
    code = "INVALID_ARGUMENT"

    def __init__(self, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}

    def body(self) -> dict[str, str]:
        return {"code": self.code, "detail": self.detail}


class InvalidArgument(QueueError):
    pass


class UnknownTargetType(QueueError):
    status = 404
    code = "UNKNOWN_TARGET_TYPE"


class UnknownTarget(QueueError):
    """No operator opened this target (and VQ_TARGETS_OPEN_ON_FIRST_USE is off): nothing was written for it."""

    status = 404
    code = "UNKNOWN_TARGET"


class InvalidQueueTicket(QueueError):
    status = 403
    code = "INVALID_QUEUE_TICKET"


class NotInQueue(QueueError):
    status = 404
    code = "NOT_IN_QUEUE"


class QueueFull(QueueError):
    status = 429
    code = "QUEUE_FULL"

    def __init__(self, retry_after_s: int) -> None:
        super().__init__("the line is full; try again later", {"Retry-After": str(retry_after_s)})


class AlreadyAdmitted(QueueError):
    """Header mode: the caller's id was admitted already, and its entry token goes only to the ticket's holder."""

    status = 409
    code = "ALREADY_ADMITTED"


class QueueBypassDenied(QueueError):
    status = 403
    code = "QUEUE_BYPASS_DENIED"


class EntryTokenUsed(QueueError):
    status = 403
    code = "ENTRY_TOKEN_USED"


class OriginNotConfigured(QueueError):
    status = 503
    code = "ORIGIN_NOT_CONFIGURED"


class OriginUnavailable(QueueError):
    """The downstream did not answer: 504 when it timed out, 502 when it could not be reached. `sent`: the
    downstream may have received the whole request (and taken the order)."""

    code = "ORIGIN_UNAVAILABLE"

    def __init__(self, detail: str, timed_out: bool, sent: bool = True) -> None:
        super().__init__(detail)
        self.status = 504 if timed_out else 502
        self.sent = sent


class QueueUnavailable(QueueError):
    """Queue state cannot be reached and the operator chose fail-closed (or the call cannot fail open)."""

    status = 503
    code = "QUEUE_UNAVAILABLE"

    def __init__(self, retry_after_s: int) -> None:
        super().__init__("the waiting room is briefly unavailable; try again", {"Retry-After": str(retry_after_s)})


class LineNotPublished(QueueError):
    """A known target's line the pump has not written yet (no tick since its first user): poll your place."""

    status = 503
    code = "LINE_NOT_PUBLISHED"

    def __init__(self) -> None:
        super().__init__("the line has no public state yet; poll your place", {"Retry-After": "1"})


class SigningKeysUnavailable(QueueUnavailable):
    """The signing keys could not be read (a cold start with Secrets Manager out of reach, or a malformed secret):
    nothing can be signed or verified. The first request after Retry-After reads them again."""


class QueueClosed(QueueError):
    """The target is past its closesAt: nobody new gets in line."""

    status = 409
    code = "QUEUE_CLOSED"


class QueueSoldOut(QueueError):
    """The target is sold out (its operator or its shop said so): nobody new gets in line."""

    status = 409
    code = "SOLD_OUT"


class Unauthenticated(QueueError):
    """No verified caller (VQ_IDENTITY=jwt): the bearer JWT is missing, malformed, expired, or not the shop's."""

    status = 401
    code = "UNAUTHENTICATED"

    def __init__(self, detail: str, invalid_token: bool = True) -> None:
        # RFC 6750: a request that sent no token gets the scheme alone; a refused token, the error too.
        challenge = 'Bearer realm="virtual-queue"' + (', error="invalid_token"' if invalid_token else "")
        super().__init__(detail, {"WWW-Authenticate": challenge})


class QueueInviteOnly(QueueError):
    """The target is invite-only and the caller's verified invites do not name it."""

    status = 403
    code = "NOT_INVITED"


class PayloadTooLarge(QueueError):
    status = 413
    code = "PAYLOAD_TOO_LARGE"


class UnsupportedMediaType(QueueError):
    status = 415
    code = "UNSUPPORTED_MEDIA_TYPE"


class MethodNotAllowed(QueueError):
    """A method the route does not take (locally; deployed, API Gateway refuses it before the function runs)."""

    status = 405
    code = "METHOD_NOT_ALLOWED"


# Chalice's own refusals, answered before any route runs as {"Code", "Message"}, by their Code. (Its 415 never
# comes: the routes check Content-Type themselves, chalicelib/media_types.py.)
_CHALICE_REFUSALS: dict[str, type[QueueError]] = {
    "MethodNotAllowedError": MethodNotAllowed,
}


def chalice_refusal(body: object) -> QueueError | None:
    """The error of the API's own shape for a body Chalice answered itself (405), else None."""
    if not isinstance(body, dict):
        return None
    error = _CHALICE_REFUSALS.get(body.get("Code"))  # type: ignore[arg-type]
    return None if error is None else error(str(body.get("Message", "")))


class ShardsInUse(QueueError):
    """A write changes the target's count of sub-lines while someone waits, is pre-queued or holds a live entry
    token: a user's sub-line follows from the count, so their place or token would be stranded (docs/sharding.md)."""

    status = 409
    code = "SHARDS_IN_USE"


class ConfigChanged(QueueError):
    """An operator's write expected another version of the target's configuration (If-Match, If-None-Match), or
    (409) others kept changing it while a PATCH was merged. Nothing was written; `ETag` names the version now."""

    status = 412
    code = "CONFIG_CHANGED"

    def __init__(self, detail: str, etag: str | None, status: int = 412) -> None:
        super().__init__(detail, {"ETag": f'"{etag}"'} if etag else None)
        self.status = status
