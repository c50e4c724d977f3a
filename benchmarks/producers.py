"""What the enqueue wake-up (NOTIFY) costs when many producers enqueue at once.

``python -m benchmarks.producers [--producers 1,4,16,64] [--jobs 4000] [--reps 3] [--dsn ADMIN_DSN]``

PostgreSQL serialises the commits of transactions that sent a NOTIFY (they take one
lock on the notification queue from pre-commit to the end of commit, WAL flush
included), so a wake-up inside every enqueue's own commit makes many producer
threads commit one at a time. pgtasks therefore sends the wake-up of an enqueue
that commits on its own after the commit, coalesced, from one connection per app
(`pgtasks.db.wakeups`). For each repetition (a fresh database) and producer count,
four variants run in turn, interleaved, each enqueueing ``--jobs`` jobs split evenly
over that many threads, one call per job, each call its own commit:

* ``wakeup``: ``task.delay()``, as an application calls it: the INSERT does not
  notify (but the first after a quiet spell of 2 ms), the app's wake-up sender does
  after the commit; the app's pool holds one connection per thread, as a web app
  sizes it;
* ``in-commit``: the same ``delay()`` with the wake-up inside the INSERT's own
  commit (the statement's ``notify`` flag on, the sender off): what an enqueue
  inside a caller's transaction does, and what every enqueue did before;
* ``silent``: the same ``delay()`` with no wake-up at all (the sender off);
* ``floor``: pgtasks' own single-job ``INSERT`` (the named query ``job_insert``, with
  its ``RETURNING id`` and no wake-up) run by bare psycopg, one connection per
  thread: what any client pays to write pgtasks' row, with none of pgtasks' Python
  (no validation, serialisation, pool or wake-up). ``wakeup`` over ``floor`` is what
  the library adds; ``floor`` over ``raw`` is what pgtasks' row and its indexes cost
  against the reference's four columns and one partial index;
* ``raw``: the raw-SQL reference's single-row ``INSERT`` (`benchmarks.systems.raw_system`)
  into its own table, one psycopg connection per thread.

The variants swap the app's `JobStore.insert` flag, `WakeupSender.wake` and
`WakeupSender.leads` on the app's own stores (there is no user-facing switch). Each thread enqueues a few jobs
before the clock starts (connections open, statements prepared); the clock runs
from releasing all threads together to the last one's end, and for ``wakeup`` to
the sender's last send. One connection LISTENs on pgtasks' channel throughout and
drains what arrives, as an idle worker would; no worker claims. Tables are emptied
before each measurement. Prints per producer count the median jobs/s of each
variant, and the ratios wakeup / silent, wakeup / raw, in-commit / silent, floor /
raw and wakeup / floor. It writes no report.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import orjson
import psycopg

import pgtasks
from benchmarks import pg
from benchmarks.environments import compile_project
from benchmarks.probe import add_common_options, positive_ints
from benchmarks.systems.ops import run_threads
from benchmarks.systems.raw_system import INSERT, SCHEMA
from pgtasks.db import NewJob
from pgtasks.settings import Settings
from pgtasks.sql import QUERIES

PRODUCERS = (1, 4, 16, 64)
JOBS = 4_000
VARIANTS = ("wakeup", "in-commit", "silent", "floor", "raw")
QUEUE = "bench"
TASK = "bench.producers.noop"
# What `task.delay()` of the no-op task binds to ``job_insert`` (no wake-up).
FLOOR_PARAMS = {
    "task_name": TASK,
    "queue": "bench",
    "tenant": "",
    "args": "[]",
    "kwargs": "{}",
    "headers": "{}",
    "priority": 0,
    "max_attempts": 4,
    "retry_on_worker_lost": True,
    "notify": False,
}


def measure(dsn: str, variant: str, producers: int, jobs: int) -> float:
    """Enqueue throughput (jobs/s) of ``variant`` with ``producers`` threads."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("TRUNCATE pgtasks.jobs, bench_jobs")
    if variant in {"raw", "floor"}:
        conns = [psycopg.connect(dsn, autocommit=True) for _ in range(producers)]
        try:
            if variant == "floor":
                return run_threads(
                    producers,
                    jobs,
                    lambda i: conns[i].execute(QUERIES["job_insert"], FLOOR_PARAMS).fetchone(),
                )
            args = orjson.dumps({"k": "noop"}).decode()
            return run_threads(producers, jobs, lambda i: conns[i].execute(INSERT, (args,)))
        finally:
            for conn in conns:
                conn.close()
    app = pgtasks.App(
        "bench-producers",
        settings=replace(Settings.from_env(dsn), pool_size=producers, load_entry_points=False),
    )
    try:
        task = app.task(name=TASK, queue=QUEUE)(_noop)
        stores = app.stores
        if variant != "wakeup":
            stores.wakeups.wake = _no_wakeup  # type: ignore[method-assign]
            stores.wakeups.leads = _never_leads  # type: ignore[method-assign]
        if variant == "in-commit":
            stores.jobs.insert = partial(_insert_notifying, stores.jobs.insert)  # type: ignore[method-assign]
        rate = run_threads(producers, jobs, lambda i: task.delay())
        if variant == "wakeup":  # the last wake-ups are part of the work
            started = time.perf_counter()
            stores.wakeups.flush()
            rate = jobs / (jobs / rate + time.perf_counter() - started)
        return rate
    finally:
        app.close()


def _no_wakeup(queue: str, job_id: int | None = None) -> None:
    """The sender switched off."""


def _never_leads() -> bool:
    """No enqueue notifies in its own commit as the first after a quiet spell."""
    return False


def _insert_notifying(
    insert: Callable[..., int], job: NewJob, *, conn: Any = None, notify: bool = True
) -> int:
    """`JobStore.insert` with the wake-up always inside the INSERT's own commit."""
    return insert(job, conn=conn, notify=True)


def _noop() -> None:
    """The task enqueued (never run: no worker claims here)."""


class _Listener:
    """One connection LISTENing on ``pgtasks_jobs``, drained in a thread until stopped."""

    def __init__(self, dsn: str) -> None:
        self._conn = psycopg.connect(dsn, autocommit=True)
        self._conn.execute("LISTEN pgtasks_jobs")
        self._stop = threading.Event()
        self.received = 0
        self._thread = threading.Thread(target=self._run, name="listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for _ in self._conn.notifies(timeout=0.2):
                self.received += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()


def run(admin_dsn: str, counts: Sequence[int], jobs: int, reps: int) -> dict[tuple[str, int], list[float]]:
    """Every (variant, producer count), interleaved, ``reps`` times; jobs/s per repetition."""
    results: dict[tuple[str, int], list[float]] = {(v, n): [] for n in counts for v in VARIANTS}
    for rep in range(reps):
        name = f"bench_producers_{os.getpid()}_{rep}"
        dsn = pg.create_database(admin_dsn, name)
        try:
            setup = pgtasks.App("bench-producers", dsn=dsn, load_entry_points=False)
            setup.migrate()
            setup.close()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(SCHEMA)
            listener = _Listener(dsn)
            try:
                for producers in counts:
                    for variant in VARIANTS:
                        results[(variant, producers)].append(measure(dsn, variant, producers, jobs))
            finally:
                listener.close()
        finally:
            pg.drop_database(admin_dsn, name)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, measure, print one line per producer count; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.producers", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument(
        "--producers", default=",".join(str(n) for n in PRODUCERS), help="comma-separated thread counts"
    )
    parser.add_argument("--jobs", type=int, default=JOBS, help="jobs per measurement (default %(default)s)")
    add_common_options(parser)
    args = parser.parse_args(argv)
    counts = positive_ints(parser, "--producers", args.producers)
    if args.reps < 1:
        parser.error("--reps must be >= 1")
    if args.jobs < counts[-1]:
        parser.error(f"--jobs must be at least the largest producer count ({counts[-1]}), got {args.jobs}")
    compile_project()
    results = run(args.dsn, counts, args.jobs, args.reps)
    print(f"enqueue, one call per job, {args.jobs:,} jobs per run, {args.reps} repetitions, medians")
    for producers in counts:
        runs = {v: results[(v, producers)] for v in VARIANTS}
        medians = {v: statistics.median(r) for v, r in runs.items()}
        cells = "  ".join(f"{v} {medians[v]:,.0f} ({min(r):,.0f}-{max(r):,.0f})" for v, r in runs.items())
        print(
            f"{producers:>3} producers: jobs/s {cells};"
            f" wakeup/silent {medians['wakeup'] / medians['silent']:.2f}x"
            f" wakeup/raw {medians['wakeup'] / medians['raw']:.2f}x"
            f" in-commit/silent {medians['in-commit'] / medians['silent']:.2f}x"
            f" floor/raw {medians['floor'] / medians['raw']:.2f}x"
            f" wakeup/floor {medians['wakeup'] / medians['floor']:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
