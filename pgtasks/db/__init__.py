"""The data layer: the only code in pgtasks that names a query or holds a cursor.

`Database` owns the pool, connections, transactions and COPY. Beside it, one typed
store per group of tables, each with one method per named query of
``pgtasks/sql/queries.sql``: `JobStore`, `WorkerStore`, `ScheduleStore`,
`MigrationStore`. `Stores` bundles them over one `Database`; the engine (worker,
scheduler, results) is handed the stores it needs. See docs/architecture.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgtasks.db.database import (
    AnyConnection,
    Database,
    Now,
    Row,
    bigint_array_literal,
    describe_dsn,
    text_array_literal,
    translate_error,
)
from pgtasks.db.jobs import CancelRequest, JobStore, NewJob, ReapedJob, StoredJobStatus
from pgtasks.db.migrations import MigrationStore
from pgtasks.db.schedules import ScheduleRow, ScheduleStore
from pgtasks.db.workers import WorkerInfo, WorkerStore

__all__ = [
    "AnyConnection",
    "CancelRequest",
    "Database",
    "JobStore",
    "MigrationStore",
    "NewJob",
    "Now",
    "ReapedJob",
    "Row",
    "ScheduleRow",
    "ScheduleStore",
    "StoredJobStatus",
    "Stores",
    "WorkerInfo",
    "WorkerStore",
    "bigint_array_literal",
    "describe_dsn",
    "text_array_literal",
    "translate_error",
]


@dataclass(frozen=True, slots=True)
class Stores:
    """The typed stores over one `Database`.

    Attributes:
        database: pool, connections, transactions (``database.transaction()``) and the clock.
        jobs, workers, schedules, migrations: the stores.
    """

    database: Database
    jobs: JobStore
    workers: WorkerStore
    schedules: ScheduleStore
    migrations: MigrationStore

    @classmethod
    def over(cls, database: Database) -> Stores:
        """The stores running their statements on ``database``."""
        return cls(
            database=database,
            jobs=JobStore(database),
            workers=WorkerStore(database),
            schedules=ScheduleStore(database),
            migrations=MigrationStore(database),
        )
