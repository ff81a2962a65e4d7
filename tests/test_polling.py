"""Server-paced polling (`pollAfterMs`): rare far from the front, every second near it, spread around an opening,
never long enough apart that an obedient client is evicted; and a heartbeat timeout that would is refused."""

import time

import pytest

from chalicelib import polling
from chalicelib.config import ConfigError, load_settings
from chalicelib.pump import Pump
from chalicelib.target_config import TargetConfig
from chalicelib.targets import Target

DROP = Target("limited-drop", 13)
LOW, HIGH = (lambda: 1.0), (lambda: 0.0)  # the random draw that shortens most, and least


def test_far_from_the_front_polls_are_a_third_of_the_heartbeat_apart_at_most():
    assert polling.waiting_poll_after_ms(1000.0, 60, HIGH) == 20_000
    assert polling.waiting_poll_after_ms(1000.0, 60, LOW) == 18_000
    assert polling.waiting_poll_after_ms(1000.0, 120, HIGH) == 40_000
    assert polling.waiting_poll_after_ms(None, 60, HIGH) == 20_000  # no ETA (paused): as far as allowed


def test_closer_to_the_front_polls_come_after_half_the_wait_then_every_second():
    assert polling.waiting_poll_after_ms(16.0, 60, HIGH) == 8_000
    assert polling.waiting_poll_after_ms(3.0, 60, HIGH) == 1_500
    assert polling.waiting_poll_after_ms(1.0, 60, HIGH) == 1_000
    assert polling.waiting_poll_after_ms(0.0, 60, LOW) == 900


def test_jitter_spreads_a_crowd_without_passing_the_bound():
    advice = {polling.waiting_poll_after_ms(1000.0, 60) for _ in range(1000)}
    assert min(advice) >= 18_000 and max(advice) <= 20_000
    assert len(advice) > 500


def test_a_burst_of_newcomers_spreads_over_the_whole_gap_at_once():
    first = [polling.waiting_poll_after_ms(1000.0, 60, newcomer=True) for _ in range(4000)]
    assert min(first) >= 5_000 and max(first) <= 20_000
    per_second = [sum(ms // 1000 == s for ms in first) for s in range(5, 20)]
    assert max(per_second) < 2 * min(per_second)  # about even: no wave a gap after the burst


def test_the_pre_queue_wakes_just_after_the_opening_spread_over_seconds():
    assert polling.pre_queue_poll_after_ms(3_600_000, 60, HIGH) == 20_000  # far off: rarely
    assert polling.pre_queue_poll_after_ms(None, 60, HIGH) == 20_000
    wakes = [polling.pre_queue_poll_after_ms(10_000, 60) - 10_000 for _ in range(2000)]
    assert min(wakes) >= 500 and max(wakes) <= 5_500
    per_100_ms = max(sum(w // 100 == slot for w in wakes) for slot in range(5, 55))
    assert per_100_ms < 0.05 * len(wakes)  # no 100 ms holds more than a twentieth of the pre-queue
    assert 500 <= polling.pre_queue_poll_after_ms(-2_000, 60) <= 5_500  # opened, not drawn yet: soon


def test_an_obedient_client_that_loses_a_poll_is_never_evicted():
    for heartbeat_s in (3, 4, 10, 60, 120, 3600):
        longest = max(
            max(
                polling.waiting_poll_after_ms(eta, heartbeat_s, HIGH, newcomer)
                for eta in (None, 0.0, 5.0, 1e6)
                for newcomer in (False, True)
            ),
            polling.pre_queue_poll_after_ms(polling.longest_interval_ms(heartbeat_s), heartbeat_s, LOW)
            - polling.longest_interval_ms(heartbeat_s),  # from the opening on, when the draw starts the heartbeat
        )
        assert longest <= polling.longest_interval_ms(heartbeat_s)
        assert 2 * longest + polling.LATENCY_ALLOWANCE_MS <= heartbeat_s * 1000, heartbeat_s
        assert polling.heartbeat_problem(heartbeat_s) is None


@pytest.mark.parametrize("timeout", ["1", "2"])
def test_a_heartbeat_timeout_that_would_evict_obedient_clients_is_refused(timeout):
    env = {"VQ_TOKEN_KEYS": '{"k1": "' + "x" * 32 + '"}', "VQ_HEARTBEAT_TIMEOUT_S": timeout}
    with pytest.raises(ConfigError, match="VQ_HEARTBEAT_TIMEOUT_S.*evict clients that follow pollAfterMs"):
        load_settings(env)
    assert load_settings({**env, "VQ_HEARTBEAT_TIMEOUT_S": "3"}).heartbeat_timeout_s == 3


def test_waiting_answers_of_enter_and_status_carry_the_advice(make_room):
    room = make_room(VQ_BATCH_SIZE=1, VQ_TICK_MS=1000, VQ_HEARTBEAT_TIMEOUT_S=60)  # one admission a second
    entries = [room.enter(DROP, str(user)) for user in range(1, 101)]
    front, back = entries[0].to_body(), entries[-1].to_body()
    assert 250 <= front["pollAfterMs"] <= 1000  # a newcomer's first advice: cut by up to three quarters
    assert 5_000 <= back["pollAfterMs"] <= 20_000  # 99 s away: half of it is past the bound
    middle = room.status(DROP, "20", entries[19].queue_ticket).to_body()
    assert middle["etaSeconds"] == 19 and 7_125 <= middle["pollAfterMs"] <= 9_500


@pytest.mark.slow
def test_pre_queue_answers_carry_the_advice_and_admitted_ones_none(make_room):
    room = make_room(VQ_TICK_MS=100, VQ_BATCH_SIZE=5)
    opens_in_ms = 4000
    room.configure(DROP, TargetConfig(opens_at_ms=int(time.time() * 1000) + opens_in_ms))
    early = room.enter(DROP, "7")
    assert early.status == "PRE_QUEUE"
    assert opens_in_ms - 1000 <= early.to_body()["pollAfterMs"] <= opens_in_ms + 5_500
    polled = room.status(DROP, "7", early.queue_ticket).to_body()
    assert polled["status"] == "PRE_QUEUE" and polled["pollAfterMs"] >= 500
    time.sleep(opens_in_ms / 1000 + 0.1)
    Pump(room.store, room.settings).run(ticks=2)  # draws, then admits
    admitted = room.status(DROP, "7", early.queue_ticket).to_body()
    assert admitted["status"] == "ADMITTED" and "pollAfterMs" not in admitted


@pytest.mark.parametrize(
    "config",
    [
        TargetConfig(batch=1, tick_ms=60_000),
        TargetConfig(paused=True),
        TargetConfig(batch=1, tick_ms=60_000, paused=True),
    ],
)
def test_no_target_configuration_stretches_the_advice_past_the_heartbeat(make_room, config):
    # A target has no heartbeat of its own: its pace and pause change the ETA, never the bound the one
    # heartbeat timeout (which also evicts) sets on the advice inside the presence window. Beyond it (at one a
    # minute, all but the first three) no heartbeat is asked: the advice is to read /line, within the read cap.
    room = make_room(VQ_HEARTBEAT_TIMEOUT_S=60)
    room.configure(DROP, config)
    entries = [room.enter(DROP, str(user)) for user in range(1, 51)]
    polled = [room.status(DROP, str(user), entry.queue_ticket).to_body() for user, entry in enumerate(entries, 1)]
    assert all(answer["status"] == "WAITING" for answer in polled)
    near = [answer["pollAfterMs"] for answer in polled if "lineAfterMs" not in answer]
    far = [answer for answer in polled if "lineAfterMs" in answer]
    assert near and max(near) <= polling.longest_interval_ms(60) == 20_000
    assert max(near) > 10_000  # far from the front: near the bound
    assert len(far) == (47 if config.batch == 1 and not config.paused else 0)
    assert all(answer["pollAfterMs"] == answer["lineAfterMs"] <= 300_000 for answer in far)
