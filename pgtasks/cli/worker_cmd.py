"""``pgtasks worker``: run jobs, with Celery's flags where Celery has them.

Exit codes: 0 after a graceful stop (signal, ``--burst`` done); 1 on a
configuration or database error at start; 2 on a usage error; 130 when a second
signal forced an immediate exit (running jobs are then recovered by lease).
"""

from __future__ import annotations

import logging
import sys

import click

from pgtasks.cli.common import PROCESS_ENTRY_KEY, AppLoader, shown
from pgtasks.errors import ConfigurationError
from pgtasks.worker import WorkerConfig
from pgtasks.worker.launch import WorkerLaunch, reexec, reexec_allowed, run

__all__ = ["worker_command"]


def _queues(value: str) -> tuple[str, ...]:
    queues = tuple(q.strip() for q in value.split(",") if q.strip())
    if not queues:
        raise click.BadParameter("give at least one queue name")
    return queues


@click.command("worker")
@click.option("-Q", "--queues", default="default", show_default=True, help="Comma-separated queues to serve.")
@click.option(
    "-c", "--concurrency", type=click.IntRange(min=1), default=4, show_default=True, help="Jobs run at once."
)
@click.option(
    "-n", "--hostname", default=None, help="Host part of the worker id (default: this host's name)."
)
@click.option(
    "-P",
    "--pool",
    type=click.Choice(["threads", "processes"]),
    default="threads",
    show_default=True,
    help="threads (I/O-bound) or processes (CPU-bound, hard time limits).",
)
@click.option(
    "--max-tasks-per-child",
    type=click.IntRange(min=1),
    default=None,
    help="Replace a child process after this many jobs (processes pool).",
)
@click.option(
    "--prefetch-multiplier",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Jobs claimed ahead per slot.",
)
@click.option("--burst", is_flag=True, help="Exit once no job is due and none is running.")
@click.option(
    "--lease-timeout",
    type=click.FloatRange(min=1.0),
    default=30.0,
    show_default=True,
    help="Seconds without heartbeat before this worker's jobs are recovered elsewhere.",
)
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0.01),
    default=1.0,
    show_default=True,
    help="Seconds between polls (NOTIFY only wakes; polling always runs).",
)
@click.option(
    "--no-listen", is_flag=True, help="Poll only (PgBouncer transaction pooling; also PGTASKS_LISTEN=off)."
)
@click.option(
    "--shutdown-timeout",
    type=click.FloatRange(min=0.0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds running jobs get to finish after SIGTERM.",
)
@click.option(
    "--tenant-fair/--no-tenant-fair",
    default=True,
    show_default=True,
    help="Serve tenants round-robin, or strictly by priority.",
)
@click.option(
    "--unknown-tasks",
    type=click.Choice(["fail", "defer"]),
    default="fail",
    show_default=True,
    help="Fail jobs of tasks this worker does not know, or leave them queued for one that does.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve this worker's Prometheus metrics on /metrics at this port (0: any free port).",
)
@click.option(
    "--metrics-host", default="127.0.0.1", show_default=True, help="Address to serve the metrics on."
)
@click.option(
    "--metrics-tenants", is_flag=True, help="Label the per-job metrics with the tenant too (one series each)."
)
@click.option("-B", "--beat", is_flag=True, help="Also run the scheduler in this process (as Celery's -B).")
@click.option(
    "-l",
    "--loglevel",
    default=None,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Log level (also accepted before the command, as in Celery).",
)
@click.pass_context
def worker_command(
    ctx: click.Context,
    queues: str,
    concurrency: int,
    hostname: str | None,
    pool: str,
    max_tasks_per_child: int | None,
    prefetch_multiplier: int,
    burst: bool,
    lease_timeout: float,
    poll_interval: float,
    no_listen: bool,
    shutdown_timeout: float,
    tenant_fair: bool,
    unknown_tasks: str,
    metrics_port: int | None,
    metrics_host: str,
    metrics_tenants: bool,
    beat: bool,
    loglevel: str | None,
) -> None:
    """Run jobs from the given queues until stopped (SIGTERM/SIGINT: graceful)."""
    loader: AppLoader = ctx.obj
    if loglevel:
        logging.getLogger().setLevel(loglevel.upper())
    if not loader.app_spec:
        raise click.UsageError("the worker needs the app: pgtasks -A module:app worker")
    app = loader.get()
    try:
        config = WorkerConfig(
            queues=_queues(queues),
            concurrency=concurrency,
            hostname=hostname,
            pool=pool,
            max_tasks_per_child=max_tasks_per_child,
            prefetch_multiplier=prefetch_multiplier,
            burst=burst,
            lease_timeout=lease_timeout,
            poll_interval=poll_interval,
            listen=app.settings.listen and not no_listen,
            shutdown_timeout=shutdown_timeout,
            tenant_fair=tenant_fair,
            unknown_tasks=unknown_tasks,
            app_spec=loader.app_spec,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            metrics_tenants=metrics_tenants,
        )
    except ConfigurationError as exc:
        raise click.UsageError(shown(exc)) from None
    launch = WorkerLaunch(
        app_spec=loader.app_spec,
        dsn=loader.dsn,
        plugins=loader.plugins,
        loglevel=logging.getLevelName(logging.getLogger().level),
        config=config,
        beat=beat,
    )
    if ctx.meta.get(PROCESS_ENTRY_KEY) and reexec_allowed():
        try:
            reexec(launch)  # the same process goes on without the command line (see launch)
        except OSError as exc:
            log = logging.getLogger("pgtasks")
            log.warning("cannot re-execute the worker with %s (%s); it runs here", sys.executable, exc)
    raise SystemExit(run(launch, app))
