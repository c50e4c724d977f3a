"""The data layer: the only code in pgtasks that names a query or holds a cursor.

`Database` owns the pool, connections, transactions and COPY. Beside it, one typed
store per group of tables, each with one method per named query of
``pgtasks/sql/queries.sql``: `JobStore`, `WorkerStore`, `ScheduleStore`,
`MigrationStore`, `IsolationStore`. `Stores` bundles them over one `Database`; the
engine (worker, scheduler, results) is handed the stores it needs. See
docs/architecture.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgtasks.db.database import (
    AnyAsyncConnection,
    AnyConnection,
    Database,
    Now,
    Row,
    bigint_array_literal,
    current_tenant,
    describe_dsn,
    tenant_context,
    text_array_literal,
    translate_error,
)
from pgtasks.db.held import HeldTransaction
from pgtasks.db.isolation import IsolationStore, TableIsolation
from pgtasks.db.jobs import (
    CancelRequest,
    JobSituation,
    JobStore,
    NewJob,
    Prerequisite,
    ReapedJob,
    StoredJobStatus,
)
from pgtasks.db.migrations import MigrationStore
from pgtasks.db.schedules import ScheduleRow, ScheduleStore
from pgtasks.db.wakeups import WakeupSender
from pgtasks.db.workers import WorkerInfo, WorkerStore

__all__ = [
    "AnyAsyncConnection",
    "AnyConnection",
    "CancelRequest",
    "Database",
    "HeldTransaction",
    "IsolationStore",
    "JobSituation",
    "JobStore",
    "MigrationStore",
    "NewJob",
    "Now",
    "Prerequisite",
    "ReapedJob",
    "Row",
    "ScheduleRow",
    "ScheduleStore",
    "StoredJobStatus",
    "Stores",
    "TableIsolation",
    "WakeupSender",
    "WorkerInfo",
    "WorkerStore",
    "bigint_array_literal",
    "current_tenant",
    "describe_dsn",
    "tenant_context",
    "text_array_literal",
    "translate_error",
]


@dataclass(frozen=True, slots=True)
class Stores:
    """The typed stores over one `Database`.

    Attributes:
        database: pool, connections, transactions (``database.transaction()``) and the clock.
        jobs, workers, schedules, migrations, isolation: the stores.
        wakeups: sends the wake-ups of enqueues that committed on their own
            (`pgtasks.db.wakeups`).
    """

    database: Database
    jobs: JobStore
    workers: WorkerStore
    schedules: ScheduleStore
    migrations: MigrationStore
    wakeups: WakeupSender
    isolation: IsolationStore

    @classmethod
    def over(cls, database: Database) -> Stores:
        """The stores running their statements on ``database``."""
        jobs = JobStore(database)
        return cls(
            database=database,
            jobs=jobs,
            workers=WorkerStore(database),
            schedules=ScheduleStore(database),
            migrations=MigrationStore(database),
            wakeups=WakeupSender(jobs),
            isolation=IsolationStore(database),
        )

    def close(self) -> None:
        """Send pending wake-ups, then close the wake-up connection and the pool
        (later calls reopen them)."""
        self.wakeups.close()
        self.database.close()
