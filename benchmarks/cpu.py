"""Where the CPU goes per processed job: worker processes vs their PostgreSQL backends.

``python -m benchmarks.cpu [--jobs N] [--reps R] [--systems pgtasks,raw] [--dsn ADMIN_DSN]``

For each repetition and system (interleaved), a fresh database is filled with ``N``
no-op jobs and the system's benchmark workers (the same commands as the processing
figure) run them. Between the first and the last completion it reads the CPU time
(user + system, ``/proc/<pid>/stat``) of the worker process trees and of the
PostgreSQL backends connected to that database, and prints per system the medians
of jobs/s and of microseconds of CPU per job on each side. Backends that connect
during the run count whole. This is the profiling companion of the processing
figure (docs/benchmarks.md, "Profiling notes"); it writes no report.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import pg
from benchmarks.cli import DEFAULT_DSN
from benchmarks.environments import compile_project
from benchmarks.systems.base import Params
from benchmarks.systems.procfs import cpu_seconds, process_tree
from benchmarks.systems.records import progress_count

SYSTEMS = ("pgtasks", "raw")  # the ones that run in the project's interpreter
POLL_SECONDS = 0.005


def backend_pids(conn: Any, dbname: str) -> list[int]:
    """Pids of the PostgreSQL backends connected to ``dbname`` (``conn``'s own excluded)."""
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (dbname,)
    ).fetchall()
    return [int(r[0]) for r in rows]


def cpu_times(pids: Iterable[int]) -> dict[int, float]:
    """CPU seconds (user + system) so far of each process, by pid."""
    return {pid: cpu_seconds(pid) for pid in pids}


def cpu_spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two `cpu_times` readings; a process new in ``after`` counts whole."""
    return sum(after[p] - before.get(p, 0.0) for p in after)


def measure(system: str, admin_dsn: str, jobs: int, rep: int) -> dict[str, float]:
    """Run ``jobs`` no-op jobs of ``system`` once; jobs/s and CPU µs per job on each side."""
    import psycopg

    module = importlib.import_module(f"benchmarks.systems.{system}_system")
    name = f"bench_cpu_{system}_{os.getpid()}_{rep}"
    dsn = pg.create_database(admin_dsn, name)
    try:
        with tempfile.TemporaryDirectory() as workdir:
            driver = module.DRIVER(Params(dsn=dsn, workdir=Path(workdir), deadline=600.0))
            try:
                driver.migrate()
                driver.fill(jobs)
                driver.analyze()
                with psycopg.connect(admin_dsn, autocommit=True) as conn:
                    return _run_fleet(driver, conn, name, jobs)
            finally:
                driver.close()
    finally:
        pg.drop_database(admin_dsn, name)


def _run_fleet(driver: Any, conn: Any, dbname: str, jobs: int) -> dict[str, float]:
    fleet = driver.fleet()
    fleet.start()
    try:
        deadline = time.monotonic() + 600.0
        while progress_count(driver.record_dir) == 0:
            fleet.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError("no job finished within 600 s")
            time.sleep(POLL_SECONDS)
        started = time.perf_counter()
        done_at_start = progress_count(driver.record_dir)
        workers = [pid for p in fleet.processes for pid in process_tree(p.pid)]
        workers_before = cpu_times(workers)
        backends_before = cpu_times(backend_pids(conn, dbname))
        while progress_count(driver.record_dir) < jobs:
            fleet.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError("the jobs did not finish within 600 s")
            time.sleep(POLL_SECONDS)
        elapsed = time.perf_counter() - started
        workers_after = cpu_times(workers)
        backends_after = cpu_times(backend_pids(conn, dbname))
    finally:
        fleet.stop()
    counted = jobs - done_at_start
    worker_cpu = cpu_spent(workers_before, workers_after)
    backend_cpu = cpu_spent(backends_before, backends_after)
    return {
        "jobs_per_s": counted / elapsed,
        "worker_us_per_job": worker_cpu / counted * 1e6,
        "backend_us_per_job": backend_cpu / counted * 1e6,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, measure, print one line per system; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="no-op jobs per run (default %(default)s)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (default %(default)s)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of pgtasks,raw")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="admin DSN of the PostgreSQL to use")
    args = parser.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if args.jobs < 1 or args.reps < 1 or not systems or any(s not in SYSTEMS for s in systems):
        parser.error(f"--jobs and --reps must be >= 1, --systems a subset of {','.join(SYSTEMS)}")
    compile_project()
    results: dict[str, list[dict[str, float]]] = {s: [] for s in systems}
    for rep in range(args.reps):
        for system in systems:
            results[system].append(measure(system, args.dsn, args.jobs, rep))
    print(f"{args.jobs:,} no-op jobs, {args.reps} repetitions, medians (CPU µs per job)")
    for system, runs in results.items():
        line = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(
            f"{system:8s} {line['jobs_per_s']:9,.0f} jobs/s  workers {line['worker_us_per_job']:5.1f} µs"
            f"  PostgreSQL backends {line['backend_us_per_job']:5.1f} µs"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
