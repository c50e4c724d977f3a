"""`TenantScope`: the API of one tenant, what ``app.tenant("acme")`` returns.

Many tenants share one database (every job row carries its ``tenant``). A
`TenantScope` is the view a tenant's code (a request handler acting for tenant
``acme``) should hold: every operation acts only on that tenant's jobs.

- enqueue: ``send_task(name, ...)``, ``apply_async(task, ...)``, ``delay(task, ...)``
  and ``bind(task).delay(...)`` write jobs of the handle's tenant; a ``tenant=``
  option that names another is refused (`ConfigurationError`, nothing written), and so
  is a ``link`` / ``link_error`` callback signature that names another (a callback is
  its job's tenant's: `pgtasks.enqueue`);
  their ``*_async`` forms do the same from asyncio code, natively in the caller's
  transaction when ``connection=`` is a ``psycopg.AsyncConnection``;
- lookups and actions: ``AsyncResult(id)``, ``get_job``, ``cancel``/``cancel_job``,
  ``requeue``, ``list_jobs``, ``search``: another tenant's job id behaves exactly as
  an id no job has (`JobNotFound`, same message), because the tenant is a condition
  of the one statement that looks the job up (``WHERE id = ... AND tenant = ...``
  on the primary key), not a comparison made after reading the row;
- results it returns (`pgtasks.AsyncResult`) read through the handle, so they stay
  scoped too;
- every statement the handle runs says whose transaction it is
  (``set_config('pgtasks.tenant', tenant, true)``), and ``connection()`` opens such a
  transaction for the caller's own SQL: with row-level security mode on
  (`pgtasks.isolation`), PostgreSQL itself then hides and protects other tenants' rows.

The unscoped `pgtasks.App` API stays the operator's view across tenants. A handle is
not a security boundary against code that holds the DSN or the `App`: see
docs/security.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from pgtasks import jobadmin
from pgtasks.db import AnyConnection, tenant_context
from pgtasks.enqueue import async_connection
from pgtasks.errors import AlreadyQueued, ConfigurationError, JobNotFound
from pgtasks.result import AsyncResult
from pgtasks.task import Task
from pgtasks.validation import (
    check_text,
    short,
)

if TYPE_CHECKING:
    from pgtasks.db import Stores
    from pgtasks.ports import Engine
    from pgtasks.records import Explanation, Job

__all__ = ["TenantScope", "TenantTask"]


class TenantScope:
    """The API of one tenant: enqueue, look up, cancel, requeue, list and search only
    that tenant's jobs (``app.tenant("acme")``; see the module docstring).

    Args:
        app: the application (a `pgtasks.App`; typed as `pgtasks.ports.Engine`).
        tenant: the tenant, a non-empty string without NUL of at most
            `pgtasks.validation.MAX_KEY_BYTES` bytes in UTF-8. The empty tenant (jobs
            enqueued without one) has no handle: a name that came out empty by
            mistake would otherwise see every untenanted job.

    Attributes:
        tenant: the tenant.

    Raises:
        ConfigurationError: ``tenant`` is not such a string.
    """

    __slots__ = ("_app", "_stores", "tenant")

    def __init__(self, app: Engine, tenant: str) -> None:
        self._app = app
        self.tenant: str = check_text("tenant", tenant)
        self._stores: Stores | None = None

    def __repr__(self) -> str:
        return f"<TenantScope {self.tenant!a}>"

    @property
    def stores(self) -> Stores:
        """The app's stores, with the job store scoped to the tenant
        (`pgtasks.db.JobStore.scoped`): what the handle's `AsyncResult` reads through."""
        if self._stores is None:
            stores = self._app.stores
            self._stores = replace(
                stores, database=stores.database.scoped(self.tenant), jobs=stores.jobs.scoped(self.tenant)
            )
        return self._stores

    @contextmanager
    def connection(self) -> Iterator[AnyConnection]:
        """A pooled connection in a transaction of the tenant, committed when the block
        ends without an error (rolled back otherwise).

        Its first statement sets ``pgtasks.tenant`` for the transaction, so with
        row-level security mode on even raw SQL in it sees and writes only the
        tenant's rows. Pass it as ``connection=`` to enqueue in the same transaction
        as your own writes.

        Session state the block leaves behind (``SET``, ``SET ROLE``, a session
        advisory lock, a temporary table) is undone before the connection goes back to
        the pool, so it never reaches another tenant's request or pgtasks' own statements.

        Raises:
            ConnectionFailed: the server cannot be reached.
            DatabaseError: a statement of the block failed (translated).
        """
        with self.stores.database.lent_transaction() as conn:
            yield conn

    # -- enqueue -------------------------------------------------------------------

    def _task(self, task: Task | str) -> Task:
        if isinstance(task, str):
            return self._app.get_task(task)
        if not isinstance(task, Task) or task.app is not self._app:
            raise ConfigurationError(f"task must be a task of this app or its name, got {short(task)}")
        return task

    def _options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        tenant = options.get("tenant", self.tenant)
        if tenant != self.tenant:
            raise ConfigurationError(
                f"tenant {short(tenant)} is not this handle's tenant {short(self.tenant)}; "
                "a tenant handle enqueues only for its own tenant (leave tenant= out)"
            )
        return {**options, "tenant": self.tenant}

    def _scoped(self, result: AsyncResult) -> AsyncResult:
        return AsyncResult(result.id, self)

    def apply_async(
        self,
        task: Task | str,
        args: Iterable[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Enqueue a job of ``task`` for the tenant, as `pgtasks.Task.apply_async`.

        Args:
            task: a task of this app, or its registered name.
            args, kwargs, options: as `pgtasks.Task.apply_async` takes them;
                ``tenant`` may be left out or name the handle's tenant.

        Returns:
            An `AsyncResult` that reads through the handle.

        Raises:
            ConfigurationError: ``tenant`` names another tenant (or a ``link`` /
                ``link_error`` signature does), ``task`` is not a task of this app, or
                any error of `pgtasks.Task.apply_async` (nothing is written).
            UnknownTask: no task has this name.
            AlreadyQueued: an unfinished job holds the unique key; its ``job_id`` is
                -1 when that job is another tenant's (its id is not shown).
        """
        target = self._task(task)
        scoped = self._options(options)
        try:
            with tenant_context(self.tenant):
                result = target.apply_async(args, kwargs, **scoped)
        except AlreadyQueued as exc:
            raise self._hidden_holder(exc) from None
        return self._scoped(result)

    def send_task(
        self,
        name: str,
        args: Iterable[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Enqueue a job of the task registered as ``name`` (Celery's ``send_task``);
        see `apply_async`."""
        return self.apply_async(self._app.get_task(name), args, kwargs, **options)

    def delay(self, task: Task | str, *args: Any, **kwargs: Any) -> AsyncResult:
        """Enqueue ``task(*args, **kwargs)`` for the tenant with the task's default
        options; see `apply_async`."""
        return self.apply_async(task, args, kwargs)

    def bind(self, task: Task | str) -> TenantTask:
        """``task`` bound to the tenant: ``acme.bind(ocr).delay(42)``.

        Raises:
            ConfigurationError: ``task`` is not a task of this app.
            UnknownTask: no task has this name.
        """
        return TenantTask(self, self._task(task))

    async def apply_async_async(
        self,
        task: Task | str,
        args: Iterable[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        """`apply_async` for asyncio callers, as `pgtasks.Task.apply_async_async`.

        With ``connection=`` a ``psycopg.AsyncConnection`` the job is written on it in
        the event loop, in the caller's transaction, whose statement says it is the
        tenant's (``pgtasks.tenant`` set for it, and the transaction's own setting put
        back after it). Otherwise the enqueue runs in a worker thread.

        Raises:
            ConfigurationError, UnknownTask, AlreadyQueued: as `apply_async`
                (nothing is written on a refusal).
        """
        target = self._task(task)
        scoped = self._options(options)
        try:
            with tenant_context(self.tenant):
                result = await target.apply_async_async(args, kwargs, **scoped)
        except AlreadyQueued as exc:
            raise await self._hidden_holder_async(exc, options.get("connection")) from None
        return self._scoped(result)

    async def send_task_async(
        self,
        name: str,
        args: Iterable[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        """`send_task` for asyncio callers; see `apply_async_async`."""
        return await self.apply_async_async(self._app.get_task(name), args, kwargs, **options)

    async def delay_async(self, task: Task | str, *args: Any, **kwargs: Any) -> AsyncResult:
        """`delay` for asyncio callers (the enqueue runs in a worker thread); see
        `apply_async_async`."""
        return await self.apply_async_async(task, args, kwargs)

    async def _hidden_holder_async(self, exc: AlreadyQueued, connection: object) -> AlreadyQueued:
        """`_hidden_holder` from asyncio code: looked up on the caller's asyncio
        connection if there is one, else in a worker thread."""
        conn = async_connection(connection)
        if conn is None:
            return await asyncio.to_thread(self._hidden_holder, exc)
        try:
            await self.stores.jobs.get_async(id=exc.job_id, conn=conn)
        except JobNotFound:
            return AlreadyQueued(exc.unique_key, -1)
        return exc

    def _hidden_holder(self, exc: AlreadyQueued) -> AlreadyQueued:
        """``exc``, or the same error without the holder's id when it is another tenant's."""
        try:
            self.stores.jobs.get(id=exc.job_id)
        except JobNotFound:
            return AlreadyQueued(exc.unique_key, -1)
        return exc

    # -- one job -------------------------------------------------------------------

    def AsyncResult(self, id: int) -> AsyncResult:
        """A handle on one of the tenant's jobs, reading through this scope (its
        properties raise `JobNotFound` for another tenant's id).

        Raises:
            ConfigurationError: ``id`` is not an int in the bigint range.
        """
        return AsyncResult(id, self)

    def get_job(self, job_id: int) -> Job:
        """The tenant's job with this id (status, attempts, progress, ...).

        Raises:
            ConfigurationError: ``job_id`` is not an int in the bigint range.
            JobNotFound: the tenant has no job with this id (another tenant's id
                included, with the same message).
        """
        return jobadmin.get_job(self.stores.jobs, job_id)

    def explain(self, job_id: int) -> Explanation:
        """Why one of the tenant's jobs is where it is, as `pgtasks.App.explain`; the
        counts of jobs ahead span the queue (claims serve tenants in turn), and name
        no other tenant's job.

        Raises:
            ConfigurationError: ``job_id`` is not an int in the bigint range.
            JobNotFound: the tenant has no job with this id.
        """
        return jobadmin.explain(self.stores.jobs, job_id)

    def cancel(self, job_id: int, *, terminate: bool = False) -> bool:
        """Cancel one of the tenant's jobs, as `pgtasks.App.cancel`.

        Returns:
            True if the job was queued or running; False if it had already finished.

        Raises:
            ConfigurationError: a bad ``job_id`` or ``terminate``.
            JobNotFound: the tenant has no job with this id.
        """
        return self.cancel_job(job_id, terminate=terminate) != "finished"

    def cancel_job(
        self, job_id: int, *, terminate: bool = False
    ) -> Literal["cancelled", "requested", "finished"]:
        """Cancel one of the tenant's jobs and say what happened, as `pgtasks.App.cancel_job`.

        Returns:
            ``"cancelled"`` (was queued), ``"requested"`` (running; its worker is
            asked to stop) or ``"finished"`` (nothing changed).

        Raises:
            ConfigurationError: a bad ``job_id`` or ``terminate``.
            JobNotFound: the tenant has no job with this id.
        """
        return jobadmin.cancel_job(self.stores.jobs, job_id, terminate=terminate)

    def requeue(self, job_id: int, *, by: str = "api") -> bool:
        """Put one of the tenant's failed, cancelled or partially failed jobs back in
        the queue, as `pgtasks.App.requeue`.

        Args:
            job_id: the job.
            by: who asks, recorded in the job's history: text of 1 to 200 characters
                without NUL.

        Returns:
            True if requeued; False if the job is queued, running or succeeded.

        Raises:
            ConfigurationError: a bad ``job_id`` or ``by`` (nothing is written).
            AlreadyQueued: another unfinished job now holds the job's unique key
                (``job_id`` -1 when that job is another tenant's).
            JobNotFound: the tenant has no job with this id.
        """
        return jobadmin.requeue(self.stores.jobs, job_id, by=by)

    # -- many jobs -----------------------------------------------------------------

    def list_jobs(
        self,
        *,
        status: str | None = None,
        phase: str | None = None,
        queue: str | None = None,
        task_name: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """The tenant's jobs newest first, filtered; page with ``before_id`` = last id
        of the previous page.

        Args:
            status: a `pgtasks.JobStatus` value, or None for any.
            phase: instead of ``status``, a `pgtasks.Job.phase` (``"claimed"``,
                ``"running"`` for a started body, ...), as `pgtasks.App.list_jobs`.
            queue, task_name: exact names, or None for any.
            before_id: only jobs with a smaller id, or None.
            limit: most jobs returned, 1..`pgtasks.validation.MAX_PAGE_SIZE`.

        Raises:
            ConfigurationError: a filter or bound of the wrong type or out of range, or
                both ``status`` and ``phase``.
        """
        return jobadmin.list_jobs(
            self.stores.jobs,
            status=status,
            phase=phase,
            queue=queue,
            task_name=task_name,
            before_id=before_id,
            limit=limit,
        )

    def search(self, query: str, *, limit: int = 10, language: str | None = None) -> list[Any]:
        """Full-text search in the tenant's indexed documents and mails, best hits
        first (`pgtasks.App.search` with ``tenant`` fixed).

        Raises:
            ConfigurationError: no loaded plugin implements search, or bad arguments.
        """
        hook = self._app.plugin_manager.hook.pgtasks_search
        if not hook.get_hookimpls():
            raise ConfigurationError(
                "no search plugin is loaded; install pgtasks with the built-in pgtasks_index plugin "
                "or register one implementing pgtasks_search"
            )
        with tenant_context(self.tenant):
            hits = hook(app=self._app, query=query, tenant=self.tenant, limit=limit, language=language)
        return list(hits or [])


class TenantTask:
    """A task bound to a tenant (`TenantScope.bind`): its jobs are the tenant's.

    Attributes:
        scope: the tenant's `TenantScope`. task: the `pgtasks.Task`.
    """

    __slots__ = ("scope", "task")

    def __init__(self, scope: TenantScope, task: Task) -> None:
        self.scope = scope
        self.task = task

    def __repr__(self) -> str:
        return f"<TenantTask {self.task.name} tenant={self.scope.tenant!a}>"

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """Enqueue a job with these arguments for the tenant (see `TenantScope.apply_async`)."""
        return self.scope.apply_async(self.task, args, kwargs)

    def apply_async(
        self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> AsyncResult:
        """Enqueue a job for the tenant, with options (see `TenantScope.apply_async`)."""
        return self.scope.apply_async(self.task, args, kwargs, **options)

    async def delay_async(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """`delay` for asyncio callers (see `TenantScope.apply_async_async`)."""
        return await self.scope.apply_async_async(self.task, args, kwargs)

    async def apply_async_async(
        self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> AsyncResult:
        """`apply_async` for asyncio callers (see `TenantScope.apply_async_async`)."""
        return await self.scope.apply_async_async(self.task, args, kwargs, **options)

    def delay_many(self, items: Iterable[Any], **options: Any) -> list[AsyncResult]:
        """Enqueue many jobs for the tenant in one round trip, as `pgtasks.Task.delay_many`.

        Raises:
            ConfigurationError: ``tenant`` names another tenant, or any error of
                `pgtasks.Task.delay_many` (nothing is written).
        """
        scope = self.scope
        with tenant_context(scope.tenant):
            results = self.task.delay_many(items, **scope._options(options))
        return [scope._scoped(r) for r in results]
