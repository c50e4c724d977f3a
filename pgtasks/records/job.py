"""Small immutable records the store's rows are turned into."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, fields
from typing import Any, Self

from pgtasks.states import CLAIMED, JobStatus

__all__ = ["Attempt", "Job"]


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a job: number, trigger, worker, start, end, outcome, error."""

    attempt: int
    trigger: str
    worker_id: str | None
    started_at: dt.datetime | str | None
    finished_at: dt.datetime | str | None
    outcome: str
    error: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class Job:
    """A job row as stored in ``pgtasks.jobs``."""

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

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Self:
        """Build from a ``SELECT *`` row; unknown columns (added by later migrations) are ignored."""
        values: dict[str, Any] = {f.name: row.get(f.name) for f in fields(cls)}
        values["status"] = JobStatus(row["status"])
        return cls(**values)

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
        """Every attempt in order, including the current or successful last one.

        Attempts that ended without success are stored in ``attempts`` (appended by the
        same UPDATE that ended them); the last attempt, while running or after success,
        is described by the row's own columns, so the happy path writes no extra data.
        """
        out = [
            Attempt(
                attempt=int(a.get("attempt", 0)),
                trigger=str(a.get("trigger", "")),
                worker_id=a.get("worker_id"),
                started_at=a.get("started_at"),
                finished_at=a.get("finished_at"),
                outcome=str(a.get("outcome", "")),
                error=a.get("error"),
            )
            for a in self.attempts
        ]
        recorded = {a.attempt for a in out}
        if (
            self.attempt
            and self.attempt not in recorded
            and self.status
            in (
                JobStatus.RUNNING,
                JobStatus.SUCCEEDED,
            )
        ):
            out.append(
                Attempt(
                    attempt=self.attempt,
                    trigger=self.trigger if self.attempt == 1 else "retry",
                    worker_id=self.worker_id,
                    started_at=self.started_at,
                    finished_at=self.finished_at,
                    outcome=str(self.status),
                    error=None,
                )
            )
        return out
