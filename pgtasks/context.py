"""What a running task sees: its request and the calls it can make on its job.

A bound task (``@app.task(bind=True)``) receives a `TaskContext` as ``self``,
mirroring Celery's ``self.request`` and ``self.retry()``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from pgtasks.errors import PartialFailure, Retry
from pgtasks.serialization import Undecodable
from pgtasks.validation import check_retry_countdown

if TYPE_CHECKING:
    from pgtasks.db import AnyConnection, HeldTransaction
    from pgtasks.ports import Engine
    from pgtasks.task import Task

__all__ = [
    "CLAIM_COLUMNS",
    "TRANSACTION_NEEDS_THREADS",
    "JobRuntime",
    "Request",
    "TaskContext",
    "request_from_claim",
    "unreadable_claim",
]

#: Why `TaskContext.transaction` is refused in the ``processes`` pool: the parent
#: writes the outcome, so it cannot commit with a transaction of the child.
TRANSACTION_NEEDS_THREADS = (
    "transactional completion (self.transaction()) needs the threads pool; this worker runs -P processes"
)


@dataclass(slots=True)
class Request:
    """The job being run (Celery's ``self.request``); read it, do not change it.

    Not frozen, like Celery's request: a frozen dataclass pays one
    ``object.__setattr__`` per field on creation, and a worker creates one per job.

    Attributes:
        id: job id (None when the task is called directly, not through a job).
        task_name: the task's name.
        attempt: 1-based attempt number.
        retries: retries made before this attempt (``attempt - 1``), Celery's name.
        max_attempts: attempts allowed in all.
        trigger: what created the job: ``api``, ``schedule``, ``manual``,
            ``retry`` (this attempt is a retry) or ``dependency``.
        args, kwargs: the call's arguments.
        queue, tenant, priority: where and for whom it runs.
        headers: metadata added at enqueue (plugins: trace ids and the like).
        lock_key, unique_key: the job's keys, if any.
        schedule_name, scheduled_for: for runs made by a schedule.
        parent_id: the run or job that caused this one (retry/dependency links).
        correlation_id: id shared by related runs.
        worker_id: the worker running it.
    """

    id: int | None
    task_name: str
    attempt: int = 1
    max_attempts: int = 1
    trigger: str = "api"
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    queue: str = "default"
    tenant: str = ""
    priority: int = 0
    headers: Mapping[str, Any] = field(default_factory=dict)
    lock_key: str | None = None
    unique_key: str | None = None
    schedule_name: str | None = None
    scheduled_for: dt.datetime | None = None
    parent_id: int | None = None
    correlation_id: str | None = None
    worker_id: str | None = None

    @property
    def retries(self) -> int:
        """Retries made before this attempt."""
        return max(self.attempt - 1, 0)

    @property
    def attempt_trigger(self) -> str:
        """The trigger of this attempt: the job's trigger on attempt 1, else ``retry``."""
        return self.trigger if self.attempt <= 1 else "retry"


# The columns job_claim_batch and job_claim_ids return, in order: the fields of `Request` but the last
# (worker_id), so `request_from_claim` builds one by position. Both add the job's run-at in Unix
# seconds after them (due), and job_claim_batch then tenant_share (see the queries).
CLAIM_COLUMNS = (
    "id",
    "task_name",
    "attempt",
    "max_attempts",
    "trigger",
    "args",
    "kwargs",
    "queue",
    "tenant",
    "priority",
    "headers",
    "lock_key",
    "unique_key",
    "schedule_name",
    "scheduled_for",
    "parent_id",
    "correlation_id",
)
_CLAIM_WIDTH = len(CLAIM_COLUMNS)


def request_from_claim(row: Sequence[Any], worker_id: str | None) -> Request:
    """The `Request` of a claimed job: ``row`` holds the `CLAIM_COLUMNS` values in order.

    Values after them (the claim's ``tenant_share``) are not the job's and are ignored.
    """
    job_id, task_name, attempt, max_attempts, trigger, args, *rest = row[:_CLAIM_WIDTH]
    # rest: Request's next fields in order (tests/test_claim_order.py checks CLAIM_COLUMNS).
    return Request(job_id, task_name, attempt, max_attempts, trigger, tuple(args), *rest, worker_id)  # type: ignore[call-arg]


_ARGS = CLAIM_COLUMNS.index("args")
_KWARGS = CLAIM_COLUMNS.index("kwargs")
_HEADERS = CLAIM_COLUMNS.index("headers")
_SCHEDULED_FOR = CLAIM_COLUMNS.index("scheduled_for")
# JSON's names for what the jsonb loader returns (tagged values keep their Python names).
_JSON_KINDS = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}  # fmt: skip


def unreadable_claim(row: Sequence[Any]) -> str | None:
    """Why a claimed row (`CLAIM_COLUMNS` values, read with the claim's lenient loaders)
    cannot become a `Request`, or None when it can (three type checks: the common case).

    A row written by SQL may hold args that are not a JSON array, kwargs or headers
    that are not an object, or a value the loaders could not read (an
    `pgtasks.serialization.Undecodable`: an unknown type tag or time zone, a number
    beyond a float, a ``scheduled_for`` of ``infinity``).

    Returns:
        For people, each field that cannot be read and why, e.g. ``"args is an object,
        not an array"``; ``"; "`` between fields.
    """
    args, kwargs, headers, scheduled_for = row[_ARGS], row[_KWARGS], row[_HEADERS], row[_SCHEDULED_FOR]
    if (
        type(args) is list
        and type(kwargs) is dict
        and type(headers) is dict
        and type(scheduled_for) is not Undecodable
    ):
        return None
    problems = []
    for name, value, kind in (("args", args, list), ("kwargs", kwargs, dict), ("headers", headers, dict)):
        if type(value) is Undecodable:
            problems.append(f"{name} cannot be read: {value.reason}")
        elif type(value) is not kind:
            found = _JSON_KINDS.get(type(value), f"a {type(value).__name__}")
            problems.append(f"{name} is {found}, not {_JSON_KINDS[kind]}")
    if type(scheduled_for) is Undecodable:
        problems.append(f"scheduled_for cannot be read: {scheduled_for.reason}")
    return "; ".join(problems)


class JobRuntime(Protocol):
    """What the worker provides to a running job's context."""

    def report_progress(self, job_id: int, counters: Mapping[str, Any]) -> bool:
        """Store progress; returns whether cancellation was requested."""

    def is_cancelled(self, job_id: int) -> bool:
        """Whether cancellation of the job was requested."""

    def job_transaction(self, job_id: int, attempt: int) -> HeldTransaction:
        """The transaction of the job's attempt ``attempt``, committed with its success
        (`TaskContext.transaction`).

        Raises:
            ConfigurationError: this worker cannot hold one (the processes pool).
            NotOwner: the worker no longer holds that attempt of the job.
        """


class TaskContext:
    """The running job as its task sees it (``self`` of a bound task).

    Attributes:
        task: the `Task` being run.
        request: the job's `Request`.
    """

    def __init__(self, task: Task, request: Request, runtime: JobRuntime | None = None) -> None:
        self.task = task
        self.request = request
        self._runtime = runtime

    @classmethod
    def detached(cls, task: Task, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> TaskContext:
        """A context for a direct call of the function (no job, no worker)."""
        return cls(task, Request(id=None, task_name=task.name, args=args, kwargs=kwargs))

    @property
    def app(self) -> Engine:
        """The owning app (a `pgtasks.App`, typed as `pgtasks.ports.Engine`)."""
        return self.task.app

    @property
    def name(self) -> str:
        """The task's name."""
        return self.task.name

    def retry(
        self,
        exc: BaseException | None = None,
        *,
        countdown: float | None = None,
        max_retries: int | None = None,
    ) -> NoReturn:
        """Ask for another attempt (raises `Retry`; use ``raise self.retry(...)`` or just call it).

        Args:
            exc: the cause, recorded in the attempt history.
            countdown: seconds until the next attempt; None uses the task's backoff.
            max_retries: override the task's ``max_retries`` for this decision.

        Raises:
            Retry: always. When no retries are left the worker fails the job with
                ``exc`` (or a ``MaxRetriesExceeded`` error).
            ConfigurationError: ``countdown`` is ``nan``, infinite, past
                `pgtasks.validation.MAX_DELAY` or not a number, or ``max_retries``
                is not None or an int >= 0; uncaught, it fails the job.
        """
        from pgtasks.task import attempts_allowed

        check_retry_countdown(countdown)
        if max_retries is not None:
            attempts_allowed(max_retries)
        raise Retry(countdown=countdown, exc=exc, max_retries=max_retries)

    def partial_failure(self, message: str, *, result: Any = None, code: str = "PARTIAL_FAILURE") -> NoReturn:
        """End the job as ``partial_failure`` with a message and an optional result.

        Raises:
            PartialFailure: always.
        """
        raise PartialFailure(message, result=result, code=code)

    def report_progress(self, **counters: Any) -> None:
        """Merge progress counters into the job (e.g. ``bytes_processed=...``); also a heartbeat.

        Args:
            counters: JSON-serialisable values, merged key by key into ``progress``.

        Raises:
            NotOwner: this worker no longer holds the job (it was reaped or cancelled).
            SerializationError: a counter cannot be stored.
        """
        if self._runtime is None or self.request.id is None:
            return
        self._runtime.report_progress(self.request.id, counters)

    def is_cancelled(self) -> bool:
        """Whether someone asked to cancel this job; a long task should check it and return."""
        if self._runtime is None or self.request.id is None:
            return False
        return self._runtime.is_cancelled(self.request.id)

    @contextmanager
    def transaction(self) -> Iterator[AnyConnection]:
        """A transaction for the task's own writes that commits together with the job's
        success: ``with self.transaction() as conn: conn.execute(...)``.

        The block's writes are not committed when it ends. The worker writes the job's
        success in the same transaction once the task has returned, and commits both:
        the writes stay exactly when the job succeeded. If the task raises (in the
        block or after it), is cancelled or times out, or its worker dies, or the job
        is no longer the worker's when it returns (its lease ran out), nothing of the
        block stays, and a retry writes afresh. Blocks of one attempt share one
        transaction. River's ``JobCompleteTx`` and DBOS's transactions give the same
        guarantee.

        The connection is one of the app's pooled connections (``app.stores``;
        ``pool_size`` bounds how many jobs hold one at once). Do not commit or roll
        back on it yourself. Called directly (``task(...)``, not by a worker), the
        block is an ordinary transaction, committed when it ends.

        Yields:
            A psycopg connection inside the transaction.

        Raises:
            ConfigurationError: the job runs in the ``processes`` pool, which cannot
                hold it (use the threads pool for such tasks).
            NotOwner: the worker no longer holds this attempt (its lease lapsed and
                the job was claimed again); the attempt's outcome is not written either.
            DatabaseError: no pooled connection within the connect timeout, or a
                statement failed.
        """
        if self._runtime is None or self.request.id is None:
            with self.app.stores.database.transaction() as conn:
                yield conn
            return
        with self._runtime.job_transaction(self.request.id, self.request.attempt).block() as conn:
            yield conn
