"""`JobStore`: every statement on ``pgtasks.jobs``, one method per named query.

Parameters are keyword-only and typed; ``now`` is `Now` everywhere (None: the
database clock). Methods return records (`pgtasks.records.Job`), small frozen
results, plain values, or tuples on the worker's hot path (claims). This module
owns the translation of what PostgreSQL answers into pgtasks' errors: a unique
key already held (`AlreadyQueued`), a job that is not this worker's
(`NotOwner`), an id that names no job (`JobNotFound`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from pgtasks.db.database import AnyAsyncConnection, AnyConnection, Database, Now, Row, bigint_array_literal
from pgtasks.errors import AlreadyQueued, DatabaseError, JobNotFound, NotOwner
from pgtasks.records import Job
from pgtasks.serialization import dumps

__all__ = [
    "CancelRequest",
    "JobSituation",
    "JobStore",
    "NewJob",
    "Prerequisite",
    "QueueHealth",
    "ReapedJob",
    "StoredJobStatus",
    "StuckJob",
    "StuckJobs",
]

# Retries of an insert (or a requeue) whose unique key's holder finished between the
# write and the look-up.
_UNIQUE_ATTEMPTS = 3
_UNIQUE_VIOLATION = "23505"


@dataclass(slots=True)
class NewJob:
    """One job to insert, its values validated and encoded by the enqueue path.

    Not frozen: one is made per enqueue, and a frozen dataclass pays an
    ``object.__setattr__`` per field on creation.

    Attributes:
        task_name, queue, tenant: where it goes and for whom.
        args, kwargs, headers: JSON texts (`pgtasks.serialization.dumps`).
        priority: higher runs first. max_attempts: attempts allowed in all.
        retry_on_worker_lost: retry (True) or fail the job when its worker dies.
        countdown: seconds until due, or eta: the instant it is due (at most one).
        lock_key, unique_key: the job's keys, if any.
        trigger, schedule_name, scheduled_for, parent_id, correlation_id: what made it.
        flow: flow control (docs/flow-control.md), or None: (concurrency key,
            concurrency limit, rate key, rate limit, rate period in seconds, cost),
            each None but cost (a float > 0, default 1) when unused.
    """

    task_name: str
    queue: str
    tenant: str
    args: str
    kwargs: str
    headers: str
    priority: int
    max_attempts: int
    retry_on_worker_lost: bool
    countdown: float | None = None
    eta: datetime | None = None
    lock_key: str | None = None
    unique_key: str | None = None
    trigger: str = "api"
    schedule_name: str | None = None
    scheduled_for: datetime | None = None
    parent_id: int | None = None
    correlation_id: str | None = None
    flow: FlowFields | None = None

    def _is_plain(self) -> bool:
        """Whether the narrowest INSERT (no time, keys, links or flow control) can write it."""
        return (
            self.flow is None
            and self.countdown is None
            and self.eta is None
            and self.lock_key is None
            and self.trigger == "api"
            and self.schedule_name is None
            and self.scheduled_for is None
            and self.parent_id is None
            and self.correlation_id is None
        )


#: A job's flow control as `NewJob.flow` holds it: (concurrency key, concurrency limit,
#: rate key, rate limit, rate period in seconds, cost).
FlowFields = tuple[str | None, int | None, str | None, int | None, float | None, float]
NO_FLOW: FlowFields = (None, None, None, None, None, 1.0)


@dataclass(frozen=True, slots=True)
class StoredJobStatus:
    """What `AsyncResult` reads of a job: ``job_status``'s row."""

    status: str
    result: Any
    error: Any


@dataclass(frozen=True, slots=True)
class JobSituation:
    """Where a job stands and what holds it back: ``job_explain``'s row.

    Attributes:
        id, status, queue, tenant, task_name, priority, run_at, lock_key, worker_id,
            started_at, finished_at, attempt, max_attempts: the job's columns.
        now: the database clock the rest was judged at.
        lock_held: whether a running job holds its lock key (None: no such job).
        lock_holder: that job's id, or None (none, or in a scoped store another
            tenant's job: lock keys are shared by all tenants).
        live_workers: workers serving its queue whose lease has not run out and that
            are not stopping.
        ahead, ahead_in_tenant: due jobs of its queue that come before it, in all and
            of its tenant, each counted up to the limit asked (0 unless it is queued).
    """

    id: int
    status: str
    queue: str
    tenant: str
    task_name: str
    priority: int
    run_at: datetime
    lock_key: str | None
    worker_id: str | None
    started_at: datetime | None
    finished_at: datetime | None
    attempt: int
    max_attempts: int
    now: datetime
    lock_held: bool | None
    lock_holder: int | None
    # Flow control (docs/flow-control.md): the job's concurrency and rate keys and limits;
    # the running jobs of its concurrency key (key_running_ids: the first ten, of its own
    # tenant when scoped); when its full rate window ends (None: not full); its tenant's
    # weight and running jobs in its queue, the queue's running jobs, the weights of the
    # tenants that run some (with its own); whether other tenants have due jobs there.
    concurrency_key: str | None
    concurrency_limit: int | None
    rate_key: str | None
    rate_limit: int | None
    key_running: int
    key_running_ids: list[int]
    rate_opens_at: datetime | None
    tenant_weight: float
    tenant_running: int
    queue_running: int
    weights: float
    others_due: bool
    live_workers: int
    ahead: int
    ahead_in_tenant: int


@dataclass(frozen=True, slots=True)
class Prerequisite:
    """One prerequisite of a blocked job (``job_prerequisites``).

    Attributes:
        id: the prerequisite job. run_on: ``success`` or ``failure`` (what the
            dependent needs of it). outcome: the status it ended with, recorded when
            it finished (None: not yet). status: its status now (None: purged).
    """

    id: int
    run_on: str
    outcome: str | None
    status: str | None


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """A held job someone asked to cancel (``terminate``: stop it even while it runs)."""

    job_id: int
    terminate: bool


@dataclass(frozen=True, slots=True)
class ReapedJob:
    """A job of a lost worker the reaper recovered, and the status it now has."""

    job_id: int
    task_name: str
    status: str


@dataclass(frozen=True, slots=True)
class QueueHealth:
    """A queue with queued jobs that are due (``queue_health``).

    Attributes:
        queue: its name. due: how many queued jobs are due.
        oldest_run_at: the run-at of the oldest due job (aware datetime).
        oldest_wait_seconds: how long that job has been due, in seconds (>= 0).
        live_workers: workers serving the queue whose lease has not expired and that
            are not stopping.
    """

    queue: str
    due: int
    oldest_run_at: datetime
    oldest_wait_seconds: float
    live_workers: int


@dataclass(frozen=True, slots=True)
class StuckJob:
    """A running job whose worker's lease expired or whose worker row is gone.

    Attributes:
        id, queue, task_name, tenant: the job.
        worker_id: the worker that holds it.
        started_at: when its body started (None: claimed ahead, not started).
        heartbeat_at: the job's last heartbeat, if any.
        lease_expires_at: when its worker's lease ran out (None: the worker row is gone).
    """

    id: int
    queue: str
    task_name: str
    tenant: str
    worker_id: str | None
    started_at: datetime | None
    heartbeat_at: datetime | None
    lease_expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class StuckJobs:
    """``job_stuck_past_lease``: how many jobs are stuck, and the oldest of them."""

    total: int
    jobs: tuple[StuckJob, ...]


class JobStore:
    """Typed access to the jobs table (see the module docstring).

    Args:
        database: the `Database` that runs the statements.
        tenant: None (the operator's view: every tenant's jobs), or a tenant whose
            jobs alone the lookups and operator actions see: `get`, `status`,
            `cancel`, `requeue`, `find_unique` and `list` (`scoped` makes one). The
            tenant is a condition of each statement (``AND tenant = ...`` on the
            primary-key lookup), so another tenant's id reads as no job at all. The
            enqueue, claim, outcome and maintenance methods are the engine's and are
            not scoped. Every statement of a scoped store also runs in a
            transaction of its tenant (`Database.scoped`), which the row-level
            security policies read when that mode is on.
    """

    def __init__(self, database: Database, *, tenant: str | None = None) -> None:
        self.database = database
        self.tenant = tenant

    def scoped(self, tenant: str) -> JobStore:
        """A store over the same database whose lookups and operator actions see only
        ``tenant``'s jobs, each statement in a transaction of ``tenant`` (see the
        class docstring)."""
        return JobStore(self.database.scoped(tenant), tenant=tenant)

    # -- enqueue -------------------------------------------------------------------

    def insert(self, job: NewJob, *, conn: AnyConnection | None = None, notify: bool = True) -> int:
        """Insert one job with the narrowest statement that can write it; returns its id.

        ``job_insert`` for plain jobs, ``job_insert_full`` with times, keys or links,
        ``job_insert_unique`` with a unique key. With ``notify`` the statement wakes
        the queue's workers when it commits; without, the caller wakes them after the
        commit (`pgtasks.db.wakeups.WakeupSender`).

        Raises:
            AlreadyQueued: another unfinished job holds ``job.unique_key``.
            DatabaseError: PostgreSQL refused the row.
        """
        db = self.database
        return _run_steps(self._insert_steps(job, notify), lambda n, p: db.fetch_one(n, p, conn=conn))

    async def insert_async(self, job: NewJob, *, conn: AnyAsyncConnection, notify: bool = True) -> int:
        """`insert` on the caller's asyncio connection (the same statements, in its
        transaction, without leaving the event loop); returns the job's id.

        Raises:
            AlreadyQueued: another unfinished job holds ``job.unique_key``.
            DatabaseError: PostgreSQL refused the row.
        """
        db = self.database
        return await _run_steps_async(
            self._insert_steps(job, notify), lambda n, p: db.fetch_one_async(n, p, conn=conn)
        )

    def _insert_steps(self, job: NewJob, notify: bool) -> Generator[_Step, Row | None, int]:
        """The statements of `insert`, one at a time: each step yields (query name,
        parameters) and is sent the statement's first row (or None). `insert` and
        `insert_async` run the same steps, on a sync or an asyncio connection."""
        if job.unique_key is None:
            if job._is_plain():
                params: dict[str, Any] = {
                    "task_name": job.task_name, "queue": job.queue, "tenant": job.tenant, "args": job.args,
                    "kwargs": job.kwargs, "headers": job.headers, "priority": job.priority,
                    "max_attempts": job.max_attempts, "retry_on_worker_lost": job.retry_on_worker_lost,
                    "notify": notify,
                }  # fmt: skip
                row = yield "job_insert", params
            else:
                row = yield "job_insert_full", _full_params(job, notify)
            assert row is not None  # an INSERT without ON CONFLICT returns its row
            return int(row["id"])
        params = _full_params(job, notify)
        params["unique_key"] = job.unique_key
        for _ in range(_UNIQUE_ATTEMPTS):
            row = yield "job_insert_unique", params
            if row is not None:
                return int(row["id"])
            holder = yield "job_find_unique", {"unique_key": job.unique_key, "tenant": self.tenant}
            if holder is not None:
                raise AlreadyQueued(job.unique_key, int(holder["id"]))
            # The holder finished between the insert and the look-up: try again.
        raise AlreadyQueued(job.unique_key, -1)

    def find_unique(self, *, unique_key: str, conn: AnyConnection | None = None) -> int | None:
        """The id of the unfinished job holding ``unique_key``, or None (also when a
        scoped store's tenant does not own it)."""
        params = {"unique_key": unique_key, "tenant": self.tenant}
        row = self.database.fetch_one("job_find_unique", params, conn=conn)
        return None if row is None else int(row["id"])

    # -- dependencies (migration 0007) ---------------------------------------------

    def lock_prerequisites(
        self, *, ids: Sequence[int], tenant: str, conn: AnyConnection | None = None
    ) -> list[int]:
        """Lock the jobs of ``ids`` that exist and are ``tenant``'s until the transaction
        ends (``job_lock_prerequisites``), and those moved to the history (finished for
        good; not locked); returns their ids. Writes nothing, so a caller can refuse a
        missing id before any write of its transaction.
        """
        params = {"ids": bigint_array_literal(ids), "tenant": tenant}
        found = [int(r[0]) for r in self.database.fetch_tuples("job_lock_prerequisites", params, conn=conn)]
        if len(set(found)) < len(set(ids)):
            # A job the history service moved while this statement waited for its row
            # lock: gone from the hot table, and in the history after this statement's
            # snapshot. A second statement (a new snapshot) finds it there.
            found = [
                int(r[0]) for r in self.database.fetch_tuples("job_lock_prerequisites", params, conn=conn)
            ]
        return found

    def block(
        self,
        *,
        id: int,
        prerequisites: Sequence[int],
        run_on: str,
        on_failure: str,
        pass_results: str,
        conn: AnyConnection | None = None,
    ) -> str:
        """Make job ``id``, just inserted in this transaction, wait for ``prerequisites``
        (locked by `lock_prerequisites`, in order); returns its status afterwards:
        ``blocked``, ``queued`` (all had succeeded already) or ``cancelled``.

        Args:
            run_on: ``"success"`` (each must succeed) or ``"failure"`` (each must fail:
                a link_error callback).
            on_failure: ``"cancel"`` (an unmet prerequisite cancels the job) or
                ``"run"`` (it runs once all have finished, however they ended).
            pass_results: ``"none"``, ``"each"`` (each prerequisite's result, or id for
                ``run_on="failure"``, prepended to the args in order) or ``"list"``
                (one list of them prepended).
        """
        params = {
            "id": id, "prerequisites": bigint_array_literal(prerequisites), "run_on": run_on,
            "on_failure": on_failure, "pass_results": pass_results,
        }  # fmt: skip
        row = self.database.fetch_one("job_block", params, conn=conn)
        assert row is not None
        return str(row["status"])

    async def lock_prerequisites_async(
        self, *, ids: Sequence[int], tenant: str, conn: AnyAsyncConnection
    ) -> list[int]:
        """`lock_prerequisites` on the caller's asyncio connection, in its transaction."""
        params = {"ids": bigint_array_literal(ids), "tenant": tenant}
        rows = await self.database.fetch_all_async("job_lock_prerequisites", params, conn=conn)
        if len({r["id"] for r in rows}) < len(set(ids)):  # moved meanwhile: see `lock_prerequisites`
            rows = await self.database.fetch_all_async("job_lock_prerequisites", params, conn=conn)
        return [int(r["id"]) for r in rows]

    async def block_async(
        self,
        *,
        id: int,
        prerequisites: Sequence[int],
        run_on: str,
        on_failure: str,
        pass_results: str,
        conn: AnyAsyncConnection,
    ) -> str:
        """`block` on the caller's asyncio connection, in its transaction."""
        params = {
            "id": id, "prerequisites": bigint_array_literal(prerequisites), "run_on": run_on,
            "on_failure": on_failure, "pass_results": pass_results,
        }  # fmt: skip
        row = await self.database.fetch_one_async("job_block", params, conn=conn)
        assert row is not None
        return str(row["status"])

    def prerequisites(self, *, id: int) -> list[Prerequisite]:
        """The prerequisites a blocked job waits for or has seen finish, in order (none
        once it left ``blocked``); in a scoped store only for its tenant's job."""
        rows = self.database.fetch_all("job_prerequisites", {"id": id, "tenant": self.tenant})
        return [Prerequisite(int(r["id"]), r["run_on"], r["outcome"], r["status"]) for r in rows]

    def insert_many(
        self,
        *,
        task_names: Sequence[str],
        queues: Sequence[str],
        tenants: Sequence[str],
        args: Sequence[str],
        kwargs: Sequence[str],
        headers: Sequence[str],
        priorities: Sequence[int],
        max_attempts: Sequence[int],
        retry_on_worker_lost: Sequence[bool],
        countdowns: Sequence[float | None],
        etas: Sequence[datetime | None],
        lock_keys: Sequence[str | None],
        unique_keys: Sequence[str | None],
        flows: Sequence[FlowFields] | None = None,
        notify: bool = False,
        conn: AnyConnection | None = None,
    ) -> list[int]:
        """Insert one job per position of the equally long arrays; returns the ids written.

        ``flows``: each job's `NewJob.flow` (`NO_FLOW` for none), or None when no job
        has flow control. Rows whose unique key is already held are skipped (no id for them).
        With ``notify``, the workers of the written jobs' queues are woken when ``conn``
        commits (with ``conn`` None: when the statement does).
        """
        fragment = orjson.Fragment
        jobs: list[list[Any]] = [
            [t, q, te, fragment(a), fragment(k), fragment(h), p, m, None if e is None else e.isoformat(),
             c, lk, uk, r]
            for t, q, te, a, k, h, p, m, e, c, lk, uk, r in zip(
                task_names, queues, tenants, args, kwargs, headers, priorities, max_attempts, etas,
                countdowns, lock_keys, unique_keys, retry_on_worker_lost, strict=True,
            )
        ]  # fmt: skip
        if flows is not None:
            for job, flow in zip(jobs, flows, strict=True):
                job.extend(flow)
        params = {"jobs": orjson.dumps(jobs).decode(), "notify": notify}
        return [int(r["id"]) for r in self.database.fetch_all("job_insert_many", params, conn=conn)]

    def ids_reserve(self, *, n: int, conn: AnyConnection | None = None) -> list[int] | None:
        """Take ``n`` ids from the jobs' sequence (for `copy_in`); None, taking none, when
        row-level security applies to the current role (PostgreSQL refuses COPY then:
        use `insert_many`)."""
        rows = self.database.fetch_tuples("job_ids_reserve", {"n": n}, conn=conn)
        ids: list[int] | None = rows[0][0]
        return ids

    def copy_in(self, *, rows: Iterable[Sequence[Any]], conn: AnyConnection | None = None) -> None:
        """Stream plain jobs through COPY: per row (id, task_name, queue, tenant, args,
        kwargs, headers, priority, max_attempts, lock_key, retry_on_worker_lost)."""
        self.database.copy_in("job_copy_in", rows, conn=conn)

    def notify_queues(self, *, queues: Sequence[str], conn: AnyConnection | None = None) -> None:
        """Send one wake-up notification per queue (delivered when ``conn`` commits)."""
        self.database.fetch_all("job_notify_queues", {"queues": list(queues)}, conn=conn)

    def wake(self, *, payloads: Sequence[str], conn: AnyConnection) -> None:
        """Send wake-ups for committed jobs (``queue:id`` or a bare queue per payload),
        as a transaction of their own on ``conn`` (an autocommit connection), whose
        commit does not wait for the WAL flush (see `pgtasks.db.wakeups`)."""
        self.database.fetch_all("job_wake", {"payloads": list(payloads)}, conn=conn)

    # -- reading -------------------------------------------------------------------

    def get(self, *, id: int, conn: AnyConnection | None = None) -> Job:
        """The job with this id.

        Raises:
            JobNotFound: no job has this id (in a scoped store: none of its tenant's).
        """
        row = self.database.fetch_one("job_get", {"id": id, "tenant": self.tenant}, conn=conn)
        if row is None:
            raise JobNotFound(id)
        return Job.from_row(row)

    async def get_async(self, *, id: int, conn: AnyAsyncConnection) -> Job:
        """`get` on an asyncio connection (the caller's, or one of `Database.connect_async`).

        Raises:
            JobNotFound: no job has this id (in a scoped store: none of its tenant's).
        """
        row = await self.database.fetch_one_async("job_get", {"id": id, "tenant": self.tenant}, conn=conn)
        if row is None:
            raise JobNotFound(id)
        return Job.from_row(row)

    def status(self, *, id: int, conn: AnyConnection | None = None) -> StoredJobStatus | None:
        """The job's status, result and error, or None if no job has this id (in a
        scoped store: none of its tenant's)."""
        return _stored_status(
            self.database.fetch_one("job_status", {"id": id, "tenant": self.tenant}, conn=conn)
        )

    async def status_async(self, *, id: int, conn: AnyAsyncConnection) -> StoredJobStatus | None:
        """`status` on an asyncio connection (the caller's, or one of `Database.connect_async`)."""
        params = {"id": id, "tenant": self.tenant}
        return _stored_status(await self.database.fetch_one_async("job_status", params, conn=conn))

    def situation(self, *, id: int, ahead_limit: int, now: Now = None) -> JobSituation | None:
        """Where the job stands and what holds it back (`JobSituation`), or None if no
        job has this id (in a scoped store: none of its tenant's)."""
        params = {"id": id, "tenant": self.tenant, "ahead_limit": ahead_limit, "now": now}
        row = self.database.fetch_one("job_explain", params)
        return None if row is None else JobSituation(**row)

    def queue_stats(self) -> list[Row]:
        """Job counts per queue and status: ``[{"queue", "status", "jobs", "claimed",
        "oldest_run_at"}]`` (claimed: of the ``running`` jobs, those not started)."""
        return self.database.fetch_all("queue_stats")

    def queue_health(self, *, queues: Sequence[str] | None = None, now: Now = None) -> list[QueueHealth]:
        """Every queue with queued jobs due at ``now``, with its live workers (``queue_health``).

        Args:
            queues: only these queues; None for every queue.
            now: the instant to judge at; None for the database clock.

        Returns:
            One `QueueHealth` per queue that has due jobs, by queue name.
        """
        params = {"queues": None if queues is None else list(queues), "now": now}
        return [
            QueueHealth(
                queue=str(r["queue"]),
                due=int(r["due"]),
                oldest_run_at=r["oldest_run_at"],
                oldest_wait_seconds=max(0.0, float(r["oldest_wait_seconds"])),
                live_workers=int(r["live_workers"]),
            )
            for r in self.database.fetch_all("queue_health", params)
        ]

    def stuck_past_lease(
        self, *, queues: Sequence[str] | None = None, limit: int = 20, now: Now = None
    ) -> StuckJobs:
        """Running jobs whose worker's lease expired at ``now`` or whose worker row is gone.

        Args:
            queues: only jobs of these queues; None for every queue.
            limit: most jobs listed (the oldest ids); the total counts them all.
            now: the instant to judge at; None for the database clock.
        """
        params = {"queues": None if queues is None else list(queues), "limit": limit, "now": now}
        rows = self.database.fetch_all("job_stuck_past_lease", params)
        jobs = tuple(
            StuckJob(
                id=int(r["id"]),
                queue=str(r["queue"]),
                task_name=str(r["task_name"]),
                tenant=str(r["tenant"]),
                worker_id=r["worker_id"],
                started_at=r["started_at"],
                heartbeat_at=r["heartbeat_at"],
                lease_expires_at=r["lease_expires_at"],
            )
            for r in rows
        )
        return StuckJobs(total=int(rows[0]["total"]) if rows else 0, jobs=jobs)

    # -- claiming (the worker's hot path: tuples, parameters sent as literals) -------

    def claim_batch(
        self,
        *,
        queues: str,
        worker_id: str,
        limit: int,
        start_tenant: str = "",
        max_tenants: int,
        fair: bool,
        tasks: str | None = None,
        now: Now = None,
    ) -> list[tuple[Any, ...]]:
        """Claim up to ``limit`` due jobs of ``queues`` (a ``text[]`` literal,
        `text_array_literal`) for ``worker_id``: rows of `pgtasks.context.CLAIM_COLUMNS`
        followed by ``due`` (run-at, Unix seconds) and ``tenant_share``. ``tasks``: only
        jobs of these task names (a ``text[]`` literal), None for every task.

        Raises:
            DatabaseError: SQLSTATE 23505 when another worker took a job with the
                same lock key at the same moment (claim again).
        """
        params = {
            "queues": queues, "start_tenant": start_tenant, "max_tenants": max_tenants, "limit": limit,
            "now": now, "fair": fair, "worker_id": worker_id, "tasks": tasks,
        }  # fmt: skip
        return self.database.fetch_tuples("job_claim_batch", params, lenient=True)

    def claim_ids(
        self, *, ids: Iterable[int], queues: str, worker_id: str, tasks: str | None = None, now: Now = None
    ) -> list[tuple[Any, ...]]:
        """Claim the named jobs that are due, in ``queues`` (a ``text[]`` literal), of
        ``tasks`` (as for `claim_batch`): rows of `pgtasks.context.CLAIM_COLUMNS`, then ``due``.

        Raises:
            DatabaseError: SQLSTATE 23505, as for `claim_batch`.
        """
        params = {
            "ids": bigint_array_literal(ids), "queues": queues, "tasks": tasks, "now": now,
            "worker_id": worker_id,
        }  # fmt: skip
        return self.database.fetch_tuples("job_claim_ids", params, lenient=True)

    def claim_suspects(
        self,
        *,
        queues: str,
        limit: int,
        start_tenant: str = "",
        max_tenants: int,
        tasks: str | None = None,
        now: Now = None,
    ) -> list[tuple[int, str | None]]:
        """After a failed claim: (id, lock key) of the jobs `claim_batch` with these
        parameters may have tried to take, in claim order per tenant (see the query).
        """
        params = {
            "queues": queues, "limit": limit, "start_tenant": start_tenant, "max_tenants": max_tenants,
            "tasks": tasks, "now": now,
        }  # fmt: skip
        return [(int(r[0]), r[1]) for r in self.database.fetch_tuples("job_claim_suspects", params)]

    def claim_probe(self, *, ids: Sequence[int], worker_id: str) -> None:
        """Try the claim's write on the queued jobs ``ids`` and roll it back: nothing
        changes, but a job the claim cannot take fails it here too.

        Raises:
            DatabaseError: PostgreSQL refused the write (SQLSTATE 23505: two of the
                jobs share a lock key, or one's key is running elsewhere).
        """
        params = {"ids": bigint_array_literal(ids), "worker_id": worker_id}
        with self.database.dry_run() as tx:
            self.database.execute("job_claim_probe", params, conn=tx)

    def fail_unclaimable(self, *, id: int, error: Mapping[str, Any], now: Now = None) -> str | None:
        """End a queued job that no claim can take as ``failed`` with ``error``, attempt
        not used; returns its task name, or None if it was no longer queued.

        Raises:
            SerializationError: the error record cannot be stored.
        """
        params = {"id": id, "error": dumps(dict(error), "error"), "now": now}
        row = self.database.fetch_one("job_fail_unclaimable", params)
        return None if row is None else str(row["task_name"])

    def next_run_at(
        self, *, queues: str, max_groups: int, tasks: str | None = None, now: Now = None
    ) -> tuple[datetime | None, datetime]:
        """(earliest run-at of a queued job in ``queues`` of ``tasks`` (as for
        `claim_batch`) or None, the database's now)."""
        run_at, db_now, _ = self.next_wake(queues=queues, max_groups=max_groups, tasks=tasks, now=now)
        return run_at, db_now

    def next_wake(
        self, *, queues: str, max_groups: int, tasks: str | None = None, now: Now = None
    ) -> tuple[datetime | None, datetime, datetime | None]:
        """`next_run_at`, and the earliest end of a full rate window that queued jobs of
        ``queues`` wait on (None: none): (run-at, now, opens-at)."""
        row = self.database.fetch_one(
            "job_next_run_at", {"queues": queues, "tasks": tasks, "now": now, "max_groups": max_groups}
        )
        assert row is not None  # an aggregate: always one row
        return row["run_at"], row["now"], row["opens_at"]

    # -- outcomes (only the completer writes them) --------------------------------------

    def succeed_batch(
        self,
        *,
        worker_id: str,
        ids: Sequence[int],
        results_json: Sequence[str],
        spans: Sequence[int] = (),
        base: float | None = None,
        now: Now = None,
        conn: AnyConnection | None = None,
        attempts: Sequence[int | None] | None = None,
    ) -> list[int]:
        """Mark the jobs ``worker_id`` still runs succeeded with their results (JSON
        texts, in the order of ``ids``); returns the ids it completed.

        ``attempts``: for each job, the attempt the result is of (None: any): a job
        the worker holds at another attempt is left alone, so a write repeated after
        its reply was lost cannot complete a newer attempt.

        ``spans``: for each job in turn, when its body started and when it ended, in
        microseconds after ``base`` (Unix seconds, the worker's clock): its
        ``started_at`` (unless already written) and ``finished_at``; without them, the
        database clock. The ids go as one array
        literal and the results as one JSON array: psycopg adapts a Python list element
        by element, a string in one step. ``conn``: write in the caller's transaction
        (tests that hold the write open).
        """
        params = {
            "ids": bigint_array_literal(ids),
            "results": "[" + ",".join(results_json) + "]",
            "spans": "{" + ",".join(map(str, spans)) + "}",
            "base": base,
            "worker_id": worker_id,
            "now": now,
            "attempts": list(attempts) if attempts is not None else [None] * len(ids),
        }
        return [r[0] for r in self.database.fetch_tuples("job_succeed_batch", params, conn=conn)]

    def finish(
        self,
        *,
        id: int,
        worker_id: str,
        status: str,
        error: Mapping[str, Any],
        result_json: str | None = None,
        started: float | None = None,
        attempt: int | None = None,
        now: Now = None,
    ) -> bool:
        """End a running job ``worker_id`` holds as ``failed``, ``cancelled`` or
        ``partial_failure``; False if it no longer held it. ``started``: when its body
        started (Unix seconds), None if it never did. ``attempt``: the attempt the
        outcome is of; the job must still be in it (None: any).

        Raises:
            SerializationError: the error record cannot be stored.
        """
        params = {
            "id": id, "worker_id": worker_id, "status": status, "error": dumps(dict(error), "error"),
            "result": result_json, "started": started, "attempt": attempt, "now": now,
        }  # fmt: skip
        return self.database.fetch_one("job_finish", params) is not None

    def retry(
        self,
        *,
        id: int,
        worker_id: str,
        delay: float,
        max_attempts: int,
        error: Mapping[str, Any],
        started: float | None = None,
        attempt: int | None = None,
        now: Now = None,
    ) -> bool:
        """Put a running job ``worker_id`` holds back in the queue, due in ``delay``
        seconds, recording the failed attempt (its body started at ``started``, Unix
        seconds; ``attempt``: which one, as `finish`); False if it no longer held it.
        `retry_batch` of one job.

        Raises:
            SerializationError: the error record cannot be stored.
        """
        applied = self.retry_batch(
            worker_id=worker_id, ids=[id], delays=[delay], max_attempts=[max_attempts],
            errors=[error], starts=[started], attempts=[attempt], now=now,
        )  # fmt: skip
        return bool(applied)

    def retry_batch(
        self,
        *,
        worker_id: str,
        ids: Sequence[int],
        delays: Sequence[float],
        max_attempts: Sequence[int],
        errors: Sequence[Mapping[str, Any]],
        starts: Sequence[float | None],
        attempts: Sequence[int | None] | None = None,
        now: Now = None,
    ) -> list[int]:
        """Put running jobs ``worker_id`` holds back in the queue in one statement, each
        as `retry` would (the sequences run in parallel, one entry per job; ``attempts``:
        the attempt each retry is of, None for any); returns the ids it still held and
        requeued.

        Raises:
            SerializationError: an error record cannot be stored (nothing is written).
        """
        params = {
            "ids": list(ids), "delays": list(delays), "max_attempts": list(max_attempts),
            # One JSON array, not a text[]: psycopg escapes each character of a text array.
            "errors": "[" + ",".join(dumps(dict(error), "error") for error in errors) + "]",
            "starts": list(starts),
            "attempts": list(attempts) if attempts is not None else [None] * len(ids),
            "worker_id": worker_id, "now": now,
        }  # fmt: skip
        return [int(r[0]) for r in self.database.fetch_tuples("job_retry_batch", params)]

    def defer(self, *, id: int, worker_id: str, delay: float, now: Now = None) -> bool:
        """Hand a claimed job back, due in ``delay`` seconds, without using an attempt."""
        params = {"id": id, "worker_id": worker_id, "delay": delay, "now": now}
        return self.database.fetch_one("job_defer", params) is not None

    def start(self, *, id: int, worker_id: str, started: float, now: Now = None) -> bool:
        """Record that the body of a job ``worker_id`` holds starts at ``started`` (Unix
        seconds), before it runs; False if the worker no longer holds the job."""
        params = {"id": id, "worker_id": worker_id, "started": started, "now": now}
        return self.database.fetch_one("job_start", params) is not None

    def mark_started(self, *, worker_id: str, ids: Sequence[int], starts: Sequence[float]) -> int:
        """Record the starts (Unix seconds, in the order of ``ids``) of held jobs whose
        body runs, in one statement; returns how many were written."""
        params = {
            "ids": bigint_array_literal(ids),
            "starts": "{" + ",".join(map(repr, starts)) + "}",
            "worker_id": worker_id,
        }
        return len(self.database.fetch_tuples("job_mark_started", params))

    def shift_run_at(self, *, seconds: float, ids: Sequence[int] | None = None) -> int:
        """Bring queued jobs' run-at ``seconds`` earlier (negative: later), as if the
        clock had moved on that far: every queued job, or only those of ``ids``.
        What the testing kit's clock does (`pgtasks.testing.TestClock`); returns how
        many jobs moved."""
        params = {"seconds": seconds, "ids": None if ids is None else bigint_array_literal(ids)}
        return len(self.database.fetch_all("job_shift_run_at", params))

    def release(self, *, ids: Sequence[int], worker_id: str) -> int:
        """Hand back claimed jobs that never started (attempt not used); returns how many."""
        return len(self.database.fetch_all("job_release", {"ids": list(ids), "worker_id": worker_id}))

    def release_unknown(self, *, worker_id: str, known: Sequence[int]) -> list[int]:
        """Hand back the jobs ``worker_id`` holds claimed, not started, and not among
        ``known`` (the jobs it holds): what a claim whose reply was lost took
        (``job_release_unknown``); returns their ids."""
        params = {"worker_id": worker_id, "known": bigint_array_literal(known)}
        return [row["id"] for row in self.database.fetch_all("job_release_unknown", params)]

    def report_progress(
        self, *, id: int, worker_id: str, progress: Mapping[str, Any], now: Now = None
    ) -> bool:
        """Store progress counters of a job ``worker_id`` holds (a heartbeat too);
        returns whether its cancellation was requested.

        Raises:
            NotOwner: the worker does not hold the job (reaped, cancelled, finished).
            SerializationError: a counter cannot be stored.
        """
        params = {"id": id, "worker_id": worker_id, "progress": dumps(dict(progress), "progress"), "now": now}
        row = self.database.fetch_one("job_report_progress", params)
        if row is None:
            raise NotOwner(id, worker_id)
        return bool(row["cancel_requested"])

    # -- operator actions ----------------------------------------------------------------

    def cancel(
        self, *, id: int, error: Mapping[str, Any], terminate: bool = False, now: Now = None
    ) -> str | None:
        """Cancel a queued job at once (with ``error`` recorded) or request it of a running one.

        Returns:
            The status the job had: ``"queued"`` (it is now cancelled) or ``"running"``
            (its worker is asked to stop); None if the job is finished or does not exist
            (in a scoped store: is not its tenant's).
        """
        params = {
            "id": id, "now": now, "error": dumps(dict(error), "error"), "terminate": terminate,
            "tenant": self.tenant,
        }  # fmt: skip
        row = self.database.fetch_one("job_cancel", params)
        return None if row is None else str(row["old_status"])

    def requeue(self, *, id: int, by: str, now: Now = None) -> bool:
        """Put a failed, cancelled or partially failed job back in the queue for a new
        round of attempts (a fresh budget; attempts numbered on), recording the requeue
        in its history as asked by ``by`` (the actor: ``"api"``, ``"cli:<os user>"``, or
        a caller's text); False if the job is not in one of those statuses (or none
        has this id; in a scoped store: none of its tenant's).

        Raises:
            AlreadyQueued: another unfinished job now holds the job's unique key; the
                job is left as it was.
            DatabaseError: PostgreSQL refused the write otherwise.
        """
        params = {"id": id, "by": by, "now": now, "tenant": self.tenant}
        for _ in range(_UNIQUE_ATTEMPTS):
            try:
                # A job moved to the history (migration 0009) comes back to the hot
                # table first, in the requeue's transaction: refused, it stays there.
                # Twice when the first finds the job in neither table: the history
                # service moved it meanwhile (its UPDATE waited on the move's lock).
                for _ in range(2):
                    with self.database.transaction() as conn:
                        back = self.database.fetch_one(
                            "job_history_restore", {"id": id, "tenant": self.tenant}, conn=conn
                        )
                        if self.database.fetch_one("job_requeue", params, conn=conn) is not None:
                            return True
                    if back is not None and back["id"] is not None:
                        break
                return False
            except DatabaseError as exc:
                if exc.sqlstate != _UNIQUE_VIOLATION:
                    raise
                # Queued again, the job would hold its unique key twice: who holds it?
                key = self.get(id=id).unique_key
                if key is None:  # the violation was not the unique key's
                    raise
                holder = self.find_unique(unique_key=key)
                if holder is not None:
                    raise AlreadyQueued(key, holder) from None
                # The holder finished between the UPDATE and the look-up: try again.
        raise AlreadyQueued(self.get(id=id).unique_key or "", -1)

    def cancel_requested(self, *, worker_id: str) -> list[CancelRequest]:
        """Jobs ``worker_id`` holds whose cancellation was requested."""
        rows = self.database.fetch_all("job_cancel_requested", {"worker_id": worker_id})
        return [CancelRequest(int(r["id"]), bool(r["terminate"])) for r in rows]

    def purge_finished(self, *, older_than: float, status: str | None, limit: int, now: Now = None) -> int:
        """Delete up to ``limit`` finished jobs (of ``status``, or any) that ended more
        than ``older_than`` seconds ago; returns how many."""
        params = {"older_than": older_than, "status": status, "limit": limit, "now": now}
        row = self.database.fetch_one("job_purge_finished", params)
        return int(row["deleted"]) if row else 0

    def purge_count(self, *, older_than: float, status: str | None, now: Now = None) -> int:
        """How many jobs `purge_finished` would delete now (the same condition, the
        ``job_purgeable`` fragment), without deleting any: ``pgtasks purge --dry-run``."""
        params = {"older_than": older_than, "status": status, "now": now}
        row = self.database.fetch_one("job_purge_count", params)
        return int(row["jobs"]) if row else 0

    # -- maintenance ---------------------------------------------------------------------

    def reap_lost(self, *, lease_timeout: float, limit: int, now: Now = None) -> list[ReapedJob]:
        """Recover up to ``limit`` running jobs whose worker's lease expired: retried,
        or failed ``WORKER_LOST`` (see the query's comment)."""
        params = {"now": now, "lease_timeout": lease_timeout, "limit": limit}
        rows = self.database.fetch_all("job_reap_lost", params)
        return [ReapedJob(int(r["id"]), str(r["task_name"]), str(r["status"])) for r in rows]

    # -- notifications -------------------------------------------------------------------

    def listen_jobs(self, *, conn: AnyConnection) -> None:
        """LISTEN for enqueue notifications on ``conn`` (a dedicated connection)."""
        self.database.execute("listen_jobs", conn=conn)

    def listen_cancel(self, *, conn: AnyConnection) -> None:
        """LISTEN for cancellation requests on ``conn``."""
        self.database.execute("listen_cancel", conn=conn)

    def listen_done(self, *, conn: AnyConnection) -> None:
        """LISTEN for finished jobs on ``conn``."""
        self.database.execute("listen_done", conn=conn)

    async def listen_done_async(self, *, conn: AnyAsyncConnection) -> None:
        """LISTEN for finished jobs on ``conn``, a dedicated asyncio connection."""
        await self.database.fetch_all_async("listen_done", conn=conn)

    # -- listing (last in the class: a method named ``list`` shadows the builtin in the
    # annotations of the methods below it, as mypy resolves them in the class's namespace)

    def list(
        self,
        *,
        status: str | None = None,
        started: bool | None = None,
        queue: str | None = None,
        task_name: str | None = None,
        tenant: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        before_id: int | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """Jobs newest first, filtered (None: any) by status, whether the body started
        (``started_at`` set; with status ``running``, False gives the jobs claimed ahead,
        `pgtasks.Job.phase`), queue, task, tenant and creation time in
        ``[created_after, created_before)``; ``before_id`` pages on.

        In a scoped store only its tenant's jobs: ``tenant`` then filters nothing more
        when it is None or the same, and a different one matches no job.
        """
        if self.tenant is not None:
            if tenant is not None and tenant != self.tenant:
                return []
            tenant = self.tenant
        params = {
            "status": status, "started": started, "queue": queue, "task_name": task_name,
            "tenant": tenant, "created_after": created_after, "created_before": created_before,
            "before_id": before_id, "limit": limit,
        }  # fmt: skip
        return [Job.from_row(r) for r in self.database.fetch_all("job_list", params)]


# One statement a step of a store method needs: (query name, parameters).
_Step = tuple[str, dict[str, Any]]


def _run_steps(
    steps: Generator[_Step, Row | None, int], fetch: Callable[[str, dict[str, Any]], Row | None]
) -> int:
    """Run ``steps`` (see `JobStore._insert_steps`), each statement through ``fetch``."""
    try:
        name, params = next(steps)
        while True:
            name, params = steps.send(fetch(name, params))
    except StopIteration as done:
        result: int = done.value
        return result


async def _run_steps_async(
    steps: Generator[_Step, Row | None, int],
    fetch: Callable[[str, dict[str, Any]], Coroutine[Any, Any, Row | None]],
) -> int:
    """`_run_steps` with an asyncio ``fetch``."""
    try:
        name, params = next(steps)
        while True:
            name, params = steps.send(await fetch(name, params))
    except StopIteration as done:
        result: int = done.value
        return result


def _stored_status(row: Row | None) -> StoredJobStatus | None:
    """``job_status``'s row as a record (None: no such job)."""
    if row is None:
        return None
    return StoredJobStatus(status=str(row["status"]), result=row["result"], error=row["error"])


def _full_params(job: NewJob, notify: bool) -> dict[str, Any]:
    params = {
        "task_name": job.task_name, "queue": job.queue, "tenant": job.tenant, "args": job.args,
        "kwargs": job.kwargs, "headers": job.headers, "priority": job.priority,
        "max_attempts": job.max_attempts, "retry_on_worker_lost": job.retry_on_worker_lost,
        "countdown": job.countdown, "eta": job.eta, "lock_key": job.lock_key, "trigger": job.trigger,
        "schedule_name": job.schedule_name, "scheduled_for": job.scheduled_for, "parent_id": job.parent_id,
        "correlation_id": job.correlation_id, "notify": notify,
    }  # fmt: skip
    flow = job.flow or NO_FLOW
    params.update(
        concurrency_key=flow[0],
        concurrency_limit=flow[1],
        rate_key=flow[2],
        rate_limit=flow[3],
        rate_period=flow[4],
        cost=flow[5],
    )
    return params
