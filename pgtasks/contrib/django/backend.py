"""A backend for Django's task framework that runs Django tasks on pgtasks.

```python
TASKS = {"default": {"BACKEND": "pgtasks.contrib.django.backend.PgtasksBackend"}}
```

A project that writes tasks the Django way (``from django.tasks import task``, or the
``django_tasks`` package on Django releases before 6.0) then runs them on pgtasks
workers without changing its code:

* a Django task becomes a pgtasks task of the same name (its ``module_path``,
  ``myapp.tasks.send_receipt``) when it is defined, so the worker knows every task of
  the ``tasks.py`` modules that `pgtasks.contrib.django` imports at start-up;
* ``task.enqueue(...)`` writes a job on Django's database connection (inside
  ``transaction.atomic()``, with the block's commit), on the task's ``queue_name``,
  with its ``priority`` (both run higher first) and ``run_after`` (the job's ``eta``);
* ``get_result(id)`` (``task.get_result``, ``result.refresh()``) reads the job:
  ``queued`` is READY, ``running`` RUNNING, ``succeeded`` SUCCESSFUL with the
  task's return value, ``failed``, ``cancelled`` and ``partial_failure`` FAILED;
  each failed attempt is a `TaskError`, each attempt's worker one of ``worker_ids``.

``OPTIONS``: ``MAX_RETRIES`` (default 0: a Django task that raises ends FAILED, as
Django's own backends do; more lets pgtasks retry it on `pgtasks.errors.Retry` and
the exceptions of ``AUTORETRY_FOR``), ``AUTORETRY_FOR`` (exception classes or their
dotted paths).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from django.utils import timezone
from django.utils.module_loading import import_string

from pgtasks.contrib.django.core import get_app
from pgtasks.errors import ConfigurationError, JobNotFound, SerializationError
from pgtasks.records import Attempt, Job
from pgtasks.states import JobStatus

if TYPE_CHECKING:  # Django 6 has the framework as django.tasks; the types come from the backport
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued
elif find_spec("django.tasks") is not None:
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued
else:  # Django before 6.0: the django-tasks package
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued

__all__ = ["PgtasksBackend", "result_of_job"]

_STATUS = {
    JobStatus.QUEUED: TaskResultStatus.READY,
    JobStatus.RUNNING: TaskResultStatus.RUNNING,
    JobStatus.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    JobStatus.FAILED: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
    JobStatus.PARTIAL_FAILURE: TaskResultStatus.FAILED,
}


def _instant(value: object) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value
    if isinstance(value, str):
        try:
            return dt.datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


def _task_error(error: dict[str, Any]) -> TaskError:
    """A Django `TaskError` of a pgtasks error record (``module``, ``type``, ``traceback``;
    its code and message stand in for a traceback when there is none, e.g. ``CANCELLED``)."""
    module, type_name = error.get("module"), str(error.get("type") or "Exception")
    path = f"{module}.{type_name}" if module else f"builtins.{type_name}"
    traceback = error.get("traceback") or f"{error.get('code', '')}: {error.get('message', '')}"
    return TaskError(exception_class_path=path, traceback=str(traceback))


def result_of_job(task: Task[Any, Any], job: Job, backend: str) -> TaskResult[Any]:
    """The Django `TaskResult` of a pgtasks job of ``task`` (see the module docstring)."""
    attempts = [a for a in job.timeline() if isinstance(a, Attempt)]
    errors = [_task_error(a.error) for a in attempts if a.error]
    if job.status in (JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.PARTIAL_FAILURE) and not errors:
        errors.append(_task_error(job.error or {"type": "Exception", "code": str(job.status)}))
    result: TaskResult[Any] = TaskResult(
        task=task,
        id=str(job.id),
        status=_STATUS[job.status],
        enqueued_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        last_attempted_at=_instant(attempts[-1].started_at) if attempts else None,
        args=list(job.args),
        kwargs=dict(job.kwargs),
        backend=backend,
        errors=errors,
        worker_ids=[str(a.worker_id) for a in attempts if a.worker_id],
    )
    if job.status == JobStatus.SUCCEEDED:
        object.__setattr__(result, "_return_value", job.result)
    return result


def _exception_classes(value: object) -> tuple[type[BaseException], ...]:
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ConfigurationError("TASKS OPTIONS['AUTORETRY_FOR'] must be a list of exception classes")
    classes = []
    for item in value:
        cls = import_string(item) if isinstance(item, str) else item
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise ConfigurationError(f"TASKS OPTIONS['AUTORETRY_FOR']: {item!r} is not an exception class")
        classes.append(cls)
    return tuple(classes)


class PgtasksBackend(BaseTaskBackend):
    """Runs Django tasks as pgtasks jobs (see the module docstring).

    Args:
        alias: the backend's name in ``TASKS``.
        params: its ``TASKS`` entry: ``QUEUES`` (Django's: the queue names tasks may
            use), ``OPTIONS`` (``MAX_RETRIES``, ``AUTORETRY_FOR``).

    Raises:
        ConfigurationError: a bad option.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = params.get("OPTIONS") or {}
        unknown = sorted(set(options) - {"MAX_RETRIES", "AUTORETRY_FOR"})
        if unknown:
            raise ConfigurationError(f"unknown TASKS OPTIONS for {alias!r}: {', '.join(map(str, unknown))}")
        self.max_retries = options.get("MAX_RETRIES", 0)
        self.autoretry_for = _exception_classes(options.get("AUTORETRY_FOR", ()))

    def validate_task(self, task: Task[Any, Any]) -> None:
        """Django's checks, then make the task a pgtasks task (once per function).

        Raises:
            InvalidTaskError: as Django's backends (a nested function, a bad priority,
                a queue not in ``QUEUES`` ...).
            ConfigurationError: another function is registered in pgtasks under the
                task's name.
        """
        super().validate_task(task)
        self._pgtasks_task(task)

    def _pgtasks_task(self, task: Task[Any, Any]) -> Any:
        """The pgtasks task that runs ``task``, registered on first call."""
        app = get_app()
        name = task.module_path
        existing = app.tasks.get(name)
        if existing is not None:
            if getattr(existing.fn, "__wrapped__", existing.fn) is not task.func:
                raise ConfigurationError(
                    f"pgtasks has another function registered as {name!r}; a Django task of that "
                    "name cannot run on pgtasks"
                )
            return existing
        fn: Callable[..., Any] = task.func
        options: dict[str, Any] = {"name": name, "queue": task.queue_name, "max_retries": self.max_retries}
        if self.autoretry_for:
            options["autoretry_for"] = self.autoretry_for
        if task.takes_context:
            fn = self._with_context(task)
            options.update(bind=True, typing=False)
        return app.register_task(fn, **options)

    def _with_context(self, task: Task[Any, Any]) -> Callable[..., Any]:
        """A pgtasks task function that calls ``task`` with its `TaskContext` first."""
        backend = self

        def run(request_task: Any, *args: Any, **kwargs: Any) -> Any:
            job = get_app().get_job(int(request_task.request.id))
            context = TaskContext(task_result=result_of_job(task, job, backend.alias))
            return task.call(context, *args, **kwargs)

        run.__wrapped__ = task.func  # type: ignore[attr-defined]
        run.__qualname__ = task.func.__qualname__
        run.__module__ = task.func.__module__
        return run

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any]:
        """Write the task's job (on Django's connection; see the module docstring).

        Returns:
            A READY `TaskResult` whose ``id`` is the job's id.

        Raises:
            InvalidTaskError: as `validate_task`.
            ConfigurationError: arguments that do not fit the function.
            SerializationError: an argument that is not a JSON value (Django's
                rule; a datetime, say) or cannot round-trip exactly; nothing is written.
        """
        self.validate_task(task)
        try:  # Django's TaskResult keeps JSON values only: refuse others before writing
            result: TaskResult[Any] = TaskResult(
                task=task,
                id="",
                status=TaskResultStatus.READY,
                enqueued_at=None,
                started_at=None,
                finished_at=None,
                last_attempted_at=None,
                args=list(args),
                kwargs=dict(kwargs),
                backend=self.alias,
                errors=[],
                worker_ids=[],
            )
        except (TypeError, ValueError) as exc:
            raise SerializationError("args", f"Django tasks take JSON values only ({exc})") from exc
        options: dict[str, Any] = {"queue": task.queue_name, "priority": task.priority}
        if task.run_after is not None:
            options["eta"] = task.run_after
        job = self._pgtasks_task(task).apply_async(args=tuple(args), kwargs=dict(kwargs), **options)
        object.__setattr__(result, "id", str(job.id))
        object.__setattr__(result, "enqueued_at", timezone.now())
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any]:
        """The result of the job ``result_id``, read from pgtasks' connections.

        Raises:
            TaskResultDoesNotExist: no job has that id, the id is not a job id, or the
                job is not one of a Django task.
        """
        try:
            job_id = int(str(result_id))
            job = get_app().get_job(job_id)
        except (ValueError, JobNotFound, ConfigurationError):
            raise TaskResultDoesNotExist(result_id) from None
        try:
            task = import_string(job.task_name)
        except ImportError:
            task = None
        if not isinstance(task, Task):
            raise TaskResultDoesNotExist(result_id)
        return result_of_job(task, job, self.alias)
