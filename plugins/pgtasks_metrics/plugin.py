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
    are shown as escapes (`pgtasks.plugin_api.shown`): the exposition format writes a
    backslash in a value as ``\\\\``, so an escape such as ``\\x1b`` cannot be read as
    another value, and two values stay two. Written to a pipe or a file (a textfile
    collector), the output is the exposition format byte for byte, in UTF-8: that
    format has no escape for a control character, and dropping one (as ``click.echo``
    drops ANSI sequences off a terminal) would merge the series of ``"mail\\x1b[31m"``
    and ``"mail"``, which a collector refuses as duplicates. Enqueue refuses such
    names (`pgtasks.validation.check_name`); only rows written by other means hold
    them. With ``--read-dsn`` (or ``PGTASKS_READ_DSN``) the numbers are read on that
    replica.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(loader.reader()))  # a replica's, with --read-dsn
    if port is None:
        exposition = generate_latest(registry)
        if sys.stdout.isatty():
            text = exposition.decode()
            click.echo("\n".join(shown(line) for line in text.split("\n")), nl=False)
            return
        sys.stdout.flush()  # the bytes as they are: click.echo would drop ANSI sequences
        sys.stdout.buffer.write(exposition)
        sys.stdout.buffer.flush()
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
