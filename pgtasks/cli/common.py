"""What every command shares: the app loader (`pgtasks.loader`), error display, rich tables."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from pgtasks.errors import PgtasksError
from pgtasks.loader import AppLoader, configure_logging, load_app

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = [
    "PROCESS_ENTRY_KEY",
    "AppLoader",
    "configure_logging",
    "fail",
    "load_app",
    "new_console",
    "new_table",
]

#: ``click.Context.meta`` key, true when the command line is this process's entry point
#: (`pgtasks.cli.main`) rather than called inside another program (click's ``CliRunner``):
#: only then may ``pgtasks worker`` replace the process image (`pgtasks.worker.launch`).
PROCESS_ENTRY_KEY = "pgtasks.process_entry"


def fail(exc: PgtasksError) -> None:
    """Print a pgtasks error without a traceback and exit 1."""
    click.echo(f"Error: {exc}", err=True)
    sys.exit(1)


def new_table(*columns: str, **options: Any) -> Table:
    """A ``rich`` table; rich is imported here, on first use, so a worker process never loads it (~2 MiB)."""
    from rich.table import Table

    return Table(*columns, **options)


def new_console() -> Console:
    """A ``rich`` console on stdout (imported on first use, as `new_table`)."""
    from rich.console import Console

    return Console()
