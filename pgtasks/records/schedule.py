"""Immutable records for schedules and their runs, built from store rows."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from pgtasks.records.job import REQUEUE_EVENT, Job
from pgtasks.states import TERMINAL, JobStatus

__all__ = ["Run", "Schedule"]


@dataclass(frozen=True, slots=True)
class Schedule:
    """A row of ``pgtasks.schedules`` plus the state of its last run.

    Attributes:
        name, task_name, cron, timezone, args, kwargs, queue, tenant, priority,
        lock_key, overlap, misfire, catch_up_limit, max_retries, retry_policy,
        retry_on_worker_lost, after: the definition (see `ScheduleSpec`).
        paused, paused_by, paused_at: pause state (who paused it, when).
        source: ``"code"`` (``@app.periodic_task``) or ``"api"``.
        next_fire_at: the next fire time (aware UTC), None when paused-and-never-
            computed or trigger-only.
        last_fire_at: the last fire time a tick handled.
        last_run_id, last_run_at: the most recently created run and when.
        last_run_status, last_run_trigger: that run's current status and trigger.
        last_outcome, last_outcome_run_id, last_outcome_at: the most recently
            finished run's outcome (``succeeded``, ``partial_failure``, ``failed``,
            ``cancelled``), id and finish time.
        invalid_reason: why the scheduler stopped serving the row, if it did.
        created_at, updated_at: row times.
    """

    name: str
    task_name: str
    cron: str | None
    timezone: str
    args: list[Any]
    kwargs: dict[str, Any]
    queue: str
    tenant: str
    priority: int
    lock_key: str | None
    overlap: str
    misfire: str
    catch_up_limit: int
    max_retries: int | None
    retry_policy: dict[str, Any]
    retry_on_worker_lost: bool
    after: list[str]
    paused: bool
    paused_by: str | None
    paused_at: dt.datetime | None
    source: str
    next_fire_at: dt.datetime | None
    last_fire_at: dt.datetime | None
    last_run_id: int | None
    last_run_at: dt.datetime | None
    last_run_status: str | None
    last_run_trigger: str | None
    last_outcome: str | None
    last_outcome_run_id: int | None
    last_outcome_at: dt.datetime | None
    invalid_reason: str | None
    created_at: dt.datetime
    updated_at: dt.datetime

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        """Build from a ``schedule_get`` / ``schedule_list`` row."""
        values: dict[str, Any] = {name: row.get(name) for name in cls.__dataclass_fields__}
        values["after"] = list(row.get("after") or [])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class Run:
    """One run of a schedule, as its history shows it (a job row seen as a run).

    Attributes:
        id: the run's job id.
        schedule: the schedule's name.
        task_name: the task it called.
        trigger: ``schedule``, ``manual``, ``retry`` or ``dependency``.
        attempt: 1 for a first run; n+1 for the retry of a run that was attempt n.
        status: ``queued``, ``running``, or the outcome once finished.
        outcome: ``succeeded``, ``partial_failure``, ``failed`` or ``cancelled``;
            None while the run is active.
        scheduled_for: the fire time (schedule runs and their retries), else None.
        created_at, started_at, finished_at: when it was made, started, completed.
        duration: seconds from start to completion, when both are known.
        error_code, error_message, failure_class: from the error record of a run
            that did not succeed (class ``transient`` or ``permanent``).
        correlation_id: shared by a run, its retries and the runs it triggered.
        parent_id: the run that caused this one (retry and dependency runs).
        worker_id: the worker that executed it (for a run whose worker vanished,
            the one that held it then).
        progress: counters the task reported (``bytes_processed``, ...).
        requested_by: who asked for a manual run (``user@host``).
        result: the stored result, if any.
    """

    id: int
    schedule: str
    task_name: str
    trigger: str
    attempt: int
    status: str
    outcome: str | None
    scheduled_for: dt.datetime | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    duration: float | None
    error_code: str | None
    error_message: str | None
    failure_class: str | None
    correlation_id: str | None
    parent_id: int | None
    worker_id: str | None
    progress: dict[str, Any]
    requested_by: str | None
    result: Any

    @classmethod
    def from_job(cls, job: Job) -> Self:
        """The run view of a job row of a schedule.

        A run not yet claimed (or cancelled before it was) shows the attempt it
        would be; the start and worker of a run whose worker vanished come from its
        attempt history, since the reaper clears them from the row.
        """
        status = JobStatus(job.status)
        started_at, worker_id = job.started_at, job.worker_id
        # The attempts that ended without success (the history also holds requeues).
        ended = [a for a in job.attempts if a.get("event") != REQUEUE_EVENT]
        if ended and (started_at is None or worker_id is None):
            last = ended[-1]
            worker_id = worker_id or last.get("worker_id")
            started_at = started_at or _as_datetime(last.get("started_at"))
        claimed = (
            status == JobStatus.RUNNING
            or job.started_at is not None
            or any(a.get("attempt") == job.attempt_number for a in ended)
        )
        attempt = job.attempt if claimed and job.attempt >= 1 else job.attempt + 1
        duration = None
        if started_at is not None and job.finished_at is not None:
            duration = (job.finished_at - started_at).total_seconds()
        error = job.error if status in TERMINAL and status != JobStatus.SUCCEEDED else None
        error = error or {}
        return cls(
            id=job.id,
            schedule=job.schedule_name or "",
            task_name=job.task_name,
            trigger=job.trigger,
            attempt=attempt,
            status=str(status),
            outcome=str(status) if status in TERMINAL else None,
            scheduled_for=job.scheduled_for,
            created_at=job.created_at,
            started_at=started_at,
            finished_at=job.finished_at,
            duration=duration,
            error_code=error.get("code"),
            error_message=error.get("message"),
            failure_class=error.get("class"),
            correlation_id=job.correlation_id,
            parent_id=job.parent_id,
            worker_id=worker_id,
            progress=dict(job.progress or {}),
            requested_by=(job.headers or {}).get("requested_by"),
            result=job.result,
        )


def _as_datetime(value: Any) -> dt.datetime | None:
    """A datetime from the attempt history (jsonb holds ISO text)."""
    if value is None or isinstance(value, dt.datetime):
        return value
    text = str(value)
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        return None
