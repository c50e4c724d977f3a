"""``python -m chaos --seed N --duration S``: one chaos run; exit 1 on a violation."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from chaos.report import render
from chaos.run import Options, run


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run, print the table; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=1, help="fixes the fault plan and the job stream")
    parser.add_argument("--duration", type=float, default=90.0, help="seconds of faults (default 90)")
    parser.add_argument("--workers", type=int, default=3, help="worker processes on the default queue")
    parser.add_argument("--concurrency", type=int, default=4, help="jobs each worker runs at once")
    parser.add_argument("--rate", type=float, default=4.0, help="jobs enqueued per second")
    parser.add_argument("--tick-slack", type=float, default=1.0, help="seconds a cron run may start late")
    parser.add_argument(
        "--pooler",
        action="store_true",
        help="run the fleet and the producer through PgBouncer in transaction pooling",
    )
    parser.add_argument("--logs", type=Path, default=None, help="keep the processes' logs here")
    args = parser.parse_args(argv)
    if args.duration < 10 or args.workers < 1 or args.concurrency < 1 or args.rate <= 0:
        parser.error("need --duration >= 10, --workers >= 1, --concurrency >= 1, --rate > 0")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    outcome = run(
        Options(
            seed=args.seed,
            duration=args.duration,
            workers=args.workers,
            concurrency=args.concurrency,
            rate=args.rate,
            tick_slack=args.tick_slack,
            log_dir=args.logs,
            pooler=args.pooler,
        )
    )
    print(render(outcome))
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
