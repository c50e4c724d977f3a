"""``python -m benchmarks run [--quick] [--systems ...] [--dsn DSN] [--out PATH] [--n N]``.

``python -m benchmarks report [--json PATH] [--out PATH]`` writes the report again from
a run's numbers, for instance after an edit of benchmarks/analysis.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks import report
from benchmarks.environments import REPO_ROOT
from benchmarks.registry import KNOWN_SYSTEMS
from benchmarks.runner import RunConfig, run
from benchmarks.sizes import FULL, QUICK

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS = "redis://127.0.0.1:6379/9"
DEFAULT_OUT = REPO_ROOT / "docs" / "benchmarks.md"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="measure every figure and write the report")
    run_parser.add_argument("--quick", action="store_true", help="small sizes (a few minutes)")
    run_parser.add_argument(
        "--systems",
        default=",".join(KNOWN_SYSTEMS),
        help=f"comma-separated subset of {','.join(KNOWN_SYSTEMS)} (default: all)",
    )
    run_parser.add_argument("--dsn", default=DEFAULT_DSN, help="admin DSN of the PostgreSQL to use")
    run_parser.add_argument(
        "--redis-url",
        default=DEFAULT_REDIS,
        help="Redis database for Celery's broker; it is FLUSHDB'd (default %(default)s)",
    )
    run_parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Markdown report path")
    run_parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="raw numbers (default: next to --out as <name>.json)",
    )
    run_parser.add_argument(
        "--n", type=int, default=None, help="one-call enqueue count; every other count scales with it"
    )
    run_parser.add_argument("--reps", type=int, default=3, help="repetitions (default %(default)s)")
    run_parser.add_argument(
        "--no-install", action="store_true", help="skip peers whose virtual environment is not installed yet"
    )
    report_parser = commands.add_parser(
        "report", help="write the report again from a run's numbers (after editing benchmarks/analysis.md)"
    )
    report_parser.add_argument(
        "--json",
        type=Path,
        default=DEFAULT_OUT.with_suffix(".json"),
        help="numbers written by a run (default: docs/benchmarks.json, the committed report's)",
    )
    report_parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Markdown report path")
    return parser


def _rewrite_report(json_path: Path, markdown_path: Path) -> int:
    """Render ``markdown_path`` (and its charts) from the numbers a run wrote to ``json_path``."""
    try:
        results = json.loads(json_path.read_text())
    except (OSError, ValueError) as exc:
        print(f"cannot read the run's numbers from {json_path}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(results, dict) or not isinstance(results.get("systems"), dict):
        print(f"{json_path} does not hold a benchmark run's numbers", file=sys.stderr)
        return 2
    results.pop("summary", None)  # derived; computed again from the runs
    report.write_markdown(results, markdown_path)
    print(f"report: {markdown_path}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run, write the report; return the process exit code."""
    args = _parser().parse_args(argv)
    if args.command == "report":
        return _rewrite_report(args.json, args.out)
    systems = tuple(s.strip() for s in args.systems.split(",") if s.strip())
    unknown = [s for s in systems if s not in KNOWN_SYSTEMS]
    if unknown:
        print(f"unknown systems: {', '.join(unknown)} (known: {', '.join(KNOWN_SYSTEMS)})", file=sys.stderr)
        return 2
    if args.reps < 1:
        print("--reps must be at least 1", file=sys.stderr)
        return 2
    sizes = QUICK if args.quick else FULL
    if args.n is not None:
        try:
            sizes = sizes.scaled(args.n)
        except ValueError as exc:
            print(str(exc), file=sys.stderr)
            return 2
    json_path = args.json if args.json is not None else args.out.with_suffix(".json")
    command = "python -m benchmarks " + shlex.join(list(argv if argv is not None else sys.argv[1:]))
    config = RunConfig(
        dsn=args.dsn,
        redis_url=args.redis_url,
        systems=systems,
        sizes=sizes,
        mode="quick" if args.quick else "full",
        reps=args.reps,
        command=command,
        install=not args.no_install,
    )
    # SIGTERM unwinds like Ctrl-C, so running drivers are killed and databases dropped.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    results = run(config)
    report.write(results, args.out, json_path)
    print(f"report: {args.out}\nnumbers: {json_path}", file=sys.stderr)
    return 0
