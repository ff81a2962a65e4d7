"""The operator CLI (`vq`, infra/vq/) against a running local API: every command, the API's refusals printed
with their code and detail and a non-zero exit, SigV4 signing through a gateway that checks signatures as API
Gateway's IAM authorization does, and the console's signing proxy refusing what is not the console's."""

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from infra.vq import cli
from infra.vq.client import OperatorApi, signing_region
from infra.vq.console_proxy import console_proxy
from tests.support import sigv4_gateway
from tests.support.browser import http
from tests.support.sigv4_gateway import SigV4Gateway

pytestmark = pytest.mark.slow  # the local stack in its own processes


def vq(stack_or_url, *args, capsys):
    """Run `vq --api URL ARGS...` in this process: (exit status, stdout, stderr)."""
    url = stack_or_url if isinstance(stack_or_url, str) else stack_or_url.url
    status = cli.main(["--api", url, *args])
    out, err = capsys.readouterr()
    return status, out, err


def own_config(stack, target_id):
    return http("GET", stack.queue(target_id, "/config"))[1]["config"]


def test_the_installed_console_script_runs_the_cli(stack, target_id):
    # The same step that `make run` and `make test` use installs it into the virtualenv (pyproject's scripts).
    script = Path(sys.executable).parent / "vq"
    assert script.exists(), "make installs the vq console script into the virtualenv"
    done = subprocess.run(
        [script, "--api", stack.url, "open", f"limited-drop/{target_id}", "--rate", "25/s"],
        capture_output=True,
        text=True,
        cwd="/",  # works from anywhere, not only the checkout
    )
    assert done.returncode == 0, done.stderr
    assert own_config(stack, target_id) == {"batch": 50, "tickMs": 2000}


def test_a_sale_steered_from_open_to_close_changes_only_what_each_command_names(stack, target_id, capsys):
    target = f"limited-drop/{target_id}"
    status, out, _ = vq(
        stack, "open", target, "--rate", "10/s", "--name", "Air 90", "--max-waiting", "500", "--shards", "2",
        capsys=capsys,
    )  # fmt: skip
    assert status == 0 and "opened" in out and "10/s (20 every 2000 ms)" in out
    assert vq(stack, "pause", target, capsys=capsys)[0] == 0
    assert own_config(stack, target_id) == {"batch": 20, "tickMs": 2000, "maxWaiting": 500, "shards": 2,
                                            "paused": True, "displayName": "Air 90"}  # fmt: skip
    assert vq(stack, "resume", target, capsys=capsys)[0] == 0
    assert "paused" not in own_config(stack, target_id)
    status, out, _ = vq(stack, "set", target, "rate=3000/min", "originSlo.p95Ms=800", "displayName=null", capsys=capsys)
    assert status == 0
    assert own_config(stack, target_id) == {"batch": 100, "tickMs": 2000, "maxWaiting": 500, "shards": 2,
                                            "originSlo": {"p95Ms": 800}}  # fmt: skip
    assert vq(stack, "sold-out", target, capsys=capsys)[0] == 0
    assert own_config(stack, target_id)["soldOut"] is True
    assert vq(stack, "sold-out", target, "--clear", capsys=capsys)[0] == 0
    assert vq(stack, "close", target, capsys=capsys)[0] == 0
    assert "closesAt" in own_config(stack, target_id)

    status, out, _ = vq(stack, "show", target, capsys=capsys)
    assert status == 0 and "closesAt" in out and 'version "' in out
    status, out, _ = vq(stack, "show", target, "--json", capsys=capsys)
    assert json.loads(out)["config"]["maxWaiting"] == 500


def test_stats_watch_and_targets_show_a_live_line(stack, target_id, capsys):
    target = f"limited-drop/{target_id}"
    stack.configure(target_id, batch=1, tickMs=1000)
    for user in (1, 2, 3):
        stack.enter(target_id, user)
    stack.tick(target_id)
    status, out, _ = vq(stack, "stats", target, capsys=capsys)
    assert status == 0
    assert f"{target}  admitting" in out and "2 waiting" in out and "admitted     1; 0 passed through;" in out
    assert "ETA          none measured yet" in out  # the admitted user has not polled since
    status, out, _ = vq(stack, "stats", target, "--json", capsys=capsys)
    assert json.loads(out)["waitingCount"] == 2
    status, out, _ = vq(stack, "watch", target, "--count", "2", "--interval", "0.2", capsys=capsys)
    assert status == 0 and out.count(f"vq watch {target}") == 2 and "admitted/s" in out
    status, out, _ = vq(stack, "targets", capsys=capsys)
    assert status == 0 and target in out.split()


def test_open_with_the_safety_net_lets_newcomers_through_and_stats_say_so(stack, target_id, capsys):
    target = f"limited-drop/{target_id}"
    assert vq(stack, "open", target, "--rate", "1/s", "--safety-net", capsys=capsys)[0] == 0
    assert own_config(stack, target_id) == {"batch": 2, "tickMs": 2000, "safetyNet": True}
    status, out, _ = vq(stack, "stats", target, capsys=capsys)
    assert status == 0 and f"{target}  idle: nobody in line  safety net: passing through" in out
    assert stack.enter(target_id, 1)["queued"] is False
    status, out, _ = vq(stack, "stats", target, capsys=capsys)
    assert "1 passed through" in out


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("pause", "limited-drop/{other}"), "UNKNOWN_TARGET"),
        (("set", "limited-drop/{id}", "batch=0"), "INVALID_ARGUMENT"),
        (("set", "limited-drop/{id}", "colour=red"), "INVALID_ARGUMENT"),
        (("set", "limited-drop/{id}", "paused=true", "--if-match", '"' + "0" * 40 + '"'), "CONFIG_CHANGED"),
        (("open", "limited-drop/{id}"), "CONFIG_CHANGED"),
        (("stats", "no-such-type/{id}"), "UNKNOWN_TARGET_TYPE"),
    ],
)
def test_a_refusal_prints_the_apis_code_and_detail_and_exits_non_zero(stack, target_id, capsys, args, code):
    stack.configure(target_id, batch=5)
    args = [a.format(id=target_id, other=target_id + 500_000) for a in args]
    status, out, err = vq(stack, *args, capsys=capsys)
    assert status == 1, out
    assert err.startswith(f"vq: {code}: ") and len(err.strip()) > len(f"vq: {code}: ")
    assert own_config(stack, target_id) == {"batch": 5}


def test_no_answer_is_exit_3(capsys):
    status, _, err = vq("http://127.0.0.1:9", "targets", capsys=capsys)
    assert status == 3 and "UNREACHABLE" in err


def test_an_execute_api_url_names_the_region_to_sign_for():
    assert signing_region("https://a1b2c3.execute-api.eu-west-1.amazonaws.com/api") == "eu-west-1"
    assert signing_region("https://a1b2c3-vpce-0abc.execute-api.ap-northeast-2.vpce.amazonaws.com/api") == (
        "ap-northeast-2"
    )
    assert signing_region("http://127.0.0.1:8000") is None
    assert signing_region("https://queue.shop.example/api", "us-east-1") == "us-east-1"


@pytest.fixture
def gateway(stack):
    served = SigV4Gateway(stack.url)
    yield served
    served.close()


@pytest.fixture
def operator_credentials(monkeypatch, tmp_path):
    """The gateway's key pair as the standard credential chain finds it (the environment), and nothing else."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", sigv4_gateway.ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", sigv4_gateway.SECRET_KEY)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)


def test_signed_requests_pass_an_iam_style_gateway_and_unsigned_or_forged_ones_do_not(
    stack, target_id, gateway, operator_credentials, capsys, monkeypatch
):
    target = f"limited-drop/{target_id}"
    signed = ["--region", sigv4_gateway.REGION]
    assert vq(gateway.url, *signed, "open", target, "--batch", "4", "--tick-ms", "1000", capsys=capsys)[0] == 0
    status, out, err = vq(gateway.url, *signed, "set", target, "displayName=한정판 ✓", capsys=capsys)
    assert status == 0, err
    assert own_config(stack, target_id) == {"batch": 4, "tickMs": 1000, "displayName": "한정판 ✓"}
    assert vq(gateway.url, *signed, "stats", target, capsys=capsys)[0] == 0
    assert {verdict for _, _, verdict in gateway.requests} == {"signed"}

    status, _, err = vq(gateway.url, "pause", target, capsys=capsys)  # not signed: no region, not execute-api
    assert status == 1 and "HTTP_403: Missing Authentication Token" in err
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-operators-secret")
    status, _, err = vq(gateway.url, *signed, "pause", target, capsys=capsys)
    assert status == 1 and "signature we calculated does not match" in err
    assert "paused" not in own_config(stack, target_id)


def test_without_credentials_a_signed_api_says_how_to_get_them(operator_credentials, monkeypatch, capsys):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    status, _, err = vq("https://a1b2c3.execute-api.eu-west-1.amazonaws.com/api", "targets", capsys=capsys)
    assert status == 3 and "NO_CREDENTIALS" in err and "AWS_PROFILE" in err


def test_the_console_proxy_forwards_only_the_consoles_requests_and_only_from_its_own_address(
    stack, gateway, operator_credentials, target_id
):
    stack.configure(target_id, batch=5)
    proxy = console_proxy(OperatorApi(gateway.url, region=sigv4_gateway.REGION))
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{proxy.server_address[1]}"
    try:
        # The printed address trades its key for a cookie; without the cookie, nothing is forwarded.
        assert fetch(f"{base}/console")[0] == 403
        status, headers, _ = fetch(f"{base}/console?key={proxy.key}&watch=limited-drop/{target_id}")
        assert status == 303 and headers["Location"] == f"/console?watch=limited-drop/{target_id}"
        cookie = headers["Set-Cookie"].split(";")[0]
        assert "HttpOnly" in headers["Set-Cookie"] and "SameSite=Strict" in headers["Set-Cookie"]
        status, _, page = fetch(f"{base}/console", {"Cookie": cookie})
        assert status == 200 and b"operator console" in page
        status, headers, body = fetch(
            f"{base}/virtual-queues/limited-drop/{target_id}/config",
            {"Cookie": cookie, "Content-Type": "application/merge-patch+json"},
            method="PATCH",
            body=b'{"paused": true}',
        )
        assert status == 200 and json.loads(body)["config"] == {"batch": 5, "paused": True} and headers["ETag"]
        # Not the console's requests, not its Host, not its Origin: refused, nothing reaches the API.
        before = len(gateway.requests)
        assert (
            fetch(f"{base}/limited-drops/{target_id}/orders", {"Cookie": cookie}, method="POST", body=b"{}")[0] == 404
        )
        assert fetch(f"{base}/console", {"Cookie": cookie, "Host": "evil.example"})[0] == 403
        patch_from_elsewhere = {"Cookie": cookie, "Origin": "https://evil.example", "Content-Type": "application/json"}
        url = f"{base}/virtual-queues/limited-drop/{target_id}/config"
        assert fetch(url, patch_from_elsewhere, method="PATCH", body=b'{"soldOut": true}')[0] == 403
        assert len(gateway.requests) == before
    finally:
        proxy.shutdown()
        proxy.server_close()


def test_the_console_proxy_s_key_buys_one_random_session_and_is_spent(stack, gateway, operator_credentials):
    proxy = console_proxy(OperatorApi(gateway.url, region=sigv4_gateway.REGION))
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{proxy.server_address[1]}"
    try:
        status, headers, _ = fetch(f"{base}/console?key={proxy.key}")
        assert status == 303
        cookie = headers["Set-Cookie"].split(";")[0]
        assert cookie.startswith("vq_console=") and proxy.key not in cookie  # a session of its own, not the key
        # The key a second time (a copied address, a browser's history): refused, and it starts no session.
        status, headers, _ = fetch(f"{base}/console?key={proxy.key}")
        assert status == 403 and "Set-Cookie" not in headers
        assert fetch(f"{base}/console", {"Cookie": f"vq_console={proxy.key}"})[0] == 403  # the key is no cookie
        assert fetch(f"{base}/console", {"Cookie": cookie})[0] == 200
    finally:
        proxy.shutdown()
        proxy.server_close()


def fetch(url, headers=None, method="GET", body=None):
    """(status, headers, body) without following redirects."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, data=body, method=method, headers=headers or {}), timeout=10) as a:
            return a.status, dict(a.headers.items()), a.read()
    except urllib.error.HTTPError as answer:
        return answer.code, dict(answer.headers.items()), answer.read()
