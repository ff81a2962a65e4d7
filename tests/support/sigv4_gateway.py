"""A stand-in for API Gateway's IAM authorization in front of the local stack: every request must carry a valid
SigV4 signature (service execute-api) of the one known key pair, made over what arrived on the wire (method,
path, query, the signed headers, the body), else 403 with API Gateway's `{"message": ...}`; valid ones are
forwarded to the local API unchanged. Lets the tests sign as the CLI does deployed, with nothing deployed."""

from __future__ import annotations

import datetime
import hmac
import re
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

ACCESS_KEY = "AKIAVQTESTOPERATOR01"
SECRET_KEY = "operator-secret-key-for-the-local-gateway-0123"
REGION = "eu-west-1"
_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request, "
    r"SignedHeaders=(?P<signed>[a-z0-9;-]+), Signature=(?P<signature>[0-9a-f]{64})"
)
MAX_SKEW = datetime.timedelta(minutes=5)


class SigV4Gateway:
    """Serves on 127.0.0.1 (a free port) until `close`; `requests` lists (method, path, verdict) of each."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.requests: list[tuple[str, str, str]] = []
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                gateway.handle(self)

            do_PUT = do_PATCH = do_POST = do_DELETE = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        refusal = self.refusal(request, body)
        self.requests.append((request.command, request.path, refusal or "signed"))
        if refusal:
            return _answer(request, 403, {"Content-Type": "application/json"}, b'{"message": "%s"}' % refusal.encode())
        forwarded = {k: v for k, v in request.headers.items() if not k.lower().startswith(("x-amz-", "authorization"))}
        upstream = urllib.request.Request(
            self.upstream + request.path, data=body or None, method=request.command, headers=forwarded
        )
        try:
            with urllib.request.urlopen(upstream, timeout=10) as answer:
                status, headers, raw = answer.status, answer.headers, answer.read()
        except urllib.error.HTTPError as answer:
            status, headers, raw = answer.code, answer.headers, answer.read()
        kept = {
            k: v for k, v in headers.items() if k.lower() not in ("transfer-encoding", "connection", "content-length")
        }
        _answer(request, status, kept, raw)

    def refusal(self, request: BaseHTTPRequestHandler, body: bytes) -> str | None:
        """Why the request's signature is not valid (API Gateway's words), or None."""
        match = _AUTHORIZATION.fullmatch(request.headers.get("Authorization") or "")
        if not match:
            return "Missing Authentication Token"
        if (match["key"], match["region"], match["service"]) != (ACCESS_KEY, REGION, "execute-api"):
            return "The security token included in the request is invalid."
        stamp = request.headers.get("X-Amz-Date") or ""
        try:
            when = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
        except ValueError:
            return "Signature expired or malformed X-Amz-Date"
        if abs(datetime.datetime.now(datetime.UTC) - when) > MAX_SKEW or stamp[:8] != match["date"]:
            return "Signature expired"
        signed = match["signed"].split(";")
        if "host" not in signed:
            return "The request signature must sign the Host header"
        # The signature of exactly what arrived, by SigV4's own steps (botocore's), with the known secret.
        received = AWSRequest(
            method=request.command,
            url=f"http://{request.headers['Host']}{request.path}",
            data=body,
            headers={name: request.headers[name] for name in signed if request.headers.get(name) is not None},
        )
        received.context["timestamp"] = stamp
        signer = SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "execute-api", REGION)
        expected = signer.signature(signer.string_to_sign(received, signer.canonical_request(received)), received)
        if not hmac.compare_digest(expected, match["signature"]):
            return "The request signature we calculated does not match the signature you provided."
        return None


def _answer(request: BaseHTTPRequestHandler, status: int, headers, body: bytes) -> None:
    request.send_response(status)
    for name, value in dict(headers).items():
        request.send_header(name, value)
    request.send_header("Content-Length", str(len(body)))
    request.end_headers()
    request.wfile.write(body)
