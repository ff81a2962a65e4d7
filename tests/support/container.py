"""One Lambda container in a process of its own (tests/test_faults.py runs two): a waiting room built from the
environment, with its own Redis client, breaker and dead reckoning, polls the tickets it is given until each is
admitted, refused or the time is up, and writes every answer as a JSON line: [wall time it was asked, user, status
or error code, etaSeconds].

    python -m tests.support.container TYPE ID TICKETS_JSON OUT_JSONL SECONDS POLL_EVERY_S

It writes `ready` to OUT_JSONL + ".ready" once it has polled every ticket once."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from chalicelib import runtime
from chalicelib.errors import QueueError
from chalicelib.targets import Target


def main(type_: str, target_id: str, tickets_path: str, out_path: str, seconds: str, poll_every_s: str) -> None:
    room = runtime.waiting_room()
    target = Target(type_, int(target_id))
    tickets: dict[str, str] = json.loads(Path(tickets_path).read_text())
    until = time.time() + float(seconds)
    answers = []
    first_round = True
    while tickets and time.time() < until:
        for user, ticket in list(tickets.items()):
            asked = time.time()
            try:
                entry = room.status(target, user, ticket)
                answers.append([asked, user, entry.status, entry.eta_seconds])
                if entry.status == "ADMITTED":
                    del tickets[user]
            except QueueError as err:
                answers.append([asked, user, err.code, None])
                if err.code != "QUEUE_UNAVAILABLE":
                    del tickets[user]  # left the line
        if first_round:
            Path(out_path + ".ready").write_text("ready")
            first_round = False
        time.sleep(float(poll_every_s))
    Path(out_path).write_text("".join(json.dumps(answer) + "\n" for answer in answers))


if __name__ == "__main__":
    main(*sys.argv[1:])
