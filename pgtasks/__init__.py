"""pgtasks: Celery-style background tasks with PostgreSQL as broker, result store and schedule store.

Quick start::

    import pgtasks

    app = pgtasks.App("billing")

    @app.task(queue="ocr", max_retries=5, retry_backoff=True)
    def ocr_document(document_id: int) -> dict: ...

    ocr_document.delay(42).get(timeout=30)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgtasks import errors
from pgtasks.app import App
from pgtasks.canvas import GroupResult, chain, chord, group
from pgtasks.context import Request, TaskContext
from pgtasks.flow import TENANT
from pgtasks.hookspecs import hookimpl
from pgtasks.records import Attempt, Job, Requeue
from pgtasks.result import AsyncResult
from pgtasks.settings import Settings
from pgtasks.states import JobStatus, Trigger
from pgtasks.task import Signature, Task, TaskOptions
from pgtasks.tenancy import TenantScope

if TYPE_CHECKING:
    from pgtasks.scheduler import Run, Schedule, ScheduleSpec

__all__ = [  # noqa: RUF022 - plain sorted() order, which tests/test_public_api.py checks
    "App",
    "AsyncResult",
    "Attempt",
    "GroupResult",
    "Job",
    "JobStatus",
    "Request",
    "Requeue",
    "Run",
    "Schedule",
    "ScheduleSpec",
    "Settings",
    "Signature",
    "TENANT",
    "Task",
    "TaskContext",
    "TaskOptions",
    "TenantScope",
    "Trigger",
    "__version__",
    "chain",
    "chord",
    "errors",
    "group",
    "hookimpl",
]

__version__ = "0.1.0"

# Imported on first access (PEP 562): the scheduler package loads croniter and
# dateutil, which a process that defines no schedule (a plain worker) never needs
# (1.0 MiB of peak resident memory per worker process on CPython 3.11).
_LAZY_EXPORTS = {
    "Run": "pgtasks.scheduler",
    "Schedule": "pgtasks.scheduler",
    "ScheduleSpec": "pgtasks.scheduler",
}


def __getattr__(name: str) -> Any:
    """``pgtasks.Schedule`` and friends, imported from `pgtasks.scheduler` on first access."""
    module = _LAZY_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pgtasks' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    """Module attributes, the lazy ones included."""
    return sorted(set(globals()) | set(_LAZY_EXPORTS))
