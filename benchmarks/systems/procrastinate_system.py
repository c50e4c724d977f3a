"""procrastinate 3.x peer.

Enqueue one: ``task.defer(**kwargs)`` with the app opened synchronously
(``app.open()``, which runs a ``SyncPsycopgConnector`` pool). Bulk:
``task.batch_defer(*kwargs)`` (one ``procrastinate_defer_jobs_v1`` call per chunk of
10,000). Workers: 2 ``procrastinate worker`` processes (one per core) with
``--concurrency 10`` async jobs each; finished jobs are kept (the default,
``--delete-jobs never``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from benchmarks.systems.base import Driver, Params, SystemSpec
from benchmarks.systems.entry import main
from benchmarks.systems.records import Job, job_args

WORKER_PROCESSES = 2
CONCURRENCY = int(os.environ.get("BENCH_PROCRASTINATE_CONCURRENCY", "10"))
BULK_CHUNK = 10_000


class ProcrastinateDriver(Driver):
    """procrastinate through its public API; ``pending`` reads its jobs table."""

    spec = SystemSpec(
        name="procrastinate",
        requirements=("procrastinate>=3,<4", "psycopg[binary]>=3.2"),
        packages=("procrastinate", "psycopg"),
        settings=f"{WORKER_PROCESSES} processes x concurrency {CONCURRENCY} (async task)",
        notes="sync defer (app.open()); batch_defer in chunks of 10,000; jobs kept",
    )

    def __init__(self, params: Params) -> None:
        super().__init__(params)
        import psycopg

        from benchmarks.systems import procrastinate_app

        self.task = procrastinate_app.bench
        self.app = procrastinate_app.app
        self.app.open()
        self.conn = psycopg.connect(params.dsn, autocommit=True)

    def migrate(self) -> None:
        self.app.schema_manager.apply_schema()

    def enqueue_one(self, kind: str, enqueued_at: float, tenant: str | None = None) -> None:
        self.task.defer(**job_args(kind, enqueued_at))

    def enqueue_bulk(self, jobs: Sequence[Job], tenant: str | None = None) -> None:
        for start in range(0, len(jobs), BULK_CHUNK):
            self.task.batch_defer(*(job_args(k, t) for k, t in jobs[start : start + BULK_CHUNK]))

    def worker_commands(self) -> list[list[str]]:
        command = [
            sys.executable, "-m", "procrastinate", "--app", "benchmarks.systems.procrastinate_app.app",
            "--log-level", "warning", "worker", "--queues", "bench", "--concurrency", str(CONCURRENCY),
        ]  # fmt: skip
        return [command] * WORKER_PROCESSES

    def pending(self) -> int | None:
        row = self.conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
        ).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self.app.close()
        self.conn.close()


SYSTEM = ProcrastinateDriver.spec
DRIVER = ProcrastinateDriver

if __name__ == "__main__":
    main(ProcrastinateDriver)
