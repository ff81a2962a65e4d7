"""Virtual users under load: threads of users who enter, poll, leave and buy, and an admission pump, every call
recorded with what it answered and how long it took (what the fault and topology tests judge)."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from chalicelib import runtime
from chalicelib.errors import QueueError
from chalicelib.pump import Pump, TickReport
from chalicelib.targets import Target
from tests.support.buying import request_for


@dataclass
class Call:
    """One call a virtual user made, and what it answered."""

    op: str
    target: Target
    user: int
    started: float
    took: float = 0.0
    status: int = 200
    answer: str | None = None  # the entry's status, or the error code
    seq: int | None = None  # the seq of the ticket the user held
    token_id: str | None = None
    error: str | None = None  # an exception that is not a QueueError: a 500


@dataclass
class VirtualUser:
    target: Target
    user: int
    state: str = "new"  # new -> waiting -> holding -> done
    ticket: str | None = None
    seq: int | None = None
    token: object = None


@dataclass
class Run:
    """What a load run saw: every call, the fault's timeline, the pump's totals."""

    calls: list[Call] = field(default_factory=list)
    fault_at: float = 0.0
    healing_at: float = 0.0  # heal() began: a restarted server may answer from here on
    healed_at: float = 0.0
    resumed_at: float | None = None
    pump_admitted_after_heal: int = 0
    pump_admitted: int = 0  # over the whole run
    pump_errors: int = 0
    failures: list[BaseException] = field(default_factory=list)


class Load:
    """`threads` workers, each with a crowd of virtual users of its own spread over `targets`, and one admission
    pump, until stopped (a `with` block). Each worker calls one of `containers` (a waiting room and a purchase
    gate over one store: what one Lambda container holds), in turn: one container serves its calls one at a time,
    whichever target they are for, as a Lambda container does."""

    def __init__(
        self,
        containers: list[tuple[Any, Any]],
        pump: Pump,
        targets: tuple[Target, ...],
        threads: int = 6,
        users_per_thread: int = 50,
    ) -> None:
        self.containers, self.pump = containers, pump
        self.targets = targets
        self.users_per_thread = users_per_thread
        self.stop = threading.Event()
        self.run = Run()
        self.lock = threading.Lock()  # over run.calls
        self._threads = [threading.Thread(target=self._worker, args=(i,)) for i in range(threads)]
        self._threads.append(threading.Thread(target=self._pump))

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in self._threads), "a load thread hung"

    def calls(self) -> list[Call]:
        """The calls made so far."""
        with self.lock:
            return list(self.run.calls)

    def _worker(self, index: int) -> None:
        rng = random.Random(index)
        ids = iter(range(index * 1_000_000 + 1, (index + 1) * 1_000_000))
        # A steady crowd: whoever is done (bought or left) makes room for a newcomer.
        room, gate = self.containers[index % len(self.containers)]
        users = [VirtualUser(self.targets[n % len(self.targets)], next(ids)) for n in range(self.users_per_thread)]
        try:
            while not self.stop.is_set():
                slot = rng.randrange(len(users))
                call = self._step(room, gate, users[slot], rng)
                if users[slot].state == "done":
                    users[slot] = VirtualUser(users[slot].target, next(ids))
                with self.lock:
                    self.run.calls.append(call)
                time.sleep(0.002)
        except BaseException as err:  # noqa: BLE001 (the test must see it)
            self.run.failures.append(err)

    def _pump(self) -> None:
        try:
            result = self.pump.run(remaining_ms=lambda: 0 if self.stop.is_set() else 3_600_000.0)
            self.run.pump_errors = result.errors
        except BaseException as err:  # noqa: BLE001
            self.run.failures.append(err)

    def _step(self, room, gate, u: VirtualUser, rng: random.Random) -> Call:
        if u.state == "new":
            op = "enter"
        elif u.state == "waiting":
            op = "leave" if rng.random() < 0.03 else "status"
        else:
            op = "buy"
        call = Call(op, u.target, u.user, time.monotonic(), seq=u.seq)
        try:
            if op == "enter":
                self._took_place(room, u, call, room.enter(u.target, str(u.user)))
            elif op == "status":
                self._took_place(room, u, call, room.status(u.target, str(u.user), u.ticket))
            elif op == "leave":
                u.state = "done"  # gone either way: a leave Redis did not confirm may still have happened
                room.leave(u.target, str(u.user), u.ticket)
                call.status = 204
            else:
                call.token_id = u.token.token_id
                answer = gate.purchase(request_for(u.token, u.target, str(u.user)))
                call.status = answer.status
                if answer.status < 500:
                    u.state = "done"
        except QueueError as err:
            call.status, call.answer = err.status, err.code
            if err.code == "NOT_IN_QUEUE":  # the data was lost, or the user was evicted: enter again
                u.state, u.ticket, u.seq = "new", None, None
            if err.status in (429, 503) and "Retry-After" not in err.headers:
                call.error = f"{err.code} without Retry-After"
        except Exception as err:  # noqa: BLE001 (anything else would be a 500)
            call.status, call.error = 500, repr(err)
        call.took = time.monotonic() - call.started
        return call

    @staticmethod
    def _took_place(room, u: VirtualUser, call: Call, entry) -> None:
        call.answer = entry.status
        if entry.queue_ticket:
            u.ticket, u.seq = entry.queue_ticket, room.signer.read_ticket(entry.queue_ticket).seq
            call.seq = u.seq
        if entry.status == "WAITING":
            u.state = "waiting" if u.ticket else "new"
        elif entry.status in ("ADMITTED", "DIRECT_ADMITTED"):
            u.state, u.token = "holding", entry.entry_token
            call.token_id = entry.entry_token.token_id


@dataclass(frozen=True)
class PumpTick:
    """One tick of a RecordedPump: its span on the machine's clock, which is the clock the loopback servers' TIME
    reads (so a script's server time falls within the tick that ran it), and what it reported."""

    started: float
    ended: float
    report: TickReport


class RecordedPump(Pump):
    """A pump that keeps every tick it makes (`ticks`), to match what the sub-lines record against its ticks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ticks: list[PumpTick] = []

    def tick(self) -> TickReport:
        started = time.time()
        report = super().tick()
        self.ticks.append(PumpTick(started, time.time(), report))
        return report


def between(calls: list[Call], start: float, end: float) -> list[Call]:
    return [c for c in calls if start <= c.started < end]


def containers(n: int) -> list[tuple[Any, Any]]:
    """The waiting room and purchase gate of `n` Lambda containers, each built from the environment as runtime.py
    builds them: a Redis client and circuit breakers of its own."""
    built = []
    for _ in range(n):
        runtime.reset()
        built.append((runtime.waiting_room(), runtime.purchase_gate()))
    return built
