"""What the single-purpose probes share (``benchmarks.idle``, ``benchmarks.tenants``,
``benchmarks.producers``).

Each probe measures one setting at a time (a queue depth, a tenant count) in a fresh
database, all settings in turn per repetition, and prints medians; it writes no report.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence

from benchmarks.cli import DEFAULT_DSN


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--reps`` (repetitions, default 3) and ``--dsn`` (the admin DSN of the server)."""
    parser.add_argument("--reps", type=int, default=3, help="repetitions (default %(default)s)")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="admin DSN of the PostgreSQL to use")


def positive_ints(parser: argparse.ArgumentParser, option: str, text: str) -> list[int]:
    """The distinct integers of the comma-separated ``text``, ascending.

    Exits through ``parser.error`` (status 2, naming ``option``) when an item is not
    an integer, or none is given, or one is below 1.
    """
    try:
        values = sorted({int(item) for item in text.split(",") if item.strip()})
    except ValueError:
        parser.error(f"{option} must be comma-separated integers, got {text!r}")
    if not values or values[0] < 1:
        parser.error(f"{option} must be integers >= 1, got {text!r}")
    return values


def require_positive(parser: argparse.ArgumentParser, args: argparse.Namespace, *options: str) -> None:
    """Exit through ``parser.error`` (status 2, naming the option) when one of the integer
    ``options`` (attribute names of ``args``, ``--name`` on the command line) is below 1."""
    for option in options:
        if getattr(args, option) < 1:
            parser.error(f"--{option} must be >= 1")


def print_against_raw(results: dict[str, list[float]], width: int = 8) -> None:
    """One line per variant: its median jobs/s, range and ratio to the ``raw`` variant's median."""
    medians = {variant: statistics.median(runs) for variant, runs in results.items()}
    for variant, runs in results.items():
        print(
            f"{variant:>{width}}: {medians[variant]:>9,.0f} jobs/s ({min(runs):,.0f}-{max(runs):,.0f}),"
            f" {medians[variant] / medians['raw']:.2f}x raw"
        )


def interleaved(
    settings: Sequence[int], reps: int, measure: Callable[[int, int], float]
) -> dict[int, list[float]]:
    """``measure(setting, rep)`` for every setting in turn, ``reps`` times (A B A B ...).

    Interleaving spreads the host's drift over every setting alike. Returns each
    setting's results in repetition order.
    """
    results: dict[int, list[float]] = {setting: [] for setting in settings}
    for rep in range(reps):
        for setting in settings:
            results[setting].append(measure(setting, rep))
    return results
