"""What a request body may be: the one check of a request's Content-Type, for every route that reads a body.

Chalice's own check is loose (it takes any `;` or `,` separated part of the header, so `text/plain;application/json`
passes, and a missing header counts as JSON) and answers in a shape of its own. app.py switches it off; the routes
that read a body call `require` before anything changes, and answer `{"code", "detail"}` like every refusal.
"""

from __future__ import annotations

import re

from chalicelib.errors import InvalidArgument, UnsupportedMediaType

JSON = ("application/json",)
# JSON Merge Patch (RFC 7396) names its own media type; a PATCH takes plain JSON too.
MERGE_PATCH = ("application/merge-patch+json", "application/json")

# A media type as RFC 9110 spells it: `type/subtype` and `; name=value` parameters (a token or a quoted string),
# in visible ASCII (http.client refuses anything else: a purchase's is forwarded to the shop).
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_MEDIA_TYPE = re.compile(
    rf"[ \t]*(?P<type>{_TOKEN})/(?P<subtype>{_TOKEN})"
    rf"(?:[ \t]*;[ \t]*{_TOKEN}=(?:{_TOKEN}|\"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\[\x20-\x7e])*\"))*[ \t]*"
)
MAX_CONTENT_TYPE = 255


def require(content_type: str | None, accepted: tuple[str, ...] = JSON) -> None:
    """Refuse a body whose `content_type` is not one of `accepted` (parameters aside, letter case ignored):
    UnsupportedMediaType when it is missing or another type, InvalidArgument unless it is one well-formed media
    type of at most MAX_CONTENT_TYPE visible ASCII characters (a list such as `text/plain;application/json` is not)."""
    names = " or ".join(accepted)
    if content_type is None:
        raise UnsupportedMediaType(f"the body must be {names}, and say so in Content-Type")
    match = _MEDIA_TYPE.fullmatch(content_type) if len(content_type) <= MAX_CONTENT_TYPE else None
    if match is None:
        raise InvalidArgument(
            f"Content-Type must be one media type of at most {MAX_CONTENT_TYPE} visible ASCII characters"
        )
    if f"{match['type']}/{match['subtype']}".lower() not in accepted:
        raise UnsupportedMediaType(f"the body must be {names}")
