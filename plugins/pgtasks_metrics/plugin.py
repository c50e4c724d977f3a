"""The metrics plugin: adds ``pgtasks metrics`` (print once, or ``--serve PORT``)."""

from __future__ import annotations

import sys
import threading

import click
from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from pgtasks.plugin_api import AppLoader, hookimpl, shown
from pgtasks_metrics.collector import QueueCollector

__all__ = ["metrics_command", "pgtasks_add_commands"]


@click.command("metrics")
@click.option(
    "--serve",
    "port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve /metrics on this port until stopped, instead of printing once.",
)
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address to serve on.")
@click.pass_obj
def metrics_command(loader: AppLoader, port: int | None, bind: str) -> None:
    """Queue length per status and worker state, in Prometheus' text format.

    On a terminal, control characters in label values (queue names, worker ids)
    are shown as escapes (`pgtasks.plugin_api.shown`). Written to a pipe or a file
    (a textfile collector), the text stays in the exposition format, which has no
    such escapes (click drops ANSI sequences there). With ``--read-dsn`` (or
    ``PGTASKS_READ_DSN``) the numbers are read on that replica.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(loader.reader()))  # a replica's, with --read-dsn
    if port is None:
        text = generate_latest(registry).decode()
        if sys.stdout.isatty():  # piped, the text stays in the exposition format
            text = "\n".join(shown(line) for line in text.split("\n"))
        click.echo(text, nl=False)
        return
    server, thread = start_http_server(port, addr=bind, registry=registry)
    click.echo(f"serving metrics on http://{bind}:{port}/metrics")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        thread.join(5)


@hookimpl
def pgtasks_add_commands(cli: click.Group) -> None:
    """Add ``pgtasks metrics``."""
    cli.add_command(metrics_command)
