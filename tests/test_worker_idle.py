"""An idle worker sleeps: due jobs it cannot claim (their lock key is running) do not make it spin."""

from __future__ import annotations

import threading
import time
from typing import Any

from helpers import eventually, on_store_call

import pgtasks
from pgtasks.worker import Worker


def test_lock_blocked_due_job_does_not_make_the_claim_loop_spin(app: pgtasks.App) -> None:
    release = threading.Event()

    @app.task(name="idle.hold", lock="agent-1")
    def hold() -> None:
        release.wait(10)

    first = hold.delay()
    second = hold.delay()  # due at once, but its lock key is held by the first
    worker = Worker(app, concurrency=2, poll_interval=0.5, listen=False)
    claims: list[float] = []
    for method in ("claim_batch", "claim_ids"):
        on_store_call(worker, method, lambda name: claims.append(time.monotonic()))
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


def _watched(app: pgtasks.App, **config: Any) -> tuple[Worker, threading.Thread, list[tuple[float, str]]]:
    """A started worker whose claim statements are recorded as (monotonic time, name)."""
    worker = Worker(app, **config)
    claims: list[tuple[float, str]] = []
    for method in ("claim_batch", "claim_ids"):  # recorded as job_claim_batch, job_claim_ids
        on_store_call(worker, method, lambda name: claims.append((time.monotonic(), name)))
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    assert worker.started.wait(10)
    return worker, thread, claims


def _stop(worker: Worker, thread: threading.Thread) -> None:
    worker.request_stop()
    thread.join(15)
    assert not thread.is_alive()


def test_finished_job_on_a_drained_queue_does_not_cost_a_claim(app: pgtasks.App) -> None:
    @app.task(name="idle.noop", queue="idle")
    def noop(i: int) -> int:
        return i

    worker, thread, claims = _watched(app, queues=["idle"], concurrency=2, poll_interval=5.0)
    try:
        assert worker._listener is not None
        eventually(worker._listener.connected.is_set, message="listener connected")
        eventually(lambda: claims, message="first full claim")
        for i in range(3):
            before = len(claims)
            assert noop.delay(i).get(timeout=10) == i
            time.sleep(0.3)  # a window in which a needless claim would show, not a wait for a condition
            # One claim by id per job, nothing after it finished: the queue was drained.
            assert [name for _, name in claims[before:]] == ["job_claim_ids"]
    finally:
        _stop(worker, thread)


def test_a_freed_lock_key_lets_its_next_job_start_at_once(app: pgtasks.App) -> None:
    """The worker that ran a key's job claims the key's next one once the outcome is
    written, not at the next poll (5 s here)."""

    @app.task(name="idle.locked", queue="idle", lock="one-at-a-time")
    def locked(i: int) -> int:
        time.sleep(0.05)
        return i

    chain = [locked.delay(i) for i in range(3)]
    worker, thread, _ = _watched(app, queues=["idle"], concurrency=2, poll_interval=5.0, listen=False)
    started = time.monotonic()
    try:
        assert [r.get(timeout=10) for r in chain] == [0, 1, 2]
        assert time.monotonic() - started < 4.0, "a job of the key waited for the poll"
    finally:
        _stop(worker, thread)


def test_tenants_beyond_the_claim_bound_are_claimed_as_jobs_finish(app: pgtasks.App) -> None:
    """A claim that stopped at its tenant bound came back short but left tenants behind:
    finishing jobs still wake the loop, so no tenant waits for the poll (5 s here)."""

    @app.task(name="idle.tenant", queue="idle")
    def per_tenant(i: int) -> int:
        return i

    spread = [per_tenant.apply_async((i,), tenant=f"t{i:02d}") for i in range(12)]
    worker, thread, _ = _watched(
        app, queues=["idle"], concurrency=2, poll_interval=5.0, listen=False, max_tenants_per_claim=3
    )
    started = time.monotonic()
    try:
        assert [r.get(timeout=10) for r in spread] == list(range(12))
        assert time.monotonic() - started < 4.0, "a tenant waited for the poll"
    finally:
        _stop(worker, thread)


def test_polls_above_jobs_due_later_ask_when_instead_of_claiming(app: pgtasks.App) -> None:
    """With nothing due, a poll reads the next run-at (a few index probes) and does not
    run the claim, which would walk every job that is not due yet."""

    @app.task(name="idle.later", queue="idle")
    def later(i: int) -> int:
        return i

    later.delay_many(list(range(500)), countdown=3600)
    worker, thread, claims = _watched(app, queues=["idle"], concurrency=2, poll_interval=0.1, listen=False)
    asked: list[float] = []
    original = worker.jobs.next_wake

    def recording(*args: Any, **kw: Any) -> Any:  # job_next_run_at
        asked.append(time.monotonic())
        return original(*args, **kw)

    worker.jobs.next_wake = recording  # type: ignore[method-assign]
    try:
        eventually(lambda: claims, message="first full claim")
        window_start = time.monotonic()
        time.sleep(1.0)  # ten polls' worth of window, not a wait for a condition
        assert [c for c in claims if c[0] > window_start] == []
        assert len([t for t in asked if t > window_start]) >= 5, "the polls did not ask for the next run-at"
        # Without notifications (listen=False) a job that becomes due is still found by
        # the next poll, and claimed.
        soon = later.apply_async((7,), countdown=0.3)
        assert soon.get(timeout=10) == 7
        assert "job_claim_batch" in [name for t, name in claims if t > window_start]
    finally:
        _stop(worker, thread)
