"""Operator commands on jobs and queues: ``jobs``, ``queues``, ``workers``, ``purge``."""

from __future__ import annotations

import getpass

import click

from pgtasks.cli.common import AppLoader, fail, new_console, new_table
from pgtasks.errors import PgtasksError
from pgtasks.records import Requeue
from pgtasks.serialization import dumps
from pgtasks.states import CLAIMED

__all__ = ["jobs_group", "purge_command", "queues_command", "workers_command"]

_STATUSES = ["queued", "running", "succeeded", "failed", "cancelled", "partial_failure"]


@click.group("jobs")
def jobs_group() -> None:
    """List, inspect, retry and cancel jobs."""


@jobs_group.command("list")
@click.option("--status", type=click.Choice(_STATUSES), default=None)
@click.option("-Q", "--queue", default=None)
@click.option("--task", "task_name", default=None)
@click.option("--tenant", default=None)
@click.option("--before", "before_id", type=int, default=None, help="Show jobs with ids below this (paging).")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.pass_obj
def jobs_list(
    loader: AppLoader,
    status: str | None,
    queue: str | None,
    task_name: str | None,
    tenant: str | None,
    before_id: int | None,
    limit: int,
) -> None:
    """Jobs, newest first."""
    jobs = loader.get().list_jobs(
        status=status, queue=queue, task_name=task_name, tenant=tenant, before_id=before_id, limit=limit
    )
    table = new_table("id", "task", "queue", "tenant", "status", "attempt", "run at", "finished", "error")
    for j in jobs:
        table.add_row(
            str(j.id),
            j.task_name,
            j.queue,
            j.tenant,
            j.phase,
            f"{j.attempt}/{j.max_attempts}",
            f"{j.run_at:%Y-%m-%d %H:%M:%S}",
            f"{j.finished_at:%H:%M:%S}" if j.finished_at else "",
            (j.error or {}).get("code", "") or "",
        )
    new_console().print(table)
    if len(jobs) == limit:
        click.echo(f"next page: --before {jobs[-1].id}")


@jobs_group.command("show")
@click.argument("job_id", type=int)
@click.pass_obj
def jobs_show(loader: AppLoader, job_id: int) -> None:
    """Everything about one job, with its attempt history."""
    try:
        job = loader.get().get_job(job_id)
    except PgtasksError as exc:
        fail(exc)
        return
    console = new_console()
    table = new_table(show_header=False)
    for name in (
        "id",
        "task_name",
        "queue",
        "tenant",
        "status",
        "phase",
        "attempt_number",
        "attempt",
        "max_attempts",
        "priority",
        "trigger",
        "schedule_name",
        "scheduled_for",
        "run_at",
        "created_at",
        "started_at",
        "finished_at",
        "worker_id",
        "lock_key",
        "unique_key",
        "parent_id",
        "correlation_id",
    ):
        value = getattr(job, name)
        if value is not None:
            table.add_row(name, str(value))
    table.add_row("args", dumps(job.args))
    table.add_row("kwargs", dumps(job.kwargs))
    if job.progress:
        table.add_row("progress", dumps(job.progress))
    if job.result is not None:
        table.add_row("result", dumps(job.result)[:2000])
    if job.error:
        table.add_row("error", f"{job.error.get('code')}: {job.error.get('message')}")
    console.print(table)
    # Attempts are numbered across manual requeues; a requeue is a row of its own, its
    # time under "finished" and who asked under "worker".
    history = new_table("attempt", "trigger", "worker", "started", "finished", "outcome", "error")
    for a in job.history():
        if isinstance(a, Requeue):
            history.add_row("", "manual", f"by {a.by or 'unknown'}", "", str(a.at or ""), "requeued", "")
            continue
        history.add_row(
            str(a.attempt),
            a.trigger,
            a.worker_id or "",
            str(a.started_at or ""),
            str(a.finished_at or ""),
            a.outcome,
            ((a.error or {}).get("message") or "")[:80],
        )
    console.print(history)


@jobs_group.command("retry")
@click.argument("job_ids", type=int, nargs=-1, required=True)
@click.pass_obj
def jobs_retry(loader: AppLoader, job_ids: tuple[int, ...]) -> None:
    """Put failed, cancelled or partially failed jobs back in the queue."""
    app = loader.get()
    for job_id in job_ids:
        try:
            done = app.requeue(job_id, by=f"cli:{getpass.getuser()}")
        except PgtasksError as exc:
            fail(exc)
            return
        click.echo(f"job {job_id}: {'requeued' if done else 'not requeued (queued, running or succeeded)'}")


@jobs_group.command("cancel")
@click.argument("job_ids", type=int, nargs=-1, required=True)
@click.option("--terminate", is_flag=True, help="Kill a running job (processes pool).")
@click.pass_obj
def jobs_cancel(loader: AppLoader, job_ids: tuple[int, ...], terminate: bool) -> None:
    """Cancel jobs: queued ones at once, running ones by request."""
    app = loader.get()
    for job_id in job_ids:
        try:
            done = app.cancel(job_id, terminate=terminate)
        except PgtasksError as exc:
            fail(exc)
            return
        click.echo(f"job {job_id}: {'cancel requested' if done else 'already finished'}")


@click.command("queues")
@click.pass_obj
def queues_command(loader: AppLoader) -> None:
    """Job counts per queue and status."""
    rows = loader.get().queue_stats()
    # Running jobs whose body has not started (claimed ahead) are shown apart.
    columns = ["queued", CLAIMED, *_STATUSES[1:]]
    table = new_table("queue", *columns, "oldest queued")
    by_queue: dict[str, dict[str, object]] = {}
    for r in rows:
        q = by_queue.setdefault(r["queue"], {})
        q[r["status"]] = r["jobs"] - r["claimed"]
        if r["claimed"]:
            q[CLAIMED] = r["claimed"]
        if r["oldest_run_at"] is not None:
            q["oldest"] = r["oldest_run_at"]
    for name, counts in sorted(by_queue.items()):
        table.add_row(name, *(str(counts.get(s, 0)) for s in columns), str(counts.get("oldest", "")))
    new_console().print(table)


@click.command("workers")
@click.pass_obj
def workers_command(loader: AppLoader) -> None:
    """Registered workers, their lease, running jobs and jobs claimed ahead."""
    workers = loader.get().stores.workers.list()
    table = new_table("id", "queues", "pool", "concurrency", "running", CLAIMED, "last seen", "state")
    for w in workers:
        table.add_row(
            w.id,
            ",".join(w.queues),
            w.pool,
            str(w.concurrency),
            str(w.running),
            str(w.claimed),
            f"{w.last_seen_at:%Y-%m-%d %H:%M:%S}",
            w.state,
        )
    new_console().print(table)


@click.command("purge")
@click.option(
    "--older-than",
    type=click.FloatRange(min=0),
    default=7 * 86400.0,
    show_default=True,
    help="Seconds since the job finished.",
)
@click.option(
    "--status", type=click.Choice(["succeeded", "failed", "cancelled", "partial_failure"]), default=None
)
@click.pass_obj
def purge_command(loader: AppLoader, older_than: float, status: str | None) -> None:
    """Delete finished jobs older than a cutoff."""
    n = loader.get().purge(older_than=older_than, status=status)
    click.echo(f"deleted {n} job(s)")
