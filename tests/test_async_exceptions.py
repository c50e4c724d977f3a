"""Time limits reach a thread-pool task as an asynchronous exception."""

from __future__ import annotations

import threading

from pgtasks.errors import SoftTimeLimitExceeded
from pgtasks.worker.pool import raise_in_thread


def _blocked_thread(outcome: list[str], release: threading.Event) -> threading.Thread:
    def body() -> None:
        try:
            release.wait(10)  # C code: a pending exception waits until it returns
            for _ in range(1000):  # bytecode: a pending exception lands here
                pass
            outcome.append("returned")
        except SoftTimeLimitExceeded:
            outcome.append("interrupted")

    thread = threading.Thread(target=body)
    thread.start()
    return thread


def test_raised_exception_lands_in_the_thread() -> None:
    outcome: list[str] = []
    release = threading.Event()
    thread = _blocked_thread(outcome, release)
    assert thread.ident is not None
    assert raise_in_thread(thread.ident, SoftTimeLimitExceeded)
    release.set()
    thread.join(10)
    assert outcome == ["interrupted"]
