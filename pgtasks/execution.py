"""Calling a task's function for a job: positional binding, ``bind=True``, and ``async def``.

`CoreExecution` is pgtasks' own, innermost ``pgtasks_execute_job`` implementation,
which every app registers; it calls `call_task`.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from pgtasks.context import TaskContext
from pgtasks.hookspecs import hookimpl
from pgtasks.secret_ref import resolve_call

__all__ = ["CoreExecution", "call_task"]


def call_task(context: TaskContext) -> Any:
    """Call the task function with the job's arguments and return its result.

    A bound task gets ``context`` as first argument. An ``async def`` task runs to
    completion in a fresh event loop on the calling worker thread. Secret references
    among the arguments (`pgtasks.secret_ref`) are resolved here, just before the
    call, from this process's environment: the task gets the values, the request
    keeps the references.

    Raises:
        Reject: ``SECRET_UNAVAILABLE``: a referenced secret is not set here.
    """
    task = context.task
    args, kwargs, _ = resolve_call(context.request.args, context.request.kwargs)
    if task.options.bind:
        args = (context, *args)
    result = task.fn(*args, **kwargs)
    if result is not None and inspect.isawaitable(result):
        return asyncio.run(_await(result))
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


class CoreExecution:
    """pgtasks' own, innermost implementation of `pgtasks_execute_job` (registered as ``pgtasks.core``)."""

    @hookimpl(trylast=True)
    def pgtasks_execute_job(self, context: TaskContext) -> Any:
        """Run the job's task: `call_task` of ``context``."""
        return call_task(context)
