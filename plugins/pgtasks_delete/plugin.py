"""Hook implementations of the ``pgtasks_delete`` plugin: it registers ``pgtasks.delete``."""

from __future__ import annotations

from pgtasks.plugin_api import TaskRegistry, hookimpl

from .tasks import DELETE_QUEUE, DELETE_TASK, delete_task

__all__: list[str] = []


@hookimpl
def pgtasks_register_tasks(app: TaskRegistry) -> None:
    """Register ``pgtasks.delete`` (bound; 5 retries with backoff for transient failures)."""
    app.register_task(
        delete_task, name=DELETE_TASK, queue=DELETE_QUEUE, bind=True, max_retries=5, retry_backoff=True
    )
