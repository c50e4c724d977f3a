"""pgtasks: Celery-style background tasks with PostgreSQL as broker, result store and schedule store.

Quick start::

    import pgtasks

    app = pgtasks.App("billing")

    @app.task(queue="ocr", max_retries=5, retry_backoff=True)
    def ocr_document(document_id: int) -> dict: ...

    ocr_document.delay(42).get(timeout=30)
"""

from __future__ import annotations

from pgtasks import errors
from pgtasks.app import App
from pgtasks.context import Request, TaskContext
from pgtasks.hookspecs import hookimpl
from pgtasks.records import Attempt, Job
from pgtasks.result import AsyncResult
from pgtasks.scheduler import Run, Schedule, ScheduleSpec
from pgtasks.settings import Settings
from pgtasks.states import JobStatus, Trigger
from pgtasks.task import Signature, Task, TaskOptions

__all__ = [
    "App",
    "AsyncResult",
    "Attempt",
    "Job",
    "JobStatus",
    "Request",
    "Run",
    "Schedule",
    "ScheduleSpec",
    "Settings",
    "Signature",
    "Task",
    "TaskContext",
    "TaskOptions",
    "Trigger",
    "__version__",
    "errors",
    "hookimpl",
]

__version__ = "0.1.0"
