"""Hook specifications: every way a plugin can extend pgtasks.

Plugins implement these with ``@pgtasks.hookimpl`` on a module or object and are
found through the ``pgtasks`` entry-point group, ``--plugin module.path`` on the
CLI, or ``app.plugin_manager.register(obj)``. Every function or method of a plugin
whose name starts with ``pgtasks_`` is taken as a hook implementation, marked with
``@hookimpl`` or not (pytest's habit for ``pytest_*`` names), so a misspelled hook
name is refused with `pgtasks.errors.ConfigurationError` when the plugin is
registered, i.e. at start-up, instead of being silently never called.

Hooks are synchronous and meant to be cheap. Notification hooks (``*_succeeded``,
``*_failed`` and the like) are isolated: an implementation that raises is logged
and skipped, and the job's outcome does not change. "Decide" hooks are
``firstresult``: the first implementation returning something other than None
wins. The one wrapper hook, `pgtasks_execute_job`, runs inside the job's
execution; an exception raised there counts as the task's own failure. A slow
implementation is not cut short (hooks run on the calling thread), but one taking
longer than `pgtasks.plugins.SLOW_HOOK_SECONDS` is logged as a warning.

Hooks that do work on request (`pgtasks_delete_item`, `pgtasks_search`,
`pgtasks_add_migrations`) are *not* isolated: their errors reach the caller, so a
delete job whose index removal failed fails (and is retried) instead of
reporting success.

The layout follows pytest's ``hookspec.py``: grouped by phase, typed, and
documented argument by argument.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import click
    import psycopg

    from pgtasks.context import TaskContext
    from pgtasks.plugins import PluginMigrations
    from pgtasks.ports import Engine, TaskRegistry

__all__ = ["ISOLATED_HOOKS", "hookimpl", "hookspec"]

hookspec = pluggy.HookspecMarker("pgtasks")
hookimpl = pluggy.HookimplMarker("pgtasks")

#: Notification hooks: pgtasks calls them with `pgtasks.plugins.call_isolated`, so an
#: implementation that raises is logged and skipped and nothing else changes.
ISOLATED_HOOKS = frozenset(
    {
        "pgtasks_after_enqueue",
        "pgtasks_job_succeeded",
        "pgtasks_job_failed",
        "pgtasks_job_retrying",
        "pgtasks_job_reaped",
        "pgtasks_worker_started",
        "pgtasks_worker_stopping",
        "pgtasks_schedule_fired",
    }
)


# ---------------------------------------------------------------------------
# Registration (historic: late registrants are called too)
# ---------------------------------------------------------------------------


@hookspec(historic=True)
def pgtasks_register_tasks(app: TaskRegistry) -> None:
    """Register the plugin's tasks on ``app`` (``app.register_task(fn, **options)``).

    Called once per app, when the plugin is registered or, for plugins
    registered earlier, when the app is created.

    Args:
        app: the application the plugin is being added to (a `pgtasks.App`;
            a `pgtasks.ports.TaskRegistry`: ``register_task``, ``get_task``, ``tasks``).
    """


@hookspec(historic=True)
def pgtasks_add_commands(cli: click.Group) -> None:
    """Add sub-commands to the ``pgtasks`` command line.

    Called when the command line looks up a command it does not know itself (and
    for ``pgtasks --help``). A command gets the app with
    ``click.get_current_context().obj.get()``.

    Args:
        cli: a ``click.Group`` to add to with ``cli.add_command(...)``; its
            commands become sub-commands of ``pgtasks``.
    """


@hookspec
def pgtasks_add_migrations() -> PluginMigrations | None:
    """Name the numbered SQL migrations the plugin ships for its own tables.

    `pgtasks.App.migrate` applies them after pgtasks' own migrations, each in its
    own transaction under the same advisory lock, and records them in
    ``pgtasks.plugin_migrations`` per plugin. Plugin objects live in their own
    schema (or carry the plugin's prefix).

    Returns:
        A `pgtasks.plugins.PluginMigrations` (plugin key, package, directory of
        ``NNNN_name.sql`` files), or None.
    """


# ---------------------------------------------------------------------------
# Enqueue
# ---------------------------------------------------------------------------


@hookspec
def pgtasks_before_enqueue(task_name: str, options: dict[str, Any], headers: dict[str, Any]) -> None:
    """Inspect or amend a job just before it is written.

    Args:
        task_name: the task's registered name.
        options: the resolved enqueue options (``queue``, ``priority``, ``tenant``,
            ``lock``, ``unique_key``, ``countdown``, ``eta``); read-only by convention.
            An enqueue through a task or a tenant handle adds ``batch_index``: None
            for one job, else the call's 0-based position in a bulk enqueue
            (``delay_many``, ``bulk_apply``), whose jobs then reach
            ``pgtasks_after_enqueue`` in one call; a schedule's run has no such key
            (its ``pgtasks_after_enqueue`` comes after the scheduler's commit).
        headers: the job's headers dict, stored with the job; a plugin may add
            JSON-serialisable entries (e.g. a trace id). Mutate it in place.
    """


@hookspec
def pgtasks_after_enqueue(task_name: str, job_ids: list[int], in_transaction: bool) -> None:
    """Called after jobs were written (not necessarily committed).

    Args:
        task_name: the task's name (``"*"`` for a bulk call mixing tasks).
        job_ids: ids of the new jobs.
        in_transaction: True when written on the caller's connection, so the jobs
            exist only if the caller commits.
    """


# ---------------------------------------------------------------------------
# Job execution
# ---------------------------------------------------------------------------


@hookspec(firstresult=True)
def pgtasks_execute_job(context: TaskContext) -> Any:
    """Run the job's task and return its result; the wrapper point around execution.

    pgtasks itself provides the innermost implementation. Plugins add
    ``@hookimpl(wrapper=True)`` implementations that ``yield`` to run the task
    (for tracing spans, context variables, per-job transactions). Exceptions
    raised here are the task's own failure and follow its retry policy.

    Args:
        context: the running job's `pgtasks.context.TaskContext` (``request``,
            ``task``, ``report_progress``, ``is_cancelled``).

    Returns:
        The task's return value.
    """


@hookspec
def pgtasks_job_succeeded(job_id: int, task_name: str, result: Any, runtime: float) -> None:
    """A job succeeded (its result is committed).

    Args:
        job_id: the job's id.
        task_name: its task.
        result: the task's return value.
        runtime: seconds the attempt took, measured by the worker.
    """


@hookspec
def pgtasks_job_failed(job_id: int, task_name: str, error: dict[str, Any], final_status: str) -> None:
    """A job ended without success and will not be retried.

    Args:
        job_id: the job's id.
        task_name: its task.
        error: the stored error record: ``type``, ``message``, ``code``,
            ``class`` (``"transient"`` or ``"permanent"``), ``traceback``.
        final_status: ``"failed"``, ``"cancelled"`` or ``"partial_failure"``.
    """


@hookspec
def pgtasks_job_retrying(
    job_id: int, task_name: str, error: dict[str, Any], delay: float, attempt: int
) -> None:
    """A failed attempt goes back to the queue.

    Args:
        job_id: the job's id.
        task_name: its task.
        error: the error record of the failed attempt.
        delay: seconds until the next attempt may start.
        attempt: the number of the attempt that failed (1-based).
    """


@hookspec
def pgtasks_job_reaped(job_id: int, task_name: str, new_status: str) -> None:
    """A running job of a vanished worker was recovered by the reaper.

    Args:
        job_id: the job's id.
        task_name: its task.
        new_status: ``"queued"`` (will be retried) or ``"failed"``.
    """


# ---------------------------------------------------------------------------
# Worker life cycle
# ---------------------------------------------------------------------------


@hookspec
def pgtasks_worker_started(worker_id: str, queues: list[str], concurrency: int) -> None:
    """A worker registered itself and is about to claim jobs.

    Args:
        worker_id: the worker's unique id (``host:pid:random``).
        queues: the queues it serves.
        concurrency: how many jobs it runs at once.
    """


@hookspec
def pgtasks_worker_stopping(worker_id: str, reason: str) -> None:
    """A worker stopped claiming and is draining.

    Args:
        worker_id: the worker's id.
        reason: ``"signal"``, ``"burst-done"``, ``"max-tasks"`` or ``"error"``.
    """


# ---------------------------------------------------------------------------
# Documents: search and deletion (served by the built-in index and delete plugins)
# ---------------------------------------------------------------------------


@hookspec(firstresult=True)
def pgtasks_search(
    app: Engine, query: str, tenant: str, limit: int, language: str | None
) -> list[Any] | None:
    """Answer `pgtasks.App.search`; the first implementation returning a list wins.

    The built-in ``pgtasks_index`` plugin implements it with PostgreSQL full-text
    search. Not isolated: errors reach the caller.

    Args:
        app: the app searched in (a `pgtasks.App`; a `pgtasks.ports.Engine`, whose
            ``stores.database`` runs the plugin's statements).
        query: the user's query, in web-search syntax (words, ``"phrases"``,
            ``or``, ``-word``).
        tenant: the tenant whose entries are searched (only those).
        limit: most hits to return (>= 1).
        language: text-search configuration for stemming (e.g. ``"english"``),
            or None for the plugin's default.

    Returns:
        Hits, best first (``pgtasks_index.SearchHit`` for the built-in plugin).
    """


@hookspec
def pgtasks_delete_item(  # noqa: PLR0917 - pluggy passes hook arguments by name
    app: Engine, tenant: str, kind: str, key: str, derived: bool, conn: psycopg.Connection[Any]
) -> dict[str, int] | None:
    """Remove everything a plugin holds about one document or mail.

    Called by the ``pgtasks.delete`` task (built-in ``pgtasks_delete`` plugin) for
    every implementation, all on one connection inside one transaction, so the
    deletion is all or nothing. Must be idempotent: deleting what is not there
    is not an error. Not isolated: an exception fails the delete job (which is
    then retried by its policy) and rolls back every implementation's part.

    Args:
        app: the app (a `pgtasks.App`; a `pgtasks.ports.Engine`).
        tenant: the item's tenant.
        kind: ``"document"`` or ``"mail"`` (or an application's own kind).
        key: the item's key within its tenant and kind.
        derived: True when the application asked to remove derived data too
            (extracted text, thumbnails, ...); the index entry goes either way.
        conn: the transaction's connection; run every statement on it.

    Returns:
        Counts of what was removed, e.g. ``{"index_entries": 1}``, or None.
    """


# ---------------------------------------------------------------------------
# Scheduling
# ---------------------------------------------------------------------------


@hookspec
def pgtasks_schedule_fired(schedule_name: str, job_id: int | None, trigger: str, scheduled_for: Any) -> None:
    """A schedule produced a run (or skipped one).

    Args:
        schedule_name: the schedule's name.
        job_id: the new run's job id, or None when the run was skipped
            (overlap policy).
        trigger: ``"schedule"``, ``"manual"``, ``"retry"`` or ``"dependency"``.
        scheduled_for: the fire time (aware UTC ``datetime``) or None for manual runs.
    """
