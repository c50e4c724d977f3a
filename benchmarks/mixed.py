"""What each ingredient of the mixed-work figure costs pgtasks' processing.

``python -m benchmarks.mixed [--jobs 20000] [--reps 3] [--dsn ADMIN_DSN]``

The mixed-work figure (`benchmarks.systems.ops.figure_mixed`) spreads its jobs over
150 tenants, fails one in ten once (retried with no delay) and gives another one in
ten a lock key (one key per 10 locked jobs; ``--lock-keys`` sets another count). This
probe drains the same backlog four ways, each in a fresh database, interleaved per
repetition: ``plain`` (150 tenants only), ``retries``
(plus the failing jobs), ``locks`` (plus the lock keys) and ``mixed`` (both: the
figure); and beside them the raw-SQL reference (`benchmarks.systems.raw_system`)
twice: ``raw-plain`` (the same backlog with neither ingredient) and ``raw-mixed``
(both, with the least SQL that does them correctly), so the figure's target (0.6 x
raw's plain processing) can be read against what the work itself costs the
reference. Each drain is the figure's own op, with its checks (every job succeeded,
exactly the failing jobs retried) and the processing figure's worker fleet and
timing. Prints per variant the median jobs/s and its ratio to ``plain``, then the
figure over each raw variant. It writes no report.
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
from benchmarks.probe import add_common_options, interleaved
from benchmarks.sizes import MIXED_TENANTS, mixed_lock_keys
from benchmarks.systems.base import Driver, Params
from benchmarks.systems.clock import Clock
from benchmarks.systems.ops import figure_mixed
from benchmarks.systems.pgtasks_system import PgtasksDriver
from benchmarks.systems.raw_system import RawDriver

# Variant: (driver, retries, lock keys), in the order they run.
VARIANTS: dict[str, tuple[type[Driver], bool, bool]] = {
    "plain": (PgtasksDriver, False, False),
    "retries": (PgtasksDriver, True, False),
    "locks": (PgtasksDriver, False, True),
    "mixed": (PgtasksDriver, True, True),
    "raw-plain": (RawDriver, False, False),
    "raw-mixed": (RawDriver, True, True),
}
JOBS = 20_000
DEADLINE_SECONDS = 600.0
CAP_SECONDS = 120.0


def measure(admin_dsn: str, variant: str, jobs: int, rep: int, lock_keys: int) -> float:
    """One drain of ``jobs`` jobs of ``variant`` (a key of `VARIANTS`) over ``lock_keys``
    distinct lock keys; returns jobs/s.

    Raises:
        RuntimeError: the drain was cut at `CAP_SECONDS` or timed nothing.
        benchmarks.systems.clock.BenchmarkError: the work did not happen as specified.
    """
    driver_cls, retries, locks = VARIANTS[variant]
    name = f"bench_mixed_{variant.replace('-', '_')}_{os.getpid()}_{rep}"
    dsn = pg.create_database(admin_dsn, name)
    try:
        with tempfile.TemporaryDirectory() as workdir:
            driver = driver_cls(Params(dsn=dsn, workdir=Path(workdir), deadline=DEADLINE_SECONDS))
            try:
                driver.migrate()
                result = figure_mixed(
                    driver, Clock(DEADLINE_SECONDS), jobs, tenants=MIXED_TENANTS, lock_keys=lock_keys,
                    cap=CAP_SECONDS, retries=retries, locks=locks,
                )  # fmt: skip
            finally:
                driver.close()
    finally:
        pg.drop_database(admin_dsn, name)
    rate = float(result["process_jobs_per_s"])
    if result["partial"] or math.isnan(rate):
        raise RuntimeError(f"{variant}: {result['jobs_done']} of {jobs} jobs timed, too few or too late")
    return rate


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, measure, print one line per variant; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mixed", description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=JOBS, help="jobs per drain (default %(default)s)")
    parser.add_argument(
        "--lock-keys",
        type=int,
        default=None,
        help="distinct lock keys (default: as the figure, one per 10 locked jobs); "
        "few keys make each a long chain of serial commits",
    )
    add_common_options(parser)
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    if args.jobs < MIXED_TENANTS:
        parser.error(f"--jobs must be at least the tenant count ({MIXED_TENANTS}), got {args.jobs}")
    lock_keys = mixed_lock_keys(args.jobs) if args.lock_keys is None else args.lock_keys
    if lock_keys < 1:
        parser.error(f"--lock-keys must be >= 1, got {lock_keys}")
    compile_project()
    names = list(VARIANTS)
    results = interleaved(
        range(len(names)),
        args.reps,
        lambda index, rep: measure(args.dsn, names[index], args.jobs, rep, lock_keys),
    )
    medians = {names[i]: statistics.median(v) for i, v in results.items()}
    print(
        f"{args.jobs:,} jobs, {MIXED_TENANTS} tenants, {lock_keys:,} lock keys, 2 worker processes, "
        f"{args.reps} repetitions, medians"
    )
    for index, runs in results.items():
        name = names[index]
        spread = f"{min(runs):,.0f}-{max(runs):,.0f}"
        ratio = medians[name] / medians["plain"]
        print(f"{name:>9}: {medians[name]:9,.0f} jobs/s ({spread}), {ratio:.2f}x of plain")
    for reference in ("raw-plain", "raw-mixed"):
        print(f"mixed over {reference}: {medians['mixed'] / medians[reference]:.2f}x")
    print(f"raw-mixed over raw-plain: {medians['raw-mixed'] / medians['raw-plain']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
