"""Admin pages for pgtasks' jobs and schedules, with pgtasks' operator actions.

Jobs: list, filter by status, search by exact task name, queue or tenant; a job's page
shows its arguments, result, progress, error and traceback masked as ``pgtasks jobs
show`` masks them (`pgtasks.redaction`: the task's sensitive parameters and
``redact``, the built-in secret names, secrets in error text). Actions: **retry**
(`pgtasks.App.requeue`, recorded as ``admin:<username>``) and **cancel**
(`pgtasks.App.cancel`). Schedules: list and a masked page; actions **run now**
(`Schedules.trigger`), **pause**, **resume**. Every change goes through pgtasks'
API, none through the ORM; the actions need the model's *change* permission.
Nothing is added or deleted here. Every value is escaped by Django's templates or
`format_html`.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import TYPE_CHECKING, Any, Final, cast

from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from pgtasks.contrib.django.core import get_app
from pgtasks.contrib.django.models import Job, Schedule
from pgtasks.errors import PgtasksError
from pgtasks.redaction import Redactor, redact_data
from pgtasks.states import JobStatus

__all__ = ["COUNT_CAP", "CappedPaginator", "JobAdmin", "ScheduleAdmin", "StatusFilter"]

#: Most jobs the job list counts (`CappedPaginator`).
COUNT_CAP: Final = 10_000


def _redactor(task_name: str) -> Redactor:
    """The masking rules of a job or schedule of ``task_name`` (as the CLI's and the dashboard's)."""
    task = get_app().tasks.get(task_name)
    if task is None:
        return Redactor()
    return Redactor.of(task.fn, task.options.redact, bind=task.options.bind)


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _pre(text: str) -> SafeString:
    return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>', text)


def _actor(request: HttpRequest) -> str:
    """Who acts, as pgtasks records it: ``admin:<username>``."""
    user = getattr(request, "user", None)
    name = user.get_username() if user is not None else ""
    return f"admin:{name or 'anonymous'}"[:200]


class _ReadOnly(admin.ModelAdmin):  # type: ignore[type-arg]
    """No add, delete or edit form: rows change only through pgtasks' API (the actions)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The list's actions ask without an object; a row's page is read-only.
        return obj is None and super().has_change_permission(request)


if TYPE_CHECKING:
    _Paginator = Paginator[Any]
else:  # generic in django-stubs only
    _Paginator = Paginator


class CappedPaginator(_Paginator):
    """A paginator that counts at most `cap` rows (``count(*)`` over a ``LIMIT``
    subquery): a full count of a large jobs table on every page would scan it. Past
    the cap the pages end; filter or search to reach older jobs.

    Args:
        object_list, per_page, orphans, allow_empty_first_page: as Django's `Paginator`.
        cap: most rows counted (default `COUNT_CAP`).
    """

    def __init__(self, *args: Any, cap: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cap = COUNT_CAP if cap is None else cap

    @cached_property
    def count(self) -> int:
        """The number of rows, at most `cap`."""
        rows = cast("QuerySet[Any]", self.object_list)  # the admin's list is a QuerySet
        return int(rows[: self.cap].count())


class StatusFilter(admin.SimpleListFilter):
    """Jobs by status: the choices are `pgtasks.JobStatus`, not a ``DISTINCT`` over the table."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """Every status a job can have."""
        return [(s.value, s.value) for s in JobStatus]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """The jobs of the chosen status, or all."""
        value = self.value()
        return queryset.filter(status=value) if value else queryset


@admin.register(Job)
class JobAdmin(_ReadOnly):
    """Jobs (see the module docstring)."""

    list_display = ("id", "task_name", "queue", "tenant", "status", "attempt", "run_at", "finished_at")
    list_filter = (StatusFilter,)
    # Exact names (indexable), not Django's default substring search over the whole table.
    search_fields = ("=task_name", "=queue", "=tenant")
    show_full_result_count = False  # a count(*) over a large jobs table on every page
    paginator = CappedPaginator
    actions = ("retry_jobs", "cancel_jobs")
    fields = (
        "id", "task_name", "queue", "tenant", "status", "priority", "attempt", "max_attempts",
        "trigger", "schedule_name", "run_at", "created_at", "started_at", "finished_at", "worker_id",
        "lock_key", "unique_key", "cancel_requested", "arguments", "result", "progress", "error",
        "traceback",
    )  # fmt: skip
    readonly_fields = fields

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Job | None:
        """The job of a page, with what the page shows of its data read once (`_masked`)."""
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            obj._pgtasks_masked = self._read_masked(obj)
        return obj

    def _masked(self, obj: Job) -> dict[str, str]:
        """What the page shows of the job's data, masked (read by `get_object`)."""
        masked = getattr(obj, "_pgtasks_masked", None)
        return masked if masked is not None else self._read_masked(obj)

    def _read_masked(self, obj: Job) -> dict[str, str]:
        """The job's arguments, result, progress, error and traceback, read through
        pgtasks and masked."""
        try:
            job = get_app().get_job(obj.id)
        except PgtasksError:
            return {}
        redactor = _redactor(job.task_name)
        secrets = redactor.secrets(job.args, job.kwargs)
        args, kwargs = redactor.call(job.args, job.kwargs)
        error = job.error or {}
        return {
            "arguments": _json({"args": args, "kwargs": kwargs}),
            "result": _json(redact_data(job.result, redactor.redact)) if job.result is not None else "",
            "progress": _json(redact_data(job.progress, redactor.redact)) if job.progress else "",
            "error": redactor.text(f"{error.get('code')}: {error.get('message')}", secrets) if error else "",
            "traceback": redactor.text(str(error["traceback"]), secrets) if error.get("traceback") else "",
        }

    @admin.display(description="arguments")
    def arguments(self, obj: Job) -> SafeString:
        """Positional and keyword arguments, masked."""
        return _pre(self._masked(obj).get("arguments", ""))

    @admin.display(description="result")
    def result(self, obj: Job) -> SafeString:
        """The return value, masked under sensitive keys."""
        return _pre(self._masked(obj).get("result", ""))

    @admin.display(description="progress")
    def progress(self, obj: Job) -> SafeString:
        """The last progress report, masked under sensitive keys."""
        return _pre(self._masked(obj).get("progress", ""))

    @admin.display(description="error")
    def error(self, obj: Job) -> SafeString:
        """The last error's code and message, secrets masked."""
        return _pre(self._masked(obj).get("error", ""))

    @admin.display(description="traceback")
    def traceback(self, obj: Job) -> SafeString:
        """The last error's traceback, secrets masked."""
        return _pre(self._masked(obj).get("traceback", ""))

    @admin.action(description="Retry the selected jobs", permissions=["change"])
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        """Requeue each failed, cancelled or partially failed job (`pgtasks.App.requeue`)."""
        app, by = get_app(), _actor(request)
        done, skipped = 0, 0
        for job_id in queryset.values_list("id", flat=True):
            try:
                if app.requeue(job_id, by=by):
                    done += 1
                else:
                    skipped += 1
            except PgtasksError as exc:
                self.message_user(request, f"job {job_id}: {exc}", messages.ERROR)
        self.message_user(request, f"{done} job(s) requeued; {skipped} not failed or cancelled, left alone.")

    @admin.action(description="Cancel the selected jobs", permissions=["change"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        """Cancel each queued job, and ask the worker of each running one to stop (`pgtasks.App.cancel`)."""
        app = get_app()
        done, finished = 0, 0
        for job_id in queryset.values_list("id", flat=True):
            try:
                if app.cancel(job_id):
                    done += 1
                else:
                    finished += 1
            except PgtasksError as exc:
                self.message_user(request, f"job {job_id}: {exc}", messages.ERROR)
        self.message_user(request, f"{done} job(s) cancelled or asked to stop; {finished} already finished.")


@admin.register(Schedule)
class ScheduleAdmin(_ReadOnly):
    """Schedules (see the module docstring)."""

    list_display = ("name", "task_name", "cron", "timezone", "queue", "tenant", "paused", "next_fire_at",
                    "last_run_at", "last_outcome")  # fmt: skip
    list_filter = ("paused", "queue", "tenant")
    search_fields = ("name", "task_name")
    actions = ("run_now", "pause", "resume")
    fields = ("name", "task_name", "cron", "timezone", "queue", "tenant", "paused", "next_fire_at",
              "last_run_at", "last_outcome", "invalid_reason", "arguments")  # fmt: skip
    readonly_fields = fields

    @admin.display(description="arguments")
    def arguments(self, obj: Schedule) -> SafeString:
        """The arguments each run gets, masked."""
        try:
            schedule = get_app().schedules.get(obj.name)
        except PgtasksError:
            return _pre("")
        args, kwargs = _redactor(schedule.task_name).call(schedule.args, schedule.kwargs)
        return _pre(_json({"args": args, "kwargs": kwargs}))

    def _each(self, request: HttpRequest, queryset: QuerySet[Schedule], verb: str, act: Any) -> None:
        done = 0
        for name in queryset.values_list("name", flat=True):
            try:
                if act(name) is not False:
                    done += 1
            except PgtasksError as exc:
                self.message_user(request, f"schedule {name}: {exc}", messages.ERROR)
        self.message_user(request, f"{done} schedule(s) {verb}.")

    @admin.action(description="Run the selected schedules now", permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        """A manual run of each (`Schedules.trigger`)."""
        schedules, by = get_app().schedules, _actor(request)
        self._each(request, queryset, "triggered", lambda name: schedules.trigger(name, requested_by=by))

    @admin.action(description="Pause the selected schedules", permissions=["change"])
    def pause(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        """Pause each (`Schedules.pause`)."""
        schedules, by = get_app().schedules, _actor(request)
        self._each(request, queryset, "paused", lambda name: schedules.pause(name, by=by))

    @admin.action(description="Resume the selected schedules", permissions=["change"])
    def resume(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        """Resume each (`Schedules.resume`)."""
        self._each(request, queryset, "resumed", get_app().schedules.resume)
