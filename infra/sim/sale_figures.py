"""What the sale's controls did in a simulated sale (part of infra/sim/report.py's report): how long users
waited to hear the sale was over, and how the shop fared at the admission rate, fixed or following its originSlo.
"""

from __future__ import annotations

import itertools
import math

# The shop's first seconds are its warm-up: rates and latencies are judged from then on.
SETTLE_S = 10
WINDOW_S = 5  # the shop's p95 is also taken per window this long


def sold_out_at(shop: dict) -> float | None:
    """When the shop sold its last unit (epoch seconds), or None if it did not sell out."""
    orders = shop["orders"]
    return max(order["at"] for order in orders) if len(orders) >= shop["stockPerItem"] else None


def sold_out(users, shop: dict, started: float) -> dict:
    """When the last unit sold, and for everyone who did not buy because it had: how long they waited in all,
    and (told by the queue) how soon after the last sale, against the poll interval they were on."""
    last_sale = sold_out_at(shop)
    groups = {
        "told by the queue (SOLD_OUT on a poll)": [u for u in users if u.outcome == "told sold out"],
        "told by the shop after their turn came": [u for u in users if u.outcome == "sold out"],
        "refused at enter (409 SOLD_OUT)": [u for u in users if u.outcome == "enter answered 409 SOLD_OUT"],
    }
    figures: dict = {"last_unit_sold_s": None if last_sale is None else round(last_sale - started, 3)}
    for name, group in groups.items():
        waits = [u.finished_at - u.entered_at for u in group if u.entered_at is not None and u.finished_at]
        figures[name] = {"users": len(group), "waited_s": _spread(waits), "user_minutes": round(sum(waits) / 60, 1)}
    told = [u for u in groups["told by the queue (SOLD_OUT on a poll)"] if u.last_poll_due_at and last_sale]
    if told:
        # The promise: the poll that told them was the first one due after the last sale, so it was due within
        # one poll interval of it. When they heard also counts the local API's backlog (the machine's, not the
        # queue's: `api.backlog_s` in the report).
        figures["told_after_last_sale_s"] = _spread([u.finished_at - last_sale for u in told])
        figures["told_within_one_poll_interval"] = round(
            sum(u.last_poll_due_at - last_sale <= u.poll_after_s for u in told) / len(told), 4
        )
    return figures


def shop_load(
    shop: dict, started: float, finished: float, ticks: list[dict], capacity_per_s: float | None, slo_p95_ms: int | None
) -> dict:
    """The shop's completed orders per second and its own latency, from SETTLE_S after the first purchase
    reached it until the line emptied; the first cut of the rate (originSlo), and what came after it."""
    requests = sorted(shop["requests"], key=lambda r: r["at"])
    if not requests:
        return {}
    busy_until = max((t["server_s"] for t in ticks if t["waiting"] > 0), default=finished)
    # The first cut: the first tick whose rate is below the one before (the rate opens below the batch with an
    # originSlo, and a pause or a sale's end is no cut).
    running = [t for t in ticks if not t["held"]]
    first_cut = next(
        (t["server_s"] for before, t in itertools.pairwise(running) if t["per_tick"] < before["per_tick"]), None
    )
    since = requests[0]["at"] + SETTLE_S
    span = max(1e-9, busy_until - since)
    done = [o for o in shop["orders"] if since <= o["at"] <= busy_until]
    latency = [(r["at"], (r["done"] - r["at"]) * 1000) for r in requests if r.get("done")]
    judged_from = first_cut if first_cut is not None else since
    after = [ms for at, ms in latency if judged_from <= at <= busy_until]
    windows, per_window = [], []
    for start in range(math.floor(judged_from), math.ceil(busy_until), WINDOW_S):
        in_window = [ms for at, ms in latency if start <= at < start + WINDOW_S]
        if in_window:
            windows.append(_percentile(in_window, 0.95))
            completed = sum(start <= o["at"] < start + WINDOW_S for o in shop["orders"])
            per_window.append(
                {
                    "t": round(start - started, 1),
                    "p95_ms": round(windows[-1]),
                    "orders_per_s": round(completed / WINDOW_S, 1),
                }
            )
    orders_per_s = len(done) / span
    return {
        "measured_from_s": round(since - started, 1),
        "line_emptied_s": round(busy_until - started, 1),
        "capacity_per_s": capacity_per_s,
        "completed_orders_per_s": round(orders_per_s, 2),
        "share_of_capacity": round(orders_per_s / capacity_per_s, 3) if capacity_per_s else None,
        "first_cut_s": None if first_cut is None else round(first_cut - started, 2),
        "latency_ms_after_first_cut": _spread(after),
        "window_p95_ms": {
            "windows": len(windows),
            "max": _round(max(windows, default=None)),
            "within_objective": None if slo_p95_ms is None else sum(p <= slo_p95_ms for p in windows),
        },
        "windows": per_window,
        "latency_ms_whole_sale": _spread([ms for _, ms in latency]),
        "rate_per_s": [
            {"t": round(t["server_s"] - started, 2), "effective": t["per_tick"] * 1000 / t["tick_ms"]} for t in ticks
        ],
    }


def summary_lines(sold: dict, load: dict) -> str:
    """The report's lines on the sale's end and the shop's load."""
    told = sold.get("told by the queue (SOLD_OUT on a poll)", {})
    late = sold.get("told by the shop after their turn came", {})
    lines = [
        f"  sold out    last unit sold at {sold['last_unit_sold_s']} s; told by the queue: {told.get('users', 0)} "
        f"(waited p50 {told.get('waited_s', {}).get('p50')} s, max {told.get('waited_s', {}).get('max')} s; "
        f"{sold.get('told_within_one_poll_interval')} within one poll interval of the last sale); told by the "
        f"shop after their turn: {late.get('users', 0)} (waited p50 {late.get('waited_s', {}).get('p50')} s, "
        f"max {late.get('waited_s', {}).get('max')} s)"
    ]
    if load and load["capacity_per_s"]:
        lines.append(
            f"  shop load   {load['completed_orders_per_s']} orders/s completed from {load['measured_from_s']} s to "
            f"{load['line_emptied_s']} s (capacity {load['capacity_per_s']}, share {load['share_of_capacity']}); "
            f"first cut at {load['first_cut_s']} s; shop p95 after it "
            f"{load['latency_ms_after_first_cut'].get('p95')} ms, worst 5-s window {load['window_p95_ms']['max']} ms"
        )
    return "\n".join(lines)


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _spread(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": _round(_percentile(values, 0.5)),
        "p95": _round(_percentile(values, 0.95)),
        "max": _round(max(values)),
    }
