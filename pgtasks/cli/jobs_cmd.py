"""Operator commands on jobs and queues: ``jobs``, ``queues``, ``workers``, ``purge``.

Every value is printed literally (`pgtasks.cli.common.new_console`, `shown`).
What is shown about a job is masked (`pgtasks.redaction`): the values of its
sensitive arguments, sensitive keys of its headers, result and progress, and
secrets in its errors; the database keeps the real arguments, which the task needs.
``purge``, and ``jobs retry`` / ``jobs cancel`` given more than one id, ask before
they act (`confirm`): ``--yes`` for scripts, ``--dry-run`` to see what they would touch.
``jobs list/show/retry/cancel --tenant T`` act through ``app.tenant(T)``
(`pgtasks.TenantScope`): only T's jobs, and another tenant's id is reported as no job.
``jobs list``, ``jobs show``, ``queues``/``stats`` and ``workers`` take ``--json``
(`pgtasks.cli.jsonout`): one JSON document on stdout, masked and scoped as the table.
"""

from __future__ import annotations

import getpass
from typing import TYPE_CHECKING, Any

import click

from pgtasks.cli.common import (
    AppLoader,
    FiniteFloatRange,
    confirm,
    confirm_options,
    fail,
    interactive,
    new_console,
    new_table,
    shown,
    task_redactor,
    warn_if_rows_hidden,
)
from pgtasks.cli.jsonout import (
    echo_json,
    job_detail,
    job_summary,
    json_option,
    queue_counts,
    time_text,
    worker_object,
)
from pgtasks.errors import PgtasksError
from pgtasks.records import Requeue
from pgtasks.redaction import redact_data, redact_text
from pgtasks.serialization import dumps
from pgtasks.states import CLAIMED

if TYPE_CHECKING:
    from pgtasks.app import App
    from pgtasks.tenancy import TenantScope

__all__ = ["jobs_group", "purge_command", "queues_command", "workers_command"]

#: Longest ``purge --older-than``: ten years, pgtasks' longest delay or age in seconds.
_MAX_AGE = 10 * 365.25 * 86400.0

_STATUSES = ["queued", "running", "succeeded", "failed", "cancelled", "partial_failure", "blocked"]


@click.group("jobs")
def jobs_group() -> None:
    """List, inspect, retry and cancel jobs."""


_TENANT_HELP = "Act only on this tenant's jobs (another tenant's id is reported as no job)."
tenant_option = click.option("--tenant", default=None, help=_TENANT_HELP)


def _jobs_api(loader: AppLoader, tenant: str | None, *, read: bool = False) -> App | TenantScope:
    """The app (the operator's view), or ``app.tenant(tenant)`` when ``--tenant`` is given;
    with ``read``, the app on the read DSN if there is one (`AppLoader.reader`).

    Exits with status 1 and the error when the tenant name is refused.
    """
    try:
        app = loader.reader() if read else loader.get()
    except PgtasksError as exc:
        fail(exc)
    if tenant is None:
        return app
    try:
        return app.tenant(tenant)
    except PgtasksError as exc:
        fail(exc)


@jobs_group.command("list")
@click.option(
    "--status",
    type=click.Choice([*_STATUSES, CLAIMED]),
    default=None,
    help="Only jobs in this phase, as the status column shows it: claimed (held ahead by a worker, "
    "not started) apart from running (started).",
)
@click.option("-Q", "--queue", default=None)
@click.option("--task", "task_name", default=None)
@tenant_option
@click.option("--before", "before_id", type=int, default=None, help="Show jobs with ids below this (paging).")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@json_option
@click.pass_obj
def jobs_list(
    loader: AppLoader,
    status: str | None,
    queue: str | None,
    task_name: str | None,
    tenant: str | None,
    before_id: int | None,
    limit: int,
    as_json: bool,
) -> None:
    """Jobs, newest first (with ``--tenant``, only that tenant's).

    The status column shows each job's phase (`pgtasks.Job.phase`): ``claimed`` for a
    ``running`` job whose body has not started; ``--status`` filters by it, so
    ``--status running`` lists the started ones only. With ``--json``: an array of job
    objects (``[]`` when nothing matches); the next page is ``--before`` the last id.
    """
    api = _jobs_api(loader, tenant, read=True)
    if tenant is None:
        warn_if_rows_hidden(loader.reader())
    filters: dict[str, Any] = {"phase": status, "queue": queue, "task_name": task_name}
    try:
        jobs = api.list_jobs(**filters, before_id=before_id, limit=limit)
    except PgtasksError as exc:
        fail(exc)
    if as_json:
        echo_json([job_summary(j) for j in jobs])
        return
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
            redact_text(str((j.error or {}).get("code", "") or "")),
        )
    new_console().print(table)
    if len(jobs) == limit:
        click.echo(f"next page: --before {jobs[-1].id}")


@jobs_group.command("show")
@click.argument("job_id", type=int)
@tenant_option
@json_option
@click.pass_obj
def jobs_show(loader: AppLoader, job_id: int, tenant: str | None, as_json: bool) -> None:
    """Everything about one job, with its attempt history.

    Secrets are masked: the values of sensitive arguments (built-in names and the
    task's ``redact``, when the app knows the task), sensitive keys in headers,
    result and progress, and secrets in error messages (`pgtasks.redaction`).
    With ``--json``: one job object with its timeline.
    """
    api = _jobs_api(loader, tenant, read=True)
    try:
        job = api.get_job(job_id)
    except PgtasksError as exc:
        fail(exc)
        return
    redactor = task_redactor(loader.get(), job.task_name)
    if as_json:
        echo_json(job_detail(job, redactor))
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
    args, kwargs = redactor.call(job.args, job.kwargs)
    table.add_row("args", _dumps_shown(args))
    table.add_row("kwargs", _dumps_shown(kwargs))
    if job.headers:
        table.add_row("headers", _dumps_shown(redact_data(job.headers, redactor.redact)))
    if job.progress:
        table.add_row("progress", _dumps_shown(redact_data(job.progress, redactor.redact)))
    if job.result is not None:
        table.add_row("result", _dumps_shown(redact_data(job.result, redactor.redact))[:2000])
    if job.error:
        table.add_row("error", redactor.text(f"{job.error.get('code')}: {job.error.get('message')}"))
    console.print(table)
    # Attempts are numbered across manual requeues; a requeue is a row of its own, its
    # time under "finished" and who asked under "worker".
    history = new_table("attempt", "trigger", "worker", "started", "finished", "outcome", "error")
    for a in job.timeline():
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
            redactor.text((a.error or {}).get("message") or "")[:80],
        )
    console.print(history)


@jobs_group.command("explain")
@click.argument("job_id", type=int)
@tenant_option
@json_option
@click.pass_obj
def jobs_explain(loader: AppLoader, job_id: int, tenant: str | None, as_json: bool) -> None:
    """Why a job is not running now, or where it is (`pgtasks.App.explain`).

    One line per reason, most decisive first: not due until a time, its lock key
    held by a running job, no live worker for its queue, due jobs ahead of it;
    ``ready`` when nothing holds it back; else claimed, running or finished. With
    ``--json``: ``{"job_id", "status", "at", "reasons": [{"code", "message",
    "details"}]}``.
    """
    api = _jobs_api(loader, tenant)
    try:
        explanation = api.explain(job_id)
    except PgtasksError as exc:
        fail(exc)
        return
    if as_json:
        reasons = [
            {"code": r.code.value, "message": r.message, "details": r.details} for r in explanation.reasons
        ]
        at = time_text(explanation.at)
        echo_json({"job_id": explanation.job_id, "status": explanation.status, "at": at, "reasons": reasons})
        return
    click.echo(f"job {explanation.job_id}: {shown(explanation.status)}")
    for reason in explanation.reasons:
        click.echo(f"  {reason.code.value}: {shown(reason.message)}")


def _dumps_shown(value: object) -> str:
    """JSON text of a masked value, or its repr if it cannot be written as JSON."""
    try:
        return dumps(value)
    except PgtasksError:
        return repr(value)


_REQUEUEABLE = ("failed", "cancelled", "partial_failure")


def _preview(app: App | TenantScope, job_ids: tuple[int, ...], what: dict[str, str], otherwise: str) -> None:
    """``--dry-run`` of a bulk action: each job's status and what the action would do to it."""
    for job_id in job_ids:
        try:
            status = app.get_job(job_id).status
        except PgtasksError as exc:
            fail(exc)
        click.echo(f"job {job_id}: {shown(status)}, {what.get(status, otherwise)}")


@jobs_group.command("retry")
@click.argument("job_ids", type=int, nargs=-1, required=True)
@tenant_option
@confirm_options
@click.pass_obj
def jobs_retry(
    loader: AppLoader, job_ids: tuple[int, ...], tenant: str | None, yes: bool, dry_run: bool
) -> None:
    """Put failed, cancelled or partially failed jobs back in the queue.

    With more than one id it asks first (``--yes`` for scripts); ``--dry-run``
    says what would happen to each job and changes nothing.
    """
    app = _jobs_api(loader, tenant)
    if dry_run:
        _preview(app, job_ids, dict.fromkeys(_REQUEUEABLE, "would be requeued"), "would not be requeued")
        return
    if len(job_ids) > 1:
        confirm(f"Requeue {len(job_ids)} jobs ({_id_list(job_ids)})?", yes=yes)
    for job_id in job_ids:
        try:
            done = app.requeue(job_id, by=f"cli:{getpass.getuser()}")
        except PgtasksError as exc:
            fail(exc)
        click.echo(f"job {job_id}: {'requeued' if done else 'not requeued (queued, running or succeeded)'}")


_CANCEL_OUTCOMES = {
    "cancelled": "cancelled",
    "requested": "running: cancel requested (the worker stops it)",
    "finished": "already finished, nothing changed",
}


@jobs_group.command("cancel")
@click.argument("job_ids", type=int, nargs=-1, required=True)
@click.option("--terminate", is_flag=True, help="Kill a running job (processes pool).")
@tenant_option
@confirm_options
@click.pass_obj
def jobs_cancel(
    loader: AppLoader, job_ids: tuple[int, ...], terminate: bool, tenant: str | None, yes: bool, dry_run: bool
) -> None:
    """Cancel jobs: queued ones at once, running ones by request.

    Says for each job what happened: cancelled, cancel requested (running), or
    already finished. With more than one id it asks first (``--yes`` for
    scripts); ``--dry-run`` says what would happen and changes nothing.
    """
    app = _jobs_api(loader, tenant)
    if dry_run:
        what = {"queued": "would be cancelled", "running": "would be asked to stop"}
        _preview(app, job_ids, what, "already finished, would not change")
        return
    if len(job_ids) > 1:
        confirm(f"Cancel {len(job_ids)} jobs ({_id_list(job_ids)})?", yes=yes)
    for job_id in job_ids:
        try:
            outcome = app.cancel_job(job_id, terminate=terminate)
        except PgtasksError as exc:
            fail(exc)
        click.echo(f"job {job_id}: {_CANCEL_OUTCOMES[outcome]}")


def _id_list(job_ids: tuple[int, ...], most: int = 10) -> str:
    shown_ids = ", ".join(str(i) for i in job_ids[:most])
    return shown_ids + (f" and {len(job_ids) - most} more" if len(job_ids) > most else "")


@click.command("queues")
@json_option
@click.pass_obj
def queues_command(loader: AppLoader, as_json: bool) -> None:
    """Job counts per queue and status (``--json``: an array of queue objects)."""
    try:
        reader = loader.reader()
        rows = reader.queue_stats()
    except PgtasksError as exc:
        fail(exc)
    warn_if_rows_hidden(reader)
    if as_json:
        echo_json(queue_counts(rows))
        return
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
@json_option
@click.pass_obj
def workers_command(loader: AppLoader, as_json: bool) -> None:
    """Registered workers, their lease, running jobs and jobs claimed ahead
    (``--json``: an array of worker objects)."""
    try:
        reader = loader.reader()
        workers = reader.stores.workers.list()
    except PgtasksError as exc:
        fail(exc)
    warn_if_rows_hidden(reader)  # the running and claimed counts are of visible jobs
    if as_json:
        echo_json([worker_object(w) for w in workers])
        return
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
    type=FiniteFloatRange(min=0, max=_MAX_AGE),
    default=7 * 86400.0,
    show_default=True,
    help="Seconds since the job finished.",
)
@click.option(
    "--status", type=click.Choice(["succeeded", "failed", "cancelled", "partial_failure"]), default=None
)
@click.option(
    "--policy",
    is_flag=True,
    help="Delete what the retention policy no longer keeps (PGTASKS_RETENTION_*), not by a cutoff.",
)
@click.option("--tenant", default=None, help="With --policy: only this tenant's jobs.")
@confirm_options
@click.pass_context
def purge_command(
    ctx: click.Context,
    older_than: float,
    status: str | None,
    policy: bool,
    tenant: str | None,
    yes: bool,
    dry_run: bool,
) -> None:
    """Delete finished jobs older than a cutoff, or by the retention policy (``--policy``).

    Asks first at a terminal, saying how many jobs would go; refuses when stdin is
    not a terminal unless ``--yes`` is given. ``--dry-run`` prints that count and
    deletes nothing; with ``--policy``, per queue, task and status (``--tenant``: of
    that tenant's jobs only).
    """
    loader: AppLoader = ctx.obj
    if tenant is not None and not policy:
        raise click.UsageError("--tenant needs --policy")
    if policy:
        given = [
            f"--{name.replace('_', '-')}"
            for name in ("older_than", "status")
            if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
        ]
        if given:
            raise click.UsageError(f"--policy takes no {' or '.join(given)}: the policy says what to keep")
        from pgtasks.cli.retention import purge_by_policy

        purge_by_policy(loader.get(), yes=yes, dry_run=dry_run, tenant=tenant)
        return
    which = f"finished {status or 'job'}s that ended more than {older_than:g} s ago"
    app = loader.get()
    count = None if yes and not dry_run else app.stores.jobs.purge_count(older_than=older_than, status=status)
    if dry_run:
        click.echo(f"would delete {count} job(s): {which}")
        return
    if count == 0 and interactive():
        click.echo(f"nothing to delete: no {which}")
        return
    confirm(f"Delete {count} job(s): {which}?", yes=yes)
    n = app.purge(older_than=older_than, status=status)
    click.echo(f"deleted {n} job(s)")
