"""Load test of a deployed stage with Locust: the waiting room's user journey (enter, poll when told, buy).

    pip install locust      # not a project dependency: only this file uses it
    locust -f infra/sim/locustfile.py --host https://<api-id>.execute-api.<region>.amazonaws.com/api \\
        --users 5000 --spawn-rate 1000

Each virtual user joins the line, polls when the server says (`pollAfterMs`, and at no other time: the same
pacing as the waiting-room page), buys once when admitted, and then starts over as a new shopper, so the
load stays steady for the whole run. A 429/503 is retried after its Retry-After; NOT_IN_QUEUE enters again.

Outcomes are rows of their own in Locust's table (type `outcome`): `bought`, `sold out` (the shop's 409),
`already ordered`, `purchase refused`, `evicted`, `told sold out` (a poll's SOLD_OUT: the line closed while
waiting), `sold out at enter` (enter's 409 SOLD_OUT). After a sold-out answer the next shopper comes
SOLD_OUT_PAUSE_S later, so a sold-out line does not turn the run into a tight loop of refused enters. A
shop's 409 is then neither a failure nor hidden among the successes, and the failure column counts only what
went wrong: 5xx, timeouts, and answers the contract does not allow. (The Aggregated row adds the outcome rows
to the requests: read the request rows for rates.) Against `make run`, `-u 300 -r 100` answered enter at p50
15 ms, p95 390 ms on this 2-core machine.

Settings (environment): VQ_LOAD_TARGET, the line to load (default `limited-drop:1`); VQ_LOAD_FIRST_USER,
the first user id (default random, so that runs never share users); VQ_LOAD_ETA_CSV, a file to write, at the
end, each admitted shopper's first estimate and the wait they had (the columns of the simulator's eta.csv:
aheadCount, etaSeconds, the range, and the seconds from sending enter to the answer that said ADMITTED), so the
range's coverage can be read by distance from the front (docs/waits.md). `X-User-Id` is sent by the client
itself here: point this at a stage whose upstream lets it through, never at production.
Against `make run`: `--host http://127.0.0.1:8000`.
"""

import itertools
import os
import random
import sys
import time
from pathlib import Path

from locust import HttpUser, events, task

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: Locust runs this file on its own
from chalicelib.targets import TARGET_TYPES, parse_target  # noqa: E402

TARGET = parse_target(*os.environ.get("VQ_LOAD_TARGET", "limited-drop:1").split(":"))
ENTRIES = f"/virtual-queues/{TARGET.type}/{TARGET.id}/entries"
PURCHASE = TARGET_TYPES[TARGET.type].purchase_path_of(TARGET.id)
_user_ids = itertools.count(int(os.environ.get("VQ_LOAD_FIRST_USER") or random.randrange(1, 10**12)))
SHOP_REFUSALS = {"SOLD_OUT": "sold out", "ALREADY_ORDERED": "already ordered"}
SOLD_OUT_PAUSE_S = 5.0
ETA_CSV = os.environ.get("VQ_LOAD_ETA_CSV")
ETA_ROWS = ["ahead,eta_s,low_s,high_s,wait_s"]  # as infra/sim/report.py's eta_csv


@events.test_stop.add_listener
def _write_eta_csv(**kwargs) -> None:
    if ETA_CSV:
        Path(ETA_CSV).write_text("\n".join(ETA_ROWS) + "\n")


class Shopper(HttpUser):
    """One shopper after another: enter, poll after each answer's pollAfterMs, buy, start over."""

    def wait_time(self) -> float:
        return self.wait_s

    def on_start(self) -> None:
        self._new_shopper()

    @task
    def step(self) -> None:
        if self.token is not None:
            self.buy()
        elif self.ticket is None:
            self.enter()
        else:
            self.poll()

    def enter(self) -> None:
        sent = time.monotonic()
        with self.client.post(
            ENTRIES, headers={"X-User-Id": self.user_id}, name="enter", catch_response=True
        ) as answer:
            if answer.status_code == 200:
                entry = answer.json()
                self.ticket = entry.get("queueTicket", self.ticket)
                if entry.get("etaLowSeconds") is not None and self.told is None:
                    self.told = (
                        sent,
                        entry["aheadCount"],
                        entry["etaSeconds"],
                        entry["etaLowSeconds"],
                        entry["etaHighSeconds"],
                    )
                self._follow(entry)
            elif answer.status_code == 409 and _code(answer) == "SOLD_OUT":
                answer.success()  # the line's own answer: an outcome, not a failure
                self._sold_out("sold out at enter")
            else:
                self._retry_later(answer)

    def poll(self) -> None:
        headers = {"X-User-Id": self.user_id, "X-Queue-Ticket": self.ticket}
        with self.client.get(ENTRIES + "/me", headers=headers, name="status", catch_response=True) as answer:
            if answer.status_code == 200:
                self._follow(answer.json())
            elif answer.status_code == 404:
                answer.success()  # NOT_IN_QUEUE: evicted, or the place expired: enter again
                self._outcome("evicted")
                self.ticket, self.wait_s = None, 0
            else:
                self._retry_later(answer)

    def buy(self) -> None:
        headers = {"X-User-Id": self.user_id, "X-Entry-Token": self.token, "Content-Type": "application/json"}
        with self.client.post(
            PURCHASE, headers=headers, data='{"quantity": 1}', name="purchase", catch_response=True
        ) as answer:
            if answer.status_code in (200, 201):
                self._outcome("bought")
            elif answer.status_code == 409:
                answer.success()  # the shop's own answer: reported as its outcome below, not as a failure
                outcome = SHOP_REFUSALS.get(_code(answer), "purchase refused")
                if outcome == "sold out":
                    self._sold_out(outcome)
                    return
                self._outcome(outcome)
            else:
                self._outcome("purchase refused")
        self._new_shopper()

    def _follow(self, entry: dict) -> None:
        """Take the answer's advice: a token to buy with now, or when to poll next."""
        if entry.get("status") in ("ADMITTED", "DIRECT_ADMITTED"):
            self.token, self.wait_s = entry["entryToken"], 0
            if self.told is not None:
                sent, ahead, eta_s, low_s, high_s = self.told
                ETA_ROWS.append(f"{ahead},{eta_s},{low_s},{high_s},{time.monotonic() - sent:.3f}")
                self.told = None
        elif entry.get("status") == "SOLD_OUT":
            self._sold_out("told sold out")
        else:
            self.wait_s = entry["pollAfterMs"] / 1000

    def _retry_later(self, answer) -> None:
        if answer.status_code in (429, 503) and answer.headers.get("Retry-After"):
            answer.success()  # QUEUE_FULL / QUEUE_UNAVAILABLE: the contract's way to say "later"
            self.wait_s = float(answer.headers["Retry-After"])
        else:
            answer.failure(f"{answer.status_code} {_code(answer)}")
            self.wait_s = 1

    def _sold_out(self, what: str) -> None:
        self._outcome(what)
        self._new_shopper()
        self.wait_s = SOLD_OUT_PAUSE_S

    def _outcome(self, what: str) -> None:
        self.environment.events.request.fire(
            request_type="outcome", name=what, response_time=0, response_length=0, exception=None, context={}
        )

    def _new_shopper(self) -> None:
        self.user_id = str(next(_user_ids))
        self.ticket: str | None = None
        self.token: str | None = None
        self.told: tuple | None = None  # when enter was sent, and its first estimate (VQ_LOAD_ETA_CSV)
        self.wait_s = 0.0


def _code(answer) -> str | None:
    try:
        return answer.json().get("code")
    except ValueError:
        return None
