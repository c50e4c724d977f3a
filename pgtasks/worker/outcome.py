"""Turning the end of an attempt into the job's next state (retry policy and failure classes).

Failure classes (`FailureClass`), recorded on every failed attempt:

* ``permanent``: `Reject`, unknown tasks, results that cannot be stored, and any
  exception the task's ``autoretry_for`` does not cover (as Celery: only listed
  exceptions are retried automatically);
* ``transient``: `Retry` requests, exceptions covered by ``autoretry_for``,
  ``WORKER_LOST``, time limits, and exceptions that are ``OSError`` (connection
  and timeout errors included) or a transient `DatabaseError`.

An exception may also carry a ``failure_class`` attribute (``"transient"`` or
``"permanent"``) to say so itself.

This module decides; `pgtasks.completion.Completer` writes what it decided, and
`pgtasks.db.errors` builds the error records.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from pgtasks.completion import Outcome
from pgtasks.context import Request
from pgtasks.db.errors import error_record, plain_error
from pgtasks.errors import ConfigurationError, DatabaseError, PartialFailure, Reject, Retry, TimeLimitExceeded
from pgtasks.states import ErrorCode, FailureClass, JobStatus
from pgtasks.task import TaskOptions, attempts_allowed, backoff_delay
from pgtasks.validation import check_retry_countdown

__all__ = ["Outcome", "cancelled_outcome", "decide", "failure_class", "unknown_task_outcome"]

_FAILURE_CLASSES = frozenset(FailureClass)


def failure_class(exc: BaseException, options: TaskOptions) -> FailureClass:
    """`FailureClass.TRANSIENT` or `FailureClass.PERMANENT` for an exception (see the module docs)."""
    declared = getattr(exc, "failure_class", None)
    if isinstance(declared, str) and declared in _FAILURE_CLASSES:
        return FailureClass(declared)
    if isinstance(exc, Reject):
        return FailureClass.PERMANENT
    if isinstance(exc, Retry | TimeLimitExceeded | OSError):
        return FailureClass.TRANSIENT
    if isinstance(exc, DatabaseError):
        return FailureClass.TRANSIENT if exc.transient else FailureClass.PERMANENT
    if options.autoretry_for and isinstance(exc, options.autoretry_for):
        return FailureClass.TRANSIENT
    return FailureClass.PERMANENT


def _jitter(hi: float) -> float:
    return random.uniform(0.0, hi)


def decide(exc: BaseException, options: TaskOptions, request: Request, *, cancelled: bool = False) -> Outcome:
    """Decide what happens after an attempt raised ``exc``.

    Args:
        exc: what the task raised (including control-flow signals).
        options: the task's options (retry policy).
        request: the attempt's request (attempt number, attempts allowed).
        cancelled: cancellation was requested while it ran.

    Returns:
        The `Outcome` to write: ``queued`` (a retry, with its delay in seconds),
        ``failed``, ``partial_failure`` or ``cancelled``.
    """
    max_attempts = request.max_attempts
    if cancelled:
        return Outcome(
            JobStatus.CANCELLED,
            error_record(exc, code=ErrorCode.CANCELLED, klass=FailureClass.PERMANENT),
            max_attempts=max_attempts,
        )
    if isinstance(exc, PartialFailure):
        record = plain_error("PartialFailure", exc.code, exc.message)
        return Outcome(JobStatus.PARTIAL_FAILURE, record, max_attempts=max_attempts, result=exc.result)
    if isinstance(exc, Reject):
        record = error_record(exc, code=exc.code, klass=FailureClass.PERMANENT)
        return Outcome(JobStatus.FAILED, record, max_attempts=max_attempts)
    klass = failure_class(exc, options)
    if isinstance(exc, Retry):
        try:
            countdown = check_retry_countdown(exc.countdown)
            if exc.max_retries is not None:  # clamped: max_attempts is a PostgreSQL integer
                max_attempts = attempts_allowed(exc.max_retries)
        except ConfigurationError as refused:  # a retry that cannot be scheduled: fail, say why
            record = error_record(refused, klass=FailureClass.PERMANENT)
            return Outcome(JobStatus.FAILED, record, max_attempts=max_attempts)
        cause = exc.exc if exc.exc is not None else exc
        code = ErrorCode.RETRY if exc.exc is None else None
        record = error_record(cause, code=code, klass=FailureClass.TRANSIENT)
        if request.attempt >= max_attempts:
            record["code"] = ErrorCode.MAX_RETRIES_EXCEEDED.value
            record["message"] = f"max retries ({max_attempts - 1}) exceeded: {record['message']}"
            return Outcome(JobStatus.FAILED, record, max_attempts=request.max_attempts)
        delay = countdown if countdown is not None else backoff_delay(options, request.retries, _jitter)
        return Outcome(JobStatus.QUEUED, record, delay=delay, max_attempts=max_attempts)
    code = ErrorCode.TIME_LIMIT if isinstance(exc, TimeLimitExceeded) else None
    record = error_record(exc, code=code, klass=klass)
    autoretry = bool(options.autoretry_for) and isinstance(exc, options.autoretry_for)
    if autoretry and request.attempt < max_attempts:
        delay = backoff_delay(options, request.retries, _jitter)
        return Outcome(JobStatus.QUEUED, record, delay=delay, max_attempts=max_attempts)
    return Outcome(JobStatus.FAILED, record, max_attempts=max_attempts)


def cancelled_outcome(request: Request, message: str, *, result: object = None) -> Outcome:
    """A ``cancelled`` outcome that no exception carries (before the job started,
    terminated on request, or a task that returned after cancellation).

    Args:
        request: the attempt's request. message: why, for people.
        result: what a task that returned anyway returned (stored with the job).
    """
    error = plain_error("Cancelled", ErrorCode.CANCELLED, message)
    return Outcome(JobStatus.CANCELLED, error, max_attempts=request.max_attempts, result=result)


def unknown_task_outcome(request: Request, worker_id: str, known: Iterable[str]) -> Outcome:
    """The ``failed`` outcome of a job whose task this worker does not know.

    Args:
        request: the claimed job's request. worker_id: this worker.
        known: the task names this worker knows (listed in the message).
    """
    names = ", ".join(sorted(known)) or "none"
    message = f"task {request.task_name!r} is not registered on worker {worker_id}; known tasks: {names}"
    error = plain_error("UnknownTask", ErrorCode.UNKNOWN_TASK, message)
    return Outcome(JobStatus.FAILED, error, max_attempts=request.max_attempts)
