"""Hook specifications: every way a plugin can extend pgtasks.

Plugins implement these with ``@pgtasks.hookimpl`` on a module or object and are
found through the ``pgtasks`` entry-point group, ``--plugin module.path`` on the
CLI, or ``app.plugin_manager.register(obj)``. A hook implementation whose name is
not specified here is refused at start-up (pluggy's ``check_pending``).

Hooks are synchronous and meant to be cheap. Notification hooks (``*_succeeded``,
``*_failed`` and the like) are isolated: an implementation that raises is logged
and skipped, and the job's outcome does not change. "Decide" hooks are
``firstresult``: the first implementation returning something other than None
wins. The one wrapper hook, `pgtasks_execute_job`, runs inside the job's
execution; an exception raised there counts as the task's own failure.

The layout follows pytest's ``hookspec.py``: grouped by phase, typed, and
documented argument by argument.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import click

    from pgtasks.app import App
    from pgtasks.context import TaskContext

__all__ = ["hookimpl", "hookspec"]

hookspec = pluggy.HookspecMarker("pgtasks")
hookimpl = pluggy.HookimplMarker("pgtasks")


# ---------------------------------------------------------------------------
# Registration (historic: late registrants are called too)
# ---------------------------------------------------------------------------


@hookspec(historic=True)
def pgtasks_register_tasks(app: App) -> None:
    """Register the plugin's tasks on ``app`` (e.g. with ``app.task(...)``).

    Called once per app, when the plugin is registered or, for plugins
    registered earlier, when the app is created.

    Args:
        app: the `pgtasks.App` the plugin is being added to.
    """


@hookspec(historic=True)
def pgtasks_add_commands(cli: click.Group) -> None:
    """Add sub-commands to the ``pgtasks`` command line.

    Args:
        cli: the root ``click.Group``; call ``cli.add_command(...)``.
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
