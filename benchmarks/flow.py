"""Flow control in the claim: what its limits cost, and whether shares and rates hold.

``python -m benchmarks.flow [--short] [--jobs 20000] [--seconds 30] [--workers 2]
[--concurrency 8] [--dsn ADMIN_DSN]``

Four figures, one after the other, each on a fresh database whose jobs table is never
analyzed (autovacuum off for it: a queue table rarely has fresh statistics), with real
``pgtasks worker`` processes (``--workers`` of ``--concurrency`` threads each):

* **per-key limit**: ``--jobs`` no-op jobs, spread over 1,000 concurrency keys with a
  limit of 3 each, drained; the same jobs without keys, drained; jobs/s of each (from
  the first start to the last end, as the jobs table records them) and the ratio.
* **weights 1:3**: two tenants with a backlog, weights 1 and 3, jobs of 5 ms;
  the heavier tenant's share of the jobs finished in each 10-second window.
* **rate limit**: 20/s on a backlog for ``--seconds``; starts in that time from the
  first (target 20 x seconds, +-10 at 30 s).
* **Jain's index**: 100 tenants of weights 1, 2, 3, 4 (25 each), backlogged, jobs of
  5 ms; the fairness index of their weight-normalised throughput over ``--seconds``
  (1.0: every tenant got exactly its weight's share).

``--short`` makes every figure small (10,000 jobs, 10 s windows). Prints one line per
figure; writes no report.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

import pgtasks
from benchmarks import pg
from benchmarks.cli import DEFAULT_DSN
from benchmarks.environments import compile_project

QUEUE = "flow"
KEYS = 1000
LIMIT = 3
RATE = 20
WINDOW = 10.0
PAUSE = 0.005  # seconds a job of the share figures runs


def _register(application: pgtasks.App) -> pgtasks.Task:
    @application.task(name="flow.job", queue=QUEUE, max_retries=0)
    def job(pause: float = 0.0) -> None:
        if pause:
            time.sleep(pause)

    return job


# The workers load this module with -A benchmarks.flow:app.
app = pgtasks.App("bench-flow", dsn=os.environ.get("BENCH_DSN"), load_entry_points=False)
_register(app)


@contextmanager
def database(admin_dsn: str, label: str) -> Iterator[tuple[str, pgtasks.App, pgtasks.Task]]:
    """A fresh migrated database, its jobs table never to be analyzed; an app and the task."""
    name = f"bench_flow_{label}_{os.getpid()}"
    dsn = pg.create_database(admin_dsn, name)
    try:
        driver = pgtasks.App("bench-flow-driver", dsn=dsn, load_entry_points=False)
        try:
            driver.migrate()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("ALTER TABLE pgtasks.jobs SET (autovacuum_enabled = false)")
            yield dsn, driver, _register(driver)
        finally:
            driver.close()
    finally:
        pg.drop_database(admin_dsn, name)


@contextmanager
def fleet(dsn: str, workers: int, concurrency: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``workers`` worker processes on ``dsn``; stopped (SIGTERM, then SIGKILL) on exit."""
    command = [
        sys.executable, "-m", "pgtasks", "-A", "benchmarks.flow:app", "-l", "WARNING", "--dsn", dsn,
        "worker", "-Q", QUEUE, "-c", str(concurrency), "--poll-interval", "0.5",
    ]  # fmt: skip
    env = {**os.environ, "BENCH_DSN": dsn, "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    procs = [subprocess.Popen(command, env=env) for _ in range(workers)]
    try:
        yield procs
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _one(dsn: str, query: str, params: Any = None) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def _run_for(dsn: str, seconds: float) -> None:
    """Wait for the fleet's first start (worker processes take seconds to start on a
    busy machine), then ``seconds`` more."""
    deadline = time.monotonic() + 120
    while not _one(dsn, "SELECT count(started_at) FROM pgtasks.jobs"):
        if time.monotonic() > deadline:
            raise RuntimeError("no job started in 120 s")
        time.sleep(0.1)
    time.sleep(seconds)


def drain(admin_dsn: str, jobs: int, keyed: bool, workers: int, concurrency: int) -> float:
    """Jobs/s of draining ``jobs`` no-op jobs, with or without a concurrency key each."""
    with database(admin_dsn, "keyed" if keyed else "plain") as (dsn, driver, task):
        for start in range(0, jobs, 1000):
            chunk = range(start, min(jobs, start + 1000))
            if keyed:  # key after key, as users enqueue: one bulk INSERT per chunk
                driver.bulk_apply(
                    task.s(0.0).set(concurrency_key=f"k{i % KEYS}", concurrency_limit=LIMIT) for i in chunk
                )
            else:
                task.delay_many([0.0] * len(chunk))
        deadline = time.monotonic() + 600
        with fleet(dsn, workers, concurrency):
            while _one(dsn, "SELECT count(*) FROM pgtasks.jobs WHERE status IN ('queued', 'running')"):
                if time.monotonic() > deadline:
                    raise RuntimeError("the drain did not finish in 600 s")
                time.sleep(0.2)
        seconds = _one(
            dsn, "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM pgtasks.jobs"
        )
        return float(jobs / seconds)


def weighted(admin_dsn: str, seconds: float, workers: int, concurrency: int) -> list[float]:
    """The heavier tenant's share of the jobs finished in each whole window of ``WINDOW`` s."""
    with database(admin_dsn, "weights") as (dsn, driver, task):
        backlog = int(seconds * workers * concurrency / PAUSE) + 1000
        for tenant in ("light", "heavy"):
            task.delay_many([PAUSE] * backlog, tenant=tenant)
        driver.set_tenant_weight("heavy", 3)
        with fleet(dsn, workers, concurrency):
            _run_for(dsn, seconds + 1)
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute(
                "WITH t0 AS (SELECT min(finished_at) AS t FROM pgtasks.jobs WHERE status = 'succeeded')"
                " SELECT floor(extract(epoch FROM j.finished_at - t0.t) / %s)::int AS w,"
                " count(*) FILTER (WHERE j.tenant = 'heavy')::float8 / count(*)"
                " FROM pgtasks.jobs j, t0 WHERE j.status = 'succeeded' GROUP BY 1 ORDER BY 1",
                (WINDOW,),
            ).fetchall()
        whole = int(seconds // WINDOW)
        return [share for w, share in rows if w < whole]


def rated(admin_dsn: str, seconds: float, workers: int, concurrency: int) -> int:
    """Starts within ``seconds`` of the first, at a limit of ``RATE`` per second."""
    with database(admin_dsn, "rate") as (dsn, _, task):
        task.delay_many([0.0] * int(RATE * seconds * 3), rate_limit=f"{RATE}/s", rate_limit_key="bench")
        with fleet(dsn, workers, concurrency):
            _run_for(dsn, seconds + 1)
        return int(
            _one(
                dsn,
                "SELECT count(*) FROM pgtasks.jobs WHERE started_at"
                " < (SELECT min(started_at) FROM pgtasks.jobs) + make_interval(secs => %s)",
                (seconds,),
            )
        )


def jain(admin_dsn: str, seconds: float, workers: int, concurrency: int) -> tuple[float, int]:
    """Jain's fairness index of 100 tenants' weight-normalised throughput, and the jobs done."""
    tenants = [(f"t{i:03d}", 1 + i % 4) for i in range(100)]
    with database(admin_dsn, "jain") as (dsn, driver, task):
        backlog = int(seconds * workers * concurrency / PAUSE / 100 * 2) + 50
        for tenant, weight in tenants:
            task.delay_many([PAUSE] * backlog, tenant=tenant)
            driver.set_tenant_weight(tenant, weight)
        with fleet(dsn, workers, concurrency):
            _run_for(dsn, seconds)
        with psycopg.connect(dsn, autocommit=True) as conn:
            done: dict[str, int] = dict(
                conn.execute(
                    "SELECT tenant, count(*) FROM pgtasks.jobs WHERE status = 'succeeded' GROUP BY tenant"
                ).fetchall()
            )
    normalised = [done.get(tenant, 0) / weight for tenant, weight in tenants]
    total = sum(normalised)
    index = total * total / (len(normalised) * sum(x * x for x in normalised)) if total else 0.0
    return index, sum(done.values())


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, measure the four figures, print one line each; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flow", description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="small sizes: 10,000 jobs, 10 s windows")
    parser.add_argument("--jobs", type=int, default=None, help="jobs per drain (20,000; short 10,000)")
    parser.add_argument("--seconds", type=float, default=None, help="share and rate runs, s (30; short 10)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default %(default)s)")
    parser.add_argument("--concurrency", type=int, default=8, help="threads per worker (default %(default)s)")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="admin DSN of the PostgreSQL to use")
    args = parser.parse_args(argv)
    jobs = args.jobs or (10_000 if args.short else 20_000)
    seconds = args.seconds or (10.0 if args.short else 30.0)
    if jobs < KEYS or seconds < WINDOW or args.workers < 1 or args.concurrency < 1:
        parser.error(f"--jobs must be >= {KEYS}, --seconds >= {WINDOW:g}, --workers and --concurrency >= 1")
    compile_project()
    fleet_text = f"{args.workers} workers x {args.concurrency} threads, jobs table never analyzed"
    print(f"flow control, {fleet_text}")
    plain = drain(args.dsn, jobs, False, args.workers, args.concurrency)
    keyed = drain(args.dsn, jobs, True, args.workers, args.concurrency)
    print(
        f"per-key limit:  {jobs:,} no-op jobs over {KEYS:,} keys, limit {LIMIT}: {keyed:,.0f} jobs/s;"
        f" without keys {plain:,.0f} jobs/s; ratio {keyed / plain:.2f}x (target >= 0.8x)"
    )
    shares = weighted(args.dsn, seconds, args.workers, args.concurrency)
    shown = ", ".join(f"{s:.3f}" for s in shares)
    worst = max((abs(s - 0.75) for s in shares), default=float("nan"))
    print(
        f"weights 1:3:    heavier tenant's share per {WINDOW:g} s window: {shown}"
        f" (target 0.750 +- 5%: worst off by {worst / 0.75:.1%})"
    )
    starts = rated(args.dsn, seconds, args.workers, args.concurrency)
    print(f"rate limit:     {RATE}/s for {seconds:g} s: {starts} starts (target {RATE * seconds:.0f} +- 10)")
    index, done = jain(args.dsn, seconds, args.workers, args.concurrency)
    print(f"Jain's index:   100 tenants, weights 1-4, {done:,} jobs in {seconds:g} s: {index:.4f} (1: fair)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
