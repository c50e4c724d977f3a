"""Small immutable records the store's rows are turned into."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Self

from pgtasks.states import CLAIMED, JobStatus

__all__ = ["Attempt", "Job", "Requeue"]

# The marker of a requeue among the entries of ``jobs.attempts`` (attempts have no "event").
REQUEUE_EVENT = "requeue"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a job: number, trigger, worker, start, end, outcome, error.

    Attributes:
        attempt: 1-based, numbered across manual requeues (the first attempt after
            a requeue that followed attempt 3 is attempt 4).
        trigger: ``api``, ``schedule``, ``manual``, ``dependency`` (the job's trigger)
            on its first attempt; ``manual`` on the first attempt after a requeue;
            ``retry`` on the others.
        worker_id: the worker that ran it.
        started_at, finished_at: when its body started and when it ended (a datetime,
            or ISO text as stored in the jsonb history; None when unknown).
        outcome: ``retry``, ``failed``, ``cancelled``, ``partial_failure``, ``lost``
            (its worker died), or, for the last attempt, ``running``/``succeeded``.
        error: the attempt's error record (type, message, code, class, traceback), None
            when it did not fail.
    """

    attempt: int
    trigger: str
    worker_id: str | None
    started_at: dt.datetime | str | None
    finished_at: dt.datetime | str | None
    outcome: str
    error: dict[str, Any] | None

    kind: ClassVar[str] = "attempt"


@dataclass(frozen=True, slots=True)
class Requeue:
    """A manual requeue in a job's history (``app.requeue``, ``pgtasks jobs retry``).

    A requeue starts a new round of attempts: the job gets a fresh budget of
    ``max_attempts`` attempts, and its attempts go on being numbered from
    ``after_attempt + 1``.

    Attributes:
        at: when it was requeued (database clock; ISO text as stored in the jsonb
            history), None for a requeue recorded before migration 0005.
        by: who asked: ``"api"`` (`pgtasks.App.requeue` without ``by=``),
            ``"cli:<os user>"`` (``pgtasks jobs retry``) or the caller's own text;
            None for a requeue recorded before migration 0005.
        from_status: the status it left (``failed``, ``cancelled``,
            ``partial_failure``), None when recorded before migration 0005.
        after_attempt: the number of the last attempt before it (0: none).
    """

    at: dt.datetime | str | None
    by: str | None
    from_status: str | None
    after_attempt: int

    kind: ClassVar[str] = "requeue"


@dataclass(frozen=True, slots=True)
class Job:
    """A job row as stored in ``pgtasks.jobs``.

    ``attempt`` counts the attempts of the current round against ``max_attempts``; a
    manual requeue starts a new round (``attempt`` back to 0, a fresh budget) and adds
    the attempts made so far to ``attempt_base``, so `attempt_number` and the
    `history` number attempts across requeues. ``error`` is the error of the last
    attempt that ended (None once the job succeeded); ``attempts`` is the raw history
    as stored: the attempts that ended without success, and the requeues (entries with
    ``"event": "requeue"``), in order.
    """

    id: int
    task_name: str
    queue: str
    tenant: str
    args: list[Any]
    kwargs: dict[str, Any]
    headers: dict[str, Any]
    priority: int
    status: JobStatus
    attempt: int
    max_attempts: int
    run_at: dt.datetime
    lock_key: str | None
    unique_key: str | None
    worker_id: str | None
    heartbeat_at: dt.datetime | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    result: Any
    error: dict[str, Any] | None
    attempts: list[dict[str, Any]]
    trigger: str
    schedule_name: str | None
    scheduled_for: dt.datetime | None
    parent_id: int | None
    correlation_id: str | None
    progress: dict[str, Any] | None
    cancel_requested: bool
    retry_on_worker_lost: bool
    attempt_base: int = 0

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Self:
        """Build from a ``SELECT *`` row; unknown columns (added by later migrations) are ignored."""
        values: dict[str, Any] = {f.name: row.get(f.name) for f in fields(cls)}
        values["status"] = JobStatus(row["status"])
        values["attempt_base"] = int(row.get("attempt_base") or 0)
        return cls(**values)

    @property
    def attempt_number(self) -> int:
        """The number of the current or last attempt, counted across manual requeues
        (``attempt_base + attempt``; 0 before the first attempt)."""
        return self.attempt_base + self.attempt

    @property
    def started(self) -> bool:
        """Whether the current attempt's body started (``started_at`` is set)."""
        return self.started_at is not None

    @property
    def phase(self) -> str:
        """The status, except ``claimed`` for a job a worker holds but has not started
        (status ``running``, no ``started_at``: claimed ahead, waiting for a free slot)."""
        if self.status == JobStatus.RUNNING and self.started_at is None:
            return CLAIMED
        return str(self.status)

    @property
    def duration(self) -> float | None:
        """Seconds from start to finish of the last attempt, when both are known."""
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()

    def history(self) -> list[Attempt]:
        """Every attempt in order, including the current or successful last attempt
        (`timeline` adds the manual requeues between them)."""
        return [entry for entry in self.timeline() if isinstance(entry, Attempt)]

    def timeline(self) -> list[Attempt | Requeue]:
        """Every attempt and manual requeue in order, including the current or successful
        last attempt.

        Attempts that ended without success and requeues are stored in ``attempts``
        (appended by the same UPDATE that ended or requeued the job); the last attempt,
        while running or after success, is described by the row's own columns, so the
        happy path writes no extra data. Attempts are numbered across requeues.
        """
        out: list[Attempt | Requeue] = []
        for a in self.attempts:
            if a.get("event") == REQUEUE_EVENT:
                out.append(
                    Requeue(
                        at=a.get("at"),
                        by=a.get("by"),
                        from_status=a.get("from_status"),
                        after_attempt=int(a.get("after_attempt") or 0),
                    )
                )
                continue
            out.append(
                Attempt(
                    attempt=int(a.get("attempt", 0)),
                    trigger=str(a.get("trigger", "")),
                    worker_id=a.get("worker_id"),
                    started_at=a.get("started_at"),
                    finished_at=a.get("finished_at"),
                    outcome=str(a.get("outcome", "")),
                    error=a.get("error"),
                )
            )
        number = self.attempt_number
        recorded = any(isinstance(a, Attempt) and a.attempt == number for a in out)
        if self.attempt and not recorded and self.status in (JobStatus.RUNNING, JobStatus.SUCCEEDED):
            # The first attempt of a round is manual after a requeue (anything came before).
            first = "manual" if out else self.trigger
            trigger = "retry" if self.attempt > 1 else first
            out.append(
                Attempt(
                    attempt=number,
                    trigger=trigger,
                    worker_id=self.worker_id,
                    started_at=self.started_at,
                    finished_at=self.finished_at,
                    outcome=str(self.status),
                    error=None,
                )
            )
        return out
