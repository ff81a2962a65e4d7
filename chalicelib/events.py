"""State-change events: what the scripts wrote to each target's outbox (lua/outbox.lua), published.

Each event is written in the same script call as the change it reports, so there is never an event without
its change or a change without its event, and no client call pays a round trip for it. The publisher reads
the outboxes, sends the events (EventBridge `PutEvents`, at most 10 entries a call: the API's limit), and
deletes from the outbox only what was accepted: at-least-once, and a republished event carries the same id.
The schema of every event is `infra/events.schema.json`; no event carries a token or ticket, only token ids.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from chalicelib.observability import count, logger
from chalicelib.redis_connection import REDIS_FAILURES
from chalicelib.store import QueueStore
from chalicelib.target_config import TargetConfig, iso_time
from chalicelib.targets import Target

SOURCE = "virtual-queue"
PUT_EVENTS_MAX_ENTRIES = 10  # PutEvents refuses more entries in one call

# Outbox field -> (detail field, how to read it). Ids stay strings: up to 18 digits is past a JSON double.
_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "user": ("userId", str),
    "seq": ("seq", int),
    "token": ("tokenId", str),
    "status": ("status", int),
    "by": ("by", str),
    "seed": ("seed", str),
    "commitment": ("commitment", str),
    "placed": ("placed", int),
    "opens_at_ms": ("opensAt", lambda ms: iso_time(int(ms)) if ms else None),
    "queued": ("queued", lambda flag: flag == "1"),
}


@dataclass(frozen=True)
class Event:
    """One state change, as published."""

    target: Target
    entry_id: str  # the outbox entry's id: server time (ms) and a counter
    detail_type: str
    detail: dict[str, Any]

    @property
    def time_ms(self) -> int:
        return int(self.entry_id.split("-")[0])

    def put_events_entry(self, bus: str) -> dict[str, Any]:
        """This event as one `PutEvents` entry for `bus`."""
        return {
            "Source": SOURCE,
            "DetailType": self.detail_type,
            "Detail": json.dumps(self.detail),
            "Resources": [],
            "EventBusName": bus,
            "Time": self.time_ms / 1000,
        }


def read_event(target: Target, entry_id: str, fields: dict[str, str]) -> Event:
    """The event an outbox entry records."""
    detail_type = fields.pop("type")
    detail: dict[str, Any] = {
        # Unique across targets, and the same each time the event is published: consumers deduplicate on it.
        "eventId": f"{target}/{entry_id}",
        "target": {"type": target.type, "id": str(target.id)},
        "serverTime": iso_time(int(entry_id.split("-")[0])),
    }
    if detail_type == "TargetConfigChanged":
        commitment = fields.pop("commitment", None)
        detail["config"] = TargetConfig.from_redis(fields).to_body()
        if commitment is not None:
            detail["commitment"] = commitment  # of the next opening's seed (docs/guarantees.md#the-opening-draw)
    else:
        for name, text in fields.items():
            key, read = _FIELDS[name]
            detail[key] = read(text)
        if detail_type == "UserAdmitted":
            # Written by a release before the safety net, when every admission was the pump's.
            detail.setdefault("queued", True)
    return Event(target, entry_id, detail_type, detail)


class EventSink(Protocol):
    """Where events go: `put` answers, for each event, whether it was accepted (else it is sent again later)."""

    def put(self, events: Sequence[Event]) -> list[bool]: ...


class EventBridgeSink:
    """An EventBridge bus (`default` or a bus's name or ARN), through a boto3 `events` client with timeouts."""

    def __init__(self, client: Any, bus: str) -> None:
        self.client = client
        self.bus = bus

    def put(self, events: Sequence[Event]) -> list[bool]:
        reply = self.client.put_events(Entries=[event.put_events_entry(self.bus) for event in events])
        # Entries answer in order; a failed one carries ErrorCode (throttled, internal) and is sent again later.
        return ["ErrorCode" not in entry for entry in reply["Entries"]]


class FileSink:
    """Events as JSON lines in a file, shaped as EventBridge delivers them (`make run`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def put(self, events: Sequence[Event]) -> list[bool]:
        lines = "".join(
            json.dumps(
                {
                    "id": event.detail["eventId"],
                    "source": SOURCE,
                    "detail-type": event.detail_type,
                    "time": iso_time(event.time_ms),
                    "detail": event.detail,
                }
            )
            + "\n"
            for event in events
        )
        with self._lock, self.path.open("a") as out:
            out.write(lines)
        return [True] * len(events)


@dataclass(frozen=True)
class Drained:
    """What one round of publishing did."""

    published: int
    failed: int  # left in the outbox, to be sent again
    dropped: int  # pushed out of a full outbox unpublished (reported as EventsDropped)
    more: bool  # an outbox had more than one round reads


class Publisher:
    """Publishes the targets' outboxes to a sink, several `PutEvents` calls at a time."""

    def __init__(self, store: QueueStore, sink: EventSink, read_count: int = 1000, workers: int = 8) -> None:
        self.store = store
        self.sink = sink
        self.read_count = read_count
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="event-publisher")

    def drain(self, targets: Sequence[Target]) -> Drained:
        """One round: read up to `read_count` events of each target, send them, delete what was accepted."""
        pending = self.store.pending_events(targets, self.read_count)
        events = [
            read_event(target, entry_id, dict(fields))
            for target, (entries, _) in pending.items()
            for entry_id, fields in entries
        ]
        chunks = [events[i : i + PUT_EVENTS_MAX_ENTRIES] for i in range(0, len(events), PUT_EVENTS_MAX_ENTRIES)]
        accepted: dict[Target, list[str]] = {}
        failed = 0
        for chunk, answers in zip(chunks, self._pool.map(self._put, chunks), strict=True):
            for event, ok in zip(chunk, answers, strict=True):
                if ok:
                    accepted.setdefault(event.target, []).append(event.entry_id)
                else:
                    failed += 1
        dropped = {target: n for target, (_, n) in pending.items() if n}
        if accepted or dropped:
            self.store.events_published(accepted, dropped)
        published = sum(map(len, accepted.values()))
        if published:
            count("EventsPublished", value=published)
        if failed:
            count("EventsUnpublished", value=failed)
        for target, n in dropped.items():
            logger.error("outbox full: events dropped unpublished", extra={"target": str(target), "dropped": n})
            count("EventsDropped", target, value=n)
        more = any(len(entries) == self.read_count for entries, _ in pending.values())
        return Drained(published, failed, sum(dropped.values()), more)

    def _put(self, chunk: list[Event]) -> list[bool]:
        try:
            return self.sink.put(chunk)
        except Exception:
            # The events stay in the outbox and go out in a later round.
            logger.exception("publishing events failed", extra={"events": len(chunk)})
            return [False] * len(chunk)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class PublisherLoop:
    """Runs the publisher beside the pump's ticks, in a thread of its own, so it never delays an admission.

    It publishes while `should_run()` (the pump holds its lock: one publisher at a time), right after each tick
    (`nudge`) and every `idle_s` between, and again at once while an outbox has more than a round reads.
    """

    def __init__(
        self,
        publisher: Publisher,
        targets: Callable[[], Sequence[Target]],
        should_run: Callable[[], bool],
        idle_s: float = 0.25,
    ) -> None:
        self.publisher = publisher
        self.targets = targets
        self.should_run = should_run
        self.idle_s = idle_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="event-publisher", daemon=True)
        self._thread.start()

    def nudge(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float) -> None:
        """Publish what is pending once more (within `timeout_s`), then stop."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            stopping = self._stop.is_set()  # read first: a stop asks for one more round
            more = self.should_run() and self._round()
            if stopping:
                return
            if not more:
                self._wake.wait(self.idle_s)
                self._wake.clear()

    def _round(self) -> bool:
        try:
            targets = self.targets()
            return bool(targets) and self.publisher.drain(targets).more
        except REDIS_FAILURES:
            logger.warning("outbox unreadable; publishing later", exc_info=True)
            return False
        except Exception:
            # Never end the thread: what was not deleted is published in a later round.
            logger.exception("publishing round failed")
            count("PumpErrors")
            return False
