"""What processing pgtasks' rows costs PostgreSQL, with none of pgtasks' work.

``python -m benchmarks.floor [--jobs 20000] [--batch 100] [--tenants 1] [--reps 3] [--dsn ADMIN_DSN]``

The processing figure sets pgtasks' workers against the raw-SQL reference's, whose
table has four columns and one partial index. This probe drains the same backlog of
no-op jobs twice per repetition, interleaved, each time in a fresh database, with
the reference's own worker loop (two processes, each claiming ``--batch`` rows with
``FOR UPDATE SKIP LOCKED`` and marking them done in one statement, nothing else):

* ``raw``: the loop on the reference's table (`benchmarks.systems.raw_system`'s
  ``CLAIM`` and ``COMPLETE``);
* ``floor``: the same loop on pgtasks' own table, filled by ``delay_many``,
  claiming in the order of pgtasks' claim index and writing the columns pgtasks'
  claim and success write (status, attempt, worker, heartbeat; result, start and
  finish), with its constraints, indexes and triggers. No fairness, flow control,
  leases, prefetch, results of Python functions or error records.
* ``statements``: the same loop running pgtasks' own claim and success statements
  (``job_claim_batch`` with the worker's defaults, ``job_succeed_batch`` with a start
  and an end per job) through its data layer (`pgtasks.db.JobStore` on a worker's
  connection settings, rows read with the worker's loaders), one claim of
  ``--batch`` jobs and one success write after the other. No worker around them: no
  pool threads, requests, task calls, heartbeat, listener or metrics.

``--tenants N`` spreads pgtasks' jobs evenly over N tenants (the mixed-work figure has
150), so ``statements`` claims them in turn as its worker would; the reference's table
has no tenant and ``floor`` drains tenant after tenant.

``floor`` over ``raw`` is what pgtasks' row costs the loop; ``statements`` over ``floor``
what its claim rules (tenants served in turn, priorities, lock, concurrency and rate
keys, leases) and its success record cost in SQL; pgtasks' processing over
``statements`` is what its worker costs. Prints each median jobs/s, its range and its
ratio to ``raw``; it writes no report.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from multiprocessing.synchronize import Event

import orjson
import psycopg

import pgtasks
from benchmarks import pg
from benchmarks.environments import compile_project
from benchmarks.probe import add_common_options, print_against_raw, require_positive
from benchmarks.systems.raw_system import CLAIM, COMPLETE, COPY, SCHEMA
from pgtasks.db import JobStore, text_array_literal
from pgtasks.db.workers import worker_database
from pgtasks.worker.config import WorkerConfig

VARIANTS = ("raw", "floor", "statements")
JOBS = 20_000
BATCH = 100
WORKERS = 2
QUEUE = "bench"
TASK = "bench.floor.noop"
FLOOR_CLAIM = """
WITH c AS (
    SELECT id FROM pgtasks.jobs WHERE status = 'queued' AND queue = %s
    ORDER BY queue, tenant, priority DESC, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED
)
UPDATE pgtasks.jobs j SET status = 'running', attempt = j.attempt + 1, worker_id = %s,
    heartbeat_at = clock_timestamp()
FROM c WHERE j.id = c.id RETURNING j.id, j.args
"""
FLOOR_COMPLETE = """
UPDATE pgtasks.jobs SET status = 'succeeded', result = 'null', started_at = clock_timestamp(),
    finished_at = clock_timestamp()
WHERE id = ANY(%s) AND status = 'running' AND worker_id = %s
"""

# Jobs a drain left unfinished (none, when it worked).
LEFT_PGTASKS = "SELECT count(*) FROM pgtasks.jobs WHERE status <> 'succeeded'"
LEFT = {
    "raw": "SELECT count(*) FROM bench_jobs WHERE status <> 'done'",
    "floor": LEFT_PGTASKS,
    "statements": LEFT_PGTASKS,
}


def _noop(job: dict[str, object]) -> None:
    """The task enqueued (pgtasks' workers never run here)."""


def _work(dsn: str, variant: str, batch: int, worker_id: str, start: Event) -> None:
    """One worker process: claim and complete until a claim comes back empty."""
    if variant == "statements":
        _work_statements(dsn, batch, worker_id, start)
        return
    with psycopg.connect(dsn, autocommit=True) as conn:
        start.wait()
        while True:
            if variant == "raw":
                ids = [row[0] for row in conn.execute(CLAIM, (batch,))]
            else:
                ids = [row[0] for row in conn.execute(FLOOR_CLAIM, (QUEUE, batch, worker_id))]
            if not ids:
                return
            if variant == "raw":
                conn.execute(COMPLETE, (ids,))
            else:
                conn.execute(FLOOR_COMPLETE, (ids, worker_id))


def _work_statements(dsn: str, batch: int, worker_id: str, start: Event) -> None:
    """`_work` with pgtasks' claim and success statements, as its worker runs them."""
    config = WorkerConfig()
    app = pgtasks.App("bench-floor", dsn=dsn, load_entry_points=False)
    threshold = app.settings.prepare_threshold  # as the worker reads it
    app.close()
    database = worker_database(dsn, max_size=1, prepare_threshold=threshold)
    jobs = JobStore(database)
    queues = text_array_literal([QUEUE])
    try:
        start.wait()
        while True:
            rows = jobs.claim_batch(
                queues=queues, worker_id=worker_id, limit=batch,
                max_tenants=config.max_tenants_per_claim, fair=config.tenant_fair,
            )  # fmt: skip
            if not rows:
                return
            base = time.time()
            jobs.succeed_batch(
                worker_id=worker_id, ids=[row[0] for row in rows], results_json=["null"] * len(rows),
                spans=[0, 1] * len(rows), base=base, attempts=[row[2] for row in rows],
            )  # fmt: skip
    finally:
        database.close()


def _fill(dsn: str, variant: str, jobs: int, tenants: int) -> None:
    job = {"k": "noop", "t": 0.0}
    if variant == "raw":
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
            text = orjson.dumps(job).decode()
            with conn.cursor().copy(COPY) as copy:
                for _ in range(jobs):
                    copy.write_row((text,))
        return
    app = pgtasks.App("bench-floor", dsn=dsn, load_entry_points=False)
    try:
        app.migrate()
        task = app.task(name=TASK, queue=QUEUE)(_noop)
        for tenant in range(tenants):
            # Tenant i gets jobs i, i + tenants, ...: every tenant its share, the total exact.
            count = len(range(tenant, jobs, tenants))
            name = f"t{tenant:03d}" if tenants > 1 else ""
            for done in range(0, count, 1_000):
                task.delay_many([job] * min(1_000, count - done), tenant=name)
    finally:
        app.close()


def measure(admin_dsn: str, variant: str, jobs: int, batch: int, rep: int, *, tenants: int = 1) -> float:
    """One drain of ``jobs`` jobs of ``variant``; jobs/s from releasing the workers to
    the last one's exit.

    Raises:
        RuntimeError: a worker exited with an error, or jobs were left unfinished.
    """
    name = f"bench_floor_{variant}_{os.getpid()}_{rep}"
    dsn = pg.create_database(admin_dsn, name)
    try:
        _fill(dsn, variant, jobs, tenants)
        context = multiprocessing.get_context("spawn")
        start = context.Event()
        workers = [
            context.Process(target=_work, args=(dsn, variant, batch, f"floor-{i}", start))
            for i in range(WORKERS)
        ]
        for worker in workers:
            worker.start()
        time.sleep(1.0)  # connected and waiting
        began = time.perf_counter()
        start.set()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - began
        if any(worker.exitcode != 0 for worker in workers):
            raise RuntimeError(f"a {variant} worker failed: exit codes {[w.exitcode for w in workers]}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(LEFT[variant]).fetchone()
        if row is None or row[0]:
            raise RuntimeError(f"{variant}: {row[0] if row else '?'} jobs left unfinished")
        return jobs / elapsed
    finally:
        pg.drop_database(admin_dsn, name)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, measure, print one line per variant; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.floor", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--jobs", type=int, default=JOBS, help="jobs per drain (default %(default)s)")
    parser.add_argument("--batch", type=int, default=BATCH, help="rows per claim (default %(default)s)")
    parser.add_argument(
        "--tenants", type=int, default=1, help="tenants of pgtasks' jobs (default %(default)s)"
    )
    add_common_options(parser)
    args = parser.parse_args(argv)
    require_positive(parser, args, "jobs", "batch", "tenants", "reps")
    compile_project()
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for rep in range(args.reps):
        for variant in VARIANTS:
            rate = measure(args.dsn, variant, args.jobs, args.batch, rep, tenants=args.tenants)
            results[variant].append(rate)
    print(
        f"processing, {args.jobs:,} no-op jobs, claims of {args.batch}, {args.tenants} tenant(s),"
        f" {WORKERS} processes, {args.reps} repetitions, medians"
    )
    print_against_raw(results, width=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
