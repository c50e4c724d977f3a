"""What spreading a backlog over many tenants costs pgtasks' processing.

``python -m benchmarks.tenants [--tenants 1,10,150] [--jobs 30000] [--reps 3] [--dsn ADMIN_DSN]``

For each repetition and tenant count (interleaved), a fresh database gets ``--jobs``
no-op jobs split evenly over that many tenants (``delay_many`` per tenant), and the
processing figure's worker fleet (2 processes, the setting of
``benchmarks/systems/pgtasks_system.py``, tenant-fair claims) drains them, timed
as the processing figure times its drain: from the first completion the tasks
record to the last, confirmed by the finished jobs in the table. Prints per
tenant count the median jobs/s and its ratio to the smallest count's: 1.0 means
a fair claim over many tenants costs no more per job than one over a single
tenant. The peers have no tenants, so only pgtasks runs. It writes no report.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks import pg
from benchmarks.environments import compile_project
from benchmarks.probe import add_common_options, interleaved, positive_ints
from benchmarks.systems.base import Params
from benchmarks.systems.clock import Clock
from benchmarks.systems.drain import wait_processed
from benchmarks.systems.pgtasks_system import PgtasksDriver
from benchmarks.systems.records import NOOP

TENANT_COUNTS = (1, 10, 150)
JOBS = 30_000
DEADLINE_SECONDS = 600.0


def measure(admin_dsn: str, tenants: int, jobs: int, rep: int) -> float:
    """One drain of ``jobs`` jobs spread over ``tenants`` tenants; returns jobs/s."""
    name = f"bench_tenants_{tenants}_{os.getpid()}_{rep}"
    dsn = pg.create_database(admin_dsn, name)
    try:
        with tempfile.TemporaryDirectory() as workdir:
            driver = PgtasksDriver(Params(dsn=dsn, workdir=Path(workdir), deadline=DEADLINE_SECONDS))
            try:
                driver.migrate()
                for i in range(tenants):
                    count = jobs // tenants + (1 if i < jobs % tenants else 0)
                    driver.task.delay_many([(NOOP, 0.0)] * count, tenant=f"t{i:04d}")
                driver.analyze()
                fleet = driver.fleet()
                fleet.start()
                try:
                    drain = wait_processed(driver, fleet, jobs, jobs, Clock(DEADLINE_SECONDS))
                finally:
                    fleet.stop()
            finally:
                driver.close()
    finally:
        pg.drop_database(admin_dsn, name)
    rate = drain.rate()
    if drain.partial or math.isnan(rate):
        raise RuntimeError(f"{drain.done} of {jobs} jobs timed, too few or too late: use more --jobs")
    return rate


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, measure, print one line per tenant count; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tenants", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tenants", default=",".join(str(t) for t in TENANT_COUNTS), help="comma-separated tenant counts"
    )
    parser.add_argument("--jobs", type=int, default=JOBS, help="jobs per drain (default %(default)s)")
    add_common_options(parser)
    args = parser.parse_args(argv)
    counts = positive_ints(parser, "--tenants", args.tenants)
    if args.reps < 1 or args.jobs < counts[-1]:
        parser.error("--reps must be >= 1 and --jobs at least the largest tenant count")
    compile_project()
    results = interleaved(counts, args.reps, lambda tenants, rep: measure(args.dsn, tenants, args.jobs, rep))
    medians = {t: statistics.median(v) for t, v in results.items()}
    print(f"{args.jobs:,} no-op jobs, 2 worker processes, {args.reps} repetitions, medians")
    for tenants, runs in results.items():
        spread = f"{min(runs):,.0f}-{max(runs):,.0f}"
        ratio = f"{medians[tenants] / medians[counts[0]]:.2f}x of {counts[0]}"
        print(f"{tenants:>6,} tenants: {medians[tenants]:9,.0f} jobs/s ({spread}), {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
