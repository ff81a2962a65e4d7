"""How users got in, in a simulated sale (part of infra/sim/report.py's report): the share the safety net admitted as
they entered, how long enter-to-token took for them and for those who queued, the admissions per window of ticks
against what the rate allows, and the line's length over time."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

WINDOW_TICKS = 10  # admissions are also counted over every run of this many ticks
LINE_EVERY_S = 10  # the line's length is sampled this often


def admissions(events_file: Path) -> list[tuple[int, bool]]:
    """Every admission the queue published (UserAdmitted): (Redis time in ms, queued)."""
    if not events_file.exists():
        return []
    found = []
    for line in events_file.read_text().splitlines():
        event = json.loads(line)
        if event["detail-type"] == "UserAdmitted":
            at = datetime.fromisoformat(event["detail"]["serverTime"].replace("Z", "+00:00"))
            found.append((round(at.timestamp() * 1000), event["detail"]["queued"]))
    return sorted(found)


def net_per_tick(made: list[tuple[int, bool]], tick_ms: int) -> dict[int, int]:
    """The safety net's admissions per tick number."""
    counts: dict[int, int] = {}
    for at, queued in made:
        if not queued:
            counts[at // tick_ms] = counts.get(at // tick_ms, 0) + 1
    return counts


def entry(
    users,
    made: list[tuple[int, bool]],
    tick_ms: int,
    batch: int,
    waiting: list[int],
    cost_usd: float,
    phases: list[tuple[float, float]] | None = None,
    covered: dict[int, int] | None = None,
) -> dict:
    """The figures, from the users as they ended, the published admissions, the line's length each second and the
    sale's cost; with the arrivals' `phases` (rate, seconds), also per phase. `covered` gives, per applied tick
    number, the ticks it covered: a late pump's tick makes up for the ticks it missed (admit.lua's catch-up), so
    its admissions count against those ticks, spread evenly, as the rate owed them."""
    seen = [u for u in users if u.admitted_at is not None and u.entered_at is not None]
    passed = [u for u in seen if u.passed]
    queued = [u for u in seen if not u.passed]
    per_tick: dict[int, int] = {}
    for at, _ in made:
        per_tick[at // tick_ms] = per_tick.get(at // tick_ms, 0) + 1
    owed: dict[int, float] = {}
    for tick, count in per_tick.items():
        spread = max(1, (covered or {}).get(tick, 1))
        for t in range(tick - spread + 1, tick + 1):
            owed[t] = owed.get(t, 0) + count / spread
    ticks = range(min(owed, default=0), max(owed, default=-1) + 1)
    counts = [owed.get(t, 0) for t in ticks]
    windows = [sum(counts[i : i + WINDOW_TICKS]) for i in range(max(1, len(counts) - WINDOW_TICKS + 1))]
    return {
        "meaning": "enter to token: when the user saw ADMITTED minus when they sent their enter; admissions per "
        "tick and per run of ticks from the UserAdmitted events, by Redis time",
        "admitted": len(seen),
        "passed_through": len(passed),
        "share_admitted_at_once": round(len(passed) / len(seen), 4) if seen else None,
        "enter_to_token_s": _spread([u.admitted_at - u.entered_at for u in seen]),
        "enter_to_token_s_passed_through": _spread([u.admitted_at - u.entered_at for u in passed]),
        "enter_to_token_s_queued": _spread([u.admitted_at - u.entered_at for u in queued]),
        "batch": batch,
        "tick_ms": tick_ms,
        "peak_admissions_per_tick": max(per_tick.values(), default=0),
        "window_ticks": WINDOW_TICKS,
        "peak_admissions_per_window": math.ceil(max(windows, default=0) - 1e-9),
        "allowed_per_window": batch * WINDOW_TICKS,
        "line_every_s": LINE_EVERY_S,
        "line": waiting[::LINE_EVERY_S],
        "longest_line": max(waiting, default=0),
        "seconds_with_a_line": sum(n > 0 for n in waiting),
        "cost_per_admitted_user_usd": round(cost_usd / len(seen), 7) if seen else None,
        "by_phase": _by_phase(seen, phases or []),
    }


def _by_phase(seen: list, phases: list[tuple[float, float]]) -> list[dict]:
    """Per phase of arrivals: who arrived in it, the share let through at once, and their enter-to-token times."""
    figures, start = [], 0.0
    for rate, seconds in phases:
        group = [u for u in seen if start <= u.arrives_s < start + seconds]
        figures.append(
            {
                "arrivals_per_s": rate,
                "from_s": start,
                "seconds": seconds,
                "admitted": len(group),
                "share_admitted_at_once": round(sum(u.passed for u in group) / len(group), 4) if group else None,
                "enter_to_token_s": _spread([u.admitted_at - u.entered_at for u in group]),
            }
        )
        start += seconds
    return figures


def _spread(values: list[float]) -> dict:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}

    def rank(share: float) -> float:
        return round(ordered[min(len(ordered) - 1, max(0, int(share * len(ordered) + 0.999999) - 1))], 3)

    return {"n": len(ordered), "p50": rank(0.5), "p95": rank(0.95), "max": round(ordered[-1], 3)}


def summary_line(figures: dict) -> str:
    every = figures["enter_to_token_s"]
    passed, queued = figures["enter_to_token_s_passed_through"], figures["enter_to_token_s_queued"]
    return (
        f"  entry       {figures['passed_through']} of {figures['admitted']} admitted at once "
        f"({figures['share_admitted_at_once']}); enter -> token p50 {every.get('p50')} s, p95 {every.get('p95')} s "
        f"(at once p50 {passed.get('p50')} s; queued p50 {queued.get('p50')} s, p95 {queued.get('p95')} s); "
        f"admissions at most {figures['peak_admissions_per_tick']} a tick (batch {figures['batch']}), "
        f"{figures['peak_admissions_per_window']} per {figures['window_ticks']} ticks, late ticks' counted against the "
        f"ticks they made up (allowed "
        f"{figures['allowed_per_window']}); line at most {figures['longest_line']}, "
        f"{figures['seconds_with_a_line']} s with a line; ${figures['cost_per_admitted_user_usd']} per admitted user"
    )
