"""Running one attempt of a job, the same way in a pool thread and in a child process."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pgtasks.completion import Outcome
from pgtasks.context import TaskContext
from pgtasks.db.errors import error_record
from pgtasks.errors import SerializationError
from pgtasks.execution import CoreExecution, call_task
from pgtasks.serialization import dumps
from pgtasks.states import ErrorCode, FailureClass, JobStatus
from pgtasks.worker.outcome import cancelled_outcome, decide

__all__ = ["Success", "run_attempt"]


@dataclass(slots=True)
class Success:
    """A successful attempt: the result and its stored JSON form.

    Not frozen, like `pgtasks.context.Request`: one is made per job, and a frozen
    dataclass pays one ``object.__setattr__`` per field on creation.
    """

    result: Any
    result_json: str
    runtime: float


def run_attempt(context: TaskContext, *, cancelled: Any = None) -> Success | Outcome:
    """Run the task through the ``pgtasks_execute_job`` hook and classify how it ended.

    Args:
        context: the job's context.
        cancelled: a callable returning whether cancellation was requested
            (default: ``context.is_cancelled``).

    Returns:
        `Success`, or the `Outcome` to write (retry, failed, partial_failure, cancelled).
    """
    is_cancelled = cancelled or context.is_cancelled
    started = time.perf_counter()
    hook = context.task.app.plugin_manager.hook.pgtasks_execute_job
    impls = hook.get_hookimpls()
    try:
        if len(impls) == 1 and isinstance(impls[0].plugin, CoreExecution):
            # Only pgtasks' own implementation: call it without pluggy's dispatch.
            result = call_task(context)
        else:
            result = hook(context=context)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        return decide(exc, context.task.options, context.request, cancelled=bool(is_cancelled()))
    runtime = time.perf_counter() - started
    if is_cancelled():
        try:
            stored = dumps(result, "result")
        except SerializationError:
            stored = "null"
        return cancelled_outcome(
            context.request, "cancelled while running; the task returned", result=_raw(stored)
        )
    try:
        return Success(result, dumps(result, "result"), runtime)
    except SerializationError as exc:
        return Outcome(
            JobStatus.FAILED,
            error_record(exc, code=ErrorCode.RESULT_NOT_SERIALIZABLE, klass=FailureClass.PERMANENT),
            max_attempts=context.request.max_attempts,
        )


@dataclass(frozen=True, slots=True)
class _Raw:
    json: str


def _raw(text: str) -> _Raw:
    return _Raw(text)
