"""The flash-sale simulator's 5,000-user burst: the shop is kept to the rate, nothing is oversold, and every
user who kept polling gets in or, once the shop sold out, is told so (infra/sim/simulate.py, run as `make simulate`
runs it)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from infra.local.stack import ROOT
from tests.support.edge_cache import require_nginx


@pytest.mark.slow
def test_5000_user_burst_keeps_the_shop_to_the_rate_and_never_oversells(env, prefix, tmp_path):
    command = [
        sys.executable,
        str(ROOT / "infra" / "sim" / "simulate.py"),
        "--users",
        "5000",
        "--out",
        str(tmp_path),
        "--key-prefix",
        prefix,
        "--no-progress",
    ]
    # The `env` fixture has put this test's Redis in os.environ: the simulator's stack uses it.
    run = subprocess.run(command, cwd=ROOT, env=os.environ, capture_output=True, text=True, timeout=300)
    assert (tmp_path / "report.json").exists(), run.stdout + run.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    shop, admissions, users = report["shop"], report["admissions"], report["users"]

    # 25 admitted every 500 ms: five seconds hold ten ticks' worth, the edge of one more, and the users admitted
    # in the second before who hear of it within the window.
    assert shop["max_per_window"] <= shop["allowed_per_window"] == 325, shop["per_second"]
    assert admissions["ticks_with_users_waiting"] > 0
    assert admissions["admitted_per_busy_tick"]["max"] == admissions["target_per_tick"]
    assert report["checks"]["admissions per tick never above the batch"]
    assert report["checks"]["a full batch every tick while users waited"]
    oversells = report["oversells"]
    assert (oversells["units_over_stock"], oversells["second_orders"], oversells["tokens_used_twice"]) == (0, 0, 0)
    assert report["oversells"]["double_clicks"] > 0  # the gate was tried, and held
    # The shop says sold out with its last unit: the users still in line hear it at their next poll.
    assert shop["orders"] == 3000 and users["outcomes"]["told sold out"] > 0
    assert report["sold_out"]["told_within_one_poll_interval"] >= 0.99
    assert report["checks"]["every user who kept polling was admitted, or told sold out"]
    assert users["kept_polling"] > 4000
    assert report["api_failures"] == {}
    # Every user waited as the server said: requests per admitted user and the sale's cost are measured, and
    # smaller than with the page's old fixed 2.5 s poll.
    paced, fixed = report["load"]["paced"], report["load"]["fixed_2.5s_poll"]
    assert paced["requests_per_admitted_user"] < fixed["requests_per_admitted_user"]
    assert 0 < report["cost_usd"]["paced"]["total"] < report["cost_usd"]["fixed_2.5s_poll"]["total"]
    assert report["notice_s"]["n"] == users["admitted"] and users["reentries"] == 0
    assert report["ok"] and run.returncode == 0, run.stdout
    assert (tmp_path / "plot.png").stat().st_size > 10_000
    # The crowd called the app in its own processes, as Lambda does; the report says so.
    assert report["parameters"]["transport"] == "inproc" and "transport inproc" in run.stdout


@pytest.mark.slow
def test_through_the_edge_cache_the_report_counts_origin_requests_apart_from_the_edges(env, prefix, tmp_path):
    require_nginx()
    command = [
        sys.executable,
        str(ROOT / "infra" / "sim" / "simulate.py"),
        *("--users", "300", "--stock", "200", "--edge", "--out", str(tmp_path), "--key-prefix", prefix),
        "--no-progress",
    ]
    run = subprocess.run(command, cwd=ROOT, env=os.environ, capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["parameters"]["transport"] == "http" and "through the edge cache" in run.stdout
    edge = report["edge"]
    # Today's clients poll only their own routes, which the cache passes through: every request reached the origin,
    # counted from the cache's log as the crowd counted it.
    assert edge["origin"]["requests"] == report["api"]["requests"] and edge["edge"]["requests"] == 0
    assert edge["origin"]["by_kind"]["enter"] == 300 and set(edge["by_cache_status"]) == {"-"}
    assert report["ok"] and run.returncode == 0, run.stdout


@pytest.mark.slow
def test_the_http_transport_runs_the_same_sale_through_the_local_api(env, prefix, tmp_path):
    command = [
        sys.executable,
        str(ROOT / "infra" / "sim" / "simulate.py"),
        "--users",
        "400",
        "--stock",
        "300",
        "--transport",
        "http",
        "--out",
        str(tmp_path),
        "--key-prefix",
        prefix,
        "--no-progress",
    ]
    run = subprocess.run(command, cwd=ROOT, env=os.environ, capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["parameters"]["transport"] == "http" and "transport http" in run.stdout
    assert report["shop"]["orders"] == 300 and report["oversells"]["units_over_stock"] == 0
    assert report["api_failures"] == {} and report["ok"] and run.returncode == 0, run.stdout


def test_the_crowds_lambda_proxy_calls_the_app_as_chalices_local_gateway_does(api):
    # The simulator's processes call the app through LambdaProxy; the `api` fixture's client, through LocalGateway.
    from app import app
    from infra.local.api import LambdaProxy

    proxy = LambdaProxy(app)
    entries = "/virtual-queues/limited-drop/42/entries"
    entered = proxy("POST", entries, {"X-User-Id": "7"})
    assert entered["statusCode"] == 200
    me = {"X-User-Id": "7", "X-Queue-Ticket": json.loads(entered["body"])["queueTicket"]}

    def answer(status_code, text):
        return status_code, {**json.loads(text), "pollAfterMs": "jittered"}

    by_proxy = proxy("GET", entries + "/me", me)
    by_gateway = api.http.get(entries + "/me", headers=me)
    assert answer(by_proxy["statusCode"], by_proxy["body"]) == answer(by_gateway.status_code, by_gateway.body)
    assert json.loads(by_proxy["body"])["position"] == 1
    bad = "/virtual-queues/limited-drop/0/entries"
    by_proxy, by_gateway = proxy("POST", bad, {"X-User-Id": "7"}), api.http.post(bad, headers={"X-User-Id": "7"})
    assert (by_proxy["statusCode"], json.loads(by_proxy["body"])) == (400, json.loads(by_gateway.body))
    assert proxy("DELETE", entries + "/me", me)["statusCode"] == 204
    with pytest.raises(ValueError):
        proxy("GET", "/nowhere", {})


def test_the_crowds_purchase_answers_never_hold_its_loop_past_the_next_timer():
    # The loop waits for a purchase's answers until its next timer is due, often with microseconds left, right
    # after taking an answer. The wait must end (CPython 3.11's SimpleQueue hung within about 20,000 such waits).
    # In a process of its own: importing the simulator sets the environment it runs the app in.
    waits = textwrap.dedent("""
        import contextlib, queue
        from infra.sim.simulate import InProcessApi

        answers = InProcessApi.hand_back()
        for _ in range(50_000):
            answers.put("answer")
            answers.get()
            with contextlib.suppress(queue.Empty):
                answers.get(timeout=1e-9)
    """)
    try:
        subprocess.run([sys.executable, "-c", waits], cwd=ROOT, check=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("a wait for a purchase's answers outlived its timeout")


@pytest.mark.slow
def test_a_surge_passes_the_quiet_minutes_through_and_queues_the_surge_at_the_rate(env, prefix, tmp_path):
    """`scenarios.py surge`'s safety-net run, shortened: 5 arrivals a second, a surge of 100 a second against 20
    admitted a second, 5 a second again."""
    command = [
        sys.executable,
        str(ROOT / "infra" / "sim" / "simulate.py"),
        *("--arrivals", "5:8,100:4,5:8", "--batch", "10", "--tick-ms", "500", "--abandon", "0"),
        *("--stock", "1000000", "--safety-net", "--out", str(tmp_path), "--key-prefix", prefix, "--no-progress"),
    ]
    run = subprocess.run(command, cwd=ROOT, env=os.environ, capture_output=True, text=True, timeout=300)
    assert (tmp_path / "report.json").exists(), run.stdout + run.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    entry = report["entry"]
    assert report["users"]["total"] == 40 + 400 + 40 == entry["admitted"]
    # The first quiet seconds pass through in one call each; the surge queues, and the line drains at the rate.
    assert 30 <= entry["passed_through"] < entry["admitted"] - 200
    assert entry["enter_to_token_s_passed_through"]["p95"] < entry["enter_to_token_s_queued"]["p50"]
    assert entry["longest_line"] > 100 and entry["seconds_with_a_line"] > 0
    assert (
        entry["peak_admissions_per_tick"] <= 10 and entry["peak_admissions_per_window"] <= entry["allowed_per_window"]
    )
    assert report["shop"]["max_per_window"] <= report["shop"]["allowed_per_window"]
    assert entry["cost_per_admitted_user_usd"] > 0
    assert report["ok"] and run.returncode == 0, run.stdout
