"""Does ``pgtasks.jobs`` stay the same size under steady load with retention on?

``python -m benchmarks.retention [--duration 600] [--dsn ADMIN_DSN] [--workers 2] [--concurrency 2]
[--keep 30] [--interval 10] [--probe-jobs 200000] [--fraction 0.5] [--tune-autovacuum]
[--vacuum-every SECONDS]``

1. Maximum throughput: in a database of its own, ``--workers`` worker processes run
   ``--probe-jobs`` no-op jobs that one producer enqueues as fast as it can, in
   ``delay_many`` calls of `TICK_BATCH` (as the run's producer does, so the figure
   includes what enqueueing costs the machine); jobs per second from the first
   enqueue to the last job finished.
2. The run: in a fresh database, the same workers run with the retention policy on
   (succeeded and cancelled jobs kept ``--keep`` seconds, failed ones twice that, a
   pass every ``--interval`` seconds, through the ``PGTASKS_RETENTION*`` variables
   as an operator sets them) while one producer enqueues at ``--fraction`` (half)
   of the maximum throughput for ``--duration`` seconds (every 0.1 s, a ``delay_many`` of the jobs
   due by then; one job in 20 fails with ``Reject``, so failed jobs are kept
   longer beside the successes).
3. Every 10 s it prints ``pg_total_relation_size('pgtasks.jobs')`` (table, indexes
   and TOAST), its rows, the backlog and the jobs finished so far. After the
   warm-up (the longest keep time plus two passes: by then jobs are deleted as fast
   as they finish) the size is called flat when its largest sample is at most 20%
   above its smallest and the last sample is not the largest by more than 10% over
   the first. It also says whether the workers kept up (the backlog of queued and
   running jobs, which are rows of the table too, did not grow over the window).

Autovacuum runs with the server's settings unless ``--tune-autovacuum`` applies
those docs/operations.md ("Retention") recommends for ``pgtasks.jobs``. On a server
whose ``autovacuum`` is off (only there, unless ``--vacuum-every`` says otherwise) a
thread runs a plain ``VACUUM pgtasks.jobs`` every 30 s in its place, as an operator
of such a server must (docs/operations.md), and says so. Nothing is analysed or
warmed by hand. The databases are dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg

import pgtasks
from benchmarks import pg
from pgtasks.errors import Reject

QUEUE = "bench-retention"
SAMPLE_EVERY = 10.0
TICK = 0.1  # seconds between the producer's batches
TICK_BATCH = 1000  # jobs per delay_many call of the throughput probe
FAIL_EVERY = 20  # one job in this many fails (kept longer by the policy)
FLAT_SPREAD = 1.2  # largest steady sample / smallest
FLAT_DRIFT = 1.1  # last steady sample / first
AUTOVACUUM = (
    "ALTER TABLE pgtasks.jobs SET (autovacuum_vacuum_scale_factor = 0.01, "
    "autovacuum_vacuum_insert_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.02, "
    "autovacuum_vacuum_cost_delay = 0)"
)

# The workers load this module with -A benchmarks.retention:app (the DSN from BENCH_DSN;
# the retention policy from the PGTASKS_RETENTION* variables this script sets for them).
app = pgtasks.App("bench-retention", dsn=os.environ.get("BENCH_DSN"), load_entry_points=False)


@app.task(name="bench_retention", queue=QUEUE, max_retries=0)
def bench_retention(fail: bool) -> None:
    """A no-op job, or a planned failure."""
    if fail:
        raise Reject("a planned failure")


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample of the run."""

    at: float  # seconds since the producer started
    size: int  # pg_total_relation_size('pgtasks.jobs'), bytes
    rows: int
    backlog: int  # queued and running jobs
    enqueued: int
    deleted: int  # enqueued minus rows: what retention removed


def _worker_command(concurrency: int) -> list[str]:
    return [
        sys.executable, "-m", "pgtasks", "-A", "benchmarks.retention:app", "-l", "WARNING", "worker",
        "-Q", QUEUE, "-c", str(concurrency), "--prefetch-multiplier", "32",
    ]  # fmt: skip


class Fleet:
    """Worker processes with their logs in ``log_dir``, stopped by `stop`."""

    def __init__(self, dsn: str, count: int, concurrency: int, env: dict[str, str], log_dir: Path) -> None:
        full_env = {**os.environ, **env, "BENCH_DSN": dsn, "PGTASKS_DSN": dsn}
        full_env["PGTASKS_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        self.logs = [log_dir / f"worker-{i}.log" for i in range(count)]
        self.processes = []
        for path in self.logs:
            with path.open("ab") as log:
                self.processes.append(
                    subprocess.Popen(_worker_command(concurrency), env=full_env, stdout=log, stderr=log)
                )

    def check(self) -> None:
        for process, log in zip(self.processes, self.logs, strict=True):
            if process.poll() is not None:
                tail = log.read_text(errors="replace")[-800:]
                raise SystemExit(f"a worker exited with code {process.returncode}: {tail}")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def _one(conn: psycopg.Connection[tuple[int, ...]], query: str) -> int:
    row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def _wait_registered(conn: psycopg.Connection[tuple[int, ...]], fleet: Fleet, count: int) -> None:
    deadline = time.monotonic() + 60
    while _one(conn, "SELECT count(*) FROM pgtasks.workers") < count:
        fleet.check()
        if time.monotonic() > deadline:
            raise SystemExit("the workers did not register within 60 s")
        time.sleep(0.1)


def probe(admin_dsn: str, args: argparse.Namespace, log_dir: Path) -> float:
    """Jobs per second the workers finish from a full queue (retention off)."""
    name = f"bench_retention_probe_{os.getpid()}"
    dsn = pg.create_database(admin_dsn, name)
    try:
        client = pgtasks.App("bench-retention-probe", dsn=dsn, load_entry_points=False)
        task = client.task(name="bench_retention", queue=QUEUE, max_retries=0)(bench_retention.fn)
        client.migrate()
        fleet = Fleet(dsn, args.workers, args.concurrency, {"PGTASKS_RETENTION": "off"}, log_dir)
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                _wait_registered(conn, fleet, args.workers)
                started = time.monotonic()
                for start in range(0, args.probe_jobs, TICK_BATCH):
                    task.delay_many([(False,)] * min(TICK_BATCH, args.probe_jobs - start))
                finished = "SELECT count(*) FROM pgtasks.jobs WHERE finished_at IS NOT NULL"
                while _one(conn, finished) < args.probe_jobs:
                    fleet.check()
                    time.sleep(0.05)
                elapsed = time.monotonic() - started
        finally:
            fleet.stop()
            client.close()
    finally:
        pg.drop_database(admin_dsn, name)
    return float(args.probe_jobs) / elapsed


def produce(
    task: pgtasks.Task, rate: float, duration: float, counter: list[int], stop: threading.Event
) -> None:
    """Enqueue ``rate`` jobs per second for ``duration`` seconds, in a batch every `TICK`."""
    started = time.monotonic()
    sent = 0
    while not stop.is_set():
        elapsed = time.monotonic() - started
        if elapsed >= duration:
            return
        due = int(rate * elapsed)
        if due > sent:
            task.delay_many([((sent + i) % FAIL_EVERY == 0,) for i in range(due - sent)])
            sent = due
            counter[0] = sent
        stop.wait(TICK)


def vacuum(dsn: str, every: float, stop: threading.Event, count: list[int]) -> None:
    """``VACUUM pgtasks.jobs`` every ``every`` seconds until ``stop`` (a server without autovacuum)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.wait(every):
            conn.execute("VACUUM pgtasks.jobs")
            count[0] += 1


def run(admin_dsn: str, args: argparse.Namespace, rate: float, log_dir: Path) -> list[Sample]:
    """The measured run; its samples."""
    name = f"bench_retention_{os.getpid()}"
    dsn = pg.create_database(admin_dsn, name)
    samples: list[Sample] = []
    try:
        client = pgtasks.App("bench-retention-client", dsn=dsn, load_entry_points=False)
        task = client.task(name="bench_retention", queue=QUEUE, max_retries=0)(bench_retention.fn)
        client.migrate()
        env = {
            "PGTASKS_RETENTION": "on",
            "PGTASKS_RETENTION_SUCCEEDED": f"{args.keep}s",
            "PGTASKS_RETENTION_CANCELLED": f"{args.keep}s",
            "PGTASKS_RETENTION_FAILED": f"{2 * args.keep}s",
            "PGTASKS_RETENTION_PARTIAL_FAILURE": f"{2 * args.keep}s",
            "PGTASKS_RETENTION_INTERVAL": f"{args.interval}s",
        }
        with psycopg.connect(dsn, autocommit=True) as conn:
            if args.tune_autovacuum:
                conn.execute(AUTOVACUUM)
            fleet = Fleet(dsn, args.workers, args.concurrency, env, log_dir)
            stop = threading.Event()
            counter = [0]
            producer = threading.Thread(target=produce, args=(task, rate, args.duration, counter, stop))
            vacuums = [0]
            vacuumer = threading.Thread(target=vacuum, args=(dsn, args.vacuum_every, stop, vacuums))
            try:
                _wait_registered(conn, fleet, args.workers)
                started = time.monotonic()
                producer.start()
                if args.vacuum_every:
                    vacuumer.start()
                columns = ("rows", "backlog", "enqueued", "deleted")
                print(f"{'t (s)':>6} {'size (MiB)':>11} " + " ".join(f"{c:>9}" for c in columns))
                next_sample = started
                while True:
                    now = time.monotonic()
                    if now >= next_sample:
                        fleet.check()
                        size = _one(conn, "SELECT pg_total_relation_size('pgtasks.jobs')")
                        rows = _one(conn, "SELECT count(*) FROM pgtasks.jobs")
                        backlog = _one(conn, "SELECT count(*) FROM pgtasks.jobs WHERE finished_at IS NULL")
                        s = Sample(now - started, size, rows, backlog, counter[0], counter[0] - rows)
                        samples.append(s)
                        print(
                            f"{s.at:6.0f} {s.size / 2**20:11.2f} {s.rows:9d} {s.backlog:8d} "
                            f"{s.enqueued:9d} {max(0, s.deleted):9d}",
                            flush=True,
                        )
                        if s.at >= args.duration - 0.5:
                            break
                        next_sample += SAMPLE_EVERY
                    time.sleep(max(0.0, min(next_sample - time.monotonic(), 1.0)))
            finally:
                stop.set()
                producer.join()
                if vacuumer.is_alive():
                    vacuumer.join()
                    print(f"(ran VACUUM pgtasks.jobs {vacuums[0]} times)")
                fleet.stop()
                client.close()
    finally:
        pg.drop_database(admin_dsn, name)
    return samples


def verdict(samples: Sequence[Sample], warmup: float) -> tuple[bool, str]:
    """Whether the size stayed flat after ``warmup`` seconds, and the figures that say so."""
    steady = [s for s in samples if s.at >= warmup]
    if len(steady) < 2:
        return False, f"too short: fewer than two samples after the {warmup:.0f} s warm-up"
    sizes = [s.size for s in steady]
    spread = max(sizes) / min(sizes)
    drift = sizes[-1] / sizes[0]
    flat = spread <= FLAT_SPREAD and drift <= FLAT_DRIFT
    text = (
        f"after {warmup:.0f} s: {len(steady)} samples, size {min(sizes) / 2**20:.2f} to "
        f"{max(sizes) / 2**20:.2f} MiB (max/min {spread:.2f}, last/first {drift:.2f}), "
        f"median {statistics.median(sizes) / 2**20:.2f} MiB, rows {min(s.rows for s in steady)} to "
        f"{max(s.rows for s in steady)}"
    )
    first, last = steady[0], steady[-1]
    finished = (last.enqueued - last.backlog - first.enqueued + first.backlog) / (last.at - first.at)
    kept_up = last.backlog <= max(first.backlog * 1.2, 1000)
    text += (
        f"\nbacklog {first.backlog} -> {last.backlog} jobs; finished {finished:.0f} jobs/s over the window: "
        + ("the workers kept up" if kept_up else "the workers did NOT keep up at this rate")
    )
    return flat, text


def main(argv: list[str] | None = None) -> int:
    """Run the probe and the measured run; print the samples and the verdict.

    Exit status 0 when the size stayed flat, 1 when it did not.
    """
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.retention", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of the run (default 600)")
    parser.add_argument("--dsn", default=os.environ.get("PGTASKS_TEST_DSN") or os.environ.get("PGTASKS_DSN"))
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--concurrency", type=int, default=2, help="threads per worker (default 2)")
    parser.add_argument(
        "--keep", type=float, default=30.0, help="seconds succeeded jobs are kept (default 30)"
    )
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between passes (default 10)")
    parser.add_argument("--probe-jobs", type=int, default=200_000, help="jobs of the throughput probe")
    parser.add_argument("--fraction", type=float, default=0.5, help="of the maximum throughput (default 0.5)")
    parser.add_argument(
        "--tune-autovacuum", action="store_true", help="apply the documented autovacuum settings"
    )
    parser.add_argument(
        "--vacuum-every",
        type=float,
        default=None,
        help="run VACUUM pgtasks.jobs every this many seconds (default: 30 if the server's autovacuum "
        "is off, else never; 0: never)",
    )
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: the workers are stopped and the databases dropped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if not args.dsn:
        parser.error("give --dsn (a role that may create databases), or set PGTASKS_TEST_DSN or PGTASKS_DSN")
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
        autovacuum = row is not None and row[0] == "on"
    if args.vacuum_every is None:
        args.vacuum_every = 0.0 if autovacuum else 30.0
    with tempfile.TemporaryDirectory(prefix="bench-retention-") as logs:
        log_dir = Path(logs)
        maximum = probe(args.dsn, args, log_dir)
        rate = maximum * args.fraction
        print(
            f"maximum throughput {maximum:.0f} jobs/s; running at {rate:.0f} jobs/s for {args.duration:.0f} s"
        )
        print(
            f"retention: succeeded/cancelled kept {args.keep:g} s, failed {2 * args.keep:g} s, "
            f"a pass every {args.interval:g} s; autovacuum {'on' if autovacuum else 'OFF'} on this server"
            f"{' (pgtasks.jobs tuned as documented)' if args.tune_autovacuum else ''}"
        )
        if args.vacuum_every:
            print(f"VACUUM pgtasks.jobs every {args.vacuum_every:g} s by this script (autovacuum's stand-in)")
        samples = run(args.dsn, args, rate, log_dir)
    warmup = 2 * args.keep + 2 * args.interval
    flat, text = verdict(samples, warmup)
    print(text)
    print("size stays flat" if flat else "size does NOT stay flat")
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(main())
