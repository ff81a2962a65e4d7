"""Load test of a deployed stage with Locust: the waiting room's user journey (enter, poll with jitter, buy).

    pip install locust      # not a project dependency: only this file uses it
    locust -f infra/locustfile.py --host https://<api-id>.execute-api.<region>.amazonaws.com/api \\
        --users 5000 --spawn-rate 1000

Each virtual user joins the line, polls every 2-3 s (at random within that, as the page does) until
admitted, buys once and stops. QUEUE_FULL and NOT_IN_QUEUE are answers the journey expects: it enters
again on its next step. A shop's 409 (sold out, already ordered) counts as an answer, not a failure.

Settings (environment): VQ_LOAD_TARGET, the line to load (default `limited-drop:1`); VQ_LOAD_FIRST_USER,
the first user id (default random, so that runs never share users). `X-User-Id` is sent by the client
itself here: point this at a stage whose upstream lets it through, never at production.
Against `make run`: `--host http://127.0.0.1:8000`.
"""

import itertools
import os
import random

from locust import HttpUser, between, task
from locust.exception import StopUser

TARGET_TYPE, TARGET_ID = os.environ.get("VQ_LOAD_TARGET", "limited-drop:1").split(":")
ENTRIES = f"/virtual-queues/{TARGET_TYPE}/{TARGET_ID}/entries"
PURCHASE = {"limited-drop": f"/limited-drops/{TARGET_ID}/orders",
            "ticketing-event": f"/events/{TARGET_ID}/seats/select"}[TARGET_TYPE]
_user_ids = itertools.count(int(os.environ.get("VQ_LOAD_FIRST_USER") or random.randrange(1, 10**12)))


class Shopper(HttpUser):
    """One shopper: a step every 2-3 s, entering, polling or buying, until the purchase is answered."""

    wait_time = between(2, 3)

    def on_start(self) -> None:
        self.user_id = str(next(_user_ids))
        self.ticket: str | None = None
        self.token: str | None = None

    @task
    def step(self) -> None:
        if self.token is not None:
            self.buy()
        elif self.ticket is None:
            self.enter()
        else:
            self.poll()

    def enter(self) -> None:
        headers = {"X-User-Id": self.user_id}
        with self.client.post(ENTRIES, headers=headers, name="enter", catch_response=True) as answer:
            if answer.status_code == 200:
                self.ticket = answer.json().get("queueTicket", self.ticket)
                self._note(answer.json())
            elif answer.status_code == 429:
                answer.success()  # QUEUE_FULL: try again on the next step (Retry-After is about that long)

    def poll(self) -> None:
        headers = {"X-User-Id": self.user_id, "X-Queue-Ticket": self.ticket}
        with self.client.get(ENTRIES + "/me", headers=headers, name="status", catch_response=True) as answer:
            if answer.status_code == 200:
                self._note(answer.json())
            elif answer.status_code == 404:
                answer.success()  # NOT_IN_QUEUE (evicted, or the place expired): enter again
                self.ticket = None

    def buy(self) -> None:
        headers = {"X-User-Id": self.user_id, "X-Entry-Token": self.token, "Content-Type": "application/json"}
        with self.client.post(PURCHASE, headers=headers, data='{"quantity": 1}', name="purchase",
                              catch_response=True) as answer:
            if answer.status_code == 409:
                answer.success()  # the shop's own refusal (sold out, already ordered) is a normal outcome
        raise StopUser()

    def _note(self, entry: dict) -> None:
        if entry.get("status") in ("ADMITTED", "DIRECT_ADMITTED"):
            self.token = entry["entryToken"]
