"""Benchmark: the Redis side of the client calls: round trips, server throughput against plain ZADD, memory per user.

Run: .venv/bin/python tests/perf/bench_scripts.py   (REDIS_URL, else an embedded Valkey; needs redis-benchmark)
Measures, in one run on one server:
  - round trips per call, counted as sends on the client's sockets (a pipeline is one send): enter, status
    (waiting; admitted by this call; holding a token), leave, purchase (consume; consume + restore when the
    downstream fails), one pump tick over 1 and over 10 targets;
  - throughput of each client-facing script (redis-benchmark: EVALSHA, random users, 50 connections, no
    pipelining) and of plain `ZADD key <random> member:<random>`, in turns, medians of the rounds;
  - the same for the naive design's status: heartbeat ZADD, ZRANK, ZSCORE, GET mark (a waiting poll) and
    SET NX token, ZREM (the poll that admits), each its own round trip as a naive client sends them;
  - Redis memory per waiting user with 100,000 users in one target (INFO memory used_memory delta).
Every script call is recorded from the code as the store sends it (keys and arguments), never spelt out here;
redis-benchmark then puts `__rand_int__` where the user id (and a token id) was. Each `__rand_int__` is drawn
on its own, so a script's per-user token key names another random user than its user argument: the same work.
Prints a table and writes build/bench_scripts.json.
Targets: one round trip per client call; each script >= 0.5x ZADD; at most 250 bytes per waiting user.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import statistics
import subprocess
import sys
import time

import benchlib  # beside this file

sys.path.insert(0, str(benchlib.ROOT))

os.environ.update({
    **benchlib.BASE_ENV,
    "VQ_MAX_WAITING": "10000000",  # the opening burst below must never meet a full line
    "VQ_ORIGIN_LIMITED_DROP_URL": "http://127.0.0.1:9",  # never called: the downstream is stubbed
    "VQ_ORIGIN_TICKETING_URL": "http://127.0.0.1:9",
    "POWERTOOLS_LOG_LEVEL": "CRITICAL",
})

import redis  # noqa: E402
from redis.connection import Connection  # noqa: E402

from chalicelib import purchase  # noqa: E402
from chalicelib.config import load_settings  # noqa: E402
from chalicelib.errors import NotInQueue  # noqa: E402
from chalicelib.origin import OriginAnswer  # noqa: E402
from chalicelib.pump import Pump  # noqa: E402
from chalicelib.queue import WaitingRoom  # noqa: E402
from chalicelib.store import QueueStore, connect  # noqa: E402
from chalicelib.targets import Target  # noqa: E402
from chalicelib.tokens import TokenSigner  # noqa: E402

USERS = 100_000  # users in the line that status, leave and the memory figure work on
SENTINEL = 900_000_000_001  # the user id recorded calls are made for, replaced by each benchmarked user
RAND = "__rand_int__"
CONNECTIONS = 50
REQUESTS = 30_000  # per redis-benchmark run
ROUNDS = 3
TARGET_ZADD_RATIO = 0.5
TARGET_BYTES_PER_USER = 250


class QueueOn:
    """The feature flag, always on: the benchmark measures the queue, not the rollout."""

    def queue_enabled(self, target: Target, user_id: int | None = None) -> bool:
        return True


class Origin:
    """The downstream purchase API, stubbed: answers `status`."""

    status = 200

    def __call__(self, url, body, headers, timeout_s) -> OriginAnswer:
        return OriginAnswer(self.status, b"{}", "application/json")


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

    def ticket(self, target: Target, user: int) -> str:
        return self.signer.issue_ticket(target, user, 1, int(time.time() * 1000)).text

    def buy(self, token, status: int = 200) -> int:
        self.origin.status = status
        answer = self.gate.purchase(purchase.PurchaseRequest(
            target_type=token.target.type, target_id=str(token.target.id), entry_token=token.text,
            user_id=str(token.user_id), authorizer=None, body=b"{}", content_type="application/json",
        ))
        return answer.status

    # --- round trips ---

    def round_trips(self) -> dict[str, int]:
        """Sends per call. Run it twice: the first run loads the scripts and opens the connection."""
        drop = Target("limited-drop", 1)
        room = self.room
        tickets = {user: self.ticket(drop, user) for user in range(1, 7)}
        found = {}

        def measure(name, call):
            with counted_sends() as sends:
                call()
            found[name] = sends[0]

        measure("enter: first entry of a target (registers it)", lambda: room.enter(drop, 1))
        measure("enter: new user", lambda: room.enter(drop, 2))
        for user in (3, 4, 5, 6):
            room.enter(drop, user)
        measure("enter: already in line", lambda: room.enter(drop, 2))
        room.status(drop, 1, tickets[1])
        measure("status: waiting", lambda: room.status(drop, 2, tickets[2]))
        pump = Pump(self.store, self.settings)
        pump.tick()  # admits all six (batch 100)
        room.status(drop, 1, tickets[1])
        measure("status: admitted by this call", lambda: room.status(drop, 2, tickets[2]))
        measure("status: holding its token", lambda: room.status(drop, 2, tickets[2]))
        tokens = {user: room.status(drop, user, tickets[user]).entry_token for user in (1, 2, 3, 4)}
        self.buy(tokens[1], 503)  # loads consume and restore
        self.buy(tokens[1])
        measure("purchase: consume", lambda: self.buy(tokens[2]))
        measure("purchase failed downstream: consume + restore", lambda: self.buy(tokens[3], 503))
        room.leave(drop, 5, tickets[5])
        measure("leave", lambda: room.leave(drop, 6, tickets[6]))
        room.enter(drop, 7)  # someone still in line, or the pump forgets the target
        pump.tick()
        measure("pump tick, 1 target", pump.tick)
        for target_id in range(2, 11):
            room.enter(Target("limited-drop", target_id), 1)
        pump.tick()
        measure("pump tick, 10 targets", pump.tick)
        pump._release()
        return found

    def naive_round_trips(self) -> dict[str, int]:
        """The naive status, as its client sends it: one command per round trip."""
        drop = Target("limited-drop", 99)
        k = self.store.keys(drop)
        self.client.zadd(k.waiting, {"1": 1, "2": 2})
        token = self.signer.mint_entry_token(drop, 2, time.time(), 300).text

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

    def recorded_calls(self, targets: dict[str, Target]) -> dict[str, list[str]]:
        """enter, status, leave, consume exactly as the store sends them, for user `__rand_int__`."""
        user = {str(SENTINEL): RAND}
        calls = {}
        for name in ("enter", "status"):
            with benchlib.recorded(self.client) as commands:
                self.room.enter(targets[name], SENTINEL)
            calls[f"enter@{name}"] = script_call(commands, user)
        with benchlib.recorded(self.client) as commands, contextlib.suppress(NotInQueue):
            self.room.status(targets["status"], SENTINEL, self.ticket(targets["status"], SENTINEL))
        calls["status"] = script_call(commands, user)
        with benchlib.recorded(self.client) as commands:
            self.room.leave(targets["leave"], SENTINEL, self.ticket(targets["leave"], SENTINEL))
        calls["leave"] = script_call(commands, user)
        token = self.signer.mint_entry_token(targets["enter"], SENTINEL, time.time(), 3600)
        with benchlib.recorded(self.client) as commands:
            self.buy(token)
        calls["consume"] = script_call(commands, {**user, token.token_id: RAND})
        return calls

    def populate(self, enter: list[str], users: int) -> None:
        """`users` users (0 .. users-1) in line through the enter script, as the opening burst puts them."""
        for start in range(0, users, 5000):
            pipe = self.client.pipeline(transaction=False)
            for user in range(start, min(start + 5000, users)):
                pipe.execute_command(*for_user(enter, user))
            pipe.execute()

    def memory_per_user(self, enter: list[str], target: Target) -> dict:
        k = self.store.keys(target)
        self.client.execute_command("MEMORY", "PURGE")
        before = int(self.client.info("memory")["used_memory"])
        self.populate(enter, USERS)
        after = int(self.client.info("memory")["used_memory"])
        usage = {name: int(self.client.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0"))
                 for name, key in (("waiting", k.waiting), ("heartbeat", k.heartbeat))}
        return {
            "users": USERS,
            "user_id_digits": 12,
            "used_memory_delta": after - before,
            "bytes_per_user": (after - before) / USERS,
            "waiting_zset_bytes_per_user": usage["waiting"] / USERS,
            "heartbeat_zset_bytes_per_user": usage["heartbeat"] / USERS,
            "target": TARGET_BYTES_PER_USER,
        }

    # --- throughput ---

    def benchmark(self, command: list[str], keyspace: int) -> tuple[float, float]:
        """Requests per second redis-benchmark gets for `command`, and the server's CPU time per request (us)."""
        server = self.client.connection_pool.connection_kwargs
        cpu = self.server_cpu()
        out = subprocess.run(
            ["redis-benchmark", "-h", server["host"], "-p", str(server["port"]), "-c", str(CONNECTIONS), "-n", str(REQUESTS),
             "-r", str(keyspace), "--csv", *command],
            check=True, capture_output=True, text=True,
        ).stdout
        cpu = self.server_cpu() - cpu
        row = [line for line in out.splitlines() if line and not line.startswith('"test"')][-1]
        return float(row.split('","')[1]), cpu / REQUESTS * 1e6

    def server_cpu(self) -> float:
        info = self.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def throughput(self) -> dict:
        targets = {name: Target("ticketing-event", n) for n, name in enumerate(("enter", "status", "leave"), 1)}
        calls = self.recorded_calls(targets)
        for sha in {call[1] for call in calls.values()}:
            assert self.client.script_exists(sha)[0], "every recorded script is loaded"
        memory = self.memory_per_user(calls["enter@status"], targets["status"])
        # As during an opening burst, the pump has ticked: the line moves and its rate is measured.
        with contextlib.redirect_stdout(io.StringIO()):
            Pump(self.store, self.settings).run(ticks=1)

        naive = self.store.keys(Target("ticketing-event", 99))
        token = self.signer.mint_entry_token(Target("ticketing-event", 99), SENTINEL, time.time(), 300).text
        now_ms = str(int(time.time() * 1000))
        naive_waiting = {
            "ZADD heartbeat": ["ZADD", naive.heartbeat, now_ms, RAND],
            "ZRANK waiting": ["ZRANK", naive.waiting, RAND],
            "ZSCORE waiting": ["ZSCORE", naive.waiting, RAND],
            "GET mark": ["GET", naive.mark],
        }
        naive_admitting = {
            "SET NX token": ["SET", naive.token(RAND), token, "NX", "PX", "300000"],
            "ZREM waiting": ["ZREM", naive.waiting, RAND],
        }
        commands = {
            "ZADD (baseline)": (["ZADD", f"{self.prefix}:{{zadd}}:z", RAND, f"member:{RAND}"], 100_000_000),
            "enter": (calls["enter@enter"], 100_000_000),  # nearly every user new: the opening burst
            "status": (calls["status"], USERS),
            "leave": (calls["leave"], USERS),
            "consume": (calls["consume"], 100_000_000),
            **{f"naive {name}": (command, USERS) for name, command in {**naive_waiting, **naive_admitting}.items()},
        }
        rates: dict[str, list[float]] = {name: [] for name in commands}
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(ROUNDS):
            # Each round leaves from, and removes from, a full line: a copy of the one status polls.
            line, leave = self.store.keys(targets["status"]), self.store.keys(targets["leave"])
            for source, copy in ((line.waiting, leave.waiting), (line.heartbeat, leave.heartbeat),
                                 (line.waiting, naive.waiting), (line.heartbeat, naive.heartbeat)):
                self.client.copy(source, copy, replace=True)
            for name, (command, keyspace) in commands.items():
                per_second, cpu_us = self.benchmark(command, keyspace)
                rates[name].append(per_second)
                cpu[name].append(cpu_us)

        base = rates["ZADD (baseline)"]
        rows = {name: {"per_second": statistics.median(values), "x_zadd": benchlib.median_ratio(values, base),
                       "server_cpu_us": statistics.median(cpu[name]),
                       "x_zadd_by_cpu": benchlib.median_ratio(cpu["ZADD (baseline)"], cpu[name]),
                       "rounds": values}
                for name, values in rates.items()}

        def composed(names: list[str]) -> dict:
            # One status after another, each of its commands a round trip: its rate is the harmonic sum.
            per_round = [1 / sum(1 / rates[f"naive {n}"][i] for n in names) for i in range(ROUNDS)]
            cpu_round = [sum(cpu[f"naive {n}"][i] for n in names) for i in range(ROUNDS)]
            return {"per_second": statistics.median(per_round), "x_zadd": benchlib.median_ratio(per_round, base),
                    "server_cpu_us": statistics.median(cpu_round),
                    "x_zadd_by_cpu": benchlib.median_ratio(cpu["ZADD (baseline)"], cpu_round),
                    "commands": len(names), "rounds": per_round}

        rows["naive status: waiting"] = composed(list(naive_waiting))
        rows["naive status: admitted by this call"] = composed([*naive_waiting, *naive_admitting])
        return {"connections": CONNECTIONS, "requests_per_run": REQUESTS, "rounds": ROUNDS,
                "target_x_zadd": TARGET_ZADD_RATIO,
                "users_in_line": USERS, "throughput": rows, "memory": memory,
                "commands": {name: command for name, (command, _) in commands.items()}}


def main() -> None:
    if shutil.which("redis-benchmark") is None:
        sys.exit("bench_scripts needs redis-benchmark: apt-get install -y redis-tools (Debian/Ubuntu)")
    origin = Origin()
    purchase.forward = origin
    with benchlib.redis_url() as url:
        client = connect(url)
        version = benchlib.server_version(client)
        benches = [Bench(client, origin) for _ in range(3)]
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the EMF lines of admissions and purchases
                benches[0].round_trips()
                trips = {**benches[1].round_trips(), **benches[1].naive_round_trips()}
                results = benches[2].throughput()
        finally:
            for bench in benches:
                benchlib.delete_prefix(client, bench.prefix)

    print(f"\nRedis side of the client calls  ({version})\n")
    print(f"{'round trips per call':<52}{'sends':>6}")
    for name, sends in trips.items():
        print(f"  {name:<50}{sends:>6}")
    print(f"\n{'throughput, 50 connections, medians of ' + str(ROUNDS) + ' rounds':<52}{'per second':>12}{'x ZADD':>8}"
          f"{'server CPU us':>15}{'x ZADD':>8}")
    for name, row in results["throughput"].items():
        print(f"  {name:<50}{row['per_second']:>12,.0f}{row['x_zadd']:>8.2f}{row['server_cpu_us']:>15.1f}"
              f"{row['x_zadd_by_cpu']:>8.2f}")
    memory = results["memory"]
    print(f"\nmemory per waiting user ({memory['users']:,} in one target): {memory['bytes_per_user']:.0f} bytes "
          f"(waiting zset {memory['waiting_zset_bytes_per_user']:.0f}, heartbeat zset "
          f"{memory['heartbeat_zset_bytes_per_user']:.0f})")
    out = benchlib.write_json("bench_scripts.json", {"server": version, "round_trips": trips, **results})
    print(f"\nwrote {out.relative_to(benchlib.ROOT)}")


if __name__ == "__main__":
    main()
