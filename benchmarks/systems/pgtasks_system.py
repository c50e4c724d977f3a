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

Claim-path figures: bulk in calls of 1,000 is one ``delay_many`` of 1,000 jobs per
call (the default `Driver.enqueue_chunk`); concurrent enqueue is ``delay()`` from
each thread on an app whose pool holds one connection per thread, while one
connection LISTENs on the wake-up channel as an idle worker would; mixed work is the
task ``bench_mixed`` (``autoretry_for=(FailOnce,)``, no retry delay, one retry),
enqueued with ``delay_many`` per (tenant, lock key) group.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import psycopg

import pgtasks
from benchmarks.systems.base import Driver, MixedJob, Params, Producers, SystemSpec
from benchmarks.systems.entry import main
from benchmarks.systems.records import (
    FAIL_ONCE,
    NOOP,
    Job,
    job_args,
    record_failed_attempt,
    run_task,
)
from pgtasks.settings import Settings

WORKER_PROCESSES = 2
CONCURRENCY = int(os.environ.get("BENCH_PGTASKS_CONCURRENCY", "2"))
PREFETCH = int(os.environ.get("BENCH_PGTASKS_PREFETCH", "128"))
BULK_CHUNK = 50_000
FINISHED = (
    "SELECT count(*) FROM pgtasks.jobs"
    " WHERE status IN ('succeeded', 'failed', 'cancelled', 'partial_failure')"
)
MIXED_OUTCOME = (
    "SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status <> 'succeeded'),"
    " count(*) FILTER (WHERE attempt > 1) FROM pgtasks.jobs WHERE task_name = 'bench_mixed'"
)
# The channel pgtasks' workers LISTEN on (pgtasks/sql/queries.sql, job_listen).
WAKEUP_CHANNEL = "pgtasks_jobs"


class FailOnce(Exception):
    """The planned failure of a mixed-work job's first attempt."""


def _register(application: pgtasks.App) -> pgtasks.Task:
    @application.task(name="bench", queue="bench")
    def bench(k: str, t: float) -> None:
        run_task(k, t)

    return bench


def _register_mixed(application: pgtasks.App) -> pgtasks.Task:
    @application.task(
        name="bench_mixed", queue="bench", bind=True, autoretry_for=(FailOnce,), retry_backoff=False,
        default_retry_delay=0.0, max_retries=1,
    )  # fmt: skip
    def bench_mixed(self: Any, k: str, t: float) -> None:
        if k == FAIL_ONCE and self.request.attempt == 1:
            record_failed_attempt()
            raise FailOnce("the first attempt of this job fails on purpose")
        run_task(k, t)

    return bench_mixed


# The workers load this module with -A benchmarks.systems.pgtasks_system:app.
app = pgtasks.App("bench", dsn=os.environ.get("BENCH_DSN"), load_entry_points=False)
_register(app)
_register_mixed(app)


class PgtasksProducers(Producers):
    """``delay()`` from each thread on an app whose pool holds one connection per thread.

    One more connection LISTENs on the wake-up channel and drains what arrives, as an
    idle worker would, until `close`.
    """

    def __init__(self, dsn: str, threads: int) -> None:
        settings = replace(Settings.from_env(dsn), pool_size=threads, load_entry_points=False)
        self.app = pgtasks.App("bench-producers", settings=settings)
        self.task = _register(self.app)
        self.listener = psycopg.connect(dsn, autocommit=True)
        self.listener.execute(f"LISTEN {WAKEUP_CHANNEL}")
        self.stop = threading.Event()
        self.drainer = threading.Thread(target=self._drain, name="listener", daemon=True)
        self.drainer.start()

    def _drain(self) -> None:
        while not self.stop.is_set():
            for _ in self.listener.notifies(timeout=0.2):
                pass

    def call(self, index: int) -> None:
        self.task.delay(NOOP, 0.0)

    def close(self) -> None:
        self.app.close()
        self.stop.set()
        self.drainer.join()
        self.listener.close()


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
        self.mixed_task = _register_mixed(self.app)
        self.conn = psycopg.connect(params.dsn, autocommit=True)

    def migrate(self) -> None:
        self.app.migrate()

    def enqueue_one(self, kind: str, enqueued_at: float, tenant: str | None = None) -> None:
        self.task.apply_async(kwargs=job_args(kind, enqueued_at), tenant=tenant or "")

    def enqueue_bulk(self, jobs: Sequence[Job], tenant: str | None = None) -> None:
        for start in range(0, len(jobs), BULK_CHUNK):
            self.task.delay_many(jobs[start : start + BULK_CHUNK], tenant=tenant or "")

    def enqueue_mixed(self, jobs: Sequence[MixedJob]) -> None:
        groups: dict[tuple[str, str | None], list[Job]] = defaultdict(list)
        for kind, tenant, lock in jobs:
            groups[(tenant, lock)].append((kind, 0.0))
        for (tenant, lock), calls in groups.items():
            self.mixed_task.delay_many(calls, tenant=tenant, lock=lock)

    def mixed_outcome(self) -> dict[str, int]:
        row = self.conn.execute(MIXED_OUTCOME).fetchone()
        assert row is not None  # an aggregate returns one row
        return {"succeeded": int(row[0]), "other": int(row[1]), "retried": int(row[2])}

    def producers(self, threads: int) -> Producers:
        return PgtasksProducers(self.params.dsn, threads)

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
