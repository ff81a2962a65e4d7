"""Refreshes that never hold up a request: the work runs in a background thread, one at a time, while
callers go on with the value they already hold.

In Lambda a thread still running when the invocation returns is frozen with the container and resumes
with its next invocation, so a refresh may finish one request late: it is never waited for.

A process that forks (a pre-fork server such as infra/local/api.py, or gunicorn) copies a refresh's lock as it
stands but not the thread that holds it: a child forked mid-fetch would wait forever for a run that will never
end there. So every refresh forgets its run in the child (`os.register_at_fork`), and the child's first caller
starts its own.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable

# Every refresh of this process, for the child of a fork to reset (weakly: a refresh that is dropped goes).
_EVERY: weakref.WeakSet[BackgroundRefresh] = weakref.WeakSet()


class BackgroundRefresh:
    """Runs `work` in a daemon thread on `start()`, unless a run is still going."""

    def __init__(self, work: Callable[[], None], name: str) -> None:
        self._work = work
        self._name = name
        self._running = threading.Lock()
        self._thread: threading.Thread | None = None
        _EVERY.add(self)

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

    def _forget_run(self) -> None:
        self._running = threading.Lock()
        self._thread = None


def _after_fork_in_child() -> None:
    for refresh in list(_EVERY):
        refresh._forget_run()


os.register_at_fork(after_in_child=_after_fork_in_child)
