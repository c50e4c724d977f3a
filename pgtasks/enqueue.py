"""The enqueue path: validate a call's options, encode its arguments, write the job.

An enqueue goes one way down: `Task.apply_async` / `Task.delay_many` call the
app's `JobEnqueuer` (typed as `pgtasks.ports.Enqueuer`), which validates,
serialises (`pgtasks.serialization`) and writes through `pgtasks.db.JobStore`,
then tells plugins (``pgtasks_before_enqueue``, ``pgtasks_after_enqueue``). It
never climbs back into the application object.

The asyncio enqueue (`JobEnqueuer.enqueue_async`, what `Task.apply_async_async`
calls) builds the job by the same code (`JobEnqueuer.new_job`) and, given the
caller's ``psycopg.AsyncConnection``, writes it through the same named queries on
that connection, in the caller's transaction, without leaving the event loop.

Bulk enqueue validates each distinct (task, options) pair once and adds no
per-job work beyond encoding the arguments: plain batches of at least
`COPY_THRESHOLD` jobs are streamed through COPY, others go as one multi-row
INSERT of keyword arrays; either way one wake-up per queue, on the commit or just
after it (see `pgtasks.db.wakeups`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import psycopg

import pgtasks.flow as flow_control
from pgtasks.db import AnyAsyncConnection, AnyConnection, NewJob
from pgtasks.errors import AlreadyQueued, ConfigurationError, JobNotFound, SerializationError
from pgtasks.plugins import call_isolated
from pgtasks.result import AsyncResult
from pgtasks.serialization import dumps
from pgtasks.task import (
    attempts_allowed,
    check_countdown,
    check_eta,
    check_key,
    check_priority,
    check_queue,
    check_tenant,
    resolve_key,
)
from pgtasks.validation import check_choice, check_headers_size, check_job_id, short

if TYPE_CHECKING:
    import pluggy

    from pgtasks.ports import ResultSource
    from pgtasks.task import Signature, Task

__all__ = [
    "COPY_THRESHOLD",
    "MAX_PREREQUISITES",
    "BatchCall",
    "JobEnqueuer",
    "async_connection",
    "check_connection",
    "prerequisite_ids",
]

#: Batches of at least this many plain jobs go through COPY (fewer: one multi-row INSERT).
COPY_THRESHOLD: Final = 512

#: Most prerequisites one job may wait for (``depends_on``, a chord's header).
MAX_PREREQUISITES: Final = 10_000

# The options that make an enqueue write a waiting job or callbacks with it; the
# private ones are set by pgtasks.canvas and by links.
_LINK_OPTIONS: Final = ("depends_on", "link", "link_error", "_pass_results")
_ON_FAILURE: Final = ("cancel", "run")

# One call of a batch, encoded: (args JSON, kwargs JSON, headers JSON, lock key, unique key).
_CallFields = tuple[str, str, str, str | None, str | None]
#: One call as the batch path takes it: (task, args, kwargs, enqueue options).
BatchCall = tuple["Task", Sequence[Any], Mapping[str, Any], Mapping[str, Any]]


def check_connection(conn: object) -> AnyConnection | None:
    """The caller's connection for an enqueue inside their transaction, or None.

    Raises:
        ConfigurationError: ``conn`` is not a sync ``psycopg.Connection``.
    """
    if conn is None:
        return None
    if not isinstance(conn, psycopg.Connection):
        hint = " (await apply_async_async(..., connection=) takes one)" if async_connection(conn) else ""
        raise ConfigurationError(
            f"connection must be a psycopg (sync) Connection, got {type(conn).__name__}{hint}"
        )
    return conn


def async_connection(conn: object) -> AnyAsyncConnection | None:
    """``conn`` if it is a ``psycopg.AsyncConnection`` (the asyncio enqueue writes
    through it natively), else None."""
    return conn if isinstance(conn, psycopg.AsyncConnection) else None


def _has_links(options: Mapping[str, Any]) -> bool:
    """Whether an enqueue's options ask for prerequisites or callbacks."""
    return any(options.get(name) is not None for name in _LINK_OPTIONS)


def prerequisite_ids(depends_on: object) -> list[int]:
    """The job ids of a ``depends_on`` option, in order, each once.

    Args:
        depends_on: None, or an iterable of `AsyncResult` objects, job ids (int) and
            group results (anything with a ``results`` list of `AsyncResult`); a single
            `AsyncResult` is taken as a list of one.

    Raises:
        ConfigurationError: anything else, an id outside the bigint range, or more
            than `MAX_PREREQUISITES` of them.
    """
    if depends_on is None:
        return []
    if isinstance(depends_on, AsyncResult):
        depends_on = [depends_on]
    if isinstance(depends_on, str | bytes | Mapping) or not isinstance(depends_on, Iterable):
        raise ConfigurationError(
            f"depends_on must be a list of AsyncResult objects or job ids, got {short(depends_on)}"
        )
    ids: dict[int, None] = {}
    for item in depends_on:
        results = getattr(item, "results", None)
        if isinstance(item, AsyncResult):
            ids[item.id] = None
        elif isinstance(results, list) and all(isinstance(r, AsyncResult) for r in results):
            ids.update(dict.fromkeys(r.id for r in results))
        elif isinstance(item, int) and not isinstance(item, bool):
            ids[check_job_id("depends_on", item)] = None
        else:
            raise ConfigurationError(f"depends_on holds AsyncResult objects or job ids, got {short(item)}")
        if len(ids) > MAX_PREREQUISITES:
            raise ConfigurationError(f"depends_on names more than {MAX_PREREQUISITES} jobs")
    return list(ids)


def _callbacks(label: str, value: object) -> list[Signature]:
    """The signatures of a ``link`` or ``link_error`` option (one, or a list).

    Raises:
        ConfigurationError: anything but signatures.
    """
    from pgtasks.task import Signature

    if value is None:
        return []
    items = [value] if isinstance(value, Signature) else value
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        raise ConfigurationError(
            f"{label} must be a signature (task.s(...)) or a list of them, got {short(value)}"
        )
    sigs = list(items)
    for sig in sigs:
        if not isinstance(sig, Signature):
            raise ConfigurationError(f"{label} holds signatures (task.s(...)), got {short(sig)}")
    return sigs


def _check_callback_tenants(label: str, sigs: list[Signature], tenant: str) -> None:
    """Refuse callbacks (``link``, ``link_error``, and theirs in turn) whose ``tenant``
    option names another tenant than ``tenant``, their job's: a callback is written as
    its job's tenant's (it waits for the job, and a job waits only for jobs of its own
    tenant), so another tenant there would be silently replaced, as a tenant handle
    (`pgtasks.TenantScope`) refuses ``tenant=`` naming another.

    Raises:
        ConfigurationError: naming the option, the callback's task and both tenants
            (nothing is written).
    """
    for sig in sigs:
        if "tenant" in sig.options and sig.options["tenant"] != tenant:
            raise ConfigurationError(
                f"{label} callback of task {sig.task.name!r} names tenant {short(sig.options['tenant'])},"
                f" not its job's tenant {short(tenant)}; a callback is its job's tenant's"
                " (leave tenant= out of the signature)"
            )
        for option in ("link", "link_error"):
            _check_callback_tenants(option, _callbacks(option, sig.options.get(option)), tenant)


def _dependency_params(options: Mapping[str, Any]) -> tuple[list[int], str, str, str]:
    """(prerequisite ids, run_on, on_failure, pass_results) of an enqueue's options.

    Raises:
        ConfigurationError: a bad ``depends_on`` or ``on_prerequisite_failure``.
    """
    prerequisites = prerequisite_ids(options.get("depends_on"))
    on_failure = options.get("on_prerequisite_failure")
    on_failure = (
        "cancel" if on_failure is None else check_choice("on_prerequisite_failure", on_failure, _ON_FAILURE)
    )
    return prerequisites, options.get("_run_on", "success"), on_failure, options.get("_pass_results", "none")


def _callback_options(sig: Signature, job_id: int, tenant: str, run_on: str, tx: Any) -> dict[str, Any]:
    """The enqueue options of a ``link`` (run_on ``success``) or ``link_error``
    (``failure``) callback of job ``job_id``, written in transaction ``tx``."""
    return {
        **sig.options,
        "tenant": tenant,
        "depends_on": [job_id],
        "_run_on": run_on,
        "_pass_results": "none" if sig.immutable else "each",
        "_prepended": 0 if sig.immutable else 1,
        "connection": tx,
    }


def _options_key(task: Task, options: Mapping[str, Any]) -> Hashable:
    """What identifies a call's options for caching their validation in bulk."""
    try:
        return (id(task), frozenset(options.items()))
    except TypeError:  # an unhashable option value (headers): fall back to identity
        return (id(task), id(options))


def option_params(task: Task, options: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the enqueue options that do not depend on the call's arguments.

    Bulk enqueue computes this once per distinct (task, options) pair.

    Returns:
        ``task_name``, ``queue``, ``tenant``, ``headers`` (JSON text), ``priority``,
        ``max_attempts``, ``countdown`` (seconds or None), ``eta`` (aware datetime
        or None), ``lock_key``, ``unique_key`` (explicit keys or None),
        ``retry_on_worker_lost``, and ``_headers`` (the headers mapping as given).

    Raises:
        ConfigurationError: a value is out of range or of the wrong type, a queue,
            tenant, lock or unique key is longer than `pgtasks.task.MAX_KEY_BYTES`
            bytes in UTF-8, not valid UTF-8 or holds a control character or a mark that
            reorders text (`pgtasks.validation.check_name`), an ``eta`` outside the instants
            PostgreSQL and Python both hold, headers larger than
            `pgtasks.validation.MAX_HEADERS_BYTES` as JSON, or both ``countdown``
            and ``eta`` are given.
        SerializationError: a header cannot round-trip exactly.
    """
    opts = task.options
    queue = options.get("queue")
    if queue is None:
        queue = opts.queue
    check_queue(queue)
    priority = options.get("priority", opts.priority)
    check_priority(priority)
    tenant = check_tenant(options.get("tenant", opts.tenant))
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
            check_key(label, options[label])
    return {
        "task_name": task.name,
        "queue": queue,
        "tenant": tenant,
        "headers": check_headers_size("headers", dumps(dict(headers), "headers")) if headers else "{}",
        "priority": priority,
        "max_attempts": max_attempts,
        "countdown": countdown,
        "eta": eta,
        "lock_key": options.get("lock"),
        "unique_key": options.get("unique_key"),
        "retry_on_worker_lost": opts.retry_on_worker_lost,
        "_headers": headers,
    }


class JobEnqueuer:
    """Writes jobs for an app's tasks (implements `pgtasks.ports.Enqueuer`).

    Args:
        source: where the jobs go and what each `AsyncResult` reads through (an
            `pgtasks.ports.ResultSource`: its ``stores`` are opened on first write).
        plugin_manager: the app's plugin manager (``pgtasks_before_enqueue``,
            ``pgtasks_after_enqueue``).
    """

    def __init__(self, source: ResultSource, plugin_manager: pluggy.PluginManager) -> None:
        self.source = source
        self.plugin_manager = plugin_manager
        #: Rate limits per queue (``App.queue_rate_limit``): a job without a rate limit
        #: of its own, enqueued to one of these queues, gets its queue's.
        self.queue_rates: dict[str, flow_control.Rate] = {}

    def _before_enqueue_hooked(self) -> bool:
        """Whether a plugin implements ``pgtasks_before_enqueue``."""
        return bool(self.plugin_manager.hook.pgtasks_before_enqueue.get_hookimpls())

    def _call_fields(
        self,
        task: Task,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: Mapping[str, Any],
        base: Mapping[str, Any],
        *,
        hooked: bool,
        batch_index: int | None = None,
    ) -> _CallFields:
        """What one call adds to its validated options ``base``: the encoded arguments,
        the headers (a ``pgtasks_before_enqueue`` plugin may add to them) and the lock
        and unique keys (a task's key template is resolved against the arguments).

        ``base`` is `option_params` of (task, options); ``hooked`` says whether a plugin
        implements ``pgtasks_before_enqueue`` (`_before_enqueue_hooked`; a batch asks once);
        ``batch_index`` is the call's 0-based position in a bulk enqueue (None for one job),
        handed to the hook as the option of that name.

        Raises:
            ConfigurationError: the arguments do not fit the task's signature (unless
                ``typing=False``), a resolved key is not a non-empty string without
                control characters of at most `pgtasks.task.MAX_KEY_BYTES` bytes in
                UTF-8 (`pgtasks.validation.check_name`), or the
                headers exceed `pgtasks.validation.MAX_HEADERS_BYTES` as JSON.
            SerializationError: an argument or header cannot round-trip exactly.
        """
        prepended = options.get("_prepended", 0)  # results a dependency will put first
        task.check_call((None,) * prepended + args if prepended else args, kwargs)
        opts = task.options
        lock_key, unique_key, headers = base["lock_key"], base["unique_key"], base["headers"]
        if opts.lock is not None and "lock" not in options:
            lock_key = check_key("lock", resolve_key(opts.lock, args, kwargs))
        if opts.unique_key is not None and "unique_key" not in options:
            unique_key = check_key("unique_key", resolve_key(opts.unique_key, args, kwargs))
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
                "batch_index": batch_index,
            }
            self.plugin_manager.hook.pgtasks_before_enqueue(
                task_name=task.name, options=resolved, headers=extra
            )
            headers = check_headers_size("headers", dumps(extra, "headers"))
        encoded_args = dumps(list(args), "args")
        return encoded_args, dumps(kwargs, "kwargs") if kwargs else "{}", headers, lock_key, unique_key

    def new_job(
        self, task: Task, args: tuple[Any, ...], kwargs: dict[str, Any], options: Mapping[str, Any]
    ) -> NewJob:
        """The job one call writes, validated and encoded (no I/O but the
        ``pgtasks_before_enqueue`` hook): what `enqueue` and `enqueue_async` share.

        Raises:
            ConfigurationError: an invalid option value.
            SerializationError: an argument or header cannot round-trip exactly.
        """
        base = option_params(task, options)
        args_json, kwargs_json, headers_json, lock_key, unique_key = self._call_fields(
            task, args, kwargs, options, base, hooked=self._before_enqueue_hooked()
        )
        return NewJob(
            task_name=base["task_name"],
            queue=base["queue"],
            tenant=base["tenant"],
            args=args_json,
            kwargs=kwargs_json,
            headers=headers_json,
            priority=base["priority"],
            max_attempts=base["max_attempts"],
            retry_on_worker_lost=base["retry_on_worker_lost"],
            countdown=base["countdown"],
            eta=base["eta"],
            lock_key=lock_key,
            unique_key=unique_key,
            trigger=options.get("_trigger", "api"),
            schedule_name=options.get("_schedule_name"),
            scheduled_for=options.get("_scheduled_for"),
            parent_id=options.get("_parent_id"),
            correlation_id=options.get("_correlation_id"),
            flow=self.flow(task, args, kwargs, options, base),
        )

    def flow(
        self, task: Task, args: tuple[Any, ...], kwargs: Mapping[str, Any], options: Mapping[str, Any],
        base: Mapping[str, Any],
    ) -> flow_control.FlowFields | None:  # fmt: skip
        """The flow control of one call (`pgtasks.flow.flow_fields`), None for none; ``base``
        is `option_params` of (task, options). A task without any, called without any and
        to a queue without a rate limit, costs a few lookups.

        Raises:
            ConfigurationError: see `pgtasks.flow.flow_fields`.
        """
        queue_rate = self.queue_rates.get(base["queue"]) if self.queue_rates else None
        asked = bool(options) and not flow_control.FLOW_OPTIONS.isdisjoint(options)
        if not task.flow.active and queue_rate is None and not asked:
            return None
        return flow_control.flow_fields(
            task.flow, task_name=task.name, fn=task.fn, bind=task.options.bind, args=args, kwargs=kwargs,
            tenant=base["tenant"], options=options, queue=base["queue"], queue_rate=queue_rate,
        )  # fmt: skip

    def _enqueued(self, job: NewJob, job_id: int, *, in_transaction: bool) -> AsyncResult:
        """Tell plugins (``pgtasks_after_enqueue``) and return the new job's result."""
        call_isolated(
            self.plugin_manager,
            "pgtasks_after_enqueue",
            task_name=job.task_name,
            job_ids=[job_id],
            in_transaction=in_transaction,
        )
        return AsyncResult(job_id, self.source)

    def enqueue(
        self, task: Task, args: tuple[Any, ...], kwargs: dict[str, Any], options: Mapping[str, Any]
    ) -> AsyncResult:
        """Write one job (what `Task.apply_async` calls); see there for the options.

        Besides the public options, the scheduler passes ``_trigger``,
        ``_schedule_name``, ``_scheduled_for``, ``_parent_id`` and ``_correlation_id``.

        Raises:
            ConfigurationError: an invalid option value or connection.
            SerializationError: an argument or header cannot round-trip exactly.
            AlreadyQueued: an unfinished job holds the unique key.
            DatabaseError: PostgreSQL refused the write.
        """
        if _has_links(options):
            return self._enqueue_linked(task, args, kwargs, options)
        conn = check_connection(options.get("connection"))
        job = self.new_job(task, args, kwargs, options)
        stores = self.source.stores
        # A job in the caller's transaction is announced by its own statement, delivered
        # when that transaction commits; so is the first job after a quiet spell. One
        # that commits on its own amid others is announced after the commit, by the
        # sender: notifying commits would serialise the producers (pgtasks.db.wakeups).
        in_commit = conn is not None or stores.wakeups.leads()
        job_id = stores.jobs.insert(job, conn=conn, notify=in_commit)
        if not in_commit:
            stores.wakeups.wake(job.queue, job_id)
        return self._enqueued(job, job_id, in_transaction=conn is not None)

    async def enqueue_async(
        self, task: Task, args: tuple[Any, ...], kwargs: dict[str, Any], options: Mapping[str, Any]
    ) -> AsyncResult:
        """Write one job from asyncio code (what `Task.apply_async_async` calls).

        With ``connection=`` a ``psycopg.AsyncConnection``, the job is built as
        `enqueue` builds it (`new_job`) and written by the same statements on that
        connection, in the caller's transaction, in the event loop's thread: it commits
        or rolls back with the caller's writes, and its statement wakes the queue's
        workers when that transaction commits (as `enqueue` with a sync connection).
        Without a connection, or with a sync one, `enqueue` runs in a worker thread.

        Raises:
            ConfigurationError: an invalid option value or connection.
            SerializationError: an argument or header cannot round-trip exactly.
            AlreadyQueued: an unfinished job holds the unique key.
            DatabaseError: PostgreSQL refused the write.
        """
        conn = async_connection(options.get("connection"))
        if conn is None:
            return await asyncio.to_thread(self.enqueue, task, args, kwargs, options)
        if _has_links(options):
            return await self._enqueue_linked_async(task, args, kwargs, options, conn)
        job = self.new_job(task, args, kwargs, options)
        job_id = await self.source.stores.jobs.insert_async(job, conn=conn, notify=True)
        return self._enqueued(job, job_id, in_transaction=True)

    def _enqueue_linked(
        self, task: Task, args: tuple[Any, ...], kwargs: dict[str, Any], options: Mapping[str, Any]
    ) -> AsyncResult:
        """`enqueue` of a job with prerequisites (``depends_on``) or callbacks (``link``,
        ``link_error``): the job, its edges and its callbacks in one transaction (the
        caller's with ``connection=``).

        Raises:
            JobNotFound: a prerequisite is no job of the job's tenant (nothing written).
            ConfigurationError: a callback names another tenant than the job's
                (`_check_callback_tenants`), or as `enqueue` (nothing written).
            SerializationError, AlreadyQueued, DatabaseError: as `enqueue`.
        """
        conn = check_connection(options.get("connection"))
        prerequisites, run_on, on_failure, pass_results = _dependency_params(options)
        links = _callbacks("link", options.get("link"))
        errbacks = _callbacks("link_error", options.get("link_error"))
        job = self.new_job(task, args, kwargs, options)
        _check_callback_tenants("link", links, job.tenant)
        _check_callback_tenants("link_error", errbacks, job.tenant)
        stores = self.source.stores
        jobs = stores.jobs
        with stores.database.transaction(conn) as tx:
            if prerequisites:
                found = set(jobs.lock_prerequisites(ids=prerequisites, tenant=job.tenant, conn=tx))
                missing = [i for i in prerequisites if i not in found]
                if missing:
                    raise JobNotFound(missing[0])
                job_id = jobs.insert(job, conn=tx, notify=False)
                jobs.block(
                    id=job_id, prerequisites=prerequisites, run_on=run_on, on_failure=on_failure,
                    pass_results=pass_results, conn=tx,
                )  # fmt: skip
            else:
                job_id = jobs.insert(job, conn=tx, notify=True)  # wakes its queue on commit
            for kind, sigs in (("success", links), ("failure", errbacks)):
                for sig in sigs:
                    self.enqueue(
                        sig.task, tuple(sig.args), dict(sig.kwargs),
                        _callback_options(sig, job_id, job.tenant, kind, tx),
                    )  # fmt: skip
        return self._enqueued(job, job_id, in_transaction=conn is not None)

    async def _enqueue_linked_async(
        self,
        task: Task,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: Mapping[str, Any],
        conn: AnyAsyncConnection,
    ) -> AsyncResult:
        """`_enqueue_linked` on the caller's asyncio connection, in its transaction."""
        prerequisites, run_on, on_failure, pass_results = _dependency_params(options)
        links = _callbacks("link", options.get("link"))
        errbacks = _callbacks("link_error", options.get("link_error"))
        job = self.new_job(task, args, kwargs, options)
        _check_callback_tenants("link", links, job.tenant)
        _check_callback_tenants("link_error", errbacks, job.tenant)
        jobs = self.source.stores.jobs
        if prerequisites:
            found = set(await jobs.lock_prerequisites_async(ids=prerequisites, tenant=job.tenant, conn=conn))
            missing = [i for i in prerequisites if i not in found]
            if missing:
                raise JobNotFound(missing[0])
            job_id = await jobs.insert_async(job, conn=conn, notify=False)
            await jobs.block_async(
                id=job_id, prerequisites=prerequisites, run_on=run_on, on_failure=on_failure,
                pass_results=pass_results, conn=conn,
            )  # fmt: skip
        else:
            job_id = await jobs.insert_async(job, conn=conn, notify=True)
        for kind, sigs in (("success", links), ("failure", errbacks)):
            for sig in sigs:
                await self.enqueue_async(
                    sig.task, tuple(sig.args), dict(sig.kwargs),
                    _callback_options(sig, job_id, job.tenant, kind, conn),
                )  # fmt: skip
        return self._enqueued(job, job_id, in_transaction=True)

    def enqueue_batch(self, calls: Iterable[BatchCall], *, connection: Any = None) -> list[AsyncResult]:
        """Write many jobs in one transaction (what `Task.delay_many` and ``App.bulk_apply`` call).

        Args:
            calls: ``(task, args, kwargs, options)`` per job; options as `Task.apply_async`
                takes them, without ``connection``. Calls that share one options
                mapping (delay_many) are validated once.
            connection: the caller's psycopg connection (jobs commit with it), or
                None for a pooled one.

        Returns:
            One `AsyncResult` per written job, in order. Jobs whose unique key is
            already held are skipped.

        Raises:
            ConfigurationError, SerializationError: a call is refused; the message
                starts with its 0-based index in ``calls`` (``"item 3: ..."``), and
                nothing is written.
            DatabaseError: PostgreSQL refused the write (nothing is written).
        """
        conn = check_connection(connection)
        calls = calls if isinstance(calls, list) else list(calls)
        # delay_many shares one options mapping: look at each distinct one once.
        if any(_has_links(o) for o in {id(call[3]): call[3] for call in calls}.values()):
            return self._enqueue_batch_linked(calls, conn)
        # Validated options per (task, options): keyed by content, or by identity when an
        # option is unhashable; each entry keeps its options object alive, so an id in a
        # key cannot be reused by another call's options during the loop.
        bases: dict[Hashable, tuple[Mapping[str, Any], dict[str, Any]]] = {}
        hooked = self._before_enqueue_hooked()
        rows: list[_CallFields] = []
        flows: list[flow_control.FlowFields | None] = []  # each row's flow control (JobEnqueuer.flow)
        row_bases: list[dict[str, Any]] = []  # each row's validated options (shared dicts)
        last: tuple[Any, Any, dict[str, Any]] | None = None  # (task, options, base) of the previous call
        try:
            for task, call_args, call_kwargs, options in calls:
                if last is not None and task is last[0] and options is last[1]:
                    base = last[2]  # delay_many: every call shares one options mapping
                else:
                    key = _options_key(task, options)
                    if key not in bases:
                        bases[key] = (options, option_params(task, options))
                    base = bases[key][1]
                    last = (task, options, base)
                args = call_args if type(call_args) is tuple else tuple(call_args)
                kwargs = call_kwargs if type(call_kwargs) is dict else dict(call_kwargs)
                fields = self._call_fields(
                    task, args, kwargs, options, base, hooked=hooked, batch_index=len(rows)
                )
                flows.append(self.flow(task, args, kwargs, options, base))
                rows.append(fields)  # last: len(rows) is the index of the call being looked at
                row_bases.append(base)
        except (ConfigurationError, SerializationError) as exc:
            _name_item(exc, len(rows))
            raise
        if not rows:
            return []
        used = [base for _, base in bases.values()]
        flowing = any(f is not None for f in flows)
        plain = (
            all(b["countdown"] is None and b["eta"] is None for b in used)
            and all(call[4] is None for call in rows)
            and not flowing
        )
        queues = sorted({b["queue"] for b in used})
        stores = self.source.stores
        jobs = stores.jobs
        in_commit = conn is not None or stores.wakeups.leads()  # as in enqueue
        bulk = plain and len(rows) >= COPY_THRESHOLD

        def insert(tx: AnyConnection | None) -> list[int]:
            return jobs.insert_many(
                task_names=[b["task_name"] for b in row_bases],
                queues=[b["queue"] for b in row_bases],
                tenants=[b["tenant"] for b in row_bases],
                priorities=[b["priority"] for b in row_bases],
                max_attempts=[b["max_attempts"] for b in row_bases],
                etas=[b["eta"] for b in row_bases],
                countdowns=[b["countdown"] for b in row_bases],
                retry_on_worker_lost=[b["retry_on_worker_lost"] for b in row_bases],
                args=[call[0] for call in rows],
                kwargs=[call[1] for call in rows],
                headers=[call[2] for call in rows],
                lock_keys=[call[3] for call in rows],
                unique_keys=[call[4] for call in rows],
                flows=[f or flow_control.NO_FLOW for f in flows] if flowing else None,
                notify=in_commit,
                conn=tx,
            )

        if conn is None and not bulk:
            # One statement on a pooled connection: its own transaction and commit, with
            # the wake-up in it (no BEGIN, separate NOTIFY and COMMIT round trips).
            ids = insert(None)
        else:
            with stores.database.transaction(conn) as tx:
                # None under row-level security, which refuses COPY: the INSERT then.
                reserved = jobs.ids_reserve(n=len(rows), conn=tx) if bulk else None
                if reserved is None:
                    ids = insert(tx)
                else:
                    ids = reserved
                    jobs.copy_in(
                        rows=(
                            (job_id, b["task_name"], b["queue"], b["tenant"], a, k, h,
                             b["priority"], b["max_attempts"], lock, b["retry_on_worker_lost"])
                            for job_id, b, (a, k, h, lock, _) in zip(ids, row_bases, rows, strict=True)
                        ),
                        conn=tx,
                    )  # fmt: skip
                    if in_commit:
                        jobs.notify_queues(queues=queues, conn=tx)
        if not in_commit:
            for queue in queues:
                stores.wakeups.wake(queue)
        names = {b["task_name"] for b in used}
        call_isolated(
            self.plugin_manager,
            "pgtasks_after_enqueue",
            task_name=names.pop() if len(names) == 1 else "*",
            job_ids=ids,
            in_transaction=conn is not None,
        )
        source = self.source
        return [AsyncResult(i, source) for i in ids]

    def _enqueue_batch_linked(self, calls: list[BatchCall], conn: AnyConnection | None) -> list[AsyncResult]:
        """`enqueue_batch` of calls some of which have prerequisites or callbacks: each
        written as `enqueue` writes it, all in one transaction; a call whose unique key
        is held is skipped, as in a plain batch.

        Raises:
            JobNotFound: a prerequisite is no job of the job's tenant (nothing written).
            ConfigurationError, SerializationError, DatabaseError: nothing is written.
        """
        stores = self.source.stores
        results: list[AsyncResult] = []
        with stores.database.transaction(conn) as tx:
            for index, (task, call_args, call_kwargs, options) in enumerate(calls):
                try:
                    results.append(
                        self.enqueue(task, tuple(call_args), dict(call_kwargs), {**options, "connection": tx})
                    )
                except AlreadyQueued:
                    continue
                except (ConfigurationError, SerializationError) as exc:
                    _name_item(exc, index)
                    raise
        return results

    def bulk_apply(self, signatures: Iterable[Signature], *, connection: Any = None) -> list[AsyncResult]:
        """`enqueue_batch` of ``task.s(*args, **kwargs)`` signatures (optionally ``.set(...)``).

        Raises:
            ConfigurationError: an item is no signature, or as `enqueue_batch`.
            SerializationError: as `enqueue_batch`.
            DatabaseError: PostgreSQL refused the write (nothing is written).
        """
        from pgtasks.task import Signature

        calls: list[BatchCall] = []
        for index, sig in enumerate(signatures):
            if not isinstance(sig, Signature):
                got = short(sig)
                raise ConfigurationError(
                    f"item {index}: bulk_apply takes signatures (task.s(...)), got {got}"
                )
            calls.append((sig.task, sig.args, sig.kwargs, sig.options))
        return self.enqueue_batch(calls, connection=connection)


def _name_item(exc: ConfigurationError | SerializationError, index: int) -> None:
    """Put the 0-based ``index`` of the bulk call ``exc`` refused in front of its message
    (``"item 3: args[0]: ..."``), keeping its type and attributes (a `SerializationError`'s
    ``path`` and ``reason`` stay those of the value inside the call)."""
    exc.args = (f"item {index}: {exc}",)
