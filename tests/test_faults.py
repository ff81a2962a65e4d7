"""Redis faults under load: a real Valkey process of the test's own is killed, paused or restarted empty while
threads of virtual users enter, poll, leave and buy, and an admission pump ticks.

Under each fault: no 5xx (leave, and a poll whose place this container cannot reckon, may answer the explained 503
QUEUE_UNAVAILABLE), every answer within the timeout budget, the breaker spares most calls the timeout, service
resumes by itself, and the answers stay consistent: a token id belongs to one admission of one user, a user holds
one place per lifetime of the data, and nobody is admitted while someone behind them in line was admitted before.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from chalicelib import runtime
from chalicelib.errors import QueueError
from chalicelib.pump import Pump
from chalicelib.redis_connection import connect
from chalicelib.store import QueueStore
from chalicelib.target_config import TargetConfig
from chalicelib.targets import Target
from tests.support.buying import request_for
from tests.support.load import Load, Run, between
from tests.support.redis_servers import OwnRedis

pytestmark = pytest.mark.faults

CONNECT_S, COMMAND_S = 0.2, 0.5  # the timeouts of redis_connection.connect
SLACK_S = 0.5  # scheduling on a 2-core machine shared by the load threads, the pump and the servers
CALL_BUDGET_S = CONNECT_S + COMMAND_S + SLACK_S
BREAKER_FAILURES, BREAKER_COOLDOWN_MS = 3, 300
THREADS = 6
TARGETS = (Target("limited-drop", 42), Target("ticketing-event", 7))
# Answers that prove Redis took part (a fail-open answer is DIRECT_ADMITTED).
FROM_REDIS = {"WAITING", "ADMITTED", "NOT_IN_QUEUE", "QUEUE_FULL"}


class RecordingStore(QueueStore):
    """The pump's store, noting what each tick admitted and when."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.admissions: list[tuple[float, int]] = []

    def admit_and_evict_all(self, targets, rules, seen=None):
        results = super().admit_and_evict_all(targets, rules, seen)
        now = time.monotonic()
        self.admissions += [(now, r.admitted) for r in results.values() if not isinstance(r, Exception)]
        return results


@pytest.fixture
def durable_redis(tmp_path):
    """A Valkey server that writes every change to its append-only file, so a restart keeps the data."""
    server = OwnRedis(data_dir=tmp_path / "valkey")
    yield server
    server.close()


def run_load(env, redis: OwnRedis, fault, heal, fault_s: float = 1.5) -> Run:
    """Load for a while, `fault()`, load through the fault, `heal()`, and load until Redis answers again."""
    env(
        REDIS_URL=redis.url,
        VQ_BREAKER_FAILURES=BREAKER_FAILURES,
        VQ_BREAKER_COOLDOWN_MS=BREAKER_COOLDOWN_MS,
        VQ_TICK_MS=100,
        VQ_BATCH_SIZE=20,
        VQ_CATCHUP_TICKS=2,
        VQ_PUMP_LEASE_TICKS=2,
    )
    settings = runtime.settings()
    pump_store = RecordingStore(connect(redis.url), settings.key_prefix)
    load = Load([(runtime.waiting_room(), runtime.purchase_gate())], Pump(pump_store, settings), TARGETS, THREADS)
    run = load.run
    with load:
        time.sleep(0.8)
        run.fault_at = time.monotonic()
        fault()
        time.sleep(fault_s)
        run.healing_at = time.monotonic()
        heal()
        run.healed_at = time.monotonic()
        deadline = run.healed_at + BREAKER_COOLDOWN_MS / 1000 + 5
        while run.resumed_at is None and time.monotonic() < deadline:
            time.sleep(0.05)
            with load.lock:
                run.resumed_at = next(
                    (c.started for c in run.calls if c.started > run.healed_at and c.answer in FROM_REDIS), None
                )
        time.sleep(1.0)
    run.pump_admitted_after_heal = sum(n for at, n in pump_store.admissions if at > run.healed_at)
    run.pump_admitted = sum(n for _, n in pump_store.admissions)
    return run


def assert_served_through_the_fault(run: Run) -> None:
    """No 5xx, no exception; fail-open answers during the fault; every call within the timeout budget."""
    assert not run.failures, run.failures
    assert not [c for c in run.calls if c.error], [c for c in run.calls if c.error][:5]
    fives = [
        c
        for c in run.calls
        if c.status >= 500 and not (c.op in ("leave", "status") and c.answer == "QUEUE_UNAVAILABLE")
    ]
    assert not fives, fives[:5]
    slow = [c for c in run.calls if c.took > CALL_BUDGET_S]
    assert not slow, f"{len(slow)} calls over the {CALL_BUDGET_S} s budget, e.g. {slow[:3]}"
    # Calls begun once the fault bit and done before it healed (a paused server answers what it held on resuming).
    during = [
        c
        for c in between(run.calls, run.fault_at + COMMAND_S + 0.1, run.healing_at)
        if c.started + c.took < run.healing_at
    ]
    # Newcomers are let in directly; ticket holders by dead reckoning, in turn, or told to poll again.
    entered = {c.answer for c in during if c.op == "enter"}
    assert entered == {"DIRECT_ADMITTED"}
    polled = {c.answer for c in during if c.op == "status"}
    assert polled and polled <= {"ADMITTED", "WAITING", "QUEUE_UNAVAILABLE"}, polled
    bought = [c for c in during if c.op == "buy"]
    assert bought and all(c.status == 201 for c in bought), "purchases go through on the token's signature"


def assert_resumed(run: Run) -> None:
    assert run.resumed_at is not None, "Redis answered no call after it came back"
    assert run.resumed_at - run.healed_at < BREAKER_COOLDOWN_MS / 1000 + 2.0
    assert run.pump_errors >= 1, "the pump saw the outage"
    assert run.pump_admitted_after_heal > 0, "the pump admits again by itself"
    after = between(run.calls, run.resumed_at, float("inf"))
    assert any(c.answer == "ADMITTED" for c in after), "users collect tokens again"


def seqs_handed_out(run: Run, target: Target) -> tuple[list[int], list[int]]:
    """The seqs of `target`'s tickets handed out before the fault, and after it healed."""
    new = [c for c in run.calls if c.op == "enter" and c.target == target and c.answer == "WAITING" and c.seq]
    return [c.seq for c in new if c.started < run.fault_at], [c.seq for c in new if c.started > run.healing_at]


def history(run: Run, target: Target, user: int) -> list:
    """One user's calls, timed from the fault, for a failure message."""
    return [
        (round(c.started - run.fault_at, 3), round(c.took, 3), c.op, c.status, c.answer, c.seq)
        for c in run.calls
        if (c.target, c.user) == (target, user)
    ]


def assert_consistent(run: Run, epochs: list[tuple[float, float]]) -> None:
    """Within each lifetime of the data (`epochs`): one ticket, one seq and one admission per user; FIFO.
    Over the whole run: every token id belongs to one user, and bought at most once."""
    owners: dict[str, set] = defaultdict(set)
    for c in run.calls:
        if c.token_id:
            owners[c.token_id].add((c.target, c.user))
    assert all(len(users) == 1 for users in owners.values()), "a token id was handed to two users"
    bought: dict[str, int] = defaultdict(int)
    for c in run.calls:
        if c.op == "buy" and c.status == 201:
            bought[c.token_id] += 1
    assert max(bought.values()) == 1, "a token bought twice"

    for start, end in epochs:
        calls = between(run.calls, start, end)
        tickets: dict[tuple, set] = defaultdict(set)
        admissions: dict[tuple, set] = defaultdict(set)
        seq_owner: dict[tuple, set] = defaultdict(set)
        for c in calls:
            key = (c.target, c.user)
            if c.op == "enter" and c.seq is not None and c.answer == "WAITING":
                tickets[key].add(c.seq)
                seq_owner[c.target, c.seq].add(c.user)
            if c.answer == "ADMITTED":
                admissions[key].add((c.seq, c.token_id))
        twice = [key for key, seqs in tickets.items() if len(seqs) > 1]
        assert not twice, ("a user got two places in one line", history(run, *twice[0]))
        assert all(len(users) == 1 for users in seq_owner.values()), "two users got the same seq"
        assert all(len(a) == 1 for a in admissions.values()), "a user was admitted twice, at two places or tokens"
        # FIFO: once a user was admitted, nobody ahead of them (smaller seq) is told to wait any longer. Among the
        # tickets of this lifetime: a container reckons an earlier lifetime's tickets until Redis tells it otherwise.
        placed = {(c.target, c.user, c.seq) for c in calls if c.op == "enter" and c.answer == "WAITING"}
        for target in TARGETS:
            admitted = sorted(
                (c.started + c.took, c.seq)
                for c in calls
                if c.target == target
                and c.answer == "ADMITTED"
                and c.op == "status"
                and (target, c.user, c.seq) in placed
            )
            for c in calls:
                if (
                    c.target == target
                    and c.op == "status"
                    and c.answer == "WAITING"
                    and (target, c.user, c.seq) in placed
                ):
                    passed = [seq for done, seq in admitted if done < c.started and seq > c.seq]
                    assert not passed, f"user {c.user} (seq {c.seq}) waits behind admitted seqs {passed[:3]}"


def test_redis_killed_mid_load_and_restarted_with_its_data(env, origin, durable_redis):
    run = run_load(env, durable_redis, durable_redis.kill, durable_redis.restart)

    assert_served_through_the_fault(run)
    assert_resumed(run)
    assert_consistent(run, [(0.0, float("inf"))])  # nothing was lost: one lifetime
    for target in TARGETS:
        before, after = seqs_handed_out(run, target)
        assert min(after) > max(before), "the line went on where it stopped"


def test_redis_paused_past_the_timeout_fails_open_within_the_budget_and_resumes(env, origin, own_redis):
    run = run_load(env, own_redis, own_redis.pause, own_redis.resume)

    assert_served_through_the_fault(run)
    assert_resumed(run)
    assert_consistent(run, [(0.0, float("inf"))])
    # The breaker: after a few calls pay the command timeout, the rest skip Redis until the cool-down ends.
    during = between(run.calls, run.fault_at, run.healing_at)
    paid = [c for c in during if c.took >= COMMAND_S * 0.8]
    spared = [c for c in during if c.took < 0.1]
    assert paid, "the pause was long enough to time out"
    assert len(spared) > 5 * len(paid), (len(spared), len(paid))


def test_redis_restarted_empty_loses_places_but_never_issues_a_token_or_a_place_twice(env, origin, own_redis):
    run = run_load(env, own_redis, own_redis.kill, own_redis.restart)

    assert_served_through_the_fault(run)
    assert_resumed(run)
    # The new lifetime begins once Redis answers: until then, polls are reckoned from the lost one.
    assert_consistent(run, [(0.0, run.fault_at), (run.resumed_at, float("inf"))])
    # The data really was lost: the server's count of admissions started again.
    assert sum(runtime.store().stats(target, 0).admitted for target in TARGETS) < run.pump_admitted
    for target in TARGETS:
        before, after = seqs_handed_out(run, target)
        # The seq fence (lua/enter.lua): the line started again, above every seq handed out before, by the clock.
        assert min(after) > max(before), "a seq of before was handed out again"


def test_an_outage_admits_ticket_holders_in_turn_at_the_rate_and_no_outage_token_buys_on_a_paused_target(
    env, origin, own_redis
):
    batch, tick_s = 2, 0.5
    env(
        REDIS_URL=own_redis.url,
        VQ_BREAKER_FAILURES=BREAKER_FAILURES,
        VQ_BREAKER_COOLDOWN_MS=BREAKER_COOLDOWN_MS,
        VQ_BATCH_SIZE=batch,
        VQ_TICK_MS=int(tick_s * 1000),
        VQ_TARGETS_OPEN_ON_FIRST_USE="true",
    )
    room, gate = runtime.waiting_room(), runtime.purchase_gate()
    selling, held = TARGETS
    signer = runtime.signer()
    tickets = {user: room.enter(selling, str(user)).queue_ticket for user in range(1, 31)}
    seqs = {user: signer.read_ticket(ticket).seq for user, ticket in tickets.items()}
    held_ticket = room.enter(held, "1").queue_ticket
    room.configure(held, TargetConfig(paused=True))
    seen_from = time.time()
    for user, ticket in tickets.items():  # the container sees the line (no pump runs: the mark stays at 0)
        assert room.status(selling, str(user), ticket).status == "WAITING"
    assert room.status(held, "1", held_ticket).paused

    own_redis.pause()  # as a Redis stall or a failover's seconds without a primary
    polls, tokens, newcomers = [], {}, []
    try:
        until = time.monotonic() + 3.0
        while time.monotonic() < until:
            for user, ticket in tickets.items():
                if user not in tokens:
                    entry = room.status(selling, str(user), ticket)
                    polls.append((time.time(), seqs[user], entry.status))
                    if entry.status == "ADMITTED":
                        tokens[user] = entry.entry_token
            newcomers.append(room.enter(held, str(1000 + len(newcomers))))
        held_poll = room.status(held, "1", held_ticket)
    finally:
        own_redis.resume()

    # Ticket holders: in seq order, never more than a batch a tick since the line was seen, never let in directly.
    assert {status for _, _, status in polls} <= {"WAITING", "ADMITTED"}
    admitted = sorted((at, seq) for at, seq, status in polls if status == "ADMITTED")
    assert len(admitted) >= batch, "the stall was long enough for a few turns"
    for n, (at, _) in enumerate(admitted, start=1):
        assert n <= batch * ((at - seen_from) / tick_s + 1), f"{n} admitted {at - seen_from:.2f} s after the last look"
    for at, seq, status in polls:
        if status == "WAITING":
            passed = [s for done, s in admitted if done < at and s > seq]
            assert not passed, f"seq {seq} waits behind reckoned seqs {passed[:3]}"
    assert all(token.minted == "turn" for token in tokens.values())
    # Newcomers follow VQ_FAIL_MODE (open), the paused line admits no ticket holder.
    assert {entry.status for entry in newcomers} == {"DIRECT_ADMITTED"}
    assert (held_poll.status, held_poll.paused) == ("WAITING", True)

    time.sleep(BREAKER_COOLDOWN_MS / 1000 + 0.2)
    # Redis answers again: a token minted in the stall cannot buy on the paused target, the reckoned turns buy...
    with pytest.raises(QueueError, match="paused"):
        gate.purchase(request_for(newcomers[0].entry_token, held, newcomers[0].entry_token.user_id))
    user, token = next(iter(tokens.items()))
    assert gate.purchase(request_for(token, selling, token.user_id)).status == 201
    assert [r["path"] for r in origin.requests] == [f"/limited-drops/{selling.id}/orders"]
    # ...and the line goes on after them: the first poll Redis answers moves the mark past the reckoned turns.
    waiting = next(u for u in tickets if u not in tokens)
    room.status(selling, str(waiting), tickets[waiting])
    assert int(runtime.store().client.get(runtime.store().keys(selling).mark)) == max(seq for _, seq in admitted)


def test_two_containers_in_two_processes_keep_fifo_each_and_their_word_through_a_killed_redis(env, own_redis, tmp_path):
    """What holds across containers in an outage (docs/guarantees.md#fail-open), measured in two processes: each
    container reckons from its own last sighting of the line. Each keeps FIFO among its own answers, and admits a
    user it told WAITING by the time that answer named; but one whose sighting is older may tell a user to wait
    after the other admitted someone behind them. Printed with -s: how often, and for how long."""
    tick_s, users = 0.2, 60
    env(
        REDIS_URL=own_redis.url,
        VQ_BREAKER_FAILURES=1,
        VQ_BREAKER_COOLDOWN_MS=BREAKER_COOLDOWN_MS,
        VQ_BATCH_SIZE=2,
        VQ_TICK_MS=int(tick_s * 1000),
        VQ_TARGETS_OPEN_ON_FIRST_USE="true",
    )
    room, target = runtime.waiting_room(), TARGETS[0]
    tickets = {str(user): room.enter(target, str(user)).queue_ticket for user in range(1, users + 1)}
    seqs = {user: room.signer.read_ticket(ticket).seq for user, ticket in tickets.items()}
    (tmp_path / "tickets.json").write_text(json.dumps(tickets))
    stop = threading.Event()
    pump = threading.Thread(
        target=Pump(runtime.store(), runtime.settings()).run,
        kwargs={"remaining_ms": lambda: 0 if stop.is_set() else 3_600_000.0},
    )
    pump.start()
    # A container polled every 50 ms, and one polled every 300 ms, whose sightings are older.
    outs = [str(tmp_path / f"container-{n}.jsonl") for n in (0, 1)]
    containers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.container",
                target.type,
                str(target.id),
                str(tmp_path / "tickets.json"),
                out,
                "6",
                every,
            ],
            stdout=subprocess.DEVNULL,  # its log
        )
        for out, every in zip(outs, ("0.05", "0.3"), strict=True)
    ]
    try:
        deadline = time.monotonic() + 30
        while not all(Path(out + ".ready").exists() for out in outs):
            assert time.monotonic() < deadline, "the containers did not start"
            time.sleep(0.05)
        for user in list(tickets)[4:40:6]:  # some leave: the pump skips them, an older sighting still counts them
            room.leave(target, user, tickets[user])
        time.sleep(1.0)
        killed_at = time.time()
        own_redis.kill()
        for container in containers:
            assert container.wait(timeout=60) == 0
    finally:
        stop.set()
        pump.join(timeout=30)
        for container in containers:
            container.kill()
    answers = [
        [(at, seqs[user], status, eta) for at, user, status, eta in map(json.loads, Path(out).read_text().splitlines())]
        for out in outs
    ]

    reckoned, crossed, longest = 0, 0, 0.0
    for mine, theirs in ((answers[0], answers[1]), (answers[1], answers[0])):
        admitted_here = [(at, seq) for at, seq, status, _ in mine if status == "ADMITTED"]
        admitted_there = [(at, seq) for at, seq, status, _ in theirs if status == "ADMITTED"]
        for at, seq, status, eta in mine:
            if status != "WAITING":
                continue
            # FIFO within a container, whether it admitted from Redis or by reckoning.
            passed = [s for done, s in admitted_here if done < at and s > seq]
            assert not passed, f"seq {seq} told to wait behind seqs {passed[:3]} this container admitted"
            if at <= killed_at:
                continue
            reckoned += 1
            # Its word: the first poll of this user here from the time the answer named is admitted.
            later = [st for t, s, st, _ in mine if s == seq and t >= at + eta + 0.05]
            assert not later or later[0] == "ADMITTED", f"seq {seq} told {eta} s, not admitted then but {later[0]}"
            behind = [done for done, s in admitted_there if done < at and s > seq]
            if behind:
                crossed += 1
                longest = max(longest, at - min(behind))
    assert reckoned, "the containers reckoned turns in the outage"
    print(
        f"\ntwo containers through a killed Redis: {reckoned} WAITING answers reckoned, {crossed} of them after the "
        f"other container had admitted someone behind, the longest {longest:.2f} s after"
    )
