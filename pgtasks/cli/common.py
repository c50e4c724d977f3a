"""What every command shares: the app loader, error display (`pgtasks.plugin_api.fail`), rich tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgtasks.loader import AppLoader, configure_logging, load_app
from pgtasks.plugin_api import fail

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


def new_table(*columns: str, **options: Any) -> Table:
    """A ``rich`` table; rich is imported here, on first use, so a worker process never loads it (~2 MiB)."""
    from rich.table import Table

    return Table(*columns, **options)


def new_console() -> Console:
    """A ``rich`` console on stdout (imported on first use, as `new_table`)."""
    from rich.console import Console

    return Console()
