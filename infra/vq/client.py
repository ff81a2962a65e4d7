"""The operator routes over HTTP: SigV4-signed (botocore, the standard AWS credential chain) against an API
Gateway `execute-api` URL or when a region is given, plain against `make run`."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

# https://{api-id}.execute-api.{region}.amazonaws.com (a private API: ...execute-api.{region}.vpce.amazonaws.com)
_EXECUTE_API = re.compile(r"\.execute-api\.([a-z0-9-]+)\.(?:vpce\.)?amazonaws\.com(?:\.cn)?$")
TIMEOUT_S = 10


class ApiError(Exception):
    """The API refused (its `code` and `detail`), or could not be reached (`status` 0)."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"{code}: {detail}")
        self.status, self.code, self.detail = status, code, detail
        self.headers = headers or {}


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: Any  # the answer's JSON


def signing_region(url: str, region: str | None = None) -> str | None:
    """The region to sign requests to `url` for: `region` if given, else the one an execute-api host names."""
    if region:
        return region
    match = _EXECUTE_API.search(urlsplit(url).hostname or "")
    return match[1] if match else None


@dataclass
class OperatorApi:
    """One API's operator routes at `base` (the stage's URL, e.g. https://x.execute-api.eu-west-1.amazonaws.com/api,
    or http://127.0.0.1:8000)."""

    base: str
    region: str | None = None  # forces SigV4 for this region (a custom domain); else taken from an execute-api URL
    _credentials: object = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.base = self.base.rstrip("/")
        if not re.match(r"https?://[^/]+", self.base):
            raise ApiError(0, "BAD_API_URL", f"--api must be an http(s) URL, not {self.base!r}")
        self.region = signing_region(self.base, self.region)

    @property
    def signs(self) -> bool:
        return self.region is not None

    def target_path(self, target: str, what: str) -> str:
        queue_type, _, target_id = target.partition("/")
        return f"/virtual-queues/{quote(queue_type, safe='')}/{quote(target_id, safe='')}/{what}"

    def call(self, method: str, path: str, body: object = None, headers: dict[str, str] | None = None) -> Answer:
        """The API's answer to one request; ApiError for a refusal (4xx/5xx) or no answer."""
        data = None if body is None else json.dumps(body).encode()
        sent = {"Accept": "application/json", **(headers or {})}
        if data is not None:
            sent.setdefault("Content-Type", "application/json")
        status, answered, raw = self.send(method, self.base + path, sent, data)
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        if status >= 400:
            code, detail = _refusal(status, parsed)
            raise ApiError(status, code, detail, answered)
        return Answer(status, answered, parsed)

    def send(self, method: str, url: str, headers: dict[str, str], data: bytes | None) -> tuple[int, dict, bytes]:
        """(status, headers, body) of one request, signed if this API signs; ApiError(0) if nothing answered."""
        if self.signs:
            headers = self.sign(method, url, headers, data)
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                return answer.status, dict(answer.headers.items()), answer.read()
        except urllib.error.HTTPError as answer:
            return answer.code, dict(answer.headers.items()), answer.read()
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise ApiError(0, "UNREACHABLE", f"no answer from {url}: {reason}") from None

    def sign(self, method: str, url: str, headers: dict[str, str], data: bytes | None) -> dict[str, str]:
        """`headers` with SigV4's for API Gateway (service execute-api), from the standard credential chain:
        environment, AWS_PROFILE and ~/.aws (SSO too), the container's or instance's role."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        assert self.region is not None  # only an API that signs signs
        request = AWSRequest(method=method, url=url, data=data or b"", headers=headers)
        SigV4Auth(self.credentials(), "execute-api", self.region).add_auth(request)
        return dict(request.headers.items())

    def credentials(self):
        """Frozen credentials of the standard chain, looked up once (refreshed by botocore when they expire)."""
        if self._credentials is None:
            import botocore.session

            self._credentials = botocore.session.Session().get_credentials()
            if self._credentials is None:
                raise ApiError(
                    0,
                    "NO_CREDENTIALS",
                    "the API is IAM-protected and no AWS credentials were found: "
                    "set AWS_PROFILE (aws sso login), or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
                )
        return self._credentials.get_frozen_credentials()


def _refusal(status: int, body: object) -> tuple[str, str]:
    """The code and detail of a refusal: the queue's {"code", "detail"}, API Gateway's {"message"}, or the status."""
    if isinstance(body, dict):
        if "code" in body:
            return str(body["code"]), str(body.get("detail", ""))
        if "message" in body or "Message" in body:  # API Gateway's own refusals (IAM, throttling)
            return f"HTTP_{status}", str(body.get("message") or body.get("Message"))
    return f"HTTP_{status}", str(body or "")[:200]
