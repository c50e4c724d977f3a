"""``pgtasks embedded status|stop``: the local PostgreSQL started when no DSN is set."""

from __future__ import annotations

import click

from pgtasks.cli.common import confirm, confirm_options, interactive, shown
from pgtasks.cli.jsonout import echo_json, json_option
from pgtasks.embedded import default_data_dir, running_server, stop_embedded

__all__ = ["embedded_group"]


@click.group("embedded")
def embedded_group() -> None:
    """The embedded PostgreSQL used when no DSN is configured."""


@embedded_group.command("status")
@json_option
def embedded_status(as_json: bool) -> None:
    """Say whether the embedded server runs, where, and on which socket.

    ``--json``: ``{"running", "pid", "data_dir", "socket_dir", "port"}`` (null when not running).
    """
    server = running_server()
    if as_json:
        echo_json(
            {
                "running": server is not None,
                "pid": None if server is None else server.pid,
                "data_dir": str(default_data_dir() if server is None else server.data_dir),
                "socket_dir": None if server is None else str(server.socket_dir),
                "port": None if server is None else server.port,
            }
        )
        return
    if server is None:
        click.echo(f"not running (data directory {shown(default_data_dir())})")
        return
    where = f"data directory {server.data_dir}, socket {server.socket_dir}"
    click.echo(f"running: pid {server.pid}, {shown(where)}")


@embedded_group.command("stop")
@confirm_options
def embedded_stop(yes: bool, dry_run: bool) -> None:
    """Stop the embedded server (it starts again on the next use).

    Workers, schedulers and apps on it lose their connections. Asks first at a
    terminal; refuses when stdin is not a terminal unless ``--yes`` is given.
    ``--dry-run`` says which server it would stop and stops nothing.
    """
    server = running_server()
    if server is None:
        what = f"nothing: no embedded server runs (data directory {default_data_dir()})"
    else:
        what = f"the embedded PostgreSQL, pid {server.pid}, data directory {server.data_dir}"
    if dry_run:
        click.echo(f"would stop {shown(what)}")
        return
    if server is None and interactive():
        click.echo("was not running")
        return
    confirm(f"Stop {what}? Workers and apps on it lose their connections.", yes=yes)
    click.echo("stopped" if stop_embedded() else "was not running")
