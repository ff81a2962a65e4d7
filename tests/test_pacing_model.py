"""infra/sim/pacing_model.py: the sale replayed by the pacing rule alone counts what the simulator counts."""

from infra.sim.pacing_model import model


def test_paced_crowd_asks_far_less_than_a_fixed_poll_and_hears_of_its_turn_within_a_second():
    figures = model(users=3000, rate=50.0, tick_s=0.5, arrival_s=2.0, heartbeat_s=60)
    assert figures["duration_s"] >= 3000 / 50
    assert 2 < figures["requests_per_admitted_user"] < figures["fixed_requests_per_admitted_user"]
    assert figures["share_of_fixed"] < 0.8  # a 30 s average wait: mostly the polls around the turn
    p50, p95 = figures["notice_p50_p95_s"]
    assert 0 <= p50 <= p95 <= 1.0  # the near-front poll: about every second, never later
    assert 0 < figures["cost_usd"] < figures["fixed_cost_usd"]


def test_a_longer_heartbeat_halves_the_far_polls():
    short, long = (model(users=6000, rate=50.0, tick_s=0.5, arrival_s=2.0, heartbeat_s=h) for h in (60, 120))
    assert long["requests_per_admitted_user"] < short["requests_per_admitted_user"]
    assert long["per_1000_waiting_mean_peak"][0] < short["per_1000_waiting_mean_peak"][0]
