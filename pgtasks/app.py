"""`App`: the task registry, the connection to PostgreSQL, and enqueueing."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, overload

import pluggy
import psycopg

from pgtasks import migrate as _migrate
from pgtasks.db import AnyConnection, Database, Stores
from pgtasks.errors import AlreadyQueued, ConfigurationError, JobNotFound, UnknownTask
from pgtasks.hookspecs import hookimpl
from pgtasks.plugins import call_isolated, make_plugin_manager
from pgtasks.records import Job
from pgtasks.result import AsyncResult
from pgtasks.serialization import dumps
from pgtasks.settings import Settings
from pgtasks.task import (
    Signature,
    Task,
    TaskOptions,
    attempts_allowed,
    check_countdown,
    check_eta,
    check_priority,
    check_queue,
    resolve_key,
)

if TYPE_CHECKING:
    from pgtasks.scheduler import Schedules, ScheduleSpec

__all__ = ["App"]

log = logging.getLogger("pgtasks")

_COPY_THRESHOLD = 64  # batches at least this big go through COPY when they can


# One call of a batch, encoded: (args JSON, kwargs JSON, headers JSON, lock key, unique key).
_CallFields = tuple[str, str, str, str | None, str | None]
# One call as the batch path takes it: (task, args, kwargs, enqueue options).
BatchCall = tuple[Task, Sequence[Any], Mapping[str, Any], Mapping[str, Any]]

# job_insert_many's array parameters that come from the validated options: (parameter, field).
_BATCH_OPTION_ARRAYS = (
    ("task_names", "task_name"), ("queues", "queue"), ("tenants", "tenant"), ("priorities", "priority"),
    ("max_attempts", "max_attempts"), ("etas", "eta"), ("countdowns", "countdown"),
    ("retry_on_worker_lost", "retry_on_worker_lost"),
)  # fmt: skip

_PLAIN_DEFAULTS = (
    ("countdown", None), ("eta", None), ("lock_key", None), ("trigger", "api"), ("schedule_name", None),
    ("scheduled_for", None), ("parent_id", None), ("correlation_id", None),
)  # fmt: skip


def _insert_query(params: Mapping[str, Any]) -> str:
    """The narrowest INSERT that can write these job parameters."""
    if params["unique_key"] is not None:
        return "job_insert_unique"
    if all(params.get(name, default) == default for name, default in _PLAIN_DEFAULTS):
        return "job_insert"
    return "job_insert_full"


def _options_key(task: Task, options: Mapping[str, Any]) -> Hashable:
    """What identifies a call's options for caching their validation in bulk."""
    try:
        return (id(task), frozenset(options.items()))
    except TypeError:  # an unhashable option value (headers): fall back to identity
        return (id(task), id(options))


def _check_key(label: str, key: Any) -> str | None:
    """A lock or unique key: None, or a non-empty string without NUL."""
    if key is not None and (not isinstance(key, str) or not key or "\x00" in key):
        raise ConfigurationError(f"{label} must be a non-empty string without NUL, got {key!r}")
    return key


class CoreExecution:
    """pgtasks' own, innermost implementation of `pgtasks_execute_job`."""

    @hookimpl(trylast=True)
    def pgtasks_execute_job(self, context: Any) -> Any:
        from pgtasks.execution import call_task

        return call_task(context)


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
        e.g. the full-text index tables of ``pgtasks_index``.

        Returns:
            Names of the migrations this call applied: ``NNNN_name`` for pgtasks'
            own, ``plugin:NNNN_name`` for plugins'.
        """
        from pgtasks.plugins import migrate_plugins

        applied = [f"{m.version:04d}_{m.name}" for m in _migrate.migrate(self.stores)]
        return applied + migrate_plugins(self.stores, self.plugin_manager)

    def close(self) -> None:
        """Close the connection pool (it reopens on next use)."""
        if self._stores is not None:
            self._stores.database.close()

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
                ``lock``, ``unique_key``, ``tenant``, ``retry_on_worker_lost``.

        Raises:
            ConfigurationError: an unknown option, a bad value, or a name already
                registered to another function.
        """

        def register(func: Callable[..., Any]) -> Task:
            return self.register_task(func, **options)

        return register(fn) if fn is not None else register

    def register_task(self, fn: Callable[..., Any], **options: Any) -> Task:
        """Register ``fn`` with options (what ``@app.task`` does)."""
        known = set(TaskOptions.__dataclass_fields__)
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigurationError(
                f"unknown task option(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}"
            )
        options.setdefault("name", f"{fn.__module__}.{fn.__qualname__}")
        if "autoretry_for" in options:
            options["autoretry_for"] = tuple(options["autoretry_for"])
        task = Task(self, fn, TaskOptions(**options))
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

    def _option_params(self, task: Task, options: Mapping[str, Any]) -> dict[str, Any]:
        """Validate the enqueue options that do not depend on the call's arguments.

        Bulk enqueue computes this once per distinct (task, options) pair.
        """
        opts = task.options
        queue = options.get("queue")
        if queue is None:
            queue = opts.queue
        check_queue(queue)
        priority = options.get("priority", opts.priority)
        check_priority(priority)
        tenant = options.get("tenant", opts.tenant)
        if not isinstance(tenant, str) or "\x00" in tenant:
            raise ConfigurationError(f"tenant must be a string without NUL, got {tenant!r}")
        countdown = options.get("countdown")
        eta = options.get("eta")
        if countdown is not None and eta is not None:
            raise ConfigurationError("give countdown or eta, not both")
        countdown = None if countdown is None else check_countdown(countdown)
        eta = None if eta is None else check_eta(eta)
        max_attempts = attempts_allowed(options.get("max_retries", opts.max_retries))
        headers = options.get("headers") or {}
        if not isinstance(headers, Mapping):
            raise ConfigurationError(f"headers must be a dict, got {type(headers).__name__}")
        for label in ("lock", "unique_key"):
            if label in options:
                _check_key(label, options[label])
        return {
            "task_name": task.name,
            "queue": queue,
            "tenant": tenant,
            "headers": dumps(dict(headers), "headers") if headers else "{}",
            "priority": priority,
            "max_attempts": max_attempts,
            "countdown": countdown,
            "eta": eta,
            "lock_key": options.get("lock"),
            "unique_key": options.get("unique_key"),
            "retry_on_worker_lost": opts.retry_on_worker_lost,
            "_headers": headers,
        }

    def _call_fields(
        self,
        task: Task,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: Mapping[str, Any],
        base: Mapping[str, Any],
        *,
        hooked: bool,
    ) -> _CallFields:
        """What one call adds to its validated options ``base``: the encoded arguments,
        the headers (a ``pgtasks_before_enqueue`` plugin may add to them) and the lock
        and unique keys (a task's key template is resolved against the arguments).

        ``base`` is `_option_params` of (task, options); ``hooked`` says whether a plugin
        implements ``pgtasks_before_enqueue`` (`_before_enqueue_hooked`; a batch asks once).

        Raises:
            ConfigurationError: a resolved key is not a non-empty string without NUL.
            SerializationError: an argument or header cannot round-trip exactly.
        """
        opts = task.options
        lock_key, unique_key, headers = base["lock_key"], base["unique_key"], base["headers"]
        if opts.lock is not None and "lock" not in options:
            lock_key = _check_key("lock", resolve_key(opts.lock, args, kwargs))
        if opts.unique_key is not None and "unique_key" not in options:
            unique_key = _check_key("unique_key", resolve_key(opts.unique_key, args, kwargs))
        if hooked:
            extra = dict(base["_headers"])
            resolved = {
                "queue": base["queue"],
                "priority": base["priority"],
                "tenant": base["tenant"],
                "lock": lock_key,
                "unique_key": unique_key,
                "countdown": base["countdown"],
                "eta": base["eta"],
            }
            self.plugin_manager.hook.pgtasks_before_enqueue(
                task_name=task.name, options=resolved, headers=extra
            )
            headers = dumps(extra, "headers")
        encoded_args = dumps(list(args), "args")
        return encoded_args, dumps(kwargs, "kwargs") if kwargs else "{}", headers, lock_key, unique_key

    def _before_enqueue_hooked(self) -> bool:
        """Whether a plugin implements ``pgtasks_before_enqueue``."""
        return bool(self.plugin_manager.hook.pgtasks_before_enqueue.get_hookimpls())

    @staticmethod
    def _check_connection(conn: object) -> AnyConnection | None:
        if conn is None:
            return None
        if not isinstance(conn, psycopg.Connection):
            raise ConfigurationError(
                f"connection must be a psycopg (sync) Connection, got {type(conn).__name__}"
            )
        return conn

    def enqueue(
        self, task: Task, args: tuple[Any, ...], kwargs: dict[str, Any], options: Mapping[str, Any]
    ) -> AsyncResult:
        """Write one job (what `Task.apply_async` calls); see there for arguments and errors."""
        conn = self._check_connection(options.get("connection"))
        base = self._option_params(task, options)
        params = dict(base)
        del params["_headers"]  # raw headers: _call_fields encodes them
        params["args"], params["kwargs"], params["headers"], params["lock_key"], params["unique_key"] = (
            self._call_fields(task, args, kwargs, options, base, hooked=self._before_enqueue_hooked())
        )
        params.update(
            trigger=options.get("_trigger", "api"),
            schedule_name=options.get("_schedule_name"),
            scheduled_for=options.get("_scheduled_for"),
            parent_id=options.get("_parent_id"),
            correlation_id=options.get("_correlation_id"),
        )
        return AsyncResult(self._insert(params, conn), self)

    def _insert(self, params: dict[str, Any], conn: AnyConnection | None) -> int:
        for _ in range(3):
            query = _insert_query(params)
            row = self.store.fetch_one(query, params, conn=conn)
            if row is not None:
                job_id = int(row["id"])
                call_isolated(
                    self.plugin_manager,
                    "pgtasks_after_enqueue",
                    task_name=params["task_name"],
                    job_ids=[job_id],
                    in_transaction=conn is not None,
                )
                return job_id
            holder = self.store.fetch_one("job_find_unique", {"unique_key": params["unique_key"]}, conn=conn)
            if holder is not None:
                raise AlreadyQueued(params["unique_key"], int(holder["id"]))
            # The holder finished between our insert and the lookup: try again.
        raise AlreadyQueued(params["unique_key"], -1)

    def bulk_apply(self, signatures: Iterable[Signature], *, connection: Any = None) -> list[AsyncResult]:
        """Enqueue many calls in one round trip (COPY for plain batches, one INSERT otherwise).

        Args:
            signatures: ``task.s(*args, **kwargs)`` values, optionally ``.set(...)``.
            connection: the caller's psycopg connection (jobs commit with it).

        Returns:
            One `AsyncResult` per written job. Jobs whose unique key is already held
            are skipped (use `Task.apply_async` to get `AlreadyQueued` per call).

        Raises:
            ConfigurationError, SerializationError: nothing is written.
        """
        calls = ((sig.task, sig.args, sig.kwargs, sig.options) for sig in signatures)
        return self.enqueue_batch(calls, connection=connection)

    def enqueue_batch(self, calls: Iterable[BatchCall], *, connection: Any = None) -> list[AsyncResult]:
        """Write many jobs in one transaction (what `bulk_apply` and `Task.delay_many` call).

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
        conn = self._check_connection(connection)
        # Validated options per (task, options): keyed by content, or by identity when an
        # option is unhashable; each entry keeps its options object alive, so an id in a
        # key cannot be reused by another call's options during the loop.
        bases: dict[Hashable, tuple[Mapping[str, Any], dict[str, Any]]] = {}
        hooked = self._before_enqueue_hooked()
        rows: list[_CallFields] = []
        row_bases: list[dict[str, Any]] = []  # each row's validated options (shared dicts)
        last: tuple[Any, Any, dict[str, Any]] | None = None  # (task, options, base) of the previous call
        for task, call_args, call_kwargs, options in calls:
            if last is not None and task is last[0] and options is last[1]:
                base = last[2]  # delay_many: every call shares one options mapping
            else:
                key = _options_key(task, options)
                if key not in bases:
                    bases[key] = (options, self._option_params(task, options))
                base = bases[key][1]
                last = (task, options, base)
            args = call_args if type(call_args) is tuple else tuple(call_args)
            kwargs = call_kwargs if type(call_kwargs) is dict else dict(call_kwargs)
            rows.append(self._call_fields(task, args, kwargs, options, base, hooked=hooked))
            row_bases.append(base)
        if not rows:
            return []
        used = [base for _, base in bases.values()]
        plain = all(b["countdown"] is None and b["eta"] is None for b in used) and all(
            call[4] is None for call in rows
        )
        queues = sorted({b["queue"] for b in used})
        with self.store.transaction(conn) as tx:
            if plain and len(rows) >= _COPY_THRESHOLD:
                reserved = self.store.fetch_tuples("job_ids_reserve", {"n": len(rows)}, conn=tx)
                ids: list[int] = reserved[0][0]
                self.store.copy_in(
                    "job_copy_in",
                    (
                        (job_id, b["task_name"], b["queue"], b["tenant"], a, k, h,
                         b["priority"], b["max_attempts"], lock, b["retry_on_worker_lost"])
                        for job_id, b, (a, k, h, lock, _) in zip(ids, row_bases, rows, strict=True)
                    ),
                    conn=tx,
                )  # fmt: skip
            else:
                params = {param: [b[field] for b in row_bases] for param, field in _BATCH_OPTION_ARRAYS}
                for index, param in enumerate(("args", "kwargs", "headers", "lock_keys", "unique_keys")):
                    params[param] = [call[index] for call in rows]
                ids = [int(r["id"]) for r in self.store.fetch_all("job_insert_many", params, conn=tx)]
            self.store.fetch_all("job_notify_queues", {"queues": queues}, conn=tx)
        names = {b["task_name"] for b in used}
        call_isolated(
            self.plugin_manager,
            "pgtasks_after_enqueue",
            task_name=names.pop() if len(names) == 1 else "*",
            job_ids=ids,
            in_transaction=conn is not None,
        )
        return [AsyncResult(i, self) for i in ids]

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

    # -- jobs ----------------------------------------------------------------------

    def AsyncResult(self, id: int) -> AsyncResult:
        """A handle on an existing job by id."""
        return AsyncResult(id, self)

    def get_job(self, job_id: int) -> Job:
        """The job record.

        Raises:
            JobNotFound: no job has this id.
        """
        row = self.store.fetch_one("job_get", {"id": job_id})
        if row is None:
            raise JobNotFound(job_id)
        return Job.from_row(row)

    def cancel(self, job_id: int, *, terminate: bool = False) -> bool:
        """Cancel a job: queued ones at once, running ones by request.

        Returns:
            True if the job was queued or running; False if it had already finished.

        Raises:
            JobNotFound: no job has this id.
        """
        error = dumps(
            {
                "type": "Cancelled",
                "code": "CANCELLED",
                "class": "permanent",
                "message": "cancelled before it started",
            }
        )
        row = self.store.fetch_one(
            "job_cancel", {"id": job_id, "now": None, "error": error, "terminate": terminate}
        )
        if row is not None:
            return True
        self.get_job(job_id)  # raises JobNotFound
        return False

    def requeue(self, job_id: int) -> bool:
        """Put a failed, cancelled or partially failed job back in the queue (attempts start over).

        Returns:
            True if requeued; False if the job is queued, running or succeeded.

        Raises:
            JobNotFound: no job has this id.
        """
        if self.store.fetch_one("job_requeue", {"id": job_id, "now": None}) is not None:
            return True
        self.get_job(job_id)
        return False

    def list_jobs(
        self,
        *,
        status: str | None = None,
        queue: str | None = None,
        task_name: str | None = None,
        tenant: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """Jobs newest first, filtered; page with ``before_id`` = last id of the previous page."""
        rows = self.store.fetch_all(
            "job_list",
            {
                "status": status,
                "queue": queue,
                "task_name": task_name,
                "tenant": tenant,
                "before_id": before_id,
                "limit": limit,
            },
        )
        return [Job.from_row(r) for r in rows]

    def queue_stats(self) -> list[dict[str, Any]]:
        """Job counts per queue and status: ``[{"queue", "status", "jobs", "oldest_run_at"}]``."""
        return self.store.fetch_all("queue_stats")

    def purge(
        self, *, older_than: float = 7 * 86400.0, status: str | None = None, batch: int = 10_000
    ) -> int:
        """Delete finished jobs that ended more than ``older_than`` seconds ago.

        Returns:
            How many jobs were deleted.
        """
        total = 0
        while True:
            row = self.store.fetch_one(
                "job_purge_finished",
                {"older_than": older_than, "status": status, "limit": batch, "now": None},
            )
            deleted = int(row["deleted"]) if row else 0
            total += deleted
            if deleted < batch:
                return total
