"""``manage.py pgtasks ARGS...``: the pgtasks command line on the project's app.

Everything after ``pgtasks`` goes to the ``pgtasks`` command (`pgtasks.cli`) with
``-A pgtasks.contrib.django:app``: ``manage.py pgtasks worker``, ``manage.py pgtasks
jobs list --tenant acme``, ``manage.py pgtasks migrate``, ``manage.py pgtasks
schedules trigger nightly``. ``worker`` without ``-Q`` serves ``PGTASKS["QUEUES"]``.
The DSN is the app's (`pgtasks.contrib.django.get_app`); ``--dsn`` or ``PGTASKS_DSN``
still win, as for the plain command.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pgtasks.contrib.django import APP_SPEC
from pgtasks.contrib.django.core import get_app, loaded_settings
from pgtasks.errors import PgtasksError
from pgtasks.loader import shown

_QUEUE_FLAGS = ("-Q", "--queues")
_SERVING = ("worker",)


def pgtasks_argv(args: list[str]) -> list[str]:
    """The ``pgtasks`` command line for ``manage.py pgtasks ARGS``: ``-A`` the Django app
    (unless ``ARGS`` name one), and ``-Q PGTASKS["QUEUES"]`` for a worker given none.

    Raises:
        ConfigurationError: a bad ``PGTASKS`` setting.
    """
    argv = list(args)
    if (
        argv
        and argv[0] in _SERVING
        and not any(a in _QUEUE_FLAGS or a.startswith(("--queues=", "-Q")) for a in argv[1:])
    ):
        argv[1:1] = ["-Q", ",".join(loaded_settings().queues)]
    if not any(a in ("-A", "--app") or a.startswith("--app=") for a in argv):
        argv = ["-A", APP_SPEC, *argv]
    return argv


class Command(BaseCommand):
    """Runs the ``pgtasks`` command line (see the module docstring)."""

    help = "Run the pgtasks command line on this project's app (manage.py pgtasks --help)."

    def add_arguments(self, parser: CommandParser) -> None:
        """One catch-all argument: the pgtasks command line."""
        parser.add_argument("args", nargs=argparse.REMAINDER, help="pgtasks sub-command and options")

    def run_from_argv(self, argv: list[str]) -> None:
        """From ``manage.py``: hand the raw arguments to pgtasks' own entry point (its
        exit code becomes the process's; a worker may replace the process, as
        ``pgtasks worker`` does)."""
        from pgtasks.cli import main

        get_app()  # Django is set up here: a settings mistake shows before pgtasks starts
        main(pgtasks_argv(argv[2:]))

    def handle(self, *args: str, **options: Any) -> None:
        """From ``call_command("pgtasks", ...)``: run the command line inside this process.

        Raises:
            CommandError: pgtasks reported an error or exited non-zero.
        """
        import click

        from pgtasks.cli import cli

        get_app()
        try:
            cli.main(args=pgtasks_argv(list(args)), prog_name="manage.py pgtasks", standalone_mode=False)
        except PgtasksError as exc:
            raise CommandError(shown(exc)) from exc
        except click.exceptions.Exit as exc:
            if exc.exit_code:
                raise CommandError(f"pgtasks exited with status {exc.exit_code}") from exc
        except SystemExit as exc:  # a command's own exit (`pgtasks.plugin_api.fail`)
            if exc.code:
                raise CommandError(f"pgtasks exited with status {exc.code}") from exc
        except click.ClickException as exc:
            exc.show(file=sys.stderr)
            raise CommandError(shown(exc.format_message())) from exc
        except click.Abort as exc:
            raise CommandError("aborted") from exc
