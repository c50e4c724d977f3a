"""The ``pgtasks`` command line (click): ``pgtasks -A module:app COMMAND ...``.

Sub-commands live in one module each and are listed in `COMMANDS`, imported only
when run or listed in ``--help`` (a worker process loads the worker command and
nothing of the others); plugins add theirs through the ``pgtasks_add_commands``
hook.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from pgtasks.cli.common import PROCESS_ENTRY_KEY, AppLoader, configure_logging, shown
from pgtasks.cli.plugins_cmd import PluginCommandGroup
from pgtasks.errors import PgtasksError

__all__ = ["COMMANDS", "cli", "main"]

# name -> "module:attribute" of the click command; `PluginCommandGroup` imports on first use.
COMMANDS: dict[str, str] = {
    "migrate": "pgtasks.cli.migrate_cmd:migrate_command",
    "worker": "pgtasks.cli.worker_cmd:worker_command",
    "jobs": "pgtasks.cli.jobs_cmd:jobs_group",
    "queues": "pgtasks.cli.jobs_cmd:queues_command",
    "stats": "pgtasks.cli.jobs_cmd:queues_command",
    "workers": "pgtasks.cli.jobs_cmd:workers_command",
    "purge": "pgtasks.cli.jobs_cmd:purge_command",
    "embedded": "pgtasks.cli.embedded_cmd:embedded_group",
    "scheduler": "pgtasks.cli.schedules_cmd:scheduler_command",
    "schedules": "pgtasks.cli.schedules_cmd:schedules_group",
    "plugins": "pgtasks.cli.plugins_cmd:plugins_command",
    "dashboard": "pgtasks.cli.dashboard_cmd:dashboard_command",
    "check": "pgtasks.cli.check_cmd:check_command",
    "rls": "pgtasks.cli.rls_cmd:rls_group",
    "tenants": "pgtasks.cli.tenants_cmd:tenants_group",
}


@click.group(
    cls=PluginCommandGroup,
    lazy_commands=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option(
    "-A",
    "--app",
    "app_spec",
    envvar="PGTASKS_APP",
    metavar="MODULE:ATTR",
    help="The app to load, as in Celery (e.g. proj.tasks:app). Env: PGTASKS_APP.",
)
@click.option(
    "--dsn",
    envvar="PGTASKS_DSN",
    default=None,
    help="PostgreSQL DSN (default: PGTASKS_DSN, DATABASE_URL, else the embedded server).",
)
@click.option(
    "--read-dsn",
    envvar="PGTASKS_READ_DSN",
    default=None,
    help="DSN of a replica for the read-only commands (jobs list/show, queues, workers, metrics, dashboard). "
    "Env: PGTASKS_READ_DSN.",
)
@click.option(
    "--plugin", "plugins", multiple=True, metavar="MODULE", help="Load a plugin module (repeatable)."
)
@click.option(
    "-l",
    "--loglevel",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.pass_context
def cli(
    ctx: click.Context,
    app_spec: str | None,
    dsn: str | None,
    read_dsn: str | None,
    plugins: tuple[str, ...],
    loglevel: str,
) -> None:
    """pgtasks: background tasks on PostgreSQL."""
    configure_logging(loglevel)
    if ctx.obj == PROCESS_ENTRY_KEY:  # set by main(), see there
        ctx.meta[PROCESS_ENTRY_KEY] = True
    loader = AppLoader(app_spec=app_spec, dsn=dsn, plugins=plugins, read_dsn=read_dsn)
    ctx.obj = loader
    ctx.call_on_close(loader.close)  # also when click runs inside another program (CliRunner)


def main(argv: list[str] | None = None) -> Any:
    """Entry point of the ``pgtasks`` script.

    Exit codes: 0 success; 1 a pgtasks error (message on stderr, no traceback);
    2 usage error; 130 forced stop by a second signal.
    """
    try:
        # The context object marks this as the process's entry point (PROCESS_ENTRY_KEY).
        return cli.main(args=argv, prog_name="pgtasks", standalone_mode=True, obj=PROCESS_ENTRY_KEY)
    except PgtasksError as exc:  # raised outside click's own handling
        logging.getLogger("pgtasks").debug("error", exc_info=True)
        click.echo(f"Error: {shown(exc)}", err=True)
        sys.exit(1)
