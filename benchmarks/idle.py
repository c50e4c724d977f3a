"""What an idle pgtasks worker costs PostgreSQL while jobs due later pile up.

``python -m benchmarks.idle [--depths 10000,1000000] [--seconds 30] [--reps 3] [--dsn ADMIN_DSN]``

For each repetition and depth (interleaved), a fresh database gets ``depth`` jobs due
in a day (``countdown``), spread over three tenants, and one worker process (the
benchmark's worker command) starts above them. After a few seconds of idling, the CPU
time of the PostgreSQL backends connected to that database (``/proc/<pid>/stat``) is
read over ``--seconds`` seconds; the worker polls once a second (its default poll
interval), asking ``job_next_run_at`` whether a job is due and claiming only if one
is (docs/workers.md). Prints per depth the medians of backend CPU milliseconds per
second of idling, and the ratio of the deepest depth to the shallowest: 1.0 means an
idle worker's cost does not grow with the number of jobs waiting for their time. It
writes no report.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks import pg
from benchmarks.cpu import backend_pids, cpu_spent, cpu_times
from benchmarks.environments import compile_project
from benchmarks.probe import add_common_options, interleaved, positive_ints
from benchmarks.systems.base import Params
from benchmarks.systems.pgtasks_system import PgtasksDriver
from benchmarks.systems.records import NOOP

DEPTHS = (10_000, 1_000_000)
TENANTS = ("a", "b", "c")
DUE_IN_SECONDS = 86_400.0
FILL_CHUNK = 50_000
SETTLE_SECONDS = 3.0  # the worker's start: its first claims, before the window opens


def measure(admin_dsn: str, depth: int, seconds: float, rep: int) -> float:
    """One run at ``depth`` future jobs; backend CPU milliseconds per second of idling."""
    import psycopg

    name = f"bench_idle_{depth}_{os.getpid()}_{rep}"
    dsn = pg.create_database(admin_dsn, name)
    try:
        with tempfile.TemporaryDirectory() as workdir:
            driver = PgtasksDriver(Params(dsn=dsn, workdir=Path(workdir), deadline=600.0))
            try:
                driver.migrate()
                for i, tenant in enumerate(TENANTS):
                    share = depth // len(TENANTS) + (1 if i < depth % len(TENANTS) else 0)
                    for start in range(0, share, FILL_CHUNK):
                        jobs = [(NOOP, 0.0)] * min(FILL_CHUNK, share - start)
                        driver.task.delay_many(jobs, tenant=tenant, countdown=DUE_IN_SECONDS)
                driver.analyze()
                fleet = driver.fleet(processes=1)
                fleet.start()
                try:
                    time.sleep(SETTLE_SECONDS)
                    fleet.check_alive()
                    with psycopg.connect(admin_dsn, autocommit=True) as conn:
                        before = cpu_times(backend_pids(conn, name))
                        started = time.perf_counter()
                        time.sleep(seconds)
                        after = cpu_times(backend_pids(conn, name))
                        elapsed = time.perf_counter() - started
                    fleet.check_alive()
                finally:
                    fleet.stop()
            finally:
                driver.close()
    finally:
        pg.drop_database(admin_dsn, name)
    return cpu_spent(before, after) / elapsed * 1000.0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, measure, print one line per depth; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.idle", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--depths", default=",".join(str(d) for d in DEPTHS), help="comma-separated job counts"
    )
    parser.add_argument(
        "--seconds", type=float, default=30.0, help="measured idle window (default %(default)s)"
    )
    add_common_options(parser)
    args = parser.parse_args(argv)
    depths = positive_ints(parser, "--depths", args.depths)
    if args.reps < 1 or args.seconds <= 0:
        parser.error("--reps must be >= 1 and --seconds > 0")
    compile_project()
    results = interleaved(depths, args.reps, lambda depth, rep: measure(args.dsn, depth, args.seconds, rep))
    medians = {d: statistics.median(v) for d, v in results.items()}
    print(f"one idle worker, {args.seconds:g} s windows, {args.reps} repetitions, medians")
    for depth, runs in results.items():
        spread = f"{min(runs):.1f}-{max(runs):.1f}"
        print(f"{depth:>10,} jobs due later: PostgreSQL backends {medians[depth]:6.1f} ms CPU/s ({spread})")
    shallow, deep = medians[depths[0]], medians[depths[-1]]
    if len(depths) > 1 and shallow > 0:
        print(f"ratio {depths[-1]:,} / {depths[0]:,}: {deep / shallow:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
