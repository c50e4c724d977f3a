"""Every exception pgtasks raises, under one root.

Hierarchy::

    PgtasksError
    ├── ControlFlow                 signals a task raises on purpose; not failures
    │   ├── Retry                   run the job again later (``self.retry()``)
    │   ├── Reject                  fail permanently, never retry
    │   └── PartialFailure          end as ``partial_failure`` (some work done)
    ├── ConfigurationError          bad settings, options or plugin set-up
    │   └── InvalidSchedule         cron expression, time zone or policy refused
    ├── SerializationError          arguments or result cannot round-trip exactly
    ├── UnknownTask                 no task registered under that name
    ├── AlreadyQueued               unique key held by an unfinished job
    ├── RunAlreadyActive            schedule already has an active run
    ├── JobNotFound                 no job with that id
    ├── ScheduleNotFound            no schedule with that name
    ├── NotOwner                    worker does not hold the job it reports on
    ├── TaskFailed                  ``AsyncResult.get()`` of a failed job
    │   ├── TaskRevoked             ... that was cancelled
    │   └── TimeLimitExceeded       ... or exceeded its time limit
    │       └── SoftTimeLimitExceeded   raised inside a task at its soft time limit
    ├── ResultTimeout               ``AsyncResult.get(timeout=)`` ran out
    └── DatabaseError               PostgreSQL or the connection failed
        └── ConnectionFailed        could not connect at all

Control-flow signals (`Retry`, `Reject`) are kept apart from real failures so that
``except PgtasksError`` in application code rarely wants them; catch
`ControlFlow` explicitly if needed.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AlreadyQueued",
    "ConfigurationError",
    "ConnectionFailed",
    "ControlFlow",
    "DatabaseError",
    "InvalidSchedule",
    "JobNotFound",
    "NotOwner",
    "PartialFailure",
    "PgtasksError",
    "Reject",
    "ResultTimeout",
    "Retry",
    "RunAlreadyActive",
    "ScheduleNotFound",
    "SerializationError",
    "SoftTimeLimitExceeded",
    "TaskFailed",
    "TaskRevoked",
    "TimeLimitExceeded",
    "UnknownTask",
]

# SQLSTATE classes that mean "try again later": connection exceptions (08),
# insufficient resources (53), operator intervention (57, e.g. admin shutdown),
# plus serialization failure and deadlock (40001, 40P01).
# Source: PostgreSQL documentation, Appendix A "PostgreSQL Error Codes".
_TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "53", "57"})
_TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03"})


class PgtasksError(Exception):
    """Root of every pgtasks exception."""


class ControlFlow(PgtasksError):
    """A signal a task raises on purpose to steer its own job; not a failure."""


class Retry(ControlFlow):
    """Ask for the job to run again.

    Args:
        countdown: seconds from now until the next attempt (float, >= 0), or None
            to use the task's backoff policy.
        exc: the exception that caused the retry; recorded in the attempt history.
        max_retries: override the task's ``max_retries`` for this decision.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        countdown: float | None = None,
        exc: BaseException | None = None,
        max_retries: int | None = None,
    ) -> None:
        super().__init__(message or (repr(exc) if exc is not None else "retry requested"))
        self.countdown = countdown
        self.exc = exc
        self.max_retries = max_retries


class Reject(ControlFlow):
    """Fail the job permanently: no retry, whatever the task's retry policy.

    Args:
        reason: human-readable reason, stored as the job's error message.
        code: short machine-readable error code (e.g. ``"ENCRYPTED_PDF"``).
    """

    def __init__(self, reason: str = "rejected", *, code: str = "REJECTED") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class PartialFailure(ControlFlow):
    """End the job as ``partial_failure``: a terminal outcome that is not success.

    Args:
        message: what went wrong (stored as the job's error message).
        result: JSON-serialisable data to store as the job's result (e.g. counts).
        code: short machine-readable error code (default ``"PARTIAL_FAILURE"``).
    """

    def __init__(
        self, message: str = "partial failure", *, result: Any = None, code: str = "PARTIAL_FAILURE"
    ) -> None:
        super().__init__(message)
        self.message = message
        self.result = result
        self.code = code


class ConfigurationError(PgtasksError, ValueError):
    """A setting, option, task definition or plugin is invalid."""


class InvalidSchedule(ConfigurationError):
    """A schedule is refused: bad cron expression, unknown time zone or policy."""


class SerializationError(PgtasksError, TypeError):
    """A value cannot be stored so that it reads back exactly.

    Attributes:
        path: where in the arguments the bad value sits, e.g. ``"args[0]['when']"``.
        reason: why it is refused.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class UnknownTask(PgtasksError, LookupError):
    """No task is registered under this name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown task {name!r}")
        self.name = name


class AlreadyQueued(PgtasksError):
    """An unfinished job already holds this unique key.

    Attributes:
        unique_key: the key that was taken.
        job_id: id of the job that holds it.
    """

    def __init__(self, unique_key: str, job_id: int) -> None:
        super().__init__(f"unique key {unique_key!r} is held by job {job_id}")
        self.unique_key = unique_key
        self.job_id = job_id


class RunAlreadyActive(PgtasksError):
    """The schedule has an active run and its overlap policy forbids another.

    Attributes:
        schedule: schedule name.
        run_id: id of the active run (a job id).
    """

    def __init__(self, schedule: str, run_id: int) -> None:
        super().__init__(f"schedule {schedule!r} already has an active run {run_id}")
        self.schedule = schedule
        self.run_id = run_id


class JobNotFound(PgtasksError, LookupError):
    """No job has this id."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"no job with id {job_id}")
        self.job_id = job_id


class ScheduleNotFound(PgtasksError, LookupError):
    """No schedule has this name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no schedule named {name!r}")
        self.name = name


class NotOwner(PgtasksError):
    """A worker reported on a job it does not hold (wrong worker or job not running)."""

    def __init__(self, job_id: int, worker_id: str) -> None:
        super().__init__(f"worker {worker_id!r} does not hold job {job_id}")
        self.job_id = job_id
        self.worker_id = worker_id


class TaskFailed(PgtasksError):
    """The job ended without success; raised by ``AsyncResult.get()``.

    Attributes:
        job_id: the job's id.
        status: final status (``failed``, ``cancelled``, ``partial_failure``).
        error: the stored error record (type, message, code, traceback, class).
    """

    def __init__(self, job_id: int, status: str, error: dict[str, Any] | None) -> None:
        error = error or {}
        etype = error.get("type") or status
        message = error.get("message") or ""
        super().__init__(f"job {job_id} {status}: {etype}: {message}".rstrip(": "))
        self.job_id = job_id
        self.status = status
        self.error = error

    @property
    def traceback(self) -> str | None:
        """The task's traceback as text, when one was recorded."""
        tb = self.error.get("traceback")
        return str(tb) if tb else None


class TaskRevoked(TaskFailed):
    """The job was cancelled (revoked) before it finished."""


class TimeLimitExceeded(TaskFailed):
    """The job ran past its time limit.

    Raised inside a task when its ``soft_time_limit`` passes (then ``job_id`` is the
    running job's id and ``status`` is ``"running"``), and by ``AsyncResult.get()``
    for a job that was stopped at its hard ``time_limit``.
    """


class SoftTimeLimitExceeded(TimeLimitExceeded):
    """Raised inside a running task when its ``soft_time_limit`` passes (Celery's name).

    The task may catch it to clean up; if it propagates, the attempt fails with
    error code ``TIME_LIMIT`` (a transient failure, retried only when the task's
    ``autoretry_for`` covers it).
    """

    def __init__(self, job_id: int = 0, status: str = "running", error: dict[str, Any] | None = None) -> None:
        super().__init__(
            job_id, status, error or {"type": "SoftTimeLimitExceeded", "message": "soft time limit"}
        )


class ResultTimeout(PgtasksError, TimeoutError):
    """``AsyncResult.get(timeout=...)`` gave up waiting; the job is still unfinished. Also
    raised by `pgtasks.testing.run_until_idle` when its timeout runs out with jobs due."""


class DatabaseError(PgtasksError):
    """PostgreSQL reported an error or the connection broke.

    Attributes:
        sqlstate: the five-character SQLSTATE, when the server sent one.
        transient: True when trying again later can succeed (lost connection,
            admin shutdown, serialization failure, deadlock, out of resources).
    """

    def __init__(self, message: str, *, sqlstate: str | None = None, transient: bool = False) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.transient = transient

    @staticmethod
    def is_transient_sqlstate(sqlstate: str | None) -> bool:
        """True when this SQLSTATE means a retry can succeed (see module constants)."""
        if sqlstate is None:
            return True  # no SQLSTATE: the connection itself broke
        return sqlstate in _TRANSIENT_SQLSTATES or sqlstate[:2] in _TRANSIENT_SQLSTATE_CLASSES


class ConnectionFailed(DatabaseError):
    """Could not connect to PostgreSQL; the message names host and port.

    ``transient`` is False when the server answered and refused us (bad password,
    unknown database or role): retrying will not help until the settings change.
    """

    def __init__(self, message: str, *, transient: bool = True) -> None:
        super().__init__(message, sqlstate=None, transient=transient)
