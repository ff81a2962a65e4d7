"""The downstream purchase API (the origin): one POST, passed on as it is, with a short timeout."""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from dataclasses import dataclass

from chalicelib.errors import OriginUnavailable


@dataclass(frozen=True)
class OriginAnswer:
    """What the downstream answered, to be handed back to the client unchanged."""

    status: int
    body: bytes
    content_type: str | None

    @property
    def text(self) -> str:
        # Purchase APIs answer JSON; anything undecodable is passed on readable rather than refused.
        return self.body.decode("utf-8", "replace")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # urllib would replay a redirected POST as a GET without its body; the client gets the 3xx instead.
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def forward(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> OriginAnswer:
    """POST `body` with `headers` to `url` and return the answer, whatever its status.

    Raises OriginUnavailable when no answer came: timed out (504) or unreachable (502).
    """
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        try:
            response = _opener.open(request, timeout=timeout_s)
        except urllib.error.HTTPError as answer:
            # 3xx, 4xx and 5xx arrive as HTTPError; they are answers all the same.
            response = answer
        with response:
            return OriginAnswer(response.status, response.read(), response.headers.get("Content-Type"))
    except (OSError, http.client.HTTPException) as err:
        timed_out = isinstance(err, TimeoutError) or isinstance(getattr(err, "reason", None), TimeoutError)
        raise OriginUnavailable("the purchase service did not answer; try again", timed_out) from None
