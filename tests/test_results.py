"""`AsyncResult`: status, result and waiting, on jobs finished through the real claim/complete SQL."""

from __future__ import annotations

import datetime as dt
import threading
from decimal import Decimal
from typing import Any

import psycopg
import pytest

import pgtasks
from pgtasks.context import CLAIM_COLUMNS
from pgtasks.db import text_array_literal
from pgtasks.errors import (
    JobNotFound,
    ResultTimeout,
    TaskFailed,
    TaskRevoked,
    TimeLimitExceeded,
)
from pgtasks.serialization import dumps

WORKER = "test-worker"


def add(x: int, y: int) -> int:
    """A task body; run here only by direct call."""
    return x + y


@pytest.fixture
def task(app: pgtasks.App) -> pgtasks.Task:
    return app.task(name="add")(add)


def claim_ids(app: pgtasks.App, limit: int) -> list[int]:
    """Claim up to ``limit`` due jobs of the default queue the way a worker does; their ids."""
    rows = app.stores.jobs.claim_batch(
        queues=text_array_literal(["default"]), worker_id=WORKER, limit=limit, max_tenants=10, fair=True
    )
    return [row[CLAIM_COLUMNS.index("id")] for row in rows]


def claim(app: pgtasks.App, job_id: int) -> None:
    """Claim the one queued job the way a worker does."""
    assert claim_ids(app, 1) == [job_id]


def succeed(app: pgtasks.App, job_id: int, result: Any) -> None:
    done = app.stores.jobs.succeed_batch(worker_id=WORKER, ids=[job_id], results_json=[dumps(result)])
    assert done == [job_id]


def finish(app: pgtasks.App, job_id: int, status: str, error: dict[str, Any], result: Any = None) -> None:
    assert app.stores.jobs.finish(
        id=job_id, worker_id=WORKER, status=status, error=error, result_json=dumps(result)
    )


ERROR = {
    "type": "ValueError",
    "message": "page 3 is blank",
    "code": "BLANK_PAGE",
    "class": "permanent",
    "traceback": 'Traceback (most recent call last):\n  File "ocr.py", line 1\nValueError: page 3 is blank\n',
}


def test_queued_job(task: pgtasks.Task) -> None:
    r = task.delay(1, 2)
    assert r.status == "queued"
    assert r.state == "queued"
    assert not r.ready()
    assert not r.successful()
    assert not r.failed()
    assert r.result is None
    assert r.traceback is None
    with pytest.raises(ResultTimeout, match=str(r.id)) as info:
        r.get(timeout=0.2)
    assert isinstance(info.value, TimeoutError)


def test_succeeded_job(app: pgtasks.App, task: pgtasks.Task) -> None:
    r = task.delay(1, 2)
    claim(app, r.id)
    assert r.status == "running"
    assert not r.ready()
    value = {"sum": 3, "at": dt.datetime(2024, 1, 1, tzinfo=dt.UTC), "exact": Decimal("1.10"), "t": (1, 2)}
    succeed(app, r.id, value)
    assert r.status == "succeeded"
    assert r.ready()
    assert r.successful()
    assert not r.failed()
    assert r.result == value
    assert type(r.result["t"]) is tuple
    assert r.get(timeout=1) == value
    assert r.get() == value  # no timeout: returns at once when finished
    job = r.job()
    assert job.status == pgtasks.JobStatus.SUCCEEDED
    assert job.finished_at is not None
    assert job.started_at is not None
    assert job.duration is not None
    assert job.duration >= 0
    assert [(a.attempt, a.outcome, a.worker_id) for a in job.history()] == [(1, "succeeded", WORKER)]


def test_succeeded_with_none(app: pgtasks.App, task: pgtasks.Task) -> None:
    r = task.delay(1, 2)
    claim(app, r.id)
    succeed(app, r.id, None)
    assert r.successful()
    assert r.get(timeout=1) is None


def test_failed_job(app: pgtasks.App, task: pgtasks.Task) -> None:
    r = task.delay(1, 2)
    claim(app, r.id)
    finish(app, r.id, "failed", ERROR)
    assert r.status == "failed"
    assert r.ready()
    assert not r.successful()
    assert r.failed()
    assert r.traceback == ERROR["traceback"]
    with pytest.raises(TaskFailed) as info:
        r.get(timeout=1)
    err = info.value
    assert type(err) is TaskFailed
    assert (err.job_id, err.status) == (r.id, "failed")
    assert err.error["code"] == "BLANK_PAGE"
    assert "ValueError: page 3 is blank" in str(err)
    assert err.traceback == ERROR["traceback"]
    returned = r.get(timeout=1, propagate=False)
    assert isinstance(returned, TaskFailed)
    assert returned.error == err.error
    assert isinstance(r.result, TaskFailed)
    job = r.job()
    assert job.error is not None
    assert job.error["message"] == "page 3 is blank"
    assert [a.outcome for a in job.history()] == ["failed"]


def test_partial_failure_keeps_its_result(app: pgtasks.App, task: pgtasks.Task) -> None:
    r = task.delay(1, 2)
    claim(app, r.id)
    error = {"type": "PartialFailure", "message": "2 of 10 files unreadable", "code": "PARTIAL_FAILURE"}
    finish(app, r.id, "partial_failure", error, result={"files": 8})
    assert r.status == "partial_failure"
    assert r.failed()
    assert r.job().result == {"files": 8}
    with pytest.raises(TaskFailed, match="2 of 10 files unreadable") as info:
        r.get(timeout=1)
    assert info.value.status == "partial_failure"


def test_time_limit_failure_raises_time_limit_exceeded(app: pgtasks.App, task: pgtasks.Task) -> None:
    r = task.delay(1, 2)
    claim(app, r.id)
    finish(app, r.id, "failed", {"type": "TimeLimitExceeded", "message": "600 s", "code": "TIME_LIMIT"})
    with pytest.raises(TimeLimitExceeded):
        r.get(timeout=1)
    assert issubclass(TimeLimitExceeded, TaskFailed)


def test_get_wakes_when_the_job_finishes_in_another_thread(app: pgtasks.App, task: pgtasks.Task) -> None:
    r = task.delay(20, 22)
    claim(app, r.id)
    done = threading.Timer(0.3, succeed, args=(app, r.id, 42))
    done.start()
    try:
        assert r.get(timeout=30) == 42
    finally:
        done.join()


def test_get_raises_when_the_job_fails_while_waiting(app: pgtasks.App, task: pgtasks.Task) -> None:
    r = task.delay(1, 2)
    claim(app, r.id)
    done = threading.Timer(0.3, finish, args=(app, r.id, "failed", ERROR))
    done.start()
    try:
        with pytest.raises(TaskFailed, match="page 3 is blank"):
            r.get(timeout=30)
    finally:
        done.join()


def test_revoke_cancels_a_queued_job(
    app: pgtasks.App, task: pgtasks.Task, conn: psycopg.Connection[Any]
) -> None:
    r = task.delay(1, 2)
    other = task.delay(3, 4)
    assert r.revoke() is True
    assert r.status == "cancelled"
    assert r.ready()
    assert r.failed()
    with pytest.raises(TaskRevoked) as info:
        r.get(timeout=1)
    assert info.value.status == "cancelled"
    assert info.value.error["code"] == "CANCELLED"
    assert r.revoke() is False  # already finished
    assert other.status == "queued"
    # A cancelled job is never claimed.
    assert claim_ids(app, 10) == [other.id]


def test_revoke_of_a_running_job_requests_cancellation(app: pgtasks.App, task: pgtasks.Task) -> None:
    r = task.delay(1, 2)
    claim(app, r.id)
    assert r.revoke() is True
    assert r.status == "running"  # the worker decides when it stops
    job = r.job()
    assert job.cancel_requested
    assert job.headers.get("cancel_terminate") is False
    requests = app.stores.jobs.cancel_requested(worker_id=WORKER)
    assert [(request.job_id, request.terminate) for request in requests] == [(r.id, False)]


def test_revoke_of_a_succeeded_job_changes_nothing(app: pgtasks.App, task: pgtasks.Task) -> None:
    r = task.delay(1, 2)
    claim(app, r.id)
    succeed(app, r.id, 3)
    assert r.revoke() is False
    assert r.get(timeout=1) == 3


def test_get_wakes_on_revoke(app: pgtasks.App, task: pgtasks.Task) -> None:
    r = task.delay(1, 2)
    revoker = threading.Timer(0.3, r.revoke)
    revoker.start()
    try:
        with pytest.raises(TaskRevoked):
            r.get(timeout=30)
    finally:
        revoker.join()


def test_requeue_puts_a_failed_job_back(app: pgtasks.App, task: pgtasks.Task) -> None:
    r = task.delay(1, 2)
    claim(app, r.id)
    finish(app, r.id, "failed", ERROR)
    assert app.requeue(r.id) is True
    assert r.status == "queued"
    assert r.job().attempt == 0
    assert app.requeue(r.id) is False  # queued already
    claim(app, r.id)
    succeed(app, r.id, 3)
    assert r.get(timeout=1) == 3


def test_app_async_result_is_a_handle_by_id(app: pgtasks.App, task: pgtasks.Task) -> None:
    r = task.delay(1, 2)
    again = app.AsyncResult(r.id)
    assert again == r
    assert hash(again) == hash(r)
    assert again.status == "queued"
    assert repr(again) == f"<AsyncResult {r.id}>"
    assert again != app.AsyncResult(r.id + 1)
    again.forget()  # accepted, does nothing
    assert again.status == "queued"


def test_unknown_job_id_raises_job_not_found(app: pgtasks.App) -> None:
    missing = app.AsyncResult(987654321)
    for call in (
        lambda: missing.status,
        lambda: missing.result,
        missing.ready,
        missing.successful,
        missing.failed,
        lambda: missing.get(timeout=0.1),
        missing.revoke,
        missing.job,
        lambda: app.get_job(987654321),
        lambda: app.requeue(987654321),
    ):
        with pytest.raises(JobNotFound, match="987654321") as info:
            call()
        assert info.value.job_id == 987654321
        assert isinstance(info.value, LookupError)


def test_list_jobs_and_queue_stats(app: pgtasks.App, task: pgtasks.Task) -> None:
    ids = [task.delay(i, i).id for i in range(5)]
    task.apply_async(args=(0, 0), queue="other", tenant="acme")
    claim(app, ids[0])
    succeed(app, ids[0], 0)
    assert [j.id for j in app.list_jobs(queue="default")] == ids[::-1]
    assert [j.id for j in app.list_jobs(queue="default", limit=2)] == ids[:2:-1][:2]
    assert [j.id for j in app.list_jobs(queue="default", before_id=ids[2])] == [ids[1], ids[0]]
    assert [j.id for j in app.list_jobs(status="succeeded")] == [ids[0]]
    assert [j.tenant for j in app.list_jobs(tenant="acme")] == ["acme"]
    stats = {(s["queue"], s["status"]): s["jobs"] for s in app.queue_stats()}
    assert stats == {("default", "queued"): 4, ("default", "succeeded"): 1, ("other", "queued"): 1}


def test_purge_deletes_only_old_finished_jobs(app: pgtasks.App, task: pgtasks.Task) -> None:
    done = task.delay(1, 1)
    claim(app, done.id)
    succeed(app, done.id, 2)
    waiting = task.delay(2, 2)
    assert app.purge(older_than=3600) == 0
    assert app.purge(older_than=0) == 1
    with pytest.raises(JobNotFound):
        done.job()
    assert waiting.status == "queued"
