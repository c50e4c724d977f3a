"""What every command shares: the app loader, error display, safe output, confirmation.

Safe output: every value a command prints comes from the database or from an app
(task and queue names, tenants, arguments, results, errors, schedule names, worker
ids ...), and is printed literally. `shown` (`pgtasks.loader.shown`, re-exported
here) writes control characters (ESC, BEL,
CR, newlines ...) and the Unicode marks that reorder or hide text as visible
escapes (``\\x1b``), so a value cannot move the cursor, clear the screen or forge
a line; `new_console` gives the ``rich`` console every command prints tables with,
which reads no markup (``[red]``, ``[link=...]``) and no emoji codes in what it is
given, and passes every string through `shown`. Lines written with ``click.echo``
pass their values through `shown`.

Confirmation: a command that deletes or stops something takes `confirm_options`
(``--yes``, ``--dry-run``) and calls `confirm` before it acts.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from pgtasks.loader import AppLoader, configure_logging, load_app, shown
from pgtasks.plugin_api import fail
from pgtasks.redaction import Redactor

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from pgtasks.app import App

__all__ = [
    "PROCESS_ENTRY_KEY",
    "AppLoader",
    "FiniteFloatRange",
    "configure_logging",
    "confirm",
    "confirm_options",
    "fail",
    "interactive",
    "lines",
    "load_app",
    "new_console",
    "new_table",
    "shown",
    "task_redactor",
    "warn_if_rows_hidden",
]

#: ``click.Context.meta`` key, true when the command line is this process's entry point
#: (`pgtasks.cli.main`) rather than called inside another program (click's ``CliRunner``):
#: only then may ``pgtasks worker`` replace the process image (`pgtasks.worker.launch`).
PROCESS_ENTRY_KEY = "pgtasks.process_entry"

F = TypeVar("F", bound=Callable[..., Any])


def task_redactor(app: App, task_name: str) -> Redactor:
    """The masking rules for showing a job or schedule of task ``task_name``
    (`pgtasks.redaction`): its parameter names and ``redact`` when the app knows the
    task, else the built-in names only (a positional argument is then shown, unless
    it sits under a sensitive key inside a value)."""
    task = app.tasks.get(task_name)
    if task is None:
        return Redactor()
    return Redactor.of(task.fn, task.options.redact, bind=task.options.bind)


def new_table(*columns: str, **options: Any) -> Table:
    """A ``rich`` table; rich is imported here, on first use, so a worker process never loads it (~2 MiB).

    Print it with a console from `new_console`: its cells and title are then shown
    literally (see the module's docstring).
    """
    from rich.table import Table

    return Table(*columns, **options)


@functools.cache
def _literal_console_class() -> type[Console]:
    from rich.console import Console

    class LiteralConsole(Console):
        """A console that shows every string it renders literally, through `shown`."""

        def render_str(self, text: str, **options: Any) -> Text:
            return super().render_str(shown(text), **options)

    return LiteralConsole


def new_console(*, stderr: bool = False) -> Console:
    """A ``rich`` console (on stdout, or stderr) that prints what it is given literally.

    It reads no markup (``[bold]``, ``[/]``, ``[link=...]`` are text) and no emoji
    codes, highlights nothing, and shows control characters of every string it
    renders (table cells, titles, printed text) as escapes (`shown`). rich is
    imported on first use, as in `new_table`.
    """
    console_class = _literal_console_class()
    return console_class(stderr=stderr, markup=False, emoji=False, highlight=False)


def lines(values: Iterable[object]) -> Text:
    """A table cell of one line per value, each value shown literally (`shown`): the line
    breaks are the cell's own, never a value's (a newline in a value is shown as ``\\n``)."""
    from rich.text import Text

    return Text("\n".join(shown(value) for value in values))


def confirm_options(command: F) -> F:
    """Add ``-y/--yes`` and ``--dry-run`` to a command that deletes or stops something.

    The command receives them as the boolean parameters ``yes`` and ``dry_run``:
    with ``dry_run`` it prints what it would touch and changes nothing; otherwise
    it calls `confirm` before it acts.
    """
    command = click.option(
        "--dry-run",
        is_flag=True,
        help="Print what would be touched, and change nothing.",
    )(command)
    return click.option(
        "-y",
        "--yes",
        is_flag=True,
        help="Do not ask for confirmation (needed when stdin is not a terminal).",
    )(command)


def confirm(question: str, *, yes: bool) -> None:
    """Go on only if the operator agrees: ``yes`` given, or ``y`` typed at the terminal.

    Args:
        question: what is about to happen, as a question (values in it pass
            through `shown` here).
        yes: ``--yes`` was given: go on without asking.

    Raises:
        click.ClickException: stdin is not a terminal and ``yes`` is false (exit
            status 1, nothing touched; the message names ``--yes`` and ``--dry-run``).
        click.Abort: the operator answered no (exit status 1, "Aborted!").
    """
    if yes:
        return
    if not interactive():
        raise click.ClickException(
            f"refusing without confirmation ({shown(question)}): stdin is not a terminal; "
            "pass --yes to go ahead, or --dry-run to see what would be touched"
        )
    click.confirm(shown(question), abort=True)


def interactive() -> bool:
    """Whether stdin is a terminal, where `confirm` may ask."""
    return sys.stdin is not None and sys.stdin.isatty()


class FiniteFloatRange(click.FloatRange):
    """`click.FloatRange` that also refuses ``nan`` (which compares false with every
    bound, so a plain range lets it through) with click's usage error (exit status 2)."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The number, checked: finite and in the range.

        Raises:
            click.BadParameter: not a number, ``nan``, or out of the range.
        """
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def warn_if_rows_hidden(app: App) -> None:
    """Say on stderr when row-level security hides every tenant's jobs from the
    connecting role (the mode is on and the role is not a fleet role), so that an
    empty listing is not taken for an empty queue. Says nothing when the check itself
    cannot run (no schema yet, a database error: the command reports those)."""
    from pgtasks.errors import PgtasksError

    try:
        sees_all, role = app.stores.isolation.sees_every_row()
    except PgtasksError:
        return
    if not sees_all:
        click.echo(
            f"warning: row-level security is on and role {shown(role)} is not a fleet role: it sees "
            "no tenant's jobs unless the command names one (--tenant), or it connects as a fleet role",
            err=True,
        )
