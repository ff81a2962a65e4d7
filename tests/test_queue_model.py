"""Model-based: Hypothesis drives the real waiting room, pump and purchase gate against a real Redis with random
sequences of enter (one user, or a crowd up to capacity), poll, leave, pump ticks (two pumps sharing the lock,
at a new tick or within the one just applied), time passing (evictions), purchases that succeed, purchases
the downstream fails (the token stays used, a retry goes again under the same Idempotency-Key) or says it did
not take (the token is given back), four concurrent purchases with one token, purchases with a token its holder
gave up by leaving, and a restore with a stale consumption id; every answer is compared with a small pure-Python
model of the queue (seq, position, admission, token, refusal). After every step it checks, against Redis itself:
the line is the model's (FIFO by seq; nobody who left or was evicted holds a place or a token), capacity holds,
admissions never exceed batch x ticks applied, and no token has made two orders at the shop.

Time: ticks are real (Redis TIME, VQ_TICK_MS=100, the minimum), so a tick step waits for the next tick
boundary. Heartbeats are judged against Redis TIME too; "time passing" moves the room's clock forward and
the pump's heartbeat timeout back by the same amount, which is exactly what letting that much time pass
would do to the eviction test (heartbeat <= Redis now - timeout). Steps of 50 s against a 100 s timeout keep
every verdict clear of the few seconds of real time a run takes.
"""

from __future__ import annotations

import dataclasses
import time
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from chalicelib import runtime
from chalicelib.config import load_settings
from chalicelib.errors import AlreadyAdmitted, EntryTokenUsed, NotInQueue, QueueBypassDenied, QueueFull
from chalicelib.pump import Pump
from chalicelib.purchase import PurchaseGate, PurchaseRequest
from chalicelib.queue import WaitingRoom
from chalicelib.store import QueueStore
from chalicelib.targets import Target
from chalicelib.tokens import EntryGrant, EntryToken, TokenSigner
from tests.support.buying import buy_at_once
from tests.support.downstream import Origin

DROP = Target("limited-drop", 42)
EVERYONE = range(1, 7)
USERS = st.sampled_from(EVERYONE)
TICK_MS, BATCH, CAPACITY, CATCHUP = 100, 2, 4, 3
TIMEOUT_S, TIME_STEP_S = 100, 50
# Generated cases: examples x steps. Each tick step waits up to one tick; the whole run stays well under a minute.
MAX_EXAMPLES, STEPS = 50, 50


class Model:
    """What the queue of one target should hold: the line (user -> seq), the mark, heartbeats in virtual
    seconds, collected tokens, whether the pump visits the target, and the ticks it applied."""

    def __init__(self) -> None:
        self.last_seq = 0  # the last seq handed out (0: none yet, the line is new)
        self.line: dict[int, int] = {}
        self.heartbeat: dict[int, int] = {}
        self.mark = 0
        self.holding: dict[int, EntryToken] = {}  # user -> the entry token Redis holds for them
        self.registered = False
        self.first_tick: int | None = None
        self.last_tick: int | None = None
        self.admitted = 0

    def waiting(self) -> list[tuple[int, int]]:
        """(seq, user) of everyone in line not yet admitted, in line order."""
        return sorted((seq, user) for user, seq in self.line.items() if seq > self.mark)

    def ahead_of(self, seq: int) -> int:
        return sum(1 for s, _ in self.waiting() if s < seq)

    def collect(self, user: int, token: EntryToken) -> None:
        del self.line[user], self.heartbeat[user]
        self.holding[user] = token

    def evict(self, now_s: int) -> int:
        stale = [user for user, at in self.heartbeat.items() if now_s - at >= TIMEOUT_S]
        for user in stale:
            del self.line[user], self.heartbeat[user]
        return len(stale)

    def admit(self, tick: int) -> int:
        covered = 1 if self.last_tick is None else min(tick - self.last_tick, CATCHUP)
        waiting = self.waiting()
        admitted = min(BATCH * covered, len(waiting))
        if admitted:
            self.mark = waiting[admitted - 1][0]
        self.first_tick = tick if self.first_tick is None else self.first_tick
        self.last_tick = tick
        self.admitted += admitted
        return admitted


class QueueMachine(RuleBasedStateMachine):
    """One run: a fresh key prefix, the real objects over it, and the model beside them."""

    client = None
    base_settings = None
    origin: Origin | None = None
    runs = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).runs += 1
        self.prefix = f"{self.base_settings.key_prefix}-m{uuid.uuid4().hex[:8]}"
        store = QueueStore(self.client, self.prefix)
        signer = TokenSigner(self.base_settings.keyring)
        self.store, self.signer = store, signer
        self.offset_s = 0
        self.room = WaitingRoom(store, signer, self.base_settings, runtime.switch(), clock=self.now)
        self.gate = PurchaseGate(store, signer, self.base_settings, runtime.switch(), clock=self.now)
        # Two pumps over one lock, as when Lambda overlaps invocations: only the holder ticks.
        self.pumps = [Pump(QueueStore(self.client, self.prefix), self.base_settings) for _ in range(2)]
        self.model = Model()
        self.tickets: dict[int, str] = {}  # the latest ticket each user was given
        self.tokens: dict[int, object] = {}  # the latest entry token each user was given
        # token id -> "unknown" (a purchase had no certain outcome), "used" or "revoked"; absent: unused
        self.token_state: dict[str, str] = {}
        self.keys = store.keys(DROP)

    def now(self) -> float:
        return time.time() + self.offset_s

    def teardown(self) -> None:
        keys = list(self.client.scan_iter(match=f"{self.prefix}:*", count=1000))
        if keys:
            self.client.delete(*keys)

    # --- the client's calls ---

    @rule(user=USERS)
    def enter(self, user):
        m = self.model
        try:
            entry = self.room.enter(DROP, str(user))
        except QueueFull:
            assert user not in m.line and user not in m.holding and len(m.waiting()) >= CAPACITY
            return
        except AlreadyAdmitted:
            # Knowing the id hands over no token (header mode): an admitted user's is their ticket's, for a poll.
            assert user in m.holding or (user in m.line and m.line[user] <= m.mark)
            if user in m.line:  # enter admitted them: the next poll collects the token it stored
                self.received_token(user, self.room.status(DROP, str(user), self.tickets[user]))
            return
        if user in m.line:
            assert entry.status == "WAITING" and entry.queue_ticket is None
            assert entry.position == m.ahead_of(m.line[user]) + 1
            m.heartbeat[user] = self.offset_s
            m.registered = True
        else:
            assert len(m.waiting()) < CAPACITY, "accepted over capacity"
            assert entry.status == "WAITING" and entry.queue_ticket
            ticket = self.signer.read_ticket(entry.queue_ticket)
            assert ticket.seq > m.last_seq, "seqs are handed out in arrival order"
            if not m.last_seq:
                m.mark = ticket.seq - 1  # a new line's mark starts just below its first seq
            m.line[user], m.heartbeat[user] = ticket.seq, self.offset_s
            m.last_seq = ticket.seq
            m.registered = True
            assert entry.position == m.ahead_of(ticket.seq) + 1
            self.tickets[user] = entry.queue_ticket

    @rule()
    def a_crowd_arrives(self):
        """Everyone enters, in turn: the line fills up to capacity."""
        for user in EVERYONE:
            self.enter(user)

    @rule(user=USERS)
    def poll(self, user):
        if user not in self.tickets:
            return
        m = self.model
        try:
            entry = self.room.status(DROP, str(user), self.tickets[user])
        except NotInQueue:
            assert user not in m.line and user not in m.holding, "a user in line was told they are not"
            return
        if user in m.holding:
            assert (entry.status, entry.entry_token) == ("ADMITTED", m.holding[user])
        elif m.line.get(user, m.mark + 1) <= m.mark:
            assert entry.status == "ADMITTED"
            self.received_token(user, entry)
        else:
            assert user in m.line, "a user who left, was evicted or never entered got an answer from the line"
            assert entry.status == "WAITING" and entry.position == m.ahead_of(m.line[user]) + 1
            m.heartbeat[user] = self.offset_s

    @rule(user=USERS)
    def leave(self, user):
        if user not in self.tickets:
            return
        self.room.leave(DROP, str(user), self.tickets[user])
        self.model.line.pop(user, None)
        self.model.heartbeat.pop(user, None)
        if self.model.holding.pop(user, None) is not None and self.tokens[user].token_id not in self.token_state:
            self.token_state[self.tokens[user].token_id] = "revoked"

    def received_token(self, user, entry) -> None:
        assert entry.entry_token.grants(DROP, str(user))
        assert entry.entry_token.token_id not in {t.token_id for t in self.tokens.values()}, "a token id twice"
        self.model.collect(user, entry.entry_token)
        self.tokens[user] = entry.entry_token

    # --- the pump and the clock ---

    @rule(pump=st.sampled_from([0, 0, 1]))
    def tick_after_the_boundary(self, pump):
        """A pump tick right after the next tick boundary: a new tick."""
        time.sleep((TICK_MS - self.redis_ms() % TICK_MS + 2) / 1000)
        self.tick(pump)

    @rule(pump=st.sampled_from([0, 1]))
    def tick_at_once(self, pump):
        """A pump tick at once: often in the tick just applied (a duplicate), or in a later one."""
        self.tick(pump)

    def tick(self, pump):
        p = self.pumps[pump]
        p.rules = dataclasses.replace(p.rules, heartbeat_timeout_ms=(TIMEOUT_S - self.offset_s) * 1000)
        before = self.redis_ms() // TICK_MS
        report = p.tick()
        after = self.redis_ms() // TICK_MS
        assert report.errors == 0
        m = self.model
        if not report.held_lock or not m.registered:
            assert DROP not in report.targets
            return
        result = report.targets[DROP]
        assert result.evicted == m.evict(self.offset_s)
        if result.applied_tick is None:
            assert m.last_tick is not None and before <= m.last_tick, "a new tick was not applied"
        else:
            assert before <= result.applied_tick <= after
            assert m.last_tick is None or result.applied_tick > m.last_tick, "a tick applied twice"
            assert result.admitted == m.admit(result.applied_tick)
        assert result.mark == m.mark
        if result.idle:
            assert not m.line
            m.registered = False

    @rule()
    def time_passes(self):
        self.offset_s += TIME_STEP_S

    def redis_ms(self) -> int:
        seconds, micros = self.client.time()
        return seconds * 1000 + micros // 1000

    # --- purchases ---

    @rule(user=USERS, downstream=st.sampled_from([201, 503, "not taken"]))
    def buy(self, user, downstream):
        """A purchase: the shop takes it, fails (outcome unknown) or says it did not take it."""
        token = self.tokens.get(user)
        if token is None:
            return
        state = self.token_state.get(token.token_id)
        self.origin.answers = [(503, {}, {"not_taken": True})] if downstream == "not taken" else [(downstream, {})]
        try:
            answer = self.purchase(token)
        except EntryTokenUsed:
            assert state == "used"
            return
        except QueueBypassDenied:
            assert state == "revoked"
            return
        finally:
            self.origin.answers = []
        assert state in (None, "unknown") and answer.status == (503 if downstream == "not taken" else downstream)
        if downstream == 201:
            self.token_state[token.token_id] = "used"
        elif downstream == 503 or state == "unknown":
            self.token_state[token.token_id] = "unknown"

    @rule(user=USERS)
    def buy_four_at_once(self, user):
        token = self.tokens.get(user)
        if token is None:
            return
        answers = buy_at_once(self.gate, self.request(token), 4)
        state = self.token_state.get(token.token_id)
        if state == "revoked":
            assert answers == ["revoked"] * 4
            return
        wins = answers.count(201)
        assert wins == (0 if state == "used" else 1) and answers.count("used") == 4 - wins
        self.token_state[token.token_id] = "used"

    @rule(user=USERS)
    def restore_with_a_stale_consumption_id(self, user):
        token = self.tokens.get(user)
        if token is None:
            return
        assert self.store.restore(token, "not-the-consumption-that-used-it") is False

    def purchase(self, token):
        return self.gate.purchase(self.request(token))

    def request(self, token):
        return PurchaseRequest(
            target_type=DROP.type,
            target_id=str(DROP.id),
            entry_token=token.text,
            user_id=str(token.user_id),
            authorizer=None,
            body=b"{}",
            content_type="application/json",
        )

    # --- after every step ---

    @invariant()
    def redis_holds_the_models_line(self):
        m, k = self.model, self.keys
        line = {int(user): int(seq) for user, seq in self.client.zrange(k.waiting, 0, -1, withscores=True)}
        assert line == m.line, "FIFO by seq: the line in Redis is the model's"
        assert int(self.client.get(k.mark) or 0) == m.mark
        assert self.client.zcount(k.waiting, f"({m.mark}", "+inf") <= CAPACITY
        for user in self.tickets:
            held = m.holding.get(user)
            grant = held and EntryGrant(held.expires_at, held.token_id).text
            stored = self.client.get(k.token(user))  # '<entry number> <grant>'
            assert (stored and stored.split(" ")[-1]) == grant, "a held token, or one that should not be"

    @invariant()
    def admissions_never_exceed_batch_times_ticks(self):
        m = self.model
        admitted = int(self.client.hget(self.keys.stats, "admitted") or 0)
        assert admitted == m.admitted
        ticks = 0 if m.first_tick is None else m.last_tick - m.first_tick + 1
        assert admitted <= BATCH * ticks

    @invariant()
    def each_token_makes_at_most_one_order(self):
        assert all(n == 1 for n in self.origin.orders_per_key().values())


# Slow: Hypothesis runs dozens of journeys against a real Redis (25-40 s here): make test runs it, test-fast not.
@pytest.mark.slow
def test_the_queue_behaves_like_its_model(env, connect_redis, origin):
    env(
        VQ_TICK_MS=TICK_MS,
        VQ_BATCH_SIZE=BATCH,
        VQ_MAX_WAITING=CAPACITY,
        VQ_CATCHUP_TICKS=CATCHUP,
        VQ_HEARTBEAT_TIMEOUT_S=TIMEOUT_S,
        VQ_TOKEN_TTL_S=86_400,
        VQ_PUMP_LEASE_TICKS=3,
    )
    QueueMachine.client = connect_redis()
    QueueMachine.base_settings = load_settings()
    QueueMachine.origin = origin
    QueueMachine.runs = 0
    started = time.monotonic()
    run_state_machine_as_test(
        QueueMachine,
        settings=settings(
            max_examples=MAX_EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    print(f"model-based: {QueueMachine.runs} runs of up to {STEPS} steps in {time.monotonic() - started:.1f} s")
