"""Turning the end of an attempt into the job's next state (retry policy and failure classes).

Failure classes, recorded on every failed attempt:

* ``permanent``: `Reject`, unknown tasks, results that cannot be stored, and any
  exception the task's ``autoretry_for`` does not cover (as Celery: only listed
  exceptions are retried automatically);
* ``transient``: `Retry` requests, exceptions covered by ``autoretry_for``,
  ``WORKER_LOST``, time limits, and exceptions that are ``OSError`` (connection
  and timeout errors included) or a transient `DatabaseError`.

An exception may also carry a ``failure_class`` attribute (``"transient"`` or
``"permanent"``) to say so itself.
"""

from __future__ import annotations

import random
import traceback
from dataclasses import dataclass
from typing import Any

from pgtasks.context import Request
from pgtasks.errors import DatabaseError, PartialFailure, Reject, Retry, TimeLimitExceeded
from pgtasks.states import JobStatus
from pgtasks.task import UNLIMITED_ATTEMPTS, TaskOptions, backoff_delay

__all__ = ["Outcome", "decide", "error_record", "storable_text"]

_TRACEBACK_LIMIT = 16_000  # characters kept of a traceback


@dataclass(frozen=True, slots=True)
class Outcome:
    """What to write for a finished attempt.

    Attributes:
        status: next status: ``queued`` (retry), ``failed``, ``partial_failure``,
            ``cancelled``.
        error: the error record (type, message, code, class, traceback).
        delay: seconds until the retry (for ``queued``).
        max_attempts: attempts now allowed (raised by ``retry(max_retries=)``).
        result: stored result for ``partial_failure``.
    """

    status: JobStatus
    error: dict[str, Any]
    delay: float = 0.0
    max_attempts: int = 1
    result: Any = None


def failure_class(exc: BaseException, options: TaskOptions) -> str:
    """``"transient"`` or ``"permanent"`` for an exception (see the module docs)."""
    declared = getattr(exc, "failure_class", None)
    if declared in ("transient", "permanent"):
        return str(declared)
    if isinstance(exc, Reject):
        return "permanent"
    if isinstance(exc, Retry | TimeLimitExceeded | OSError):
        return "transient"
    if isinstance(exc, DatabaseError):
        return "transient" if exc.transient else "permanent"
    if options.autoretry_for and isinstance(exc, options.autoretry_for):
        return "transient"
    return "permanent"


def storable_text(text: str) -> str:
    """``text`` with what jsonb refuses escaped: NUL as ``\\x00``, lone surrogates as ``\\udXXX``."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def error_record(exc: BaseException, *, code: str | None = None, klass: str = "permanent") -> dict[str, Any]:
    """The stored form of an exception: type, message, code, class and traceback.

    Message and traceback are made storable (`storable_text`): an exception about
    binary data must not make its own failure unrecordable.
    """
    text = "".join(traceback.format_exception(exc))
    return {
        "type": type(exc).__qualname__,
        "module": type(exc).__module__,
        "message": storable_text(str(exc)),
        "code": code or getattr(exc, "code", None) or type(exc).__name__.upper(),
        "class": klass,
        "traceback": storable_text(text[-_TRACEBACK_LIMIT:]),
    }


def decide(exc: BaseException, options: TaskOptions, request: Request, *, cancelled: bool = False) -> Outcome:
    """Decide what happens after an attempt raised ``exc``.

    Args:
        exc: what the task raised (including control-flow signals).
        options: the task's options (retry policy).
        request: the attempt's request (attempt number, attempts allowed).
        cancelled: cancellation was requested while it ran.
    """
    max_attempts = request.max_attempts
    if cancelled:
        return Outcome(
            JobStatus.CANCELLED,
            error_record(exc, code="CANCELLED", klass="permanent"),
            max_attempts=max_attempts,
        )
    if isinstance(exc, PartialFailure):
        record = {
            "type": "PartialFailure",
            "message": storable_text(exc.message),
            "code": exc.code,
            "class": "permanent",
        }
        return Outcome(JobStatus.PARTIAL_FAILURE, record, max_attempts=max_attempts, result=exc.result)
    if isinstance(exc, Reject):
        return Outcome(
            JobStatus.FAILED, error_record(exc, code=exc.code, klass="permanent"), max_attempts=max_attempts
        )
    klass = failure_class(exc, options)
    if isinstance(exc, Retry):
        if exc.max_retries is not None:  # clamped: max_attempts is a PostgreSQL integer
            max_attempts = min(exc.max_retries + 1, UNLIMITED_ATTEMPTS)
        cause = exc.exc if exc.exc is not None else exc
        code = "RETRY" if exc.exc is None else None
        record = error_record(cause, code=code, klass="transient")
        if request.attempt >= max_attempts:
            record["code"] = "MAX_RETRIES_EXCEEDED"
            record["message"] = f"max retries ({max_attempts - 1}) exceeded: {record['message']}"
            return Outcome(JobStatus.FAILED, record, max_attempts=request.max_attempts)
        delay = (
            exc.countdown
            if exc.countdown is not None
            else backoff_delay(options, request.retries, lambda hi: random.uniform(0.0, hi))
        )
        return Outcome(JobStatus.QUEUED, record, delay=max(0.0, float(delay)), max_attempts=max_attempts)
    code = "TIME_LIMIT" if isinstance(exc, TimeLimitExceeded) else None
    record = error_record(exc, code=code, klass=klass)
    autoretry = bool(options.autoretry_for) and isinstance(exc, options.autoretry_for)
    if autoretry and request.attempt < max_attempts:
        delay = backoff_delay(options, request.retries, lambda hi: random.uniform(0.0, hi))
        return Outcome(JobStatus.QUEUED, record, delay=delay, max_attempts=max_attempts)
    return Outcome(JobStatus.FAILED, record, max_attempts=max_attempts)
