"""The flash-sale simulator's report: what the crowd did, checked, and what it would cost (infra/sim/simulate.py).

Checks (each makes the run fail): the pump's admissions per tick, the shop's rate, oversells, that every
user who kept polling got in, that the API never failed. Targets (measured, shown met or missed, not
failing the run: they are times, and this machine is shared): requests per admitted user against a fixed
2.5 s poll, peak requests/s per waiting user, admission-to-notice p95.
"""

from __future__ import annotations

import bisect
import math
import os
from collections import Counter
from pathlib import Path

from chalicelib import polling
from chalicelib.answers import TargetTick
from chalicelib.gate import purchase_path
from chalicelib.pump import TickReport
from chalicelib.targets import Target
from infra.sim import entry_figures, sale_figures
from infra.sim.sale_cost import Deployment, SaleLoad, sale_cost

TARGET = Target("limited-drop", 1)
ENTRIES = f"/virtual-queues/{TARGET.type}/{TARGET.id}/entries"
PURCHASE = purchase_path(TARGET)
KINDS = ("enter", "status", "leave", "purchase", "line")  # of API call
LINE = ENTRIES.removesuffix("/entries") + "/line"

SHOP_WINDOW_S = 5  # the shop's load is checked over windows this long
FIXED_POLL_S = 2.5  # what the waiting-room page did before the server paced it: the comparison
WINDOW_S = 10  # requests per waiting user are taken over windows this long
LONG_LINE_SHARE = 0.1  # ... while the line holds at least this share of its longest length
TRANSPORTS = {
    "inproc": "the crowd's processes call the app with API Gateway's events; purchases over HTTP",
    "http": "every call over HTTP to the local API",
}
TARGETS = {
    "requests per admitted user, share of the fixed poll's": 1 / 5,
    "peak requests/s per waiting user": 0.1,
    "admission-to-notice p95 s": 2.0,
}


def target_tick(report: TickReport) -> TargetTick | None:
    result = report.targets.get(TARGET)
    return result if isinstance(result, TargetTick) else None


def percentile(values: list[float], share: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def analyse(options, sale) -> dict:
    """The report of `sale` (simulate.Sale): figures, series for the plot, the checks with their verdicts, the
    targets with theirs."""
    users, api, pump, shop, settings = sale.users, sale.api, sale.pump, sale.shop, sale.settings
    started, finished, cpu_s = sale.started, sale.finished, sale.cpu_s
    duration = finished - started
    seconds = int(duration) + 1
    ticks = _ticks(pump, started, settings.catchup_ticks)
    seen = [u for u in users if u.admitted_at is not None]
    keepers = [u for u in users if u.gives_up_s is None]
    load = _load(users, api, ticks, started, seconds, len(seen), sale_figures.sold_out_at(shop))
    latency = _latency(api)
    # Those the safety net admitted as they entered heard of it in the enter call itself: no pump tick to notice.
    notice = _notice([u for u in seen if not u.passed], ticks)
    eta_accuracy = _eta_accuracy(seen, len(users), getattr(sale, "stats", None))
    made = entry_figures.admissions(options.out / "events.jsonl")
    net = entry_figures.net_per_tick(made, settings.tick_ms)
    admissions = _admissions(ticks, settings.batch_size, net)
    costs = _costs(load, latency, duration)
    entry = entry_figures.entry(
        users,
        made,
        settings.tick_ms,
        settings.batch_size,
        load["series"]["waiting"],
        costs["paced"]["total"],
        options.phases,
        {t["tick"]: t["covered"] for t in ticks},
    )
    shop_figures = _shop(shop, ticks, settings, started, seconds)
    oversells = _oversells(shop, users, options.stock)
    answered = sum(len(values) for values in api.latencies.values())
    checks = {
        "admissions per tick never above the batch": admissions["ticks_over_batch"] == 0,
        "a full batch every tick while users waited": admissions["busy_ticks_short_of_their_rate"] == 0,
        "shop never above the target rate": shop_figures["windows_over_allowed"] == 0,
        f"admissions never above the batch x {entry_figures.WINDOW_TICKS} ticks": entry["peak_admissions_per_window"]
        <= entry["allowed_per_window"],
        "no oversells": oversells["units_over_stock"] == 0 and oversells["second_orders"] == 0,
        "no entry token reached the shop twice": oversells["tokens_used_twice"] == 0,
        "every user who kept polling was admitted, or told sold out": all(
            u.admitted_at is not None or u.outcome in ("told sold out", "enter answered 409 SOLD_OUT") for u in keepers
        ),
        "the API never failed": not api.failures,
    }
    return {
        "parameters": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(options).items()},
            "target": str(TARGET),
            "batch": settings.batch_size,
            "tick_ms": settings.tick_ms,
            "heartbeat_timeout_s": settings.heartbeat_timeout_s,
        },
        "duration_s": round(duration, 2),
        "users": {
            "total": len(users),
            "kept_polling": len(keepers),
            "admitted": len(seen),
            "outcomes": dict(Counter(u.outcome for u in users)),
            "queue_full_retries": sum(u.full_retries for u in users),
            "reentries": sum(u.reentries for u in users),
        },
        "admissions": admissions,
        "shop": shop_figures,
        **notice,
        "eta_accuracy": eta_accuracy,
        "load": load,
        "entry": entry,
        "cost_usd": costs,
        "latency_ms": latency,
        "api": _api(api, answered, duration),
        "oversells": oversells,
        "api_failures": dict(api.failures),
        "machine": _machine(cpu_s, answered),
        "sold_out": sale_figures.sold_out(users, shop, started),
        "shop_load": sale_figures.shop_load(
            shop, started, finished, ticks, options.shop_capacity, options.origin_slo_p95_ms
        ),
        "checks": checks,
        "targets": _targets(load, notice["notice_s"]),
        "edge": _edge(getattr(sale, "edge", None), started, seconds, len(seen)),
        "ok": all(checks.values()),
    }


def _ticks(pump, started: float, catchup_ticks: int) -> list[dict]:
    """The target's applied ticks, from the pump's own record, each with how many ticks it covered (a late pump
    makes up for missed ticks, up to the catch-up cap)."""
    ticks, previous = [], None
    for at, report in pump.ticks:
        result = target_tick(report)
        if result is None or result.applied_tick is None:
            continue
        covered = 1 if previous is None else min(result.applied_tick - previous, catchup_ticks)
        previous = result.applied_tick
        ticks.append(
            {
                "t": round(at - started, 3),
                "tick": result.applied_tick,
                "server_s": result.server_ms / 1000,
                "covered": covered,
                "admitted": result.admitted,
                "waiting": result.waiting,
                "evicted": result.evicted,
                "mark": result.mark,
                "per_tick": result.per_tick,
                "batch": result.batch,
                "tick_ms": result.tick_ms,
                "held": result.paused or result.sold_out,
            }
        )
    return ticks


def _admissions(ticks: list[dict], batch: int, net: dict[int, int]) -> dict:
    """Admissions per tick. A tick after which users still waited had to admit what it owed for every tick it
    covered: the batch, or less while the rate follows the shop (originSlo); nothing paused or sold out; and, with
    the safety net, what the net admitted in that tick (`net`: per tick number) counts towards it."""
    busy = [t for t in ticks if t["waiting"] > 0]

    def admitted(t: dict) -> int:
        return t["admitted"] + net.get(int(t["server_s"] * 1000) // t["tick_ms"], 0)

    return {
        "target_per_tick": batch,
        "ticks": len(ticks),
        "ticks_with_users_waiting": len(busy),
        "ticks_over_batch": sum(t["admitted"] > batch * t["covered"] for t in ticks),
        "busy_ticks_short_of_their_rate": sum(admitted(t) < math.floor(t["per_tick"] * t["covered"]) for t in busy),
        "admitted_per_busy_tick": _spread([t["admitted"] / t["covered"] for t in busy]),
        "catch_up_ticks": sum(t["covered"] > 1 for t in ticks),
        "evicted": sum(t["evicted"] for t in ticks),
        "series": ticks,
    }


def _shop(shop: dict, ticks: list[dict], settings, started: float, seconds: int) -> dict:
    """Requests reaching the shop per SHOP_WINDOW_S window, against what the rate allows. Ticks start every
    tick_ms, so a window holds the admissions of SHOP_WINDOW_S / tick_ms ticks and can catch the edge of one
    more; and users admitted up to one near-front poll gap before it hear of it, and buy, within it."""
    batch, tick_ms = settings.batch_size, settings.tick_ms
    allowed = batch * (math.ceil((SHOP_WINDOW_S * 1000 + polling.NEAR_FRONT_MS) / tick_ms) + 1)
    per_second = _per_second((r["at"] for r in shop["requests"]), started, seconds)
    windows = [sum(per_second[s : s + SHOP_WINDOW_S]) for s in range(max(1, seconds - SHOP_WINDOW_S + 1))]
    admitted_per_second, made_up_per_second = [0] * seconds, [0] * seconds
    for t in ticks:
        second = min(seconds - 1, max(0, int(t["t"])))
        admitted_per_second[second] += t["admitted"]
        # A late pump's tick makes up for the ticks it missed (admit.lua's catch-up): owed, not over the rate.
        made_up_per_second[second] += min(max(0, t["admitted"] - batch), batch * (t["covered"] - 1))
    # Admitted up to a near-front poll gap before a window, made-up admissions may buy within it.
    lead = math.ceil(polling.NEAR_FRONT_MS / 1000) + 1
    made_up = [sum(made_up_per_second[max(0, s - lead) : s + SHOP_WINDOW_S]) for s in range(len(windows))]
    return {
        "target_per_s": batch * 1000 / tick_ms,
        "window_s": SHOP_WINDOW_S,
        "allowed_per_window": allowed,
        "max_per_window": max(windows, default=0),
        "max_made_up_per_window": max(made_up, default=0),
        "max_in_a_second": max(per_second, default=0),
        "windows_over_allowed": sum(n > allowed + extra for n, extra in zip(windows, made_up, strict=True)),
        "requests": len(shop["requests"]),
        "orders": len(shop["orders"]),
        "refused": shop["refused"],
        "per_second": per_second,
        "admitted_per_second": admitted_per_second,
    }


def _notice(seen: list, ticks: list[dict]) -> dict:
    """How soon admitted users heard of it, and how far their first ETA was off: each from when the pump let
    them in, the first tick whose mark reached their seq (a user is admitted by seq)."""
    marks, tick_times = [t["mark"] for t in ticks], [t["server_s"] for t in ticks]

    def admitted_at(user) -> float | None:
        i = bisect.bisect_left(marks, user.seq) if user.seq is not None else len(marks)
        return tick_times[i] if i < len(marks) else None

    told, due, eta_errors = [], [], []
    for user in seen:
        at = admitted_at(user)
        if at is None:
            continue
        told.append(user.admitted_at - at)
        if user.last_poll_due_at is not None:
            # The same without this machine's backlog: until the poll that told them was due.
            due.append(user.last_poll_due_at - at)
        if user.eta_s is not None:
            eta_errors.append(at - user.entered_at - user.eta_s)
    return {
        "notice_s": {
            "meaning": "when the user saw ADMITTED minus when the pump's tick admitted them "
            "(the poll gap near the front, plus the local API's latency and backlog)",
            **_spread(told),
            "poll_due": {
                "meaning": "when the poll that told them was due, minus when "
                "they were admitted (without this machine's backlog)",
                **_spread(due),
            },
        },
        "eta_error_s": {
            "meaning": "when the pump admitted the user minus when etaSeconds (on entry) said",
            **_spread(eta_errors),
        },
    }


DISTANCE_BANDS = 5  # the ETA's accuracy by distance from the front: fifths of the crowd, by aheadCount on entry


def _eta_accuracy(seen: list, crowd: int, stats: dict | None) -> dict:
    """How the first estimate held for the users who saw ADMITTED: their wait (entering to seeing ADMITTED, as
    the store times it) inside the first range, and its error against etaSeconds, overall and by distance from
    the front; beside them the store's own etaAccuracy from stats."""
    told = [u for u in seen if u.eta_range_s is not None and u.ahead is not None]

    def figures(users: list) -> dict:
        waits = [u.admitted_at - u.entered_at for u in users]
        errors = [wait - u.eta_s for wait, u in zip(waits, users, strict=True)]
        inside = sum(u.eta_range_s[0] <= wait <= u.eta_range_s[1] for wait, u in zip(waits, users, strict=True))
        return {
            "n": len(users),
            "inside_range_share": _round(inside / len(users)) if users else None,
            "median_abs_error_s": _round(percentile([abs(e) for e in errors], 0.5)),
            "error_s": _spread(errors),
            "wait_s": _spread(waits),
            "below_range": sum(wait < u.eta_range_s[0] for wait, u in zip(waits, users, strict=True)),
            "above_range": sum(wait > u.eta_range_s[1] for wait, u in zip(waits, users, strict=True)),
        }

    band = max(1, math.ceil(crowd / DISTANCE_BANDS))
    return {
        "meaning": "the wait from entering to seeing ADMITTED against the first answer's etaLowSeconds-"
        "etaHighSeconds and etaSeconds (error: wait minus etaSeconds); by aheadCount on entry",
        **figures(told),
        "by_distance": [
            {"ahead_from": start, "ahead_to": start + band - 1, **figures(users)}
            for start in range(0, crowd, band)
            if (users := [u for u in told if start <= u.ahead < start + band])
        ],
        "store": (stats or {}).get("etaAccuracy"),
    }


def eta_csv(users: list) -> str:
    """Per user who saw ADMITTED after a first estimate: aheadCount, etaSeconds, the range, the wait (s)."""
    rows = ["ahead,eta_s,low_s,high_s,wait_s"]
    for u in users:
        if u.admitted_at is not None and u.eta_range_s is not None and u.ahead is not None:
            rows.append(f"{u.ahead},{u.eta_s},{u.eta_range_s[0]},{u.eta_range_s[1]},{u.admitted_at - u.entered_at:.3f}")
    return "\n".join(rows) + "\n"


def _oversells(shop: dict, users: list, stock: int) -> dict:
    """What the gate and the shop let through more than once: units past the stock, a second order of one
    buyer, a token that reached the shop twice; and the double clicks that tried."""
    orders_per_item = Counter(order["item"] for order in shop["orders"])
    orders_per_buyer = Counter((order["item"], order["userId"]) for order in shop["orders"])
    requests_per_user = Counter(request["userId"] for request in shop["requests"])
    return {
        "units_over_stock": sum(max(0, n - stock) for n in orders_per_item.values()),
        "second_orders": sum(n - 1 for n in orders_per_buyer.values()),
        "tokens_used_twice": sum(n - 1 for n in requests_per_user.values()),
        "double_clicks": sum(len(u.purchase_answers) > 1 for u in users),
    }


def _latency(api) -> dict:
    """Each kind of API call's latency as the crowd saw it (ms)."""
    return {
        kind: {
            "n": len(values),
            "p50": _round(percentile(values, 0.5), 1000),
            "p95": _round(percentile(values, 0.95), 1000),
        }
        for kind, values in api.latencies.items()
        if values
    }


def _api(api, answered: int, duration: float) -> dict:
    return {
        "requests": answered,
        "per_s": round(answered / duration, 1),
        "backlog_s": {
            "meaning": "how long requests waited after they were due until this machine sent "
            "them (the load figures count them when due)",
            **_spread([wait for waits in api.backlog.values() for wait in waits]),
            "by_kind": {kind: _spread(waits) for kind, waits in api.backlog.items() if waits},
        },
    }


def _targets(load: dict, notice: dict) -> dict:
    """The design's performance targets, measured: met or missed, never failing the run."""
    paced, fixed = load["paced"], load["fixed_2.5s_poll"]
    measured = {
        "requests per admitted user, share of the fixed poll's": paced["requests_per_admitted_user"]
        / fixed["requests_per_admitted_user"]
        if fixed["requests_per_admitted_user"]
        else None,
        "peak requests/s per waiting user": paced["peak_per_1000_waiting"] and paced["peak_per_1000_waiting"] / 1000,
        "admission-to-notice p95 s": notice["p95"],
    }
    return {
        name: {
            "target": bound,
            "measured": _round(measured[name]),
            "met": None if measured[name] is None else measured[name] <= bound,
        }
        for name, bound in TARGETS.items()
    }


def _load(users, api, ticks, started, seconds, admitted, sold_out_at: float | None) -> dict:
    """Requests per admitted user by kind, and per second per 1,000 waiting users: as paced, and as a fixed
    2.5 s poll would have asked of the same users over the same waits (a user told sold out would have heard
    it at their first fixed poll after the last unit sold)."""
    waiting: list[int | None] = [None] * seconds  # users in line each second, from the last tick within it
    for t in ticks:
        waiting[min(seconds - 1, max(0, int(t["t"])))] = t["waiting"]
    for s in range(seconds):
        if waiting[s] is None:
            waiting[s] = waiting[s - 1] if s else 0
    # When each request was due: the load the crowd asked (sent, it may have waited for this machine).
    paced_series = [0] * seconds
    for times in api.due.values():
        for second, n in enumerate(_per_second(times, started, seconds)):
            paced_series[second] += n
    # The fixed poll: the same enters, leaves and purchases, and a poll every 2.5 s while each user waited.
    fixed_series = list(paced_series)
    fixed_polls = 0
    for second, n in enumerate(_per_second(api.due["status"], started, seconds)):
        fixed_series[second] -= n
    for user in users:
        if user.entered_at is None or user.stopped_waiting_at is None:
            continue
        stopped = user.stopped_waiting_at
        if user.outcome == "told sold out" and sold_out_at is not None:
            stopped = min(stopped, max(sold_out_at, user.entered_at + FIXED_POLL_S))
        polls = math.ceil((stopped - user.entered_at) / FIXED_POLL_S)
        fixed_polls += polls
        for k in range(1, polls + 1):
            second = int(user.entered_at + k * FIXED_POLL_S - started)
            fixed_series[min(seconds - 1, max(0, second))] += 1
    by_kind = {kind: len(times) for kind, times in api.due.items()}
    fixed_by_kind = {**by_kind, "status": fixed_polls}
    longest = max(waiting, default=0)
    arrived = max((u.arrives_s for u in users), default=0.0)  # as planned: the load is counted when due
    # Windows after the last arrival, while the line is long: at its tail the few left are all near the
    # front, where polls are meant to come every second, and a burst of arrivals is the gateway's burst.
    # And while the line is selling: once sold out (or paused) it only empties, each poll its user's last,
    # so a shrinking line would count every one of those polls against fewer users (the absolute peak
    # requests/s is taken over the whole run).
    held = min((int(t["t"]) for t in ticks if t["held"]), default=seconds)
    windows = [
        range(start, start + WINDOW_S) for start in range(math.ceil(arrived) + 1, min(seconds, held) - WINDOW_S + 1)
    ]
    long_windows = [w for w in windows if min(waiting[s] for s in w) >= max(1, LONG_LINE_SHARE * longest)]

    def figures(series, counts) -> dict:
        per_1000 = [1000 * sum(series[s] for s in w) / sum(waiting[s] for s in w) for w in long_windows]
        return {
            "requests": sum(counts.values()),
            "requests_by_kind": counts,
            "requests_per_admitted_user": round(sum(counts.values()) / admitted, 2) if admitted else None,
            "requests_per_admitted_user_by_kind": {kind: round(n / admitted, 2) for kind, n in counts.items()}
            if admitted
            else None,
            "peak_requests_per_s": max(series, default=0),
            "mean_per_1000_waiting": round(sum(per_1000) / len(per_1000), 1) if per_1000 else None,
            "peak_per_1000_waiting": round(max(per_1000), 1) if per_1000 else None,
        }

    return {
        "meaning": f"per 1,000 waiting: requests/s over {WINDOW_S}-s windows after the last arrival while at "
        f"least {LONG_LINE_SHARE:.0%} of the longest line waited; the fixed poll: every waiting user "
        f"polls every {FIXED_POLL_S} s over the waits measured here, the other requests as measured",
        "windows": len(long_windows),
        "longest_line": longest,
        "paced": figures(paced_series, by_kind),
        "fixed_2.5s_poll": figures(fixed_series, fixed_by_kind),
        "series": {"waiting": waiting, "paced_requests": paced_series, "fixed_poll_requests": fixed_series},
    }


def _edge(requests: list | None, started: float, seconds: int, admitted: int) -> dict | None:
    """With --edge: the requests that reached the origin (API Gateway, deployed) apart from those the cache answered,
    from the cache's own log; by kind, per admitted user, per second."""
    if requests is None:
        return None

    def kind(request) -> str:
        path = request.path
        if path.endswith("/line"):
            return "line"
        if path == ENTRIES + "/me":
            return "status" if request.method == "GET" else "leave"
        return {ENTRIES: "enter", PURCHASE: "purchase"}.get(path, "other")

    figures: dict = {
        "meaning": "requests through the local HTTP cache (infra/local/edge_cache.py): origin, those that reached "
        "the API (a miss, an expired or uncached route, a background update); edge, those the cache answered"
    }
    for where in ("origin", "edge"):
        mine = [r for r in requests if r.reached_origin == (where == "origin")]
        per_second = _per_second((r.at for r in mine), started, seconds)
        figures[where] = {
            "requests": len(mine),
            "by_kind": dict(Counter(kind(r) for r in mine)),
            "per_admitted_user": round(len(mine) / admitted, 2) if admitted else None,
            "peak_per_s": max(per_second, default=0),
            "mean_per_s": round(len(mine) / max(1, seconds), 1),
        }
    figures["by_cache_status"] = dict(Counter(r.cache_status for r in requests))
    return figures


def _costs(load: dict, latency: dict, duration: float) -> dict:
    """The sale at list prices, paced and with the fixed poll. A request is billed as long as its median
    latency here (an upper bound: that includes this machine's loopback and queueing)."""
    handler_s = {kind: (v["p50"] or 0) / 1000 for kind, v in latency.items()}
    deployment = Deployment()

    def cost(figures: dict) -> dict:
        counts = figures["requests_by_kind"]
        return sale_cost(
            SaleLoad(
                api_requests=sum(counts.values()),
                authorizer_calls=counts.get("purchase", 0),
                handler_seconds=sum(n * handler_s.get(kind, 0) for kind, n in counts.items()),
                duration_s=duration,
            ),
            deployment,
        )

    return {
        "deployment": vars(deployment),
        "paced": cost(load["paced"]),
        "fixed_2.5s_poll": cost(load["fixed_2.5s_poll"]),
    }


def _per_second(times, started: float, seconds: int) -> list[int]:
    series = [0] * seconds
    for at in times:
        series[min(seconds - 1, max(0, int(at - started)))] += 1
    return series


def _round(value: float | None, scale: float = 1) -> float | None:
    return None if value is None else round(value * scale, 3)


def _spread(values: list[float]) -> dict:
    return {
        "n": len(values),
        "min": _round(min(values, default=None)),
        "p5": _round(percentile(values, 0.05)),
        "p50": _round(percentile(values, 0.5)),
        "p95": _round(percentile(values, 0.95)),
        "max": _round(max(values, default=None)),
    }


def plot(report: dict, path: Path) -> None:
    """Queue length; admissions and shop requests per second against the target rate; API requests per
    second, paced and as a fixed 2.5 s poll would have asked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ticks, shop, series = report["admissions"]["series"], report["shop"], report["load"]["series"]
    seconds = range(len(shop["per_second"]))
    figure, (line, rates, api) = plt.subplots(3, 1, sharex=True, figsize=(10, 10), height_ratios=[2, 3, 3])
    line.plot([t["t"] for t in ticks], [t["waiting"] for t in ticks], color="tab:blue")
    line.set_ylabel("users waiting")
    line.set_title(
        f"{report['users']['total']} users, {report['parameters']['batch']} admitted every "
        f"{report['parameters']['tick_ms']} ms, stock {report['parameters']['stock']}, "
        f"heartbeat {report['parameters']['heartbeat_timeout_s']} s"
    )
    line.grid(alpha=0.3)
    rates.bar(
        [s + 0.5 for s in seconds],
        shop["per_second"],
        width=0.9,
        color="tab:orange",
        alpha=0.6,
        label="requests reaching the shop",
    )
    rates.step(
        [s + 1 for s in seconds],
        shop["admitted_per_second"],
        where="pre",
        color="tab:green",
        label="admitted by the pump",
    )
    rates.axhline(shop["target_per_s"], color="black", linestyle="--", label=f"target {shop['target_per_s']:g}/s")
    rates.axhline(
        shop["allowed_per_window"] / shop["window_s"],
        color="tab:red",
        linestyle=":",
        label=f"allowed over {shop['window_s']} s ({shop['allowed_per_window']})",
    )
    rates.set_ylabel("per second")
    rates.legend(loc="upper right")
    rates.grid(alpha=0.3)
    api.plot(seconds, series["fixed_poll_requests"], color="tab:gray", label=f"polling every {FIXED_POLL_S} s")
    api.plot(seconds, series["paced_requests"], color="tab:purple", label="paced by pollAfterMs (measured)")
    api.set_yscale("symlog")
    api.set_xlabel("seconds since the first arrival")
    api.set_ylabel("API requests per second")
    api.legend(loc="upper right")
    api.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _machine(cpu_s: dict, answered: int) -> dict:
    """What each request answered cost this machine's CPU, all told, and the rate its cores could answer at that cost
    (beyond it, requests wait: the API's backlog). `cpu_s` None for a share not counted: then no rate."""
    per_request = {who: None if s is None else round(s * 1e6 / max(1, answered)) for who, s in cpu_s.items()}
    cores, counted = os.cpu_count() or 1, None not in per_request.values()
    return {
        "meaning": "CPU time spent while the crowd ran, per request answered (microseconds)",
        "cpu_us_per_request": per_request,
        "cores": cores,
        "requests_per_s_at_that_cost": round(cores * 1e6 / max(1, sum(per_request.values()))) if counted else None,
    }


def eta_lines(accuracy: dict) -> str:
    """The ETA's accuracy, overall and by distance from the front, as the summary prints it."""
    store = accuracy["store"] or {}
    lines = [
        f"  ETA range   {accuracy['inside_range_share']} of {accuracy['n']} admitted inside their first range "
        f"({accuracy['below_range']} below, {accuracy['above_range']} above); |error| median "
        f"{accuracy['median_abs_error_s']} s; the store's etaAccuracy: {store.get('insideRangeShare')} of "
        f"{store.get('samples')}, median {store.get('medianAbsErrorSeconds')} s"
    ]
    for band in accuracy["by_distance"]:
        e = band["error_s"]
        lines.append(
            f"    ahead {band['ahead_from']:>6}-{band['ahead_to']:<6} n={band['n']:<6} inside "
            f"{band['inside_range_share']} (below {band['below_range']}, above {band['above_range']}); error p5 "
            f"{e['p5']} p50 {e['p50']} p95 {e['p95']} s; |error| median {band['median_abs_error_s']} s; wait p50 "
            f"{band['wait_s']['p50']} s"
        )
    return "\n".join(lines)


def edge_line(edge: dict) -> str:
    """The origin's requests against the edge's, as the summary prints them (--edge)."""
    origin, cache = edge["origin"], edge["edge"]
    return (
        f"  edge        origin {origin['requests']} requests ({origin['per_admitted_user']} per admitted user; "
        f"peak {origin['peak_per_s']}/s, mean {origin['mean_per_s']}/s), the cache {cache['requests']} (peak "
        f"{cache['peak_per_s']}/s); origin by kind {origin['by_kind']}; by cache status {edge['by_cache_status']}"
    )


def summary(report: dict, out: Path) -> str:
    u, a, s, o = report["users"], report["admissions"], report["shop"], report["oversells"]
    e, n = report["eta_error_s"], report["notice_s"]
    paced, fixed = report["load"]["paced"], report["load"]["fixed_2.5s_poll"]
    cost, m = report["cost_usd"], report["machine"]
    latency = "; ".join(f"{kind} p50 {v['p50']} ms p95 {v['p95']} ms" for kind, v in report["latency_ms"].items())
    outcomes = ", ".join(f"{k} {what}" for what, k in sorted(u["outcomes"].items(), key=lambda item: -item[1]))
    failed = [name for name, ok in report["checks"].items() if not ok]
    verdicts = {True: "met", False: "MISSED", None: "no verdict: nothing to measure"}
    targets = "; ".join(
        f"{name} {t['measured']} (target <= {t['target']:.3g}: {verdicts[t['met']]})"
        for name, t in report["targets"].items()
    )

    def kinds(figures: dict) -> str:
        by_kind = figures["requests_per_admitted_user_by_kind"] or {}
        return ", ".join(f"{kind} {k}" for kind, k in by_kind.items())

    return "\n".join(
        [
            f"{u['total']} users against {report['parameters']['target']}: {a['target_per_tick']} admitted every "
            f"{report['parameters']['tick_ms']} ms ({s['target_per_s']:g}/s), heartbeat "
            f"{report['parameters']['heartbeat_timeout_s']} s; run took {report['duration_s']} s; "
            f"transport {report['parameters']['transport']} ({TRANSPORTS[report['parameters']['transport']]}"
            + (", through the edge cache)" if report.get("edge") else ")"),
            f"  users       {u['admitted']} admitted ({u['kept_polling']} kept polling); {outcomes}; "
            f"{u['queue_full_retries']} queue-full retries, {u['reentries']} re-entries, {a['evicted']} evicted",
            f"  admissions  {a['ticks_with_users_waiting']} ticks with users waiting admitted "
            f"{a['admitted_per_busy_tick']['min']}-{a['admitted_per_busy_tick']['max']} per tick (target "
            f"{a['target_per_tick']}); {a['catch_up_ticks']} catch-up ticks",
            f"  shop        at most {s['max_per_window']} requests in {s['window_s']} s "
            f"(target {s['target_per_s']:g}/s, allowed {s['allowed_per_window']} with tick alignment and the "
            f"near-front poll gap, plus up to {s['max_made_up_per_window']} late ticks made up), at most "
            f"{s['max_in_a_second']} in a second; {s['requests']} requests, {s['orders']} orders",
            f"  notice      admitted -> seen: p50 {n['p50']} s, p95 {n['p95']} s, max {n['max']} s (n={n['n']}); "
            f"-> the telling poll was due: p95 {n['poll_due']['p95']} s; "
            f"ETA error p5 {e['p5']} s, p50 {e['p50']} s, p95 {e['p95']} s",
            eta_lines(report["eta_accuracy"]),
            f"  per user    {paced['requests_per_admitted_user']} requests per admitted user ({kinds(paced)}); "
            f"polling every {FIXED_POLL_S} s: {fixed['requests_per_admitted_user']} ({kinds(fixed)})",
            f"  load        per 1,000 waiting: mean {paced['mean_per_1000_waiting']}, peak "
            f"{paced['peak_per_1000_waiting']} requests/s (every {FIXED_POLL_S} s: mean "
            f"{fixed['mean_per_1000_waiting']}, peak {fixed['peak_per_1000_waiting']}); "
            f"peak {paced['peak_requests_per_s']} requests/s in a second (every {FIXED_POLL_S} s: "
            f"{fixed['peak_requests_per_s']}); "
            f"{report['load']['windows']} windows with a long line",
            f"  cost        ${cost['paced']['total']:.2f} at list prices (gateway ${cost['paced']['api_gateway']:.2f}, "
            f"Lambda ${cost['paced']['lambda_requests'] + cost['paced']['lambda_gb_seconds']:.2f}, cache "
            f"${cost['paced']['cache']:.2f}, WAF ${cost['paced']['waf']:.2f}); polling every {FIXED_POLL_S} s: "
            f"${cost['fixed_2.5s_poll']['total']:.2f}",
            f"  latency     {latency}",
            f"  API         answered {report['api']['requests']} requests ({report['api']['per_s']}/s); they waited "
            f"p50 {report['api']['backlog_s']['p50']} s, p95 {report['api']['backlog_s']['p95']} s after they were due "
            f"(status p95 {report['api']['backlog_s']['by_kind'].get('status', {}).get('p95')} s)",
            f"  oversells   {o['units_over_stock'] + o['second_orders']}; "
            f"entry tokens used twice {o['tokens_used_twice']} ({o['double_clicks']} double clicks)",
            f"  API errors  {report['api_failures'] or 0}",
            "  machine     CPU per request answered: "
            + ", ".join(
                f"{who} {'not counted' if us is None else f'{us} us'}" for who, us in m["cpu_us_per_request"].items()
            )
            + (
                f" (at that cost this machine's {m['cores']} cores answer at most {m['requests_per_s_at_that_cost']} "
                "requests/s)"
                if m["requests_per_s_at_that_cost"]
                else ""
            ),
            *([edge_line(report["edge"])] if report.get("edge") else []),
            entry_figures.summary_line(report["entry"]),
            sale_figures.summary_lines(report["sold_out"], report["shop_load"]),
            f"  targets     {targets}",
            "  checks      " + ("all passed" if not failed else "FAILED: " + "; ".join(failed)),
            f"  written     {out / 'report.json'}, {out / 'plot.png'}",
        ]
    )
