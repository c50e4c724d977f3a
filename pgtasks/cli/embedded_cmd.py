"""``pgtasks embedded status|stop``: the local PostgreSQL started when no DSN is set."""

from __future__ import annotations

import click

from pgtasks.embedded import default_data_dir, running_server, stop_embedded

__all__ = ["embedded_group"]


@click.group("embedded")
def embedded_group() -> None:
    """The embedded PostgreSQL used when no DSN is configured."""


@embedded_group.command("status")
def embedded_status() -> None:
    """Say whether the embedded server runs, where, and on which socket."""
    server = running_server()
    if server is None:
        click.echo(f"not running (data directory {default_data_dir()})")
        return
    click.echo(f"running: pid {server.pid}, data directory {server.data_dir}, socket {server.socket_dir}")


@embedded_group.command("stop")
def embedded_stop() -> None:
    """Stop the embedded server (it starts again on the next use)."""
    click.echo("stopped" if stop_embedded() else "was not running")
