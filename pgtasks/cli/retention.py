"""``pgtasks purge --policy``: one pass of the retention policy, or its dry run.

The policy is the app's (`pgtasks.settings.RetentionPolicy`: ``Settings.retention``,
from the ``PGTASKS_RETENTION*`` variables); the pass is the one the workers run
(`pgtasks.maintenance.Retention`), so the dry run counts exactly what it deletes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from pgtasks.cli.common import confirm, fail, interactive, new_console, new_table, shown
from pgtasks.db.retention import RetentionStore
from pgtasks.errors import PgtasksError
from pgtasks.maintenance import Retention

if TYPE_CHECKING:
    from pgtasks.app import App

__all__ = ["format_keep", "purge_by_policy"]

_UNITS = ((86400.0, "d"), (3600.0, "h"), (60.0, "m"))


def format_keep(seconds: float | None) -> str:
    """A keep time for people: ``forever``, or the largest whole unit (``7d``, ``12h``, ``90s``)."""
    if seconds is None:
        return "forever"
    for size, unit in _UNITS:
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def purge_by_policy(app: App, *, yes: bool, dry_run: bool, tenant: str | None = None) -> None:
    """Show (``dry_run``) or apply, once, what the app's retention policy deletes now
    (of ``tenant``'s jobs only, when given).

    The dry run prints one row per queue, task and final status with the time the
    policy keeps such jobs and how many it would delete, then the total. Otherwise
    the operator confirms (`confirm`) and one retention pass runs (bounded batches,
    as in the workers; it yields to a worker whose pass is running).

    Exits with status 1 and the error when the tenant name is refused (nothing
    deleted).

    Raises:
        click.ClickException: not confirmed (stdin not a terminal, no ``--yes``).
        click.Abort: the operator answered no.
    """
    if tenant is not None:
        try:
            app.tenant(tenant)  # the tenant handle's checks of the name
        except PgtasksError as exc:
            fail(exc)
    policy = app.settings.retention
    retention = Retention(RetentionStore(app.database), policy, tenant=tenant)
    whose = "" if tenant is None else f" of tenant {tenant}"
    preview = retention.preview() if dry_run or not yes else None
    total = None if preview is None else sum(c.jobs for c in preview)
    if dry_run:
        assert preview is not None
        table = new_table("queue", "task", "status", "kept for", "would delete")
        for c in preview:
            keep = policy.keep_for(c.status, queue=c.queue, task_name=c.task_name)
            table.add_row(c.queue, c.task_name, c.status, format_keep(keep), str(c.jobs))
        if preview:
            new_console().print(table)
        click.echo(shown(f"would delete {total} job(s){whose} by the retention policy"))
        return
    if total == 0 and interactive():
        click.echo(shown(f"nothing to delete: the retention policy keeps every finished job{whose}"))
        return
    confirm(f"Delete {total} job(s){whose} by the retention policy?", yes=yes)
    result = retention.run_once()
    click.echo(f"deleted {result.deleted} job(s)")
    if result.yielded:
        click.echo("a worker's retention pass is running; it deletes the rest", err=True)
