"""What each page of the dashboard shows, gathered through the pgtasks API (synchronous).

Reads go through the reading app (the primary's, or a replica's with
``--read-dsn``), actions through the primary app; with a tenant both go through
``app.tenant(...)``, and the overview's counts through an `OverviewStore` of that
tenant. What is shown of a job is masked as ``pgtasks jobs show`` masks it
(`pgtasks.redaction`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Final

from pgtasks.db.overview import OverviewStore
from pgtasks.errors import ConfigurationError, InvalidSchedule, JobNotFound, PgtasksError, ScheduleNotFound
from pgtasks.records import Job, Requeue, Run, Schedule
from pgtasks.redaction import Redactor, redact_data
from pgtasks.serialization import dumps
from pgtasks.states import UNFINISHED, JobStatus
from pgtasks.validation import MAX_PAGE_SIZE

if TYPE_CHECKING:
    from pgtasks.app import App
    from pgtasks.db.workers import WorkerInfo
    from pgtasks.tenancy import TenantScope

__all__ = ["STATUSES", "Dashboard", "JobFilters", "NotFound"]

STATUSES: Final = tuple(s.value for s in JobStatus)
#: The statuses a job can be requeued from (``app.requeue``).
REQUEUEABLE: Final = frozenset({"failed", "cancelled", "partial_failure"})
#: The overview's throughput window and bar width, in seconds.
WINDOW: Final = 3600.0
BUCKET: Final = 300.0
#: Most failed jobs one bulk requeue touches.
MAX_BULK: Final = 10_000
#: Who the history records as having requeued a job from the dashboard.
REQUEUED_BY: Final = "dashboard"


class NotFound(PgtasksError):
    """A job or schedule the dashboard cannot show (none with that id or name, or
    another tenant's): the page answers 404."""


@dataclass(frozen=True)
class JobFilters:
    """The jobs page's filters (None: any); ``created_after``/``created_before`` bound
    the creation time, ``before_id`` pages on."""

    status: str | None = None
    queue: str | None = None
    task_name: str | None = None
    tenant: str | None = None
    created_after: dt.datetime | None = None
    created_before: dt.datetime | None = None
    before_id: int | None = None
    limit: int = 50

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> JobFilters:
        """Filters from query or form parameters (``status``, ``queue``, ``task``,
        ``tenant``, ``since``, ``until`` as ISO 8601, UTC when no offset is given,
        ``before``, ``limit``); empty values mean any.

        Raises:
            ConfigurationError: a value of the wrong form or out of range; the message
                names the parameter.
        """

        def text(name: str) -> str | None:
            value = params.get(name, "")
            return value if value != "" else None

        status = text("status")
        if status is not None and status not in STATUSES:
            raise ConfigurationError(f"status must be one of {', '.join(STATUSES)}, got {status!r:.80}")
        return cls(
            status=status,
            queue=text("queue"),
            task_name=text("task"),
            tenant=text("tenant"),
            created_after=_instant("since", text("since")),
            created_before=_instant("until", text("until")),
            before_id=_int("before", text("before"), 1, 2**63 - 1),
            limit=_int("limit", text("limit"), 1, MAX_PAGE_SIZE) or 50,
        )

    def query(self, **changes: Any) -> dict[str, str]:
        """These filters as query parameters (for links), with ``changes`` applied."""
        values: dict[str, Any] = {
            "status": self.status, "queue": self.queue, "task": self.task_name, "tenant": self.tenant,
            "since": self.created_after.isoformat() if self.created_after else None,
            "until": self.created_before.isoformat() if self.created_before else None,
            "limit": self.limit if self.limit != 50 else None,
        }  # fmt: skip
        values.update(changes)
        return {k: str(v) for k, v in values.items() if v is not None}

    @property
    def any(self) -> bool:
        """Whether any filter (beyond paging) is set."""
        return any(
            v is not None
            for v in (self.status, self.queue, self.task_name, self.tenant, self.created_after,
                      self.created_before)
        )  # fmt: skip


def _instant(name: str, value: str | None) -> dt.datetime | None:
    if value is None:
        return None
    try:
        instant = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ConfigurationError(
            f"{name} must be a date and time in ISO 8601 (2026-01-31T08:00), got {value!r:.80}"
        ) from None
    return instant if instant.tzinfo is not None else instant.replace(tzinfo=dt.UTC)


def _int(name: str, value: str | None, low: int, high: int) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ConfigurationError(f"{name} must be a whole number, got {value!r:.80}") from None
    if not low <= number <= high:
        raise ConfigurationError(f"{name} must be in {low}..{high}, got {number}")
    return number


def shown_json(value: object) -> str:
    """JSON text of a (masked) value, or its repr when it is not JSON."""
    try:
        return dumps(value)
    except PgtasksError:
        return repr(value)


@dataclass
class Dashboard:
    """The dashboard's view of one application.

    Args:
        app: the primary application (actions, and the task registry for masking).
        read: the application reads go through (``app`` itself, or one on a replica).
        tenant: the one tenant every page and action is limited to, or None.
    """

    app: App
    read: App
    tenant: str | None = None

    def __post_init__(self) -> None:
        if self.tenant is not None:
            self.app.tenant(self.tenant)  # raises ConfigurationError for a refused name

    # -- scopes --------------------------------------------------------------------

    @cached_property
    def reader(self) -> App | TenantScope:
        """Job lookups and lists: the reading app, or its handle of the tenant."""
        return self.read if self.tenant is None else self.read.tenant(self.tenant)

    @cached_property
    def actor(self) -> App | TenantScope:
        """Job actions: the primary app, or its handle of the tenant."""
        return self.app if self.tenant is None else self.app.tenant(self.tenant)

    @cached_property
    def overview(self) -> OverviewStore:
        """The overview's counts, on the reading database, of the tenant or of all."""
        return OverviewStore(self.read.database, tenant=self.tenant)

    def redactor(self, task_name: str) -> Redactor:
        """The masking rules of a job or schedule of ``task_name`` (as the CLI's)."""
        task = self.app.tasks.get(task_name)
        if task is None:
            return Redactor()
        return Redactor.of(task.fn, task.options.redact, bind=task.options.bind)

    # -- overview ------------------------------------------------------------------

    def overview_page(self) -> dict[str, Any]:
        """Queues with depth per status and oldest wait, finished jobs and failure rate
        over the last hour per queue, and the bars of the throughput chart."""
        queues: dict[str, dict[str, Any]] = {}

        def queue(name: str) -> dict[str, Any]:
            return queues.setdefault(
                name, {"name": name, "counts": dict.fromkeys(STATUSES, 0), "claimed": 0,
                       "oldest_wait": None, "finished": 0, "failures": 0}
            )  # fmt: skip

        for d in self.overview.queue_depth():
            q = queue(d.queue)
            q["counts"][d.status] = d.jobs
            q["claimed"] += d.claimed
            if d.oldest_wait is not None:
                q["oldest_wait"] = d.oldest_wait
        buckets = int(WINDOW // BUCKET)
        bars = [{"succeeded": 0, "failed": 0, "cancelled": 0} for _ in range(buckets)]
        for f in self.overview.throughput(window=WINDOW, bucket=BUCKET):
            q = queue(f.queue)
            q["finished"] += f.jobs
            kind = "failed" if f.status in ("failed", "partial_failure") else f.status
            if kind == "failed":
                q["failures"] += f.jobs
            bars[max(0, min(f.bucket, buckets - 1))][kind] += f.jobs
        for q in queues.values():
            q["failure_rate"] = q["failures"] / q["finished"] if q["finished"] else None
        return {
            "queues": sorted(queues.values(), key=lambda q: q["name"]),
            "chart": _chart(bars),
            "finished": sum(sum(b.values()) for b in bars),
            "failures": sum(b["failed"] for b in bars),
        }

    # -- jobs ----------------------------------------------------------------------

    def jobs(self, filters: JobFilters, *, database: str = "read") -> list[Job]:
        """Jobs newest first, filtered; through the tenant's handle, or (with a time
        filter, which the job API has not) the overview store of the tenant.

        Args:
            database: ``"read"`` for the page, ``"primary"`` for what an action touches.

        Raises:
            ConfigurationError: a filter out of range.
        """
        if filters.created_after is not None or filters.created_before is not None:
            db = self.read.database if database == "read" else self.app.database
            return OverviewStore(db, tenant=self.tenant).jobs(
                status=filters.status, queue=filters.queue, task_name=filters.task_name,
                tenant=filters.tenant, created_after=filters.created_after,
                created_before=filters.created_before, before_id=filters.before_id, limit=filters.limit,
            )  # fmt: skip
        api = self.reader if database == "read" else self.actor
        options: dict[str, Any] = {
            "status": filters.status, "queue": filters.queue, "task_name": filters.task_name,
            "before_id": filters.before_id, "limit": filters.limit,
        }  # fmt: skip
        if self.tenant is None:
            options["tenant"] = filters.tenant
        elif filters.tenant is not None and filters.tenant != self.tenant:
            return []
        return api.list_jobs(**options)

    def job_page(self, job_id: int) -> dict[str, Any]:
        """One job, masked as ``pgtasks jobs show`` masks it, with its timeline.

        Raises:
            NotFound: no such job (or another tenant's).
        """
        try:
            job = self.reader.get_job(job_id)
        except (JobNotFound, ConfigurationError):
            raise NotFound(f"no job with id {job_id}") from None
        redactor = self.redactor(job.task_name)
        secrets = redactor.secrets(job.args, job.kwargs)
        args, kwargs = redactor.call(job.args, job.kwargs)

        def text(value: object) -> str:
            return redactor.text(str(value), secrets) if value is not None else ""

        timeline: list[dict[str, Any]] = []
        for entry in job.timeline():
            if isinstance(entry, Requeue):
                timeline.append({"kind": "requeue", "at": entry.at, "by": entry.by,
                                 "from_status": entry.from_status})  # fmt: skip
                continue
            error = entry.error or {}
            timeline.append(
                {
                    "kind": "attempt",
                    "attempt": entry.attempt,
                    "trigger": entry.trigger,
                    "worker": entry.worker_id,
                    "started": entry.started_at,
                    "finished": entry.finished_at,
                    "outcome": entry.outcome,
                    "error": text(f"{error.get('type', '')}: {error.get('message', '')}") if error else "",
                    "code": str(error.get("code") or ""),
                    "traceback": text(error.get("traceback")) if error.get("traceback") else "",
                }
            )
        error = job.error or {}
        return {
            "job": job,
            "args": shown_json(args),
            "kwargs": shown_json(kwargs),
            "headers": shown_json(redact_data(job.headers, redactor.redact)) if job.headers else "",
            "progress": shown_json(redact_data(job.progress, redactor.redact)) if job.progress else "",
            "result": shown_json(redact_data(job.result, redactor.redact)) if job.result is not None else "",
            "error": text(f"{error.get('code')}: {error.get('message')}") if error else "",
            "traceback": text(error.get("traceback")) if error.get("traceback") else "",
            "timeline": timeline,
            "waiting": self._waiting(job),
            "can_retry": str(job.status) in REQUEUEABLE,
            "can_cancel": job.status in UNFINISHED,
        }

    def _waiting(self, job: Job) -> list[dict[str, str]]:
        """Why a queued or blocked job is not running (`pgtasks.App.explain`): code and
        message per reason; empty for a job that is neither (or is gone meanwhile)."""
        if job.status not in (JobStatus.QUEUED, JobStatus.BLOCKED):
            return []
        try:
            reasons = self.reader.explain(job.id).reasons
        except JobNotFound:
            return []
        return [{"code": r.code.value, "message": r.message} for r in reasons]

    # -- workers, tenants ----------------------------------------------------------

    def workers(self) -> list[WorkerInfo]:
        """Registered workers; with a tenant, their running and prefetched jobs counted
        among that tenant's jobs only."""
        if self.tenant is None:
            return self.read.stores.workers.list()
        return self.overview.workers()

    # -- schedules -----------------------------------------------------------------

    def schedules(self) -> list[Schedule]:
        """Every schedule (with a tenant: those whose runs are that tenant's jobs)."""
        return [s for s in self.read.schedules.all() if self.tenant is None or s.tenant == self.tenant]

    def schedule(self, name: str, *, primary: bool = False) -> Schedule:
        """One schedule the dashboard may show and act on.

        Raises:
            NotFound: no such schedule, a name no schedule can have, or another
                tenant's schedule.
        """
        source = self.app if primary else self.read
        try:
            schedule = source.schedules.get(name)
        except (ScheduleNotFound, InvalidSchedule):
            raise NotFound(f"no schedule named {name!r:.200}") from None
        if self.tenant is not None and schedule.tenant != self.tenant:
            raise NotFound(f"no schedule named {name!r:.200}")
        return schedule

    def schedule_page(self, name: str, page: int, per_page: int = 20) -> dict[str, Any]:
        """A schedule's definition (arguments masked), next fire times and one page of
        its run history.

        Raises:
            NotFound: see `schedule`.
            InvalidSchedule: a page out of range.
        """
        schedule = self.schedule(name)
        redactor = self.redactor(schedule.task_name)
        args, kwargs = redactor.call(schedule.args, schedule.kwargs)
        runs: list[Run] = self.read.schedules.history(name, page=page, per_page=per_page)
        try:
            next_fires = self.read.schedules.next_fire_times(name, 5)
        except InvalidSchedule:
            next_fires = []
        return {
            "schedule": schedule,
            "args": shown_json(args),
            "kwargs": shown_json(kwargs),
            "next_fires": next_fires,
            "runs": [
                {
                    "run": r,
                    "progress": redact_data(r.progress, redactor.redact),
                    "error": redactor.text(r.error_message or ""),
                }
                for r in runs
            ],
            "page": page,
            "has_next": len(runs) == per_page,
        }


def _chart(bars: list[dict[str, int]]) -> dict[str, Any]:
    """The throughput chart's geometry: one stacked bar per bucket (SVG units)."""
    width, height, gap = 600, 160, 6
    step = width / max(1, len(bars))
    top = max([sum(b.values()) for b in bars] + [1])
    rects: list[dict[str, Any]] = []
    for i, b in enumerate(bars):
        y = float(height)
        for kind in ("succeeded", "failed", "cancelled"):
            if not b[kind]:
                continue
            h = b[kind] / top * (height - 10)
            y -= h
            minutes = int((len(bars) - i) * BUCKET // 60)
            rects.append(
                {"x": round(i * step + gap / 2, 1), "y": round(y, 1), "w": round(step - gap, 1),
                 "h": round(h, 1), "kind": kind,
                 "title": f"{b[kind]} {kind}, {minutes}-{minutes - int(BUCKET // 60)} min ago"}
            )  # fmt: skip
    return {"width": width, "height": height, "rects": rects, "top": top}
