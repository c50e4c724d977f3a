"""The metrics plugin: adds ``pgtasks metrics`` (print once, or ``--serve PORT``)."""

from __future__ import annotations

import threading

import click
from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from pgtasks.plugin_api import AppLoader, hookimpl
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
    """Queue length per status and worker state, in Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(loader.get()))
    if port is None:
        click.echo(generate_latest(registry).decode(), nl=False)
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
