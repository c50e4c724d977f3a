"""Jobs named by enqueue notifications are claimed by id on an idle worker, by the claim's rules.

The shortcut must never change what runs: the same jobs, the same lock-key and due-time
rules, and a full claim still runs on the poll schedule however many notifications
arrive, so a job that no notification names (a countdown coming due) still starts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from helpers import eventually, on_store_call

import pgtasks
from pgtasks.context import CLAIM_COLUMNS
from pgtasks.db import bigint_array_literal, text_array_literal
from pgtasks.worker import Worker
from pgtasks.worker.hints import WakeHints

WORKER = "w-hints"


# -- what a payload means ---------------------------------------------------------------


def test_first_take_is_a_full_claim_and_a_named_job_then_comes_by_id() -> None:
    hints = WakeHints(["bench"], max_ids=8)
    assert hints.note("bench:12")
    assert hints.take(False) is None  # a worker's first claim is always a full one
    assert hints.note("bench:13")
    assert hints.note("bench:14")
    assert hints.take(False) == [13, 14]
    assert hints.take(False) is None  # nothing named since: poll timer or a finished job


def test_queue_names_with_colons_and_other_queues() -> None:
    hints = WakeHints(["mail:high", "shard", "shard:3"], max_ids=8)
    hints.take(False)
    assert hints.note("mail:high:7")
    assert not hints.note("mail:low:8")  # not ours
    assert not hints.note("mail:high:x")  # no id, and not a queue of ours
    assert not hints.note("other")
    assert hints.take(False) == [7]
    # A payload equal to one of our queues is that queue's bare wake-up, never a name.
    assert hints.note("shard:3")
    assert hints.take(False) is None


def test_bare_wake_busy_worker_overflow_and_due_poll_mean_a_full_claim() -> None:
    hints = WakeHints(["q"], max_ids=2)
    hints.take(False)
    for payload, holding, full in [("q", False, False), ("q:1", True, False), ("q:1", False, True)]:
        hints.note(payload)
        assert hints.take(holding, full=full) is None
        assert hints.take(False) is None, "take must empty what was noted"
    for job_id in (1, 2, 3):
        hints.note(f"q:{job_id}")
    assert hints.take(False) is None  # more than one claim by id takes
    hints.note("q:4")
    hints.want_full()  # the listener reconnected: notifications may have been lost
    assert hints.take(False) is None
    hints.note("q:5")
    assert hints.take(False) == [5]


def test_max_ids_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_ids"):
        WakeHints(["q"], max_ids=0)


# -- the claim by id, in PostgreSQL --------------------------------------------------------


def _ids_params(ids: list[int], queues: list[str]) -> dict[str, Any]:
    return {
        "ids": bigint_array_literal(ids),
        "queues": text_array_literal(queues),
        "now": None,
        "worker_id": WORKER,
        "tasks": None,
    }


def _claim_ids(app: pgtasks.App, ids: list[int], queues: list[str]) -> list[tuple[Any, ...]]:
    return app.stores.jobs.claim_ids(ids=ids, queues=text_array_literal(queues), worker_id=WORKER)


def _status(app: pgtasks.App, job_id: int) -> str:
    return str(app.get_job(job_id).status)


@pytest.fixture
def noop(app: pgtasks.App) -> pgtasks.Task:
    @app.task(name="hints.noop", queue="q")
    def noop(i: int = 0) -> int:
        return i

    return noop


def test_claim_by_id_returns_the_claim_columns_and_starts_the_job(
    app: pgtasks.App, noop: pgtasks.Task
) -> None:
    job = noop.apply_async((5,), tenant="t", priority=2, headers={"h": 1})
    # The same columns, named as job_claim_batch names them (the worker reads both by position),
    # then the job's run-at in Unix seconds (due: the worker's wait-time metric).
    named = app.store.fetch_all("job_claim_ids", _ids_params([job.id], ["q"]))
    assert len(named) == 1 and tuple(named[0]) == (*CLAIM_COLUMNS, "due", "tenant_share", "keyed")
    row = named[0]
    assert row["id"] == job.id and row["attempt"] == 1 and row["args"] == [5]
    assert (row["tenant"], row["priority"], row["headers"]) == ("t", 2, {"h": 1})
    stored = app.get_job(job.id)
    assert stored.status == pgtasks.JobStatus.RUNNING and stored.worker_id == WORKER
    assert _claim_ids(app, [job.id], ["q"]) == []  # running now: not claimed twice


def test_claim_by_id_keeps_the_claim_rules(app: pgtasks.App, noop: pgtasks.Task) -> None:
    due = noop.apply_async((1,))
    later = noop.apply_async((2,), countdown=60)
    elsewhere = noop.apply_async((3,), queue="other")
    low = noop.apply_async((4,), lock="k", priority=0)
    high = noop.apply_async((5,), lock="k", priority=9)
    rows = _claim_ids(app, [due.id, later.id, elsewhere.id, low.id, high.id, 10**12], ["q"])
    # Due, in our queue, one job per lock key (the higher priority first), in start order.
    assert [r[0] for r in rows] == [high.id, due.id]
    assert _status(app, later.id) == "queued"
    assert _status(app, elsewhere.id) == "queued"
    assert _status(app, low.id) == "queued"
    # The key is running now: its other job waits, by id as by the full claim.
    assert _claim_ids(app, [low.id], ["q"]) == []
    assert _status(app, low.id) == "queued"


# -- a real worker ----------------------------------------------------------------------


@pytest.fixture
def watched_worker(app: pgtasks.App, noop: pgtasks.Task) -> Iterator[tuple[Worker, list[str]]]:
    """An idle listening worker whose claim statements are recorded by name."""
    worker = Worker(app, queues=["q"], concurrency=2, poll_interval=1.0)
    names: list[str] = []
    for method in ("claim_batch", "claim_ids"):  # recorded as job_claim_batch, job_claim_ids
        on_store_call(worker, method, names.append)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        assert worker.started.wait(10)
        assert worker._listener is not None
        eventually(worker._listener.connected.is_set, message="listener connected")
        eventually(lambda: "job_claim_batch" in names, message="first full claim")
        yield worker, names
    finally:
        worker.request_stop()
        thread.join(15)
    assert not thread.is_alive()


def test_idle_worker_claims_a_notified_job_by_id(
    app: pgtasks.App, noop: pgtasks.Task, watched_worker: tuple[Worker, list[str]]
) -> None:
    _, names = watched_worker
    before = len(names)
    result = noop.delay(7)
    assert result.get(timeout=10) == 7
    assert "job_claim_ids" in names[before:]


def test_countdown_job_starts_on_time_while_named_jobs_keep_arriving(
    app: pgtasks.App, noop: pgtasks.Task, watched_worker: tuple[Worker, list[str]], dsn: str
) -> None:
    """Notifications naming jobs that another worker got first wake this worker again and
    again, and its claims by id find nothing; a job that no notification names (a
    countdown coming due) must still start, by the full claim the poll deadline brings."""
    _, names = watched_worker
    delayed = noop.apply_async((99,), countdown=0.5)
    enqueued = time.monotonic()
    started_while_streaming = False
    with psycopg.connect(dsn, autocommit=True) as other:
        while time.monotonic() - enqueued < 3.0:
            other.execute("SELECT pg_notify('pgtasks_jobs', 'q:999999999')")
            time.sleep(0.05)  # a steady stream, far faster than the poll interval
            if app.get_job(delayed.id).status != pgtasks.JobStatus.QUEUED:
                started_while_streaming = True
                break
    assert started_while_streaming, "the countdown job waited for the stream of notifications to stop"
    assert "job_claim_ids" in names
    assert delayed.get(timeout=10) == 99
