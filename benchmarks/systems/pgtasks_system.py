"""pgtasks.

Enqueue one: ``bench.apply_async(kwargs=..., tenant=...)``, one pooled autocommit
statement per call (plain ``INSERT ... RETURNING`` with its NOTIFY). Bulk:
``bench.delay_many(...)`` in chunks of 50,000, which goes through ``COPY``.
Workers: 2 ``pgtasks worker`` processes (one per core), threads pool with
concurrency 2 and prefetch multiplier 128 (claims of up to 256 jobs: the setting
docs/workers.md gives for jobs that never wait, as these no-op jobs), LISTEN/NOTIFY wake-ups,
tenant-fair claims, results stored and heartbeats on; finished jobs kept (the
default: nothing is purged without ``pgtasks purge``). Runs in its own virtual
environment holding the project's dependencies, with pgtasks from the source tree.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import psycopg

import pgtasks
from benchmarks.systems.base import Driver, Params, SystemSpec
from benchmarks.systems.entry import main
from benchmarks.systems.records import Job, job_args, run_task

WORKER_PROCESSES = 2
CONCURRENCY = int(os.environ.get("BENCH_PGTASKS_CONCURRENCY", "2"))
PREFETCH = int(os.environ.get("BENCH_PGTASKS_PREFETCH", "128"))
BULK_CHUNK = 50_000
FINISHED = (
    "SELECT count(*) FROM pgtasks.jobs"
    " WHERE status IN ('succeeded', 'failed', 'cancelled', 'partial_failure')"
)


def _register(application: pgtasks.App) -> pgtasks.Task:
    @application.task(name="bench", queue="bench")
    def bench(k: str, t: float) -> None:
        run_task(k, t)

    return bench


# The workers load this module with -A benchmarks.systems.pgtasks_system:app.
app = pgtasks.App("bench", dsn=os.environ.get("BENCH_DSN"), load_entry_points=False)
_register(app)


class PgtasksDriver(Driver):
    """pgtasks through its public API; ``pending`` counts queued and running jobs."""

    spec = SystemSpec(
        name="pgtasks",
        requirements=(),
        project_dependencies=True,  # pgtasks itself comes from the source tree
        packages=("pgtasks", "psycopg", "orjson"),
        settings=f"{WORKER_PROCESSES} processes x {CONCURRENCY} threads, prefetch x{PREFETCH}",
        notes="apply_async per job; delay_many (COPY) for bulk; results stored, heartbeats on; jobs kept",
    )

    def __init__(self, params: Params) -> None:
        super().__init__(params)
        self.app = pgtasks.App("bench-driver", dsn=params.dsn, load_entry_points=False)
        self.task = _register(self.app)
        self.conn = psycopg.connect(params.dsn, autocommit=True)

    def migrate(self) -> None:
        self.app.migrate()

    def enqueue_one(self, kind: str, enqueued_at: float, tenant: str | None = None) -> None:
        self.task.apply_async(kwargs=job_args(kind, enqueued_at), tenant=tenant or "")

    def enqueue_bulk(self, jobs: Sequence[Job], tenant: str | None = None) -> None:
        for start in range(0, len(jobs), BULK_CHUNK):
            self.task.delay_many(jobs[start : start + BULK_CHUNK], tenant=tenant or "")

    def worker_commands(self) -> list[list[str]]:
        command = [
            sys.executable, "-m", "pgtasks", "-A", "benchmarks.systems.pgtasks_system:app", "-l", "WARNING",
            "--dsn", self.params.dsn, "worker", "-Q", "bench", "-c", str(CONCURRENCY),
            "--prefetch-multiplier", str(PREFETCH),
        ]  # fmt: skip
        return [command] * WORKER_PROCESSES

    def pending(self) -> int | None:
        counts = {r["status"]: int(r["jobs"]) for r in self.app.queue_stats()}
        return counts.get("queued", 0) + counts.get("running", 0)

    def finished(self) -> int | None:
        # Served by the index on finished jobs (jobs_finished_idx, the retention
        # purge's); counting the unfinished ones would read the whole backlog.
        row = self.conn.execute(FINISHED).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self.conn.close()
        self.app.close()


SYSTEM = PgtasksDriver.spec
DRIVER = PgtasksDriver

if __name__ == "__main__":
    main(PgtasksDriver)
