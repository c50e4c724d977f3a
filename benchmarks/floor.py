"""What processing pgtasks' rows costs PostgreSQL, with none of pgtasks' work.

``python -m benchmarks.floor [--jobs 20000] [--batch 100] [--reps 3] [--dsn ADMIN_DSN]``

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

``floor`` over ``raw`` is what pgtasks' row costs the loop; pgtasks' processing over
``floor`` is what pgtasks does beyond it. Prints each median jobs/s, its range and its
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

VARIANTS = ("raw", "floor")
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
LEFT = {
    "raw": "SELECT count(*) FROM bench_jobs WHERE status <> 'done'",
    "floor": "SELECT count(*) FROM pgtasks.jobs WHERE status <> 'succeeded'",
}


def _noop(job: dict[str, object]) -> None:
    """The task enqueued (pgtasks' workers never run here)."""


def _work(dsn: str, variant: str, batch: int, worker_id: str, start: Event) -> None:
    """One worker process: claim and complete until a claim comes back empty."""
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


def _fill(dsn: str, variant: str, jobs: int) -> None:
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
        for done in range(0, jobs, 1_000):
            task.delay_many([job] * min(1_000, jobs - done))
    finally:
        app.close()


def measure(admin_dsn: str, variant: str, jobs: int, batch: int, rep: int) -> float:
    """One drain of ``jobs`` jobs of ``variant``; jobs/s from releasing the workers to
    the last one's exit.

    Raises:
        RuntimeError: a worker exited with an error, or jobs were left unfinished.
    """
    name = f"bench_floor_{variant}_{os.getpid()}_{rep}"
    dsn = pg.create_database(admin_dsn, name)
    try:
        _fill(dsn, variant, jobs)
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
    add_common_options(parser)
    args = parser.parse_args(argv)
    require_positive(parser, args, "jobs", "batch", "reps")
    compile_project()
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for rep in range(args.reps):
        for variant in VARIANTS:
            results[variant].append(measure(args.dsn, variant, args.jobs, args.batch, rep))
    print(
        f"processing, {args.jobs:,} no-op jobs, claims of {args.batch}, {WORKERS} processes,"
        f" {args.reps} repetitions, medians"
    )
    print_against_raw(results, width=6)
    return 0


if __name__ == "__main__":
    sys.exit(main())
