"""Throughput through PgBouncer in transaction pooling against direct connections.

``python -m benchmarks.pooler [--jobs 4000] [--workers 2] [--concurrency 32] [--pool 8] [--reps 1]
[--dsn ADMIN_DSN]``

Starts Debian's ``pgbouncer`` (``pool_mode = transaction``, ``default_pool_size =
--pool``) in front of the server of ``--dsn`` (which must let its user in without a
password from 127.0.0.1, as this project's CI server does; as root, PgBouncer runs as
the ``postgres`` user). For each repetition, two variants run in turn, each on a
fresh migrated database holding ``--jobs`` queued no-op jobs:

* ``direct``: ``--workers`` processes of ``pgtasks worker --burst --no-listen -c
  --concurrency`` connect to the server itself;
* ``pooled``: the same processes connect through PgBouncer, so their job threads
  (``--workers`` x ``--concurrency``) share ``--pool`` server connections.

Both run without server-side prepared statements (``PGTASKS_PREPARE_THRESHOLD=off``,
which PgBouncer before 1.21 needs), so the pooler is the only difference. The rate is
jobs over the database-clock span from the first job's start to the last one's end
(process start-up excluded). Prints both medians and the ratio pooled / direct. It
writes no report.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgtasks
from benchmarks import pg
from benchmarks.probe import add_common_options
from chaos.pooler import pgbouncer_bin, running_pgbouncer

REPO = Path(__file__).resolve().parents[1]
APP_SPEC = "benchmarks.pooler:app"
VARIANTS = ("direct", "pooled")

app = pgtasks.App("bench-pooler", load_entry_points=False)


@app.task(name="bench.noop", max_retries=0)
def noop(n: int) -> int:
    """The job each variant runs: nothing, so the figure is pgtasks' and the pooler's."""
    return n


@contextmanager
def pgbouncer(admin_dsn: str, pool: int) -> Iterator[tuple[int, str]]:
    """A PgBouncer in transaction pooling in front of ``admin_dsn``'s server, for its
    user (`chaos.pooler.running_pgbouncer`): (its port, its version line). Exits with a
    message when ``pgbouncer`` is not installed or does not start."""
    if pgbouncer_bin() is None:
        sys.exit("pgbouncer is not installed (apt-get install pgbouncer)")
    server = conninfo_to_dict(admin_dsn)
    with ExitStack() as stack:
        try:
            bouncer = stack.enter_context(
                running_pgbouncer(
                    int(server.get("port") or 5432),
                    server_host=str(server.get("host") or "127.0.0.1"),
                    user=str(server.get("user") or "postgres"),
                    pool_size=pool,
                    max_client_conn=1000,
                )
            )
        except RuntimeError as exc:
            sys.exit(str(exc))
        yield bouncer.port, bouncer.version


def measure(
    admin_dsn: str, bouncer_port: int, variant: str, *, jobs: int, workers: int, concurrency: int
) -> float:
    """Jobs per second of one variant on a fresh database."""
    name = f"bench_pooler_{variant}_{os.getpid()}"
    dsn = pg.create_database(admin_dsn, name)
    try:
        app.use_database(dsn)  # this process only enqueues
        app.migrate()
        noop.delay_many([(n,) for n in range(jobs)])
        app.close()
        target = dsn if variant == "direct" else make_conninfo(dsn, host="127.0.0.1", port=str(bouncer_port))
        env = {
            **os.environ,
            "PGTASKS_DSN": target,
            "PGTASKS_PREPARE_THRESHOLD": "off",
            "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PGTASKS_RETENTION": "off",
        }
        command = [sys.executable, "-m", "pgtasks", "-A", APP_SPEC, "-l", "WARNING", "worker", "--burst"]
        command += ["--no-listen", "-c", str(concurrency), "--poll-interval", "0.1"]
        procs = [subprocess.Popen(command, cwd=REPO, env=env) for _ in range(workers)]
        codes = [p.wait(600) for p in procs]
        if codes != [0] * workers:
            sys.exit(f"{variant}: workers exited {codes}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'succeeded'),"
                " extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM pgtasks.jobs"
            ).fetchone()
        assert row is not None
        done, span = int(row[0]), float(row[1])
        if done != jobs:
            sys.exit(f"{variant}: {done} of {jobs} jobs succeeded")
        return jobs / span
    finally:
        pg.drop_database(admin_dsn, name)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, measure, print one line per variant and the ratio; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.pooler", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--jobs", type=int, default=4000, help="jobs per run (default %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default %(default)s)")
    parser.add_argument(
        "--concurrency", type=int, default=32, help="threads per worker (default %(default)s)"
    )
    parser.add_argument(
        "--pool", type=int, default=8, help="PgBouncer's server connections (default %(default)s)"
    )
    add_common_options(parser)
    parser.set_defaults(reps=1)
    args = parser.parse_args(argv)
    for option in ("jobs", "workers", "concurrency", "pool", "reps"):
        if getattr(args, option) < 1:
            parser.error(f"--{option} must be >= 1")
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with pgbouncer(args.dsn, args.pool) as (port, version):
        for _ in range(args.reps):
            for variant in VARIANTS:
                results[variant].append(
                    measure(
                        args.dsn,
                        port,
                        variant,
                        jobs=args.jobs,
                        workers=args.workers,
                        concurrency=args.concurrency,
                    )
                )
    threads = args.workers * args.concurrency
    print(
        f"{args.jobs:,} no-op jobs, {args.workers} workers x {args.concurrency} threads,"
        f" {args.reps} rep(s), medians"
    )
    direct = statistics.median(results["direct"])
    pooled = statistics.median(results["pooled"])
    print(f"  direct: {direct:8.0f} jobs/s  ({threads} threads, each worker's own pool)")
    print(
        f"  pooled: {pooled:8.0f} jobs/s"
        f"  ({threads} threads through {args.pool} server connections, {version})"
    )
    print(f"  pooled / direct: {pooled / direct:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
