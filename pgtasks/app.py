"""`App`: the task registry, the connection to PostgreSQL, and enqueueing."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, overload

import pluggy

from pgtasks import jobadmin
from pgtasks import migrate as _migrate
from pgtasks.db import Database, Stores
from pgtasks.db.flow import FlowStore, TenantWeight
from pgtasks.enqueue import BatchCall, JobEnqueuer
from pgtasks.errors import ConfigurationError, UnknownTask
from pgtasks.execution import CoreExecution
from pgtasks.flow import check_weight, parse_rate
from pgtasks.plugins import make_plugin_manager
from pgtasks.records import Explanation, Job
from pgtasks.result import AsyncResult
from pgtasks.settings import Settings
from pgtasks.states import TERMINAL
from pgtasks.task import Signature, Task, TaskOptions, check_queue, check_tenant
from pgtasks.tenancy import TenantScope
from pgtasks.validation import (
    MAX_BATCH,
    check_choice,
    check_int,
    check_seconds,
    short,
)

if TYPE_CHECKING:
    from pgtasks.scheduler import Schedules, ScheduleSpec

__all__ = ["App"]

log = logging.getLogger("pgtasks")


class App:
    """A pgtasks application: tasks, plugins and the database they share.

    Args:
        name: the app's name (used in logs and worker ids).
        dsn: PostgreSQL DSN. Resolution order: this argument, ``PGTASKS_DSN``,
            ``DATABASE_URL``, then the embedded PostgreSQL (started on first use).
        settings: a ready `Settings` (then ``dsn`` must be None).
        load_entry_points: load plugins of the ``pgtasks`` entry-point group
            (default: from settings, True unless ``PGTASKS_DISABLE_PLUGIN_AUTOLOAD``).
        plugins: extra plugin objects or modules to register.

    Raises:
        ConfigurationError: conflicting arguments or a broken plugin.
    """

    #: What writes the app's jobs; a subclass may give its own `JobEnqueuer` (the
    #: Django integration's joins Django's transaction when no connection is given).
    enqueuer_class: type[JobEnqueuer] = JobEnqueuer

    def __init__(
        self,
        name: str = "pgtasks",
        dsn: str | None = None,
        *,
        settings: Settings | None = None,
        load_entry_points: bool | None = None,
        plugins: Sequence[object] = (),
    ) -> None:
        if settings is not None and dsn is not None:
            raise ConfigurationError("pass either dsn or settings, not both")
        self.name = name
        self.settings = settings or Settings.from_env(dsn)
        self.tasks: dict[str, Task] = {}
        self._stores: Stores | None = None
        self._store_lock = threading.Lock()
        autoload = self.settings.load_entry_points if load_entry_points is None else load_entry_points
        self.plugin_manager: pluggy.PluginManager = make_plugin_manager(load_entry_points=autoload)
        self.plugin_manager.register(CoreExecution(), name="pgtasks.core")
        self.enqueuer = self.enqueuer_class(self, self.plugin_manager)
        for plugin in plugins:
            self.plugin_manager.register(plugin)
        self.plugin_manager.hook.pgtasks_register_tasks.call_historic(kwargs={"app": self})

    def __repr__(self) -> str:
        return f"<App {self.name} dsn from {self.settings.dsn_source}>"

    # -- database ----------------------------------------------------------------

    @property
    def stores(self) -> Stores:
        """The data layer's typed stores over the app's `Database` (see `pgtasks.db`).

        Opened on first use; with no DSN set that starts the embedded server.
        """
        if self._stores is None:
            with self._store_lock:
                if self._stores is None:
                    database = Database(
                        self.settings.resolve_dsn(),
                        max_size=self.settings.pool_size,
                        prepare_threshold=self.settings.prepare_threshold,
                        listen=self.settings.listen,
                    )
                    self._stores = Stores.over(database)
        return self._stores

    @property
    def database(self) -> Database:
        """The app's `pgtasks.db.Database`: its pool, connections (``connection()``,
        ``connect()``), transactions (``transaction()``), ``dsn`` and clock (``now()``)."""
        return self.stores.database

    @property
    def store(self) -> Database:
        """The same `Database` as `database` (the name earlier versions used)."""
        return self.stores.database

    def migrate(self) -> list[str]:
        """Create or upgrade the ``pgtasks`` schema; idempotent and safe to run concurrently.

        Then applies the migrations of plugins (``pgtasks_add_migrations`` hook),
        e.g. the full-text index tables of ``pgtasks_index``. When row-level
        security mode is on (`pgtasks.isolation`), tables these migrations created
        join it.

        Returns:
            Names of the migrations this call applied: ``NNNN_name`` for pgtasks'
            own, ``plugin:NNNN_name`` for plugins'.
        """
        from pgtasks import isolation
        from pgtasks.plugins import migrate_plugins

        applied = [f"{m.version:04d}_{m.name}" for m in _migrate.migrate(self.stores)]
        applied += migrate_plugins(self.stores, self.plugin_manager)
        if applied:
            isolation.refresh(self.stores)  # new tables join row-level security mode if it is on
        return applied

    def close(self) -> None:
        """Send pending wake-ups and close the connections (they reopen on next use)."""
        if self._stores is not None:
            self._stores.close()

    def use_database(self, dsn: str) -> None:
        """Point the app at another database from now on (the testing kit points an
        app at a fresh database per test this way).

        The current connections are closed (pending wake-ups sent); the next use
        opens connections to ``dsn``. Other settings are kept.

        Args:
            dsn: libpq DSN or URI of the database.

        Raises:
            ConfigurationError: ``dsn`` is empty or refused as `Settings` refuses one
                (nothing changes then).
        """
        settings = replace(self.settings, dsn=dsn, dsn_source="argument")
        with self._store_lock:
            old, self._stores = self._stores, None
            self.settings = settings
        if old is not None:
            old.close()
        if "schedules" in self.__dict__:  # opened already: its code-defined schedules go there too
            self.schedules.resync()

    # -- tasks ---------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[..., Any], /) -> Task: ...

    @overload
    def task(self, fn: None = None, /, **options: Any) -> Callable[[Callable[..., Any]], Task]: ...

    def task(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        """Register a function as a task: ``@app.task`` or ``@app.task(queue="ocr", ...)``.

        Args:
            fn: the function (sync or ``async def``).
            options: `TaskOptions` fields: ``name``, ``queue``, ``priority``,
                ``max_retries``, ``autoretry_for``, ``retry_backoff``,
                ``retry_backoff_max``, ``retry_jitter``, ``default_retry_delay``,
                ``time_limit``, ``soft_time_limit``, ``bind``, ``acks_late``,
                ``lock``, ``unique_key``, ``tenant``, ``retry_on_worker_lost``,
                ``typing`` (False: do not check calls against the signature).

        Raises:
            ConfigurationError: an unknown option, a bad value, or a name already
                registered to another function.
        """

        def register(func: Callable[..., Any]) -> Task:
            return self.register_task(func, **options)

        return register(fn) if fn is not None else register

    def register_task(self, fn: Callable[..., Any], **options: Any) -> Task:
        """Register ``fn`` with options (what ``@app.task`` does).

        Raises:
            ConfigurationError: ``fn`` is not callable, an unknown option, a bad
                value, or a name already registered to another function.
        """
        if not callable(fn):
            raise ConfigurationError(f"a task must wrap a function, got {short(fn)}")
        known = set(TaskOptions.__dataclass_fields__)
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigurationError(
                f"unknown task option(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}"
            )
        options.setdefault("name", f"{fn.__module__}.{fn.__qualname__}")
        if "autoretry_for" in options:
            options["autoretry_for"] = tuple(options["autoretry_for"])
        task = Task(self, fn, TaskOptions(**options), enqueuer=self.enqueuer)
        existing = self.tasks.get(task.name)
        if existing is not None:
            raise ConfigurationError(
                f"task name {task.name!r} is already registered to "
                f"{existing.fn.__module__}.{existing.fn.__qualname__}"
            )
        self.tasks[task.name] = task
        return task

    def get_task(self, name: str) -> Task:
        """The task registered under ``name``.

        Raises:
            UnknownTask: none is.
        """
        try:
            return self.tasks[name]
        except KeyError:
            raise UnknownTask(name) from None

    def send_task(
        self,
        name: str,
        args: Iterable[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Enqueue a job of the task registered as ``name`` (Celery's ``app.send_task``):
        ``app.send_task("proj.add", args=(2, 3), countdown=10)``.

        Unlike Celery's, the name must be registered in this app (import the module that
        defines the task, as the worker does): an unknown name is refused at the call,
        not left for a worker to fail.

        Args:
            name: the task's registered name.
            args, kwargs: the call's arguments.
            options: `pgtasks.Task.apply_async`'s options (``countdown``, ``eta``,
                ``queue``, ``tenant``, ``connection``, ...).

        Raises:
            UnknownTask: no task is registered as ``name``.
            ConfigurationError, SerializationError, AlreadyQueued: as `Task.apply_async`.
        """
        return self.get_task(name).apply_async(args, kwargs, **options)

    async def send_task_async(
        self,
        name: str,
        args: Iterable[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        """`send_task` for asyncio callers; see `pgtasks.Task.apply_async_async`."""
        return await self.get_task(name).apply_async_async(args, kwargs, **options)

    # -- schedules -----------------------------------------------------------------

    @cached_property
    def schedules(self) -> Schedules:
        """The app's schedules: create, change, pause, resume, trigger, history (see `Schedules`)."""
        from pgtasks.scheduler import Schedules

        return Schedules(self)

    def periodic_task(self, cron: str | None, **options: Any) -> Callable[[Callable[..., Any]], Task]:
        """Register a task and a schedule for it: ``@app.periodic_task("0 2 * * *", timezone=...)``.

        Args:
            cron: five-field cron, an ``@`` alias, or None (runs only after its
                prerequisites, ``after=[...]``).
            options: schedule options (``name``, ``timezone``, ``args``, ``kwargs``,
                ``queue``, ``overlap``, ``misfire``, ``catch_up_limit``,
                ``max_retries``, ``after``, ...) and task options; see
                `pgtasks.scheduler.Schedules.periodic_task`.

        Raises:
            InvalidSchedule: a bad cron expression, time zone or policy (nothing is
                registered).
        """
        return self.schedules.periodic_task(cron, **options)

    def add_periodic_task(self, cron: str | None, task: Task | str, **options: Any) -> ScheduleSpec:
        """Define a schedule for a registered task (Celery's name); see `Schedules.add`.

        Raises:
            InvalidSchedule: a bad cron expression, time zone or policy.
            UnknownTask: ``task`` names no registered task.
        """
        return self.schedules.add(cron, task, **options)

    # -- enqueue -------------------------------------------------------------------

    def enqueue(
        self, task: Task, args: tuple[Any, ...], kwargs: dict[str, Any], options: Mapping[str, Any]
    ) -> AsyncResult:
        """Write one job; what `Task.apply_async` does (see there for the options and errors).

        Delegates to the app's `pgtasks.enqueue.JobEnqueuer` (``app.enqueuer``).
        """
        return self.enqueuer.enqueue(task, args, kwargs, options)

    async def enqueue_async(
        self, task: Task, args: tuple[Any, ...], kwargs: dict[str, Any], options: Mapping[str, Any]
    ) -> AsyncResult:
        """Write one job from asyncio code; what `Task.apply_async_async` does (see there).

        Delegates to the app's `pgtasks.enqueue.JobEnqueuer` (``app.enqueuer``).
        """
        return await self.enqueuer.enqueue_async(task, args, kwargs, options)

    def bulk_apply(self, signatures: Iterable[Signature], *, connection: Any = None) -> list[AsyncResult]:
        """Enqueue many calls in one round trip (COPY for plain batches, one INSERT otherwise).

        Args:
            signatures: ``task.s(*args, **kwargs)`` values, optionally ``.set(...)``.
            connection: the caller's psycopg connection (jobs commit with it).

        Returns:
            One `AsyncResult` per written job. Jobs whose unique key is already held
            are skipped (use `Task.apply_async` to get `AlreadyQueued` per call).

        Raises:
            ConfigurationError, SerializationError: an item is refused (or is no
                signature); the message starts with its 0-based index (``"item 3:
                ..."``), and nothing is written.
        """
        return self.enqueuer.bulk_apply(signatures, connection=connection)

    def enqueue_batch(self, calls: Iterable[BatchCall], *, connection: Any = None) -> list[AsyncResult]:
        """Write many jobs in one transaction (what `bulk_apply` and `Task.delay_many` do).

        Args:
            calls: ``(task, args, kwargs, options)`` per job; options as `Task.apply_async`
                takes them, without ``connection``. Calls that share one options
                mapping (delay_many) are validated once.
            connection: the caller's psycopg connection (jobs commit with it), or
                None for a pooled one.

        Returns:
            One `AsyncResult` per written job, in order; see `bulk_apply`.

        Raises:
            ConfigurationError, SerializationError: nothing is written.
            DatabaseError: PostgreSQL refused the write (nothing is written).
        """
        return self.enqueuer.enqueue_batch(calls, connection=connection)

    # -- search (delegated to a plugin) ---------------------------------------------

    def search(self, query: str, *, tenant: str, limit: int = 10, language: str | None = None) -> list[Any]:
        """Full-text search in ``tenant``'s indexed documents and mails, best hits first.

        The core knows nothing of indexes: this asks the ``pgtasks_search`` hook,
        which the built-in ``pgtasks_index`` plugin implements (see docs/plugins.md).

        Args:
            query: words in web-search syntax (``"a phrase"``, ``or``, ``-word``).
            tenant: whose entries to search.
            limit: most hits (>= 1).
            language: text-search configuration (e.g. ``"german"``); None for the
                plugin's default.

        Returns:
            The plugin's hits (``pgtasks_index.SearchHit``: kind, key, title,
            snippet, rank, match).

        Raises:
            ConfigurationError: no loaded plugin implements search, or bad arguments.
        """
        if not self.plugin_manager.hook.pgtasks_search.get_hookimpls():
            raise ConfigurationError(
                "no search plugin is loaded; install pgtasks with the built-in pgtasks_index plugin "
                "or register one implementing pgtasks_search"
            )
        hits = self.plugin_manager.hook.pgtasks_search(
            app=self, query=query, tenant=tenant, limit=limit, language=language
        )
        return list(hits or [])

    # -- tenants -------------------------------------------------------------------

    def tenant(self, tenant: str) -> TenantScope:
        """A handle whose every operation acts only on ``tenant``'s jobs: enqueue
        (``send_task``, ``apply_async``, ``delay``, ``bind(task)``), ``AsyncResult``,
        ``get_job``, ``cancel``, ``requeue``, ``list_jobs``, ``search``. Another
        tenant's job id behaves as an id no job has. See `pgtasks.TenantScope` and
        docs/security.md; the methods of the app itself stay the operator's view
        across tenants.

        Args:
            tenant: a non-empty string without NUL, at most
                `pgtasks.validation.MAX_KEY_BYTES` bytes in UTF-8.

        Raises:
            ConfigurationError: ``tenant`` is not such a string.
        """
        return TenantScope(self, tenant)

    # -- jobs ----------------------------------------------------------------------

    def AsyncResult(self, id: int) -> AsyncResult:
        """A handle on an existing job by id."""
        return AsyncResult(id, self)

    def get_job(self, job_id: int) -> Job:
        """The job record.

        Args:
            job_id: the job's id, an int in PostgreSQL's bigint range.

        Raises:
            ConfigurationError: ``job_id`` is not an int in the bigint range.
            JobNotFound: no job has this id.
        """
        return jobadmin.get_job(self.stores.jobs, job_id)

    def explain(self, job_id: int) -> Explanation:
        """Why the job is not running now, or where it is: "why is my job not running?".

        For a queued job, every reason that holds it back, from the database at its
        clock: not due until a time (countdown, eta, a retry's backoff), its lock key
        held by a running job, no live worker serving its queue, due jobs of its queue
        ahead of it (in all and of its tenant); ``ready`` when nothing does. For
        another job: claimed ahead by a worker, running (since when, where), finished.

        Args:
            job_id: the job's id, an int in PostgreSQL's bigint range.

        Returns:
            An `pgtasks.records.Explanation`; ``str()`` of it reads as a sentence.

        Raises:
            ConfigurationError: ``job_id`` is not an int in the bigint range.
            JobNotFound: no job has this id.
        """
        return jobadmin.explain(self.stores.jobs, job_id)

    def cancel(self, job_id: int, *, terminate: bool = False) -> bool:
        """Cancel a job: queued ones at once, running ones by request.

        Returns:
            True if the job was queued or running; False if it had already finished.

        Raises:
            JobNotFound: no job has this id.
        """
        return self.cancel_job(job_id, terminate=terminate) != "finished"

    def cancel_job(
        self, job_id: int, *, terminate: bool = False
    ) -> Literal["cancelled", "requested", "finished"]:
        """Cancel a job, as `cancel`, and say what happened to it.

        Returns:
            ``"cancelled"``: it was queued and is now cancelled; ``"requested"``: it is
            running and its worker is asked to stop (killed with ``terminate`` in the
            processes pool); ``"finished"``: it had already finished, nothing changed.

        Raises:
            JobNotFound: no job has this id.
        """
        return jobadmin.cancel_job(self.stores.jobs, job_id, terminate=terminate)

    def requeue(self, job_id: int, *, by: str = "api") -> bool:
        """Put a failed, cancelled or partially failed job back in the queue, by hand.

        The job starts a new round of attempts with a fresh budget (its
        ``max_attempts`` again, ``self.request.attempt`` from 1), while its history
        numbers attempts on across requeues and records the requeue: when, by whom,
        from which status (`pgtasks.Requeue`, in `Job.history`). Its error stays
        that of its last attempt until an attempt of the new round ends.

        Args:
            job_id: the job.
            by: who asks, recorded in the history: ``"api"`` by default;
                ``pgtasks jobs retry`` passes ``"cli:<os user>"``; any text of 1 to
                200 characters (without NUL) that names the caller, e.g.
                ``"admin:alice"``.

        Returns:
            True if requeued; False if the job is queued, running or succeeded.

        Raises:
            ConfigurationError: ``by`` is not a string of 1 to 200 characters without
                NUL (nothing is written).
            AlreadyQueued: another unfinished job now holds the job's unique key
                (nothing is written).
            JobNotFound: no job has this id.
        """
        return jobadmin.requeue(self.stores.jobs, job_id, by=by)

    def list_jobs(
        self,
        *,
        status: str | None = None,
        phase: str | None = None,
        queue: str | None = None,
        task_name: str | None = None,
        tenant: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """Jobs newest first, filtered; page with ``before_id`` = last id of the previous page.

        Args:
            status: a `pgtasks.JobStatus` value, or None for any.
            phase: instead of ``status``, a `Job.phase`: ``"claimed"`` (``running``, its
                body not started: claimed ahead), ``"running"`` (its body started) or
                another `pgtasks.JobStatus` value; None for any.
            queue, task_name, tenant: exact names (None for any); text of at most
                `pgtasks.validation.MAX_KEY_BYTES` bytes in UTF-8.
            before_id: only jobs with a smaller id (a bigint), or None.
            limit: most jobs returned, 1..`pgtasks.validation.MAX_PAGE_SIZE`.

        Raises:
            ConfigurationError: a filter or bound of the wrong type or out of range, or
                both ``status`` and ``phase``; the message names the parameter and the limit.
        """
        return jobadmin.list_jobs(
            self.stores.jobs, status=status, phase=phase, queue=queue, task_name=task_name, tenant=tenant,
            before_id=before_id, limit=limit,
        )  # fmt: skip

    def queue_stats(self) -> list[dict[str, Any]]:
        """Job counts per queue and status: ``[{"queue", "status", "jobs", "claimed",
        "oldest_run_at"}]``; claimed: of the ``running`` jobs, those held by a worker but
        not started (`Job.phase`)."""
        return self.stores.jobs.queue_stats()

    # -- flow control (docs/flow-control.md) ----------------------------------------

    def set_tenant_weight(self, tenant: str, weight: float | None, *, queue: str | None = None) -> None:
        """Give ``tenant`` a weight in the fair claim, at once for every worker: a tenant
        with due jobs gets a share of claims proportional to its weight, measured in job
        cost (``cost=``); a tenant without a weight weighs 1.

        Args:
            tenant: the tenant.
            weight: a number above 0, at most 1,000,000; None drops the weight set.
            queue: only in this queue; None for every queue without a weight of its own.

        Raises:
            ConfigurationError: a bad tenant, queue or weight.
        """
        check_tenant(tenant)
        where = "" if queue is None else check_queue(queue)
        store = FlowStore(self.stores.database)
        if weight is None:
            store.weight_delete(queue=where, tenant=tenant)
            return
        store.weight_set(queue=where, tenant=tenant, weight=check_weight(weight))

    def tenant_weights(self, tenant: str | None = None) -> list[TenantWeight]:
        """The weights set (only ``tenant``'s unless None), by queue (``""``: every
        queue) then tenant."""
        return FlowStore(self.stores.database).weight_list(
            tenant=None if tenant is None else check_tenant(tenant)
        )

    def queue_rate_limit(self, queue: str, rate: str | int | None) -> None:
        """Limit the starts of ``queue``'s jobs across the fleet, e.g. ``"50/s"``: every
        job enqueued to it through this app from now on without a rate limit of its own
        shares the queue's (rate key ``"queue=<queue>"``); None lifts it for later jobs.

        Raises:
            ConfigurationError: a bad queue or rate string.
        """
        check_queue(queue)
        rates = self.enqueuer.queue_rates
        if rate is None:
            rates.pop(queue, None)
        else:
            rates[queue] = parse_rate("rate", rate)

    def purge(
        self, *, older_than: float = 7 * 86400.0, status: str | None = None, batch: int = 10_000
    ) -> int:
        """Delete finished jobs that ended more than ``older_than`` seconds ago, ``batch`` at a time.

        Args:
            older_than: age in seconds, finite, 0..`pgtasks.validation.MAX_DELAY`.
            status: only jobs that ended so (a finished `pgtasks.JobStatus`), or None.
            batch: most jobs one statement deletes, 1..`pgtasks.validation.MAX_BATCH`.

        Returns:
            How many jobs were deleted.

        Raises:
            ConfigurationError: a parameter of the wrong type or out of range (nothing
                is deleted); the message names the parameter and the limit.
        """
        check_seconds("older_than", older_than)
        if status is not None:
            check_choice("status", status, [s.value for s in TERMINAL])
        check_int("batch", batch, 1, MAX_BATCH)
        jobs = self.stores.jobs
        total = 0
        while True:
            deleted = jobs.purge_finished(older_than=older_than, status=status, limit=batch)
            total += deleted
            if deleted < batch:
                return total
