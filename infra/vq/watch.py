"""`vq stats` and `vq watch`: a target's figures as lines an operator reads at a glance; `watch` redraws them
every few seconds with the admissions per second between two refreshes and a sparkline of the last minutes."""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable

SPARKS = "▁▂▃▄▅▆▇█"
HISTORY = 60  # refreshes the sparklines keep
STATES = {
    "ADMITTING": "admitting",
    "WAITING": "waiting, and the pump has not ticked lately: is it running?",
    "IDLE": "idle: nobody in line",
    "PAUSED": "paused: nobody is admitted, everyone keeps their place",
    "SOLD_OUT": "sold out",
    "CLOSED": "closed to newcomers",
    "SCHEDULED": "scheduled: newcomers wait in the pre-queue for the opening",
}


# How a newcomer gets in, on a target with the safety net (stats' entryMode).
ENTRY_MODES = {"PASSING_THROUGH": "passing through", "QUEUEING": "queueing"}


def summary(target: str, stats: dict, admitted_per_s: float | None = None) -> list[str]:
    """The figures of one stats answer; `admitted_per_s` measured between two answers, when known."""
    config, shop = stats["config"], stats["recentShop"]
    state = STATES.get(stats["state"], stats["state"].lower())
    opens = f"  opens {config['opensAt']}" if stats["state"] == "SCHEDULED" and "opensAt" in config else ""
    if config.get("safetyNet"):
        opens += "  safety net: " + ENTRY_MODES.get(stats["entryMode"], stats["entryMode"].lower())
    now = "" if admitted_per_s is None else f", now {_rate(admitted_per_s)}"
    shop_now = f"last {shop['windowSeconds']:g} s: {shop['purchases']} answered" + (
        f", p95 {shop['p95Ms']} ms, errors {100 * shop['errorRate']:.1f} %" if shop["purchases"] else ""
    )
    measured = stats["waitsMeasured"]
    waits = (
        f"avg {stats['avgWaitSeconds']:.1f} s, p95 {stats['p95WaitSeconds']:.1f} s (of {measured:,} users)"
        if measured
        else "none measured yet (a wait is measured when the admitted user polls)"
    )
    accuracy = stats.get("etaAccuracy") or {}
    eta = (
        f"{100 * accuracy['insideRangeShare']:.0f} % of {accuracy['samples']:,} admitted inside their first range; "
        f"etaSeconds off by {accuracy['medianAbsErrorSeconds']:g} s (median)"
        if accuracy.get("samples")
        else "none measured yet"
    )
    return [
        f"{target}  {state}{opens}",
        f"  in line      {stats['waitingCount']:,} waiting, {stats['preQueuedCount']:,} pre-queued"
        + (f" (capacity {config['maxWaiting']:,})" if "maxWaiting" in config else ""),
        f"  admitted     {stats['admittedCount']:,}; {stats['passedThroughCount']:,} passed through; "
        f"{stats['activeCount']:,} not done (active)"
        + (f", cap {config['maxActive']:,}" if "maxActive" in config else ""),
        f"  rate         configured {_rate(stats['configuredRatePerSec'])}, effective "
        f"{_rate(stats['effectiveRatePerSec'])}, measured {_rate(stats['admissionRatePerSec'])} (last min){now}",
        f"  waits        {waits}",
        f"  ETA          {eta}",
        f"  departures   {stats['leftCount']:,} left, {stats['evictedCount']:,} evicted (stopped polling), "
        f"{stats['soldOutReleasedCount']:,} released at sold out",
        f"  shop         {stats['ordersCount']:,} orders; {shop_now}",
    ]


def run(fetch: Callable[[], dict], target: str, interval_s: float, count: int | None, out=None) -> None:
    """Redraw the figures every `interval_s` until Ctrl-C (or `count` refreshes). At a terminal the screen is
    cleared each time; into a pipe or file each refresh follows the last, under a line with its time."""
    out = out or sys.stdout
    at_terminal = out.isatty()
    waiting: deque[int] = deque(maxlen=HISTORY)
    admitted_rates: deque[float] = deque(maxlen=HISTORY)
    previous: tuple[float, int] | None = None
    shown = 0
    while count is None or shown < count:
        started = time.monotonic()
        stats = fetch()
        admitted_per_s = None
        if previous is not None and started > previous[0]:
            admitted_per_s = max(0.0, (stats["admittedCount"] - previous[1]) / (started - previous[0]))
            admitted_rates.append(admitted_per_s)
        previous = (started, stats["admittedCount"])
        waiting.append(stats["waitingCount"])
        lines = summary(target, stats, admitted_per_s)
        lines.append(f"  waiting      {sparkline(waiting)}  (last {len(waiting)} refreshes, every {interval_s:g} s)")
        if admitted_rates:
            lines.append(f"  admitted/s   {sparkline(admitted_rates)}")
        stamp = time.strftime("%H:%M:%S")
        header = f"vq watch {target}  {stamp}  (Ctrl-C ends)"
        if at_terminal:
            out.write("\x1b[H\x1b[2J")
        out.write("\n".join([header, *lines]) + "\n\n")
        out.flush()
        shown += 1
        if count is None or shown < count:
            time.sleep(max(0.0, interval_s - (time.monotonic() - started)))


def sparkline(values) -> str:
    """The values as bars scaled from 0 to their largest."""
    top = max(values, default=0)
    if top <= 0:
        return SPARKS[0] * len(values)
    return "".join(SPARKS[min(len(SPARKS) - 1, int(v / top * (len(SPARKS) - 1) + 0.5))] for v in values)


def _rate(value: float) -> str:
    return f"{value:,.1f}/s" if value != int(value) else f"{int(value):,}/s"
