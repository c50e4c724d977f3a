"""An idle worker sleeps: due jobs it cannot claim (their lock key is running) do not make it spin."""

from __future__ import annotations

import threading
import time
from typing import Any

import pgtasks
from pgtasks.worker import Worker
from tests.helpers import eventually


def test_lock_blocked_due_job_does_not_make_the_claim_loop_spin(app: pgtasks.App) -> None:
    release = threading.Event()

    @app.task(name="idle.hold", lock="agent-1")
    def hold() -> None:
        release.wait(10)

    first = hold.delay()
    second = hold.delay()  # due at once, but its lock key is held by the first
    worker = Worker(app, concurrency=2, poll_interval=0.5, listen=False)
    claims: list[float] = []
    original = worker.store.fetch_tuples

    def counting(name: str, params: Any = None, **kw: Any) -> Any:
        if name in ("job_claim_batch", "job_claim_ids"):
            claims.append(time.monotonic())
        return original(name, params, **kw)

    worker.store.fetch_tuples = counting  # type: ignore[method-assign]
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        eventually(lambda: first.status == "running", timeout=10)
        time.sleep(1.5)  # a window in which to count claims, not a wait for a condition
        window = [t for t in claims if t > time.monotonic() - 1.5]
        assert claims, "the claim loop was not observed"
        assert len(window) <= 5, f"{len(window)} claims in 1.5 s with a 0.5 s poll interval"
        assert second.status == "queued"
    finally:
        release.set()
        eventually(lambda: second.status == "succeeded", timeout=10)
        worker.request_stop()
        thread.join(15)
    assert first.status == "succeeded"
