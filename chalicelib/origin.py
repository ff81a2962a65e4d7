"""The downstream purchase API (the origin): one POST, passed on as it is, with a short timeout.

The exactly-once contract with origins (docs/shops.md): every forwarded purchase carries `Idempotency-Key` naming
the entry token's id; the same key may arrive again (a retry after a timeout or a 5xx) and must get the first
outcome again, never a second order. An origin that did not take an order and kept nothing under its key may say so
with `X-Queue-Not-Taken: true` on a non-2xx answer: the entry token is then given back.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from dataclasses import dataclass

from chalicelib.errors import OriginUnavailable

NOT_TAKEN_HEADER = "X-Queue-Not-Taken"
# An origin's word, on any answer to a purchase, that its stock ran out: the target is marked sold out.
SOLD_OUT_HEADER = "X-Queue-Sold-Out"


@dataclass(frozen=True)
class OriginAnswer:
    """What the downstream answered, to be handed back to the client unchanged."""

    status: int
    body: bytes
    content_type: str | None
    # The origin says it did not take the order (a non-2xx answer with X-Queue-Not-Taken: true).
    not_taken: bool = False
    sold_out: bool = False  # the origin said X-Queue-Sold-Out: true

    @property
    def text(self) -> str:
        # Purchase APIs answer JSON; anything undecodable is passed on readable rather than refused.
        return self.body.decode("utf-8", "replace")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # urllib would replay a redirected POST as a GET without its body; the client gets the 3xx instead.
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def forward(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> OriginAnswer:
    """POST `body` with `headers` to `url` and return the answer, whatever its status.

    Raises OriginUnavailable when no answer came: timed out (504) or unreachable (502), with `sent` telling
    whether the origin may have received the whole request (and so may have taken the order).
    """
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        try:
            response = _opener.open(request, timeout=timeout_s)
        except urllib.error.HTTPError as answer:
            # 3xx, 4xx and 5xx arrive as HTTPError; they are answers all the same.
            response = answer
        with response:
            status, text = response.status, response.read()
    except urllib.error.URLError as err:
        # urllib raises URLError only while connecting or sending: the origin never had the whole request.
        raise OriginUnavailable(
            "the purchase service could not be reached; try again", _timed_out(err), sent=False
        ) from None
    except (OSError, http.client.HTTPException) as err:
        raise OriginUnavailable("the purchase service did not answer; try again", _timed_out(err), sent=True) from None
    not_taken = not 200 <= status < 300 and (response.headers.get(NOT_TAKEN_HEADER) or "").strip().lower() == "true"
    sold_out = (response.headers.get(SOLD_OUT_HEADER) or "").strip().lower() == "true"
    return OriginAnswer(status, text, response.headers.get("Content-Type"), not_taken, sold_out)


def idempotency_key(token_id: str, as_string: bool = True) -> str:
    """The `Idempotency-Key` header naming `token_id`: the IETF draft's (draft-ietf-httpapi-idempotency-key-header)
    structured-field String, `"<id>"`, or with VQ_IDEMPOTENCY_KEY_FORMAT=bare the id alone. A token id is base16,
    so the String needs no escapes."""
    return f'"{token_id}"' if as_string else token_id


def _timed_out(err: BaseException) -> bool:
    return isinstance(err, TimeoutError) or isinstance(getattr(err, "reason", None), TimeoutError)
