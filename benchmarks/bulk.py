"""What bulk enqueue in calls of 1,000 costs, against the least any client can pay.

``python -m benchmarks.bulk [--calls 20] [--chunk 1000] [--reps 5] [--dsn ADMIN_DSN]``

The suite's figure "bulk enqueue in calls of 1,000" sets pgtasks' ``delay_many`` of
1,000 jobs per call against the raw-SQL reference's one multi-row ``INSERT`` of
1,000 rows per statement, each call its own commit. This probe runs three variants
side by side on one database, interleaved per round (A B C A B C ...), each timing
``--calls`` calls of ``--chunk`` jobs:

* ``raw``: the reference's multi-row ``INSERT`` into its own four-column table
  (`benchmarks.systems.raw_system`), autocommit;
* ``floor``: a ``COPY`` of ready-made rows into pgtasks' own table in one
  transaction per call, the ids drawn by the table's identity default, with none
  of pgtasks' Python (no validation, serialisation, id reservation or wake-up):
  what any client pays PostgreSQL to write pgtasks' rows, with its constraints and
  indexes. ``floor`` over ``raw`` bounds what pgtasks' bulk enqueue can reach
  against the reference while its row stays as it is;
* ``pgtasks``: ``task.delay_many`` of the same jobs, as an application calls it.

The jobs are the suite's no-op jobs, each with one small dict argument. Prints the
median jobs/s of each variant, its range, and its ratio to ``raw``. It writes no
report.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence

import orjson
import psycopg

import pgtasks
from benchmarks import pg
from benchmarks.environments import compile_project
from benchmarks.probe import add_common_options, print_against_raw, require_positive
from benchmarks.systems.raw_system import INSERT_CHUNK, SCHEMA

VARIANTS = ("raw", "floor", "pgtasks")
CALLS = 20
CHUNK = 1_000
TASK = "bench.bulk.noop"
QUEUE = "bench"
# The columns `delay_many` fills for these jobs; the others take their defaults.
FLOOR_COPY = (
    "COPY pgtasks.jobs (task_name, queue, tenant, args, kwargs, headers, priority, max_attempts,"
    " lock_key, retry_on_worker_lost) FROM STDIN"
)


def _noop(job: dict[str, object]) -> None:
    """The task enqueued (never run: no worker claims here)."""


def measure_all(admin_dsn: str, calls: int, chunk: int, reps: int) -> dict[str, list[float]]:
    """Every variant in turn, ``reps`` rounds, in one fresh database; jobs/s per round."""
    name = f"bench_bulk_{os.getpid()}"
    dsn = pg.create_database(admin_dsn, name)
    try:
        app = pgtasks.App("bench-bulk", dsn=dsn, load_entry_points=False)
        try:
            app.migrate()
            task = app.task(name=TASK, queue=QUEUE)(_noop)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(SCHEMA)
                ops = _variants(conn, task, chunk)
                for op in ops.values():  # connections open, statements prepared
                    op()
                results: dict[str, list[float]] = {v: [] for v in VARIANTS}
                for _ in range(reps):
                    for variant in VARIANTS:
                        began = time.perf_counter()
                        for _ in range(calls):
                            ops[variant]()
                        results[variant].append(calls * chunk / (time.perf_counter() - began))
                return results
        finally:
            app.close()
    finally:
        pg.drop_database(admin_dsn, name)


def _variants(
    conn: psycopg.Connection[tuple[object, ...]], task: pgtasks.Task, chunk: int
) -> dict[str, Callable[[], object]]:
    """One call of each variant: ``chunk`` jobs and one commit."""
    jobs = [{"k": "noop", "i": i} for i in range(chunk)]
    raw_args = [orjson.dumps(job).decode() for job in jobs]
    raw_sql = INSERT_CHUNK + ", ".join(["(%s::jsonb)"] * chunk)
    floor_rows = [
        (TASK, QUEUE, "", orjson.dumps([job]).decode(), "{}", "{}", 0, 4, None, True) for job in jobs
    ]

    def raw() -> None:
        conn.execute(raw_sql, raw_args)

    def floor() -> None:
        with conn.transaction(), conn.cursor().copy(FLOOR_COPY) as copy:
            for row in floor_rows:
                copy.write_row(row)

    def bulk() -> None:
        task.delay_many(jobs)

    return {"raw": raw, "floor": floor, "pgtasks": bulk}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, measure, print one line per variant; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bulk", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--calls", type=int, default=CALLS, help="calls per round (default %(default)s)")
    parser.add_argument("--chunk", type=int, default=CHUNK, help="jobs per call (default %(default)s)")
    add_common_options(parser)
    parser.set_defaults(reps=5)
    args = parser.parse_args(argv)
    require_positive(parser, args, "calls", "chunk", "reps")
    compile_project()
    results = measure_all(args.dsn, args.calls, args.chunk, args.reps)
    print(f"bulk enqueue, {args.calls} calls of {args.chunk:,} jobs per round, {args.reps} rounds, medians")
    print_against_raw(results, width=8)
    return 0


if __name__ == "__main__":
    sys.exit(main())
