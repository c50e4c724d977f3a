"""`AsyncResult`: a handle on a job, with Celery's names."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import psycopg

from pgtasks.errors import (
    ConfigurationError,
    DatabaseError,
    JobNotFound,
    ResultTimeout,
    TaskFailed,
    TaskRevoked,
    TimeLimitExceeded,
)
from pgtasks.states import TERMINAL, ErrorCode, JobStatus
from pgtasks.validation import check_bool, check_job_id, check_timeout

if TYPE_CHECKING:
    from pgtasks.db import AnyAsyncConnection, StoredJobStatus
    from pgtasks.ports import ResultSource
    from pgtasks.records import Explanation, Job

__all__ = ["AsyncResult"]

log = logging.getLogger("pgtasks.result")


class AsyncResult:
    """A job's id and the ways to follow it.

    Every property reads the database afresh (as Celery's result backend does).

    Args:
        id: the job id: an int (or a str of digits) in PostgreSQL's bigint range.
        app: the app whose database holds the job (any `pgtasks.ports.ResultSource`:
            its ``stores`` to read the job and wait on it, ``get_job`` and ``cancel``).

    Raises:
        ConfigurationError: ``id`` is not an int in the bigint range.
    """

    __slots__ = ("app", "id", "parent")

    def __init__(self, id: int, app: ResultSource) -> None:
        self.id = check_job_id("job id", id)
        self.app = app
        #: The result of the step before this one in a chain (an `AsyncResult` or a
        #: `pgtasks.GroupResult`), as Celery's ``parent``; None otherwise.
        self.parent: Any = None

    def __repr__(self) -> str:
        return f"<AsyncResult {self.id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsyncResult) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def _row(self) -> StoredJobStatus:
        row = self.app.stores.jobs.status(id=self.id)
        if row is None:
            raise JobNotFound(self.id)
        return row

    def job(self) -> Job:
        """The whole job record (status, attempts, progress, ...).

        Raises:
            JobNotFound: no job has this id (e.g. it was purged).
        """
        return self.app.get_job(self.id)

    def explain(self) -> Explanation:
        """Why the job is not running now, or where it is (`pgtasks.App.explain`).

        Raises:
            JobNotFound: no job has this id (through a tenant handle: none of its tenant's).
        """
        return self.app.explain(self.id)

    @property
    def status(self) -> str:
        """``queued``, ``running``, ``succeeded``, ``failed``, ``cancelled`` or ``partial_failure``;
        ``blocked`` while the job waits for prerequisites (``depends_on``, a chain, a chord)."""
        return self._row().status

    state = status  # Celery's other name

    @property
    def phase(self) -> str:
        """The status, except ``claimed`` while a worker holds the job without having
        started its body (prefetched; status ``running``): see `pgtasks.Job.phase`.

        Raises:
            JobNotFound: no job has this id.
        """
        return self.job().phase

    @property
    def result(self) -> Any:
        """The return value once succeeded; the failure as a `TaskFailed` once failed; else None."""
        row = self._row()
        if row.status == JobStatus.SUCCEEDED:
            return row.result
        if row.status in TERMINAL:
            return _failure(self.id, row)
        return None

    @property
    def traceback(self) -> str | None:
        """The last failed attempt's traceback, if any."""
        error = self._row().error or {}
        tb = error.get("traceback")
        return str(tb) if tb else None

    def ready(self) -> bool:
        """Whether the job has finished (any terminal status)."""
        return self._row().status in TERMINAL

    def successful(self) -> bool:
        """Whether the job succeeded."""
        return self._row().status == JobStatus.SUCCEEDED

    def failed(self) -> bool:
        """Whether the job ended without success."""
        status = self._row().status
        return status in TERMINAL and status != JobStatus.SUCCEEDED

    def get(self, timeout: float | None = None, *, propagate: bool = True) -> Any:
        """Wait for the job to finish and return its result.

        Waits on a LISTEN connection for "jobs finished" notifications, re-checking
        the job on each one and at least once a second (NOTIFY only wakes), so it
        never busy-polls (with ``Settings.listen`` off, behind a transaction
        pooler, it only reads the job each second). A lost connection is opened
        again, with a growing pause (0.1 s up to 2 s), until ``timeout``: the wait
        survives a server restart and a failover to a promoted standby (a
        multi-host DSN with ``target_session_attrs=read-write``; docs/operations.md).

        Args:
            timeout: seconds to wait at most (finite, 0 up to
                `pgtasks.validation.MAX_DELAY`); None waits forever.
            propagate: raise the job's failure (True, Celery's default) or return it.

        Raises:
            ConfigurationError: ``timeout`` is ``nan``, infinite, negative or too
                large, or ``propagate`` is not a bool.
            ResultTimeout: the job had not finished within ``timeout`` (or the
                database stayed unreachable that long).
            DatabaseError: the server refused the connection for good (bad
                password, unknown database).
            TaskFailed: the job failed (`TaskRevoked` if cancelled,
                `TimeLimitExceeded` if stopped at its time limit).
            JobNotFound: no job has this id.
        """
        deadline = _deadline(timeout, propagate)
        try:
            row: StoredJobStatus | None = self._row()
        except DatabaseError as exc:  # e.g. no pooled connection during a failover: wait on
            if not exc.transient:
                raise
            row = None
        if row is None or row.status not in TERMINAL:
            row = self._wait(deadline)
        return self._outcome(row, propagate)

    def _reconnect_delay(self, exc: Exception, delay: float, deadline: float | None) -> float:
        """After the wait's connection was lost (``exc``): the seconds to wait before
        connecting again (``delay``, cut short by ``deadline``).

        A lost connection, a server that refuses connections while it restarts, and
        a standby that is not promoted yet (``target_session_attrs=read-write``
        refuses it) are transient: the wait goes on until ``deadline``.

        Raises:
            DatabaseError: ``exc`` itself, when it is not transient (bad password,
                unknown database: trying again cannot help).
            ResultTimeout: ``deadline`` has passed.
        """
        if isinstance(exc, DatabaseError) and not exc.transient:
            raise exc
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ResultTimeout(
                    f"job {self.id} unfinished; the database was unreachable ({exc})"
                ) from exc
            delay = min(delay, remaining)
        log.warning(
            "waiting for job %s: connection lost (%s); connecting again in %.1fs", self.id, exc, delay
        )
        return delay

    async def get_async(self, timeout: float | None = None, *, propagate: bool = True) -> Any:
        """`get` for asyncio callers: waits without blocking the event loop.

        Waits on a dedicated asyncio connection (`pgtasks.db.Database.connect_async`)
        that LISTENs for "jobs finished" notifications, re-checking the job on each one
        and at least once a second, as `get` does; the connection is closed on return,
        on timeout and on cancellation.

        Args:
            timeout: seconds to wait at most (finite, 0 up to
                `pgtasks.validation.MAX_DELAY`); None waits forever.
            propagate: raise the job's failure (True) or return it.

        Raises:
            ConfigurationError, ResultTimeout, TaskFailed, JobNotFound: as `get`.
            ConnectionFailed: the server cannot be reached.
        """
        deadline = _deadline(timeout, propagate)
        delay = _FIRST_RECONNECT_DELAY
        while True:
            try:
                row = await self._wait_async(deadline)
                return self._outcome(row, propagate)
            except (DatabaseError, psycopg.OperationalError) as exc:  # the connection was lost
                await asyncio.sleep(self._reconnect_delay(exc, delay, deadline))
                delay = min(delay * 2, _MOST_RECONNECT_DELAY)

    async def _wait_async(self, deadline: float | None) -> StoredJobStatus:
        """`get_async`'s wait on one dedicated connection, until the job has finished."""
        stores = self.app.stores
        jobs = stores.jobs
        conn = await stores.database.connect_async()
        try:
            if stores.database.listen:
                await jobs.listen_done_async(conn=conn)
            while True:
                row = await jobs.status_async(id=self.id, conn=conn)
                wait = self._wait_step(row, deadline)
                if wait is None:
                    assert row is not None
                    return row
                async for _ in conn.notifies(timeout=wait, stop_after=1):
                    pass
        finally:
            await conn.close()

    async def job_async(self, *, connection: AnyAsyncConnection | None = None) -> Job:
        """`job` for asyncio callers: the whole job record.

        Args:
            connection: a ``psycopg.AsyncConnection`` to read on (yours, e.g. from
                ``psycopg_pool.AsyncConnectionPool``; the read joins its transaction),
                in the event loop; None reads through the app's pool in a worker thread.

        Raises:
            JobNotFound: no job has this id (e.g. it was purged).
            ConfigurationError: ``connection`` is neither None nor an asyncio connection.
        """
        if connection is None:
            return await asyncio.to_thread(self.job)
        if not isinstance(connection, psycopg.AsyncConnection):
            raise ConfigurationError(
                f"connection must be a psycopg AsyncConnection, got {type(connection).__name__}"
            )
        return await self.app.stores.jobs.get_async(id=self.id, conn=connection)

    def _outcome(self, row: StoredJobStatus, propagate: bool) -> Any:
        """What `get` returns (or raises) for a finished job's ``row``."""
        if row.status == JobStatus.SUCCEEDED:
            return row.result
        failure = _failure(self.id, row)
        if propagate:
            raise failure
        return failure

    def _wait_step(self, row: StoredJobStatus | None, deadline: float | None) -> float | None:
        """None when ``row`` has finished; else the seconds to wait for a notification
        before reading it again (at most 1).

        Raises:
            JobNotFound: ``row`` is None (no such job).
            ResultTimeout: ``deadline`` (a `time.monotonic` instant) has passed.
        """
        if row is None:
            raise JobNotFound(self.id)
        if row.status in TERMINAL:
            return None
        if deadline is None:
            return 1.0
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ResultTimeout(f"job {self.id} still {row.status} after waiting")
        return min(1.0, remaining)

    def _wait(self, deadline: float | None) -> StoredJobStatus:
        """Wait until the job has finished, on a dedicated connection; a lost connection
        is opened again (a server restart, a failover to a promoted standby:
        `_reconnect_delay`), so the wait survives them up to ``deadline``."""
        delay = _FIRST_RECONNECT_DELAY
        while True:
            try:
                return self._wait_once(deadline)
            except (DatabaseError, psycopg.OperationalError) as exc:  # the connection was lost
                time.sleep(self._reconnect_delay(exc, delay, deadline))
                delay = min(delay * 2, _MOST_RECONNECT_DELAY)

    def _wait_once(self, deadline: float | None) -> StoredJobStatus:
        stores = self.app.stores
        jobs = stores.jobs
        with stores.database.connect() as conn:
            if stores.database.listen:
                jobs.listen_done(conn=conn)
            while True:
                row = jobs.status(id=self.id, conn=conn)
                wait = self._wait_step(row, deadline)
                if wait is None:
                    assert row is not None
                    return row
                for _ in conn.notifies(timeout=wait, stop_after=1):
                    pass

    def revoke(self, *, terminate: bool = False) -> bool:
        """Cancel the job (Celery's ``revoke``).

        A queued job is cancelled at once. A running job is asked to stop: its
        task sees ``self.is_cancelled()`` become True; with ``terminate=True`` a job
        in the ``processes`` pool is killed.

        Returns:
            True if the job was queued or running, False if it had already finished.

        Raises:
            ConfigurationError: ``terminate`` is not a bool.
        """
        return self.app.cancel(self.id, terminate=check_bool("terminate", terminate))

    def forget(self) -> None:
        """Accepted for Celery compatibility: results live in the job row until purged."""


#: Seconds before `AsyncResult.get` connects again after losing its connection; doubled
#: after each failed try, up to `_MOST_RECONNECT_DELAY`.
_FIRST_RECONNECT_DELAY = 0.1
_MOST_RECONNECT_DELAY = 2.0


def _deadline(timeout: float | None, propagate: bool) -> float | None:
    """The `time.monotonic` instant a wait of ``timeout`` seconds ends (None: never),
    after checking `get`'s arguments.

    Raises:
        ConfigurationError: ``timeout`` is ``nan``, infinite, negative or too large,
            or ``propagate`` is not a bool.
    """
    seconds = check_timeout("timeout", timeout)
    check_bool("propagate", propagate)
    return None if seconds is None else time.monotonic() + seconds


def _failure(job_id: int, row: StoredJobStatus) -> TaskFailed:
    status = row.status
    error = row.error or {}
    if status == JobStatus.CANCELLED:
        return TaskRevoked(job_id, status, error)
    if error.get("code") == ErrorCode.TIME_LIMIT:
        return TimeLimitExceeded(job_id, status, error)
    return TaskFailed(job_id, status, error)
