"""Refreshes that never hold up a request: the work runs in a background thread, one at a time, while
callers go on with the value they already hold.

In Lambda a thread still running when the invocation returns is frozen with the container and resumes
with its next invocation, so a refresh may finish one request late: it is never waited for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class BackgroundRefresh:
    """Runs `work` in a daemon thread on `start()`, unless a run is still going."""

    def __init__(self, work: Callable[[], None], name: str) -> None:
        self._work = work
        self._name = name
        self._running = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self._running.acquire(blocking=False):
            return
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def wait(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the current run (the first fetch of a cold start waits a little)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _run(self) -> None:
        try:
            self._work()
        finally:
            self._running.release()
