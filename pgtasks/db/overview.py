"""`OverviewStore`: the read-only views of operators (the dashboard), one method per named query.

Every statement reads; none writes, so the store can run on a replica's `Database`.
A store made with a ``tenant`` passes it to every statement, which then counts and
lists only that tenant's jobs (the dashboard's ``--tenant``), and runs each in a
transaction of that tenant (`pgtasks.db.Database.scoped`); with None, every
tenant's.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from pgtasks.db.database import Database, Now
from pgtasks.db.jobs import JobStore
from pgtasks.db.workers import WorkerInfo
from pgtasks.records import Job

__all__ = ["FinishedCount", "OverviewStore", "QueueDepth", "TenantBacklog"]


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """Jobs of one queue in one status.

    Attributes:
        queue, status: which. jobs: how many.
        claimed: of the ``running`` ones, those held by a worker but not started.
        oldest_wait: seconds the oldest due ``queued`` job has waited since its
            run-at; None when none is due (or for other statuses).
    """

    queue: str
    status: str
    jobs: int
    claimed: int
    oldest_wait: float | None


@dataclass(frozen=True, slots=True)
class FinishedCount:
    """Jobs of one queue that finished in one time bucket with one status.

    Attributes:
        queue, status: which. jobs: how many.
        bucket: the bucket's index, 0 for the oldest of the window.
    """

    queue: str
    bucket: int
    status: str
    jobs: int


@dataclass(frozen=True, slots=True)
class TenantBacklog:
    """The unfinished jobs of one tenant.

    Attributes:
        tenant: the tenant (``""``: jobs enqueued without one).
        queued: jobs waiting, of which ``due`` are due now; running: jobs held by workers.
        backlog: queued + running. share: ``backlog`` over the backlog of all tenants
            counted (0..1).
    """

    tenant: str
    queued: int
    due: int
    running: int
    backlog: int
    share: float


class OverviewStore:
    """Read-only views across the jobs and workers tables (see the module docstring).

    Args:
        database: the `Database` that runs the statements (a replica's will do).
        tenant: None for every tenant's jobs, or the one tenant whose jobs alone are
            counted and listed.
    """

    def __init__(self, database: Database, *, tenant: str | None = None) -> None:
        # A tenant's statements also run in a transaction of that tenant, as those of a
        # scoped `pgtasks.db.JobStore` do, so row-level security holds them to it too.
        self.database = database if tenant is None else database.scoped(tenant)
        self.tenant = tenant

    def queue_depth(self, *, now: Now = None) -> list[QueueDepth]:
        """Job counts per queue and status, by queue and status."""
        rows = self.database.fetch_all("overview_queue_depth", {"tenant": self.tenant, "now": now})
        return [
            QueueDepth(
                queue=str(r["queue"]),
                status=str(r["status"]),
                jobs=int(r["jobs"]),
                claimed=int(r["claimed"]),
                oldest_wait=None if r["oldest_wait_seconds"] is None else float(r["oldest_wait_seconds"]),
            )
            for r in rows
        ]

    def throughput(self, *, window: float, bucket: float, now: Now = None) -> list[FinishedCount]:
        """Jobs that finished in the last ``window`` seconds, counted per queue, bucket
        of ``bucket`` seconds (0: the oldest) and final status.

        Args:
            window: seconds back from now (> 0). bucket: seconds per bucket (> 0).
            now: the end of the window; None for the database clock.
        """
        params = {"tenant": self.tenant, "window": window, "bucket": bucket, "now": now}
        return [
            FinishedCount(queue=str(r["queue"]), bucket=int(r["bucket"]), status=str(r["status"]),
                          jobs=int(r["jobs"]))
            for r in self.database.fetch_all("overview_throughput", params)
        ]  # fmt: skip

    def tenants(self, *, now: Now = None) -> list[TenantBacklog]:
        """The backlog of each tenant that has one, largest first."""
        rows = self.database.fetch_all("overview_tenants", {"tenant": self.tenant, "now": now})
        return [
            TenantBacklog(
                tenant=str(r["tenant"]),
                queued=int(r["queued"]),
                due=int(r["due"]),
                running=int(r["running"]),
                backlog=int(r["backlog"]),
                share=float(r["share"]),
            )
            for r in rows
        ]

    def workers(self, *, now: Now = None) -> list[WorkerInfo]:
        """Every registered worker (as `pgtasks.db.WorkerStore.list`), its running and
        claimed jobs counted among the store's tenant's jobs only."""
        rows = self.database.fetch_all("overview_workers", {"tenant": self.tenant, "now": now})
        return [WorkerInfo.of(r) for r in rows]

    def jobs(
        self,
        *,
        status: str | None = None,
        queue: str | None = None,
        task_name: str | None = None,
        tenant: str | None = None,
        created_after: dt.datetime | None = None,
        created_before: dt.datetime | None = None,
        before_id: int | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """Jobs newest first, filtered as `pgtasks.db.JobStore.list` and by creation
        time in ``[created_after, created_before)`` (None: unbounded).

        In a store with a tenant, ``tenant`` filters nothing more when it is None or
        the same, and a different one matches no job.
        """
        return JobStore(self.database, tenant=self.tenant).list(
            status=status, queue=queue, task_name=task_name, tenant=tenant,
            created_after=created_after, created_before=created_before,
            before_id=before_id, limit=limit,
        )  # fmt: skip
