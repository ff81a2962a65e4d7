"""What the sale scenarios report of the shop under originSlo (infra/sim/sale_figures.py): the windows judged against
the objective start at the rate's first cut, and a rate that opens below the configured one is no cut."""

from infra.sim import entry_figures
from infra.sim.sale_figures import shop_load

STARTED = 1000.0


def tick(at, per_tick, held=False):
    return {"server_s": STARTED + at, "per_tick": per_tick, "batch": 10, "tick_ms": 250, "waiting": 1, "held": held}


def shop(latencies_by_second):
    """One purchase a second, answered after the given latency (ms), from STARTED on."""
    requests = [{"at": STARTED + s, "done": STARTED + s + ms / 1000} for s, ms in enumerate(latencies_by_second)]
    return {"requests": requests, "orders": [{"at": r["done"]} for r in requests]}


def test_windows_are_judged_from_the_first_cut_not_from_an_opening_below_the_configured_rate():
    # Opens at 5 a tick, grows, is cut at 12 s (a pause at 8 s is no cut), grows again.
    ticks = [tick(0, 5), tick(4, 6), tick(8, 0, held=True), tick(9, 6), tick(12, 4), tick(16, 5), tick(30, 5)]
    slow_until_the_cut = [900] * 12 + [100] * 18
    load = shop_load(shop(slow_until_the_cut), STARTED, STARTED + 30, ticks, capacity_per_s=1, slo_p95_ms=500)
    assert load["first_cut_s"] == 12
    assert load["latency_ms_after_first_cut"]["max"] == 100
    assert load["window_p95_ms"] == {"windows": 4, "max": 100, "within_objective": 4}


def test_a_fixed_rate_is_judged_from_the_warm_up():
    ticks = [tick(0, 10), tick(30, 10)]
    load = shop_load(shop([900] * 12 + [100] * 18), STARTED, STARTED + 30, ticks, capacity_per_s=1, slo_p95_ms=500)
    assert load["first_cut_s"] is None
    # From 10 s after the first purchase: two slow seconds in the first window.
    assert load["window_p95_ms"]["within_objective"] == load["window_p95_ms"]["windows"] - 1


def test_a_late_tick_s_catch_up_counts_against_the_ticks_it_made_up_and_no_more():
    # Batch 50, 500 ms ticks: tick 11 was missed, tick 12 admitted both ticks' batches (admit.lua's catch-up).
    batch, tick_ms = 50, 500
    per_tick = {n: batch for n in range(30) if n != 11} | {12: 2 * batch}
    made = [(n * tick_ms + i, True) for n, count in per_tick.items() for i in range(count)]
    caught_up = entry_figures.entry([], made, tick_ms, batch, [], 0.0, covered={12: 2})
    assert caught_up["peak_admissions_per_window"] == caught_up["allowed_per_window"] == 500
    # Counted where it ran, the same admissions look like a burst: that was the false alarm.
    assert entry_figures.entry([], made, tick_ms, batch, [], 0.0)["peak_admissions_per_window"] == 550
    # A tick that made up nothing still counts in full: three batches in one tick are over.
    burst = made + [(12 * tick_ms, True)] * batch
    assert entry_figures.entry([], burst, tick_ms, batch, [], 0.0, covered={12: 2})["peak_admissions_per_window"] > 500
