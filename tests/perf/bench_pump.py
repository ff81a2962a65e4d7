"""Benchmark: the admission pump's rate under concurrency, its use of slots under abandonment, and its Redis time.

Run: .venv/bin/python tests/perf/bench_pump.py   (a Valkey of its own, or BENCH_REDIS_URL)
     .venv/bin/python tests/perf/bench_pump.py --opening 1000000   the opening alone, of that many pre-queued
Measures, in one run:
  - admissions per elapsed tick with 8 pumps at once (each its own client, lock attempts and Pump):
    as deployed; with pumps freezing past the lock's lease; and with no lock at all (tick idempotence alone);
  - the same 8 pumps beside 4 threads entering a target with the safety net, around its rate (passing through,
    then queueing, and back): admissions, the net's and the pump's, per elapsed tick, the most over any prefix of
    ticks against batch x those ticks, and admissions out of seq order;
  - with 30 % of the waiting users leaving before their turn, the share of admissions that went to users
    still waiting: this design (the mark moves over users still waiting) against a naive mark that moves
    over raw sequence numbers (`mark += batch`, implemented here only);
  - Redis time (INFO commandstats, EVALSHA usec) of admit.lua and evict.lua with 100,000 users waiting;
  - one whole tick over 100 targets of 1,000 waiting, one a mass departure: Redis time and the pump's own time
    (CPU and wall, gauges written), in at least 7 alternating rounds, each with its load average;
  - the opening of 1,000,000 pre-queued: the longest Redis command, the time to the first batch admitted, and the
    pump's memory growth (one opening: filling the pre-queue takes minutes).
Prints a table and writes build/bench_pump.json. Targets: batch admissions per tick; 100 % to users still waiting;
the opening's first batch within a tick, no Redis command over 50 ms.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import platform
import random
import resource
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

os.environ.update(
    {
        "VQ_TOKEN_KEYS": json.dumps({"k1": "bench-secret-0123456789abcdefghijklmnopqrstuv"}),
        "POWERTOOLS_LOG_LEVEL": "CRITICAL",  # lapsed-lock warnings are the point here, not news
        "POWERTOOLS_METRICS_DISABLED": "1",
        "POWERTOOLS_TRACE_DISABLED": "1",
    }
)

import benchlib  # noqa: E402  (beside this file)

from chalicelib import observability  # noqa: E402
from chalicelib import store as store_module  # noqa: E402
from chalicelib.answers import TargetTick  # noqa: E402
from chalicelib.config import load_settings  # noqa: E402
from chalicelib.flags import QUEUED  # noqa: E402
from chalicelib.pump import STOP_BEFORE_DEADLINE_MS, Pump  # noqa: E402
from chalicelib.queue import WaitingRoom  # noqa: E402
from chalicelib.redis_connection import connect  # noqa: E402
from chalicelib.scripts import run_pipelined  # noqa: E402
from chalicelib.store import Defaults, QueueStore  # noqa: E402
from chalicelib.target_config import TargetConfig  # noqa: E402
from chalicelib.targets import Target  # noqa: E402
from chalicelib.tokens import GrantTerms, TokenSigner  # noqa: E402

TARGET = Target("limited-drop", 1)
NAIVE = Target("limited-drop", 2)
PUMPS = 8

# The reference the issue warns about: tick-idempotent like admit.lua, but the mark advances over raw
# sequence numbers, so slots of users who already left are spent on nobody.
NAIVE_ADMIT = """
local time = redis.call('TIME')
local tick = math.floor((tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)) / tonumber(ARGV[1]))
local last = tonumber(redis.call('GET', KEYS[3]))
if last and tick <= last then return 0 end
local mark = tonumber(redis.call('GET', KEYS[2]) or '0')
local new = math.min(mark + tonumber(ARGV[2]), tonumber(redis.call('GET', KEYS[1]) or '0'))
redis.call('SET', KEYS[2], new)
redis.call('SET', KEYS[3], tick)
return tick
"""


def settings_for(prefix: str, **values):
    env = {**os.environ, "VQ_KEY_PREFIX": prefix, **{k: str(v) for k, v in values.items()}}
    return load_settings(env)


def load_line(store: QueueStore, target: Target, users: int, settings) -> int:
    """`users` in line, as enter.lua leaves them; the first through the real enter, which registers the target and
    gives the first seq (the server clock in microseconds), the others the seqs after it. Answers the first seq:
    user u's is first + u - 1."""
    now = int(time.time() * 1000)
    terms = GrantTerms(now // 1000 + 300, "0" * 64)
    defaults = Defaults(
        settings.max_waiting,
        settings.batch_size,
        settings.tick_ms,
        settings.queue_idle_ttl_s * 1000,
        open_on_first_use=True,
    )
    first = store.enter(target, "1", now, terms, defaults).seq
    k = store.keys(target)
    for start in range(2, users + 1, 10_000):
        chunk = range(start, min(start + 10_000, users + 1))
        pipe = store.client.pipeline(transaction=False)
        pipe.zadd(k.waiting, {str(u): first + u - 1 for u in chunk})
        pipe.zadd(k.heartbeat, {str(u): now for u in chunk})
        pipe.execute()
    store.client.set(k.seq, first + users - 1)
    return first


def clean(client, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)


def concurrent_pumps(url: str, mode: str, seconds: float = benchlib.scaled(6.0, 1.0)) -> dict:
    """8 pumps over one target for `seconds`: admissions per elapsed tick, and how many ticks each pump applied."""
    client = connect(url)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    settings = settings_for(
        prefix, VQ_TICK_MS=100, VQ_BATCH_SIZE=50, VQ_PUMP_LEASE_TICKS=2, VQ_CATCHUP_TICKS=20, VQ_MAX_WAITING=1_000_000
    )
    store = QueueStore(client, prefix)
    load_line(store, TARGET, benchlib.scaled(200_000, 5_000), settings)
    lease_s = settings.pump_lease_ticks * settings.tick_ms / 1000
    results: list[tuple[int, TargetTick]] = []

    class RecordingStore(QueueStore):
        def __init__(self, *args, number: int):
            super().__init__(*args)
            self.number = number
            self.rng = random.Random()
            self.calls_until_freeze = self.rng.randint(3, 8)

        def admit_and_evict_all(self, targets, rules, seen=None):
            if mode == "freezes":
                self.calls_until_freeze -= 1
                if self.calls_until_freeze == 0:
                    self.calls_until_freeze = self.rng.randint(3, 8)
                    time.sleep(self.rng.uniform(lease_s + 0.1, lease_s + 0.19))
            answer = super().admit_and_evict_all(targets, rules, seen)
            results.extend((self.number, r) for r in answer.values())
            return answer

    deadline = time.monotonic() + seconds

    def with_lock(number: int) -> None:
        store_ = RecordingStore(connect(url), prefix, number=number)
        Pump(store_, settings).run(remaining_ms=lambda: (deadline - time.monotonic()) * 1000 + STOP_BEFORE_DEADLINE_MS)

    def without_lock(number: int) -> None:
        # Every pump works every tick, at a random point in it: only tick idempotence holds the rate.
        store_ = RecordingStore(connect(url), prefix, number=number)
        pump = Pump(store_, settings)
        while time.monotonic() < deadline:
            store_.admit_and_evict_all(list(store_.registered_targets()), pump.rules)
            time.sleep(random.uniform(0.02, 0.1))

    worker = without_lock if mode == "no lock" else with_lock
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(PUMPS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    applied = sorted(r.applied_tick for _, r in results if r.applied_tick is not None)
    elapsed = applied[-1] - applied[0] + 1
    # Admitted users stay in line until they collect their token, which nobody does here.
    admitted = client.zcount(store.keys(TARGET).waiting, "-inf", client.get(store.keys(TARGET).mark))
    clean(client, prefix)
    return {
        "mode": mode,
        "batch": settings.batch_size,
        "ticks_elapsed": elapsed,
        "ticks_applied": len(applied),
        "ticks_applied_twice": len(applied) - len(set(applied)),
        "duplicate_calls_refused": sum(1 for _, r in results if r.applied_tick is None),
        "pumps_that_applied_ticks": len({n for n, r in results if r.applied_tick is not None}),
        "admitted": admitted,
        "admissions_per_tick": admitted / elapsed,
        "ratio_to_batch": admitted / elapsed / settings.batch_size,
    }


def net_and_pumps(url: str, seconds: float = benchlib.scaled(6.0, 1.0)) -> dict:
    """8 pumps and 4 entering threads over one target with the safety net, demand swinging around the rate: a
    second and a half at about a tenth of it, half a second at about twice it. Admissions are read back from the
    target's UserAdmitted events (Redis time, seq, queued)."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    settings = settings_for(
        prefix, VQ_TICK_MS=100, VQ_BATCH_SIZE=10, VQ_PUMP_LEASE_TICKS=2, VQ_CATCHUP_TICKS=20, VQ_MAX_WAITING=1_000_000
    )
    outbox = 10_000_000

    def room() -> WaitingRoom:
        store = QueueStore(connect(url), prefix, outbox_cap=outbox)
        return WaitingRoom(store, TokenSigner(settings.keyring), settings, _QueueOn())

    room().configure(TARGET, TargetConfig(safety_net=True))
    started = time.monotonic()
    deadline = started + seconds
    users = iter(range(1, 10_000_000))
    lock = threading.Lock()

    def pump() -> None:
        store = QueueStore(connect(url), prefix, outbox_cap=outbox)
        Pump(store, settings).run(remaining_ms=lambda: (deadline - time.monotonic()) * 1000 + STOP_BEFORE_DEADLINE_MS)

    def crowd() -> None:
        own, rng = room(), random.Random()
        while time.monotonic() < deadline:
            with lock:
                user = next(users)
            own.enter(TARGET, str(user))
            surge = int((time.monotonic() - started) * 2) % 4 == 1
            time.sleep(0.02 if surge else rng.uniform(0.3, 0.5))

    threads = [threading.Thread(target=pump) for _ in range(PUMPS)] + [threading.Thread(target=crowd) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client = connect(url)
    made = [
        (int(entry_id.split("-")[0]) // settings.tick_ms, int(fields["seq"]), fields["queued"] == "1")
        for entry_id, fields in client.xrange(QueueStore(client, prefix).keys(TARGET).events)
        if fields["type"] == "UserAdmitted"
    ]
    clean(client, prefix)
    first, last = made[0][0], made[-1][0]
    so_far, worst = 0, 0.0
    per_tick = collections.Counter(tick for tick, _, _ in made)
    for tick in range(first, last + 1):
        so_far += per_tick[tick]
        worst = max(worst, so_far / (settings.batch_size * (tick - first + 1)))
    seqs = [seq for _, seq, _ in made]
    return {
        "batch": settings.batch_size,
        "ticks_elapsed": last - first + 1,
        "admitted_by_the_pump": sum(queued for _, _, queued in made),
        "passed_through": sum(not queued for _, _, queued in made),
        "admissions_per_tick": len(made) / (last - first + 1),
        "most_over_a_prefix_x_batch": round(worst, 3),
        "most_in_a_tick": max(per_tick.values()),
        "out_of_seq_order": sum(b < a for a, b in zip(seqs, seqs[1:], strict=False)),
    }


class _QueueOn:
    """The queue's switch, on for everyone: the bench measures the queue, not the flag."""

    def decide(self, target, user_id=None):
        return QUEUED

    def adopt(self, version, configuration):
        pass


def abandonment(url: str, users: int = benchlib.scaled(20_000, 2_000), ticks: int = benchlib.scaled(20, 4)) -> dict:
    """30 % of users leave before their turn; share of admissions (slots spent) that reached users still waiting."""
    client = connect(url)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    settings = settings_for(prefix, VQ_TICK_MS=100, VQ_BATCH_SIZE=100, VQ_MAX_WAITING=1_000_000)
    store = QueueStore(client, prefix)
    first = {target: load_line(store, target, users, settings) for target in (TARGET, NAIVE)}
    leavers = random.Random(7).sample(range(1, users + 1), int(users * 0.3))
    for target in (TARGET, NAIVE):
        for user in leavers:
            store.leave(target, str(user), first[target] + user - 1, 0, 60_000, 2000)  # the ticket's seq (load_line)
    naive = client.register_script(NAIVE_ADMIT)
    rules = Pump(store, settings).rules
    dk, nk = store.keys(TARGET), store.keys(NAIVE)
    design_slots = design_reached = naive_slots = naive_reached = 0
    previous = None
    for _ in range(ticks):
        seconds, micros = client.time()
        time.sleep((settings.tick_ms - (seconds * 1000 + micros // 1000) % settings.tick_ms + 5) / 1000)
        design_before, naive_before = int(client.get(dk.mark) or 0), int(client.get(nk.mark) or 0)
        result = store.admit_and_evict_all([TARGET], rules)[TARGET]
        naive(keys=[nk.seq, nk.mark, nk.tick], args=[settings.tick_ms, settings.batch_size])
        naive_after = int(client.get(nk.mark))
        # Slots the rate granted this design: batch x ticks applied; the naive mark spends one per seq it passes.
        design_slots += settings.batch_size * (1 if previous is None else result.applied_tick - previous)
        previous = result.applied_tick
        design_reached += client.zcount(dk.waiting, f"({design_before}", result.mark)
        naive_slots += naive_after - naive_before
        naive_reached += client.zcount(nk.waiting, f"({naive_before}", naive_after)
    clean(client, prefix)
    return {
        "users": users,
        "left_before_their_turn": len(leavers),
        "batch": settings.batch_size,
        "ticks": ticks,
        "this design": {
            "slots": design_slots,
            "to_users_still_waiting": design_reached,
            "share": design_reached / design_slots,
        },
        "naive mark": {
            "slots": naive_slots,
            "to_users_still_waiting": naive_reached,
            "share": naive_reached / naive_slots,
        },
    }


def silent_abandonment(
    url: str, users: int = benchlib.scaled(20_000, 8_000), ticks: int = benchlib.scaled(200, 80)
) -> dict:
    """30 % of the users beyond the presence window stop polling (silent five heartbeat timeouts before the sale
    runs); the others poll inside the window as told. Share of the admissions beyond the first window (slots spent)
    that reached users still polling: presence is asked only inside the window, so a silent user is evicted after
    its place has been inside it for the heartbeat timeout, before the mark reaches it (docs/guarantees.md). At
    1,000 a second, a 3 s heartbeat and a 6 s window (6,000 places), scaled down from 50 a second, 60 s and 120 s."""
    client = connect(url)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    settings = settings_for(
        prefix,
        VQ_TICK_MS=100,
        VQ_BATCH_SIZE=100,
        VQ_MAX_WAITING=1_000_000,
        VQ_HEARTBEAT_TIMEOUT_S=3,
        VQ_PRESENCE_WINDOW_S=6,
    )
    store = QueueStore(client, prefix)
    first = load_line(store, TARGET, users, settings)
    reach = int(settings.admissions_per_second * settings.presence_window_s)
    far_back = range(reach + settings.batch_size + 1, users + 1)
    silent = set(random.Random(7).sample(far_back, int(len(far_back) * 0.3)))
    rules = Pump(store, settings).rules
    k = store.keys(TARGET)
    store.admit_and_evict_all([TARGET], rules)  # the first tick: the window's first edge
    long_ago = int(time.time() * 1000) - 5 * settings.heartbeat_timeout_s * 1000
    client.zadd(k.heartbeat, {str(u): long_ago for u in silent})
    slots = reached = 0
    for _ in range(ticks):
        seconds, micros = client.time()
        time.sleep((settings.tick_ms - (seconds * 1000 + micros // 1000) % settings.tick_ms + 5) / 1000)
        # Those polling within the window poll (their heartbeat); the silent do not.
        mark = int(client.get(k.mark) or first - 1)
        inside = client.zrangebyscore(k.waiting, f"({mark}", "+inf", start=0, num=reach)
        now = int(time.time() * 1000)
        polling = {u: now for u in inside if int(u) not in silent}
        if polling:
            client.zadd(k.heartbeat, polling)
        result = store.admit_and_evict_all([TARGET], rules)[TARGET]
        if mark >= first + far_back[0] - 1:  # past the first window: every place here crossed in during the run
            # The slots spent: on a loaded machine a late tick's catch-up may not cover every tick elapsed.
            slots += result.admitted
            admitted = client.zrangebyscore(k.waiting, f"({mark}", result.mark)
            reached += sum(1 for u in admitted if int(u) not in silent)
        if result.waiting == 0:
            break
    clean(client, prefix)
    return {
        "users": users,
        "stopped_polling": len(silent),
        "batch": settings.batch_size,
        "heartbeat_timeout_s": settings.heartbeat_timeout_s,
        "presence_window_s": settings.presence_window_s,
        "slots": slots,
        "to_users_still_polling": reached,
        "share": reached / slots,
    }


def evalsha_stats(client) -> tuple[int, int]:
    stats = client.info("commandstats").get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    return int(stats["calls"]), int(stats["usec"])


def redis_time(url: str, users: int = benchlib.scaled(100_000, 2_000), repeats: int = benchlib.scaled(200, 5)) -> dict:
    """Server time per script call with `users` waiting (EVALSHA usec from INFO commandstats, before/after)."""
    client = connect(url)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    settings = settings_for(prefix, VQ_TICK_MS=2000, VQ_BATCH_SIZE=100, VQ_MAX_WAITING=1_000_000)
    store = QueueStore(client, prefix)
    first = load_line(store, TARGET, users, settings)
    rules = Pump(store, settings).rules
    k = store.keys(TARGET)
    # One tick's evict and admit calls exactly as the store makes them (which also loads the scripts).
    tick_calls = []
    run_pipelined = store_module.run_pipelined
    store_module.run_pipelined = lambda client, calls: tick_calls.extend(calls) or run_pipelined(client, calls)
    try:
        store.admit_and_evict_all([TARGET], rules)
    finally:
        store_module.run_pipelined = run_pipelined
    sent = {script: (keys, args) for script, keys, args in tick_calls}
    (evict_script, (evict_keys, evict_args)), (admit_script, (admit_keys, admit_args)) = (
        (script, sent[script]) for script in (store._evict, store._admit)
    )

    def measure(prepare, call, n):
        total_calls = total_usec = 0
        for _ in range(n):
            prepare()
            calls0, usec0 = evalsha_stats(client)
            call()
            calls1, usec1 = evalsha_stats(client)
            total_calls += calls1 - calls0
            total_usec += usec1 - usec0
        return total_usec / total_calls, total_calls / n

    def rewind_tick():
        # The next call applies a fresh tick (a real admission of one batch) to the same line as before.
        client.decr(k.tick)
        client.set(k.mark, first - 1)

    def admit():
        admit_script.run(admit_keys, admit_args)

    def evict():
        evict_script.run(evict_keys, evict_args)

    stale_batches = iter(range(1, 1_000_000))

    def make_stale():
        # A mass departure: `max_evict` more users in line, who stopped polling two minutes ago.
        lowest = users + next(stale_batches) * rules.max_evict
        members = {str(u): first + u - 1 for u in range(lowest, lowest + rules.max_evict)}
        client.zadd(k.waiting, members)
        client.zadd(k.heartbeat, {m: int(time.time() * 1000) - 120_000 for m in members})

    admit_us, _ = measure(rewind_tick, admit, repeats)
    evict_us, _ = measure(lambda: None, evict, repeats)
    evict_cap_us, _ = measure(make_stale, evict, benchlib.scaled(20, 2))
    tick_us, calls = measure(rewind_tick, lambda: store.admit_and_evict_all([TARGET], rules), repeats)

    started = time.perf_counter()
    for _ in range(repeats):
        rewind_tick()
        store.admit_and_evict_all([TARGET], rules)
    client_ms = (time.perf_counter() - started) / repeats * 1000
    waiting = client.zcard(k.waiting)
    clean(client, prefix)
    return {
        "users_waiting": users,
        "still_waiting_at_end": waiting,
        "admit_us": admit_us,
        "evict_none_stale_us": evict_us,
        f"evict_{rules.max_evict}_stale_us": evict_cap_us,
        "tick_us_per_script": tick_us,
        "tick_us_total": tick_us * calls,
        "tick_client_ms_incl_round_trip": client_ms,
    }


def command_usec(client) -> int:
    """Server usec of every command so far (INFO commandstats)."""
    return sum(int(row["usec"]) for row in client.info("commandstats").values())


def hundred_targets(url: str, targets: int = benchlib.scaled(100, 5), users: int = benchlib.scaled(1_000, 200)) -> dict:
    """One whole pump tick (lock, registry, one pipeline of evict and admit per target, gauges) over `targets`
    targets of `users` waiting each, one of them a mass departure (all its users stopped polling 2 minutes ago):
    Redis time (INFO commandstats, every command) and the pump process's time (CPU and wall), in at least 7
    alternating rounds, each on a line built afresh."""
    client = benchlib.patient_client(url)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    settings = settings_for(prefix, VQ_TICK_MS=2000, VQ_BATCH_SIZE=100, VQ_MAX_WAITING=1_000_000)
    store = QueueStore(client, prefix)
    lines = [Target("limited-drop", n) for n in range(1, targets + 1)]
    stale = lines[0]

    def build() -> None:
        clean(client, prefix)
        for target in lines:
            load_line(store, target, users, settings)
        two_minutes_ago = int(time.time() * 1000) - 120_000
        client.zadd(store.keys(stale).heartbeat, {str(u): two_minutes_ago for u in range(1, users + 1)})

    def one_tick() -> dict:
        build()
        pump = Pump(store, settings)
        usec, started, cpu = command_usec(client), time.perf_counter(), time.process_time()
        report = pump.tick()
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        usec = command_usec(client) - usec
        pump._release()
        assert report.errors == 0 and report.targets[stale].evicted == min(users, settings.max_evict_per_tick)
        return {
            "redis_us": usec,
            "client_cpu_us": cpu * 1e6,
            "client_wall_us": wall * 1e6,
            "evicted": sum(r.evicted for r in report.targets.values()),
            "admitted": sum(r.admitted for r in report.targets.values()),
        }

    # As deployed, the tick writes its gauges (EMF lines to stdout, which main() sets aside).
    observability._METRICS_DISABLED = False
    try:
        one_tick()  # loads the scripts
        values, loads = benchlib.alternating({"tick": one_tick})
    finally:
        observability._METRICS_DISABLED = True
        clean(client, prefix)
    rounds = values["tick"]
    return {
        "targets": targets,
        "users_per_target": users,
        "stale_users": users,
        "evicted_per_tick": rounds[-1]["evicted"],
        "admitted_per_tick": rounds[-1]["admitted"],
        "load_average": benchlib.loads(loads),
        **{
            figure: benchlib.spread([r[figure] for r in rounds])
            for figure in ("redis_us", "client_cpu_us", "client_wall_us")
        },
    }


def opening(url: str, users: int = benchlib.scaled(1_000_000, 2_000)) -> dict:
    """A target with `users` pre-queued (each through the real enter.lua, pipelined) opens: the pump ticks from the
    opening until it has admitted a batch. Measured: the longest single Redis command meanwhile (SLOWLOG, every
    command of 1 ms or more), the time from the opening to the end of the tick that admitted the first batch, and
    the pump process's peak memory growth (ru_maxrss) over it."""
    client = benchlib.patient_client(url)  # a million enters in pipelines of thousands: a store's timeouts would trip
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    settings = settings_for(prefix, VQ_TICK_MS=1000, VQ_BATCH_SIZE=100, VQ_MAX_WAITING=users + 1)
    store = QueueStore(client, prefix)
    room = WaitingRoom(store, TokenSigner(settings.keyring), settings, _QueueOn())
    room.configure(TARGET, TargetConfig(opens_at_ms=int(time.time() * 1000) + 3_600_000))
    now = int(time.time() * 1000)
    terms = GrantTerms(now // 1000 + 300, "0" * 64)
    defaults = Defaults(settings.max_waiting, settings.batch_size, settings.tick_ms, 3_600_000)
    k = store.keys(TARGET)
    for start in range(0, users, 2_000):
        calls = [
            store.enter_call(TARGET, 1, str(user), now, terms, defaults)
            for user in range(start, min(start + 2_000, users))
        ]
        failed = [reply for reply in run_pipelined(client, calls) if isinstance(reply, Exception)]
        assert not failed, failed[:3]
    store._register(TARGET, 3_600_000)
    pre_queued = client.zcard(k.prequeue)
    room.configure(TARGET, TargetConfig(opens_at_ms=int(time.time() * 1000)))
    pump = Pump(store, settings)
    client.config_set("slowlog-log-slower-than", 1000)
    client.config_set("slowlog-max-len", 100_000)
    client.slowlog_reset()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    opened = time.monotonic()
    ticks = admitted = 0
    while admitted == 0 and time.monotonic() - opened < 120:
        admitted += sum(r.admitted for r in pump.tick().targets.values() if isinstance(r, TargetTick))
        ticks += 1
        if admitted == 0:
            time.sleep(pump._ms_to_next_tick() / 1000)
    first_batch_s = time.monotonic() - opened
    rss_growth_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    slow = [entry for entry in client.slowlog_get(100_000) if not str(entry["command"]).startswith("SLOWLOG")]
    longest = max(slow, key=lambda entry: entry["duration"], default=None)
    pump._release()
    clean(client, prefix)
    return {
        "pre_queued": pre_queued,
        "first_batch_s": round(first_batch_s, 3),
        "ticks_to_first_batch": ticks,
        "admitted": admitted,
        "longest_command_ms": round(longest["duration"] / 1000, 2) if longest else 0.0,
        "longest_command": (longest["command"] if isinstance(longest["command"], str) else longest["command"].decode())[
            :60
        ]
        if longest
        else "none of 1 ms or more",
        "commands_of_1_ms_or_more": len(slow),
        "pump_rss_growth_mb": round(rss_growth_mb, 1),
    }


def main() -> None:
    with benchlib.redis_url() as url:
        version = benchlib.server_version(connect(url))
        with contextlib.redirect_stdout(io.StringIO()):  # the pump's EMF lines
            concurrency = [concurrent_pumps(url, mode) for mode in ("as deployed", "freezes", "no lock")]
            net = net_and_pumps(url)
            abandon = abandonment(url)
            silence = silent_abandonment(url)
            timing = redis_time(url)
            timing_small = redis_time(url, users=1_000)
            tick = hundred_targets(url)
            opened = opening(url)

    print(f"\nadmission pump benchmark  ({version}, Python {platform.python_version()})\n")
    print(
        f"{'8 concurrent pumps':<22}{'batch':>6}{'ticks':>7}{'applied':>9}{'twice':>7}{'refused':>9}"
        f"{'pumps':>7}{'admitted':>10}{'per tick':>10}{'x batch':>9}"
    )
    for row in concurrency:
        print(
            f"{row['mode']:<22}{row['batch']:>6}{row['ticks_elapsed']:>7}{row['ticks_applied']:>9}"
            f"{row['ticks_applied_twice']:>7}{row['duplicate_calls_refused']:>9}{row['pumps_that_applied_ticks']:>7}"
            f"{row['admitted']:>10}{row['admissions_per_tick']:>10.2f}{row['ratio_to_batch']:>9.3f}"
        )
    print(
        f"\n8 pumps and 4 entering threads, safety net on ({net['batch']} a tick): {net['ticks_elapsed']} ticks, "
        f"{net['admitted_by_the_pump']} admitted by the pump, {net['passed_through']} passed through, "
        f"{net['admissions_per_tick']:.2f} a tick, at most {net['most_in_a_tick']} in a tick and "
        f"{net['most_over_a_prefix_x_batch']} x batch over a prefix of ticks, {net['out_of_seq_order']} out of order"
    )
    print(
        f"\n30 % abandonment ({abandon['users']} users, {abandon['left_before_their_turn']} left before "
        f"their turn, {abandon['ticks']} ticks of {abandon['batch']})"
    )
    for name in ("this design", "naive mark"):
        row = abandon[name]
        print(
            f"  {name:<12} slots {row['slots']:>5}  to users still waiting {row['to_users_still_waiting']:>5}"
            f"  share {row['share']:.1%}"
        )
    print(
        f"\n30 % of those far back stop polling ({silence['users']} users, {silence['stopped_polling']} silent; "
        f"{silence['heartbeat_timeout_s']} s heartbeat, {silence['presence_window_s']} s window): slots "
        f"{silence['slots']}, to users still polling {silence['to_users_still_polling']}, share "
        f"{silence['share']:.1%}"
    )
    print(f"\nRedis time per call (EVALSHA usec, INFO commandstats){'':<4}{'100,000 waiting':>16}{'1,000 waiting':>15}")
    for key, value in timing.items():
        if key.endswith("_us") or key.endswith("_ms_incl_round_trip") or key.endswith("total"):
            print(f"  {key:<54}{value:>9.1f}{timing_small[key]:>15.1f}")

    load = tick["load_average"]
    print(
        f"\none pump tick over {tick['targets']} targets of {tick['users_per_target']:,} waiting, one of them a mass "
        f"departure ({tick['evicted_per_tick']:,} evicted, {tick['admitted_per_tick']:,} admitted), "
        f"median [range] of "
        f"{benchlib.ROUNDS} rounds, load average {load['min']}-{load['max']}"
    )
    print(f"  Redis (all commands, INFO commandstats)  {benchlib.shown(tick['redis_us'], ' us', 0)}")
    print(f"  pump process CPU                         {benchlib.shown(tick['client_cpu_us'], ' us', 0)}")
    print(f"  pump process wall                        {benchlib.shown(tick['client_wall_us'], ' us', 0)}")
    print(
        f"\nthe opening of {opened['pre_queued']:,} pre-queued: first batch {opened['first_batch_s']} s after it "
        f"({opened['ticks_to_first_batch']} ticks), longest Redis command {opened['longest_command_ms']} ms "
        f"({opened['longest_command']}), pump memory +{opened['pump_rss_growth_mb']} MB"
    )
    out = benchlib.write_json(
        "bench_pump.json",
        {
            "server": version,
            "python": platform.python_version(),
            "concurrent_pumps": concurrency,
            "safety_net_with_pumps": net,
            "abandonment": abandon,
            "silent_abandonment": silence,
            "redis_time": [timing, timing_small],
            "tick_100_targets": tick,
            "opening": opened,
        },
    )
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--opening"]:  # the opening alone, of N pre-queued: `bench_pump.py --opening 1000000`
        with benchlib.redis_url() as url, contextlib.redirect_stdout(io.StringIO()):
            figures = opening(url, int(sys.argv[2]))
        print(json.dumps(figures))
    else:
        main()
