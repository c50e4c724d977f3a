"""``--json`` on the inspection commands: one JSON document on stdout, in a stable shape.

The shapes are documented field by field in docs/operations.md ("JSON output"); the
functions here build them from records and rows, masked as the tables are:

* times are ISO 8601 text in UTC with an explicit offset (``2026-01-31T02:00:00.123456+00:00``),
  or null;
* ids are numbers, statuses and other enum values their string values, an absent
  value is null, lists are arrays of objects;
* arguments, results, headers and progress are given as stored (pgtasks'
  serialization: plain JSON, with ``{"$pgtasks": TYPE, "v": ...}`` for tuples,
  datetimes, bytes ...), with the same values masked as in the tables
  (`pgtasks.redaction`); a value that cannot be written so is given as its repr text.

Errors are not JSON: the command exits with a non-zero status (1: a pgtasks error
such as an unknown id or an unreachable database; 2: a usage error), writes its
message on stderr and nothing on stdout, exactly as without ``--json``.

orjson writes C0 control characters as ``\\u`` escapes; `echo_json` also escapes
DEL, the C1 controls and the Unicode marks that reorder or hide text (the ones
`pgtasks.cli.common.shown` escapes), so the document cannot act on a terminal and
still parses to the same values.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import click
import orjson

from pgtasks.errors import PgtasksError
from pgtasks.records import Requeue
from pgtasks.redaction import Redactor, redact_data, redact_text
from pgtasks.serialization import encode

if TYPE_CHECKING:
    from pgtasks.db import WorkerInfo
    from pgtasks.records import Attempt, Job, Run, Schedule

__all__ = [
    "JOB_STATUS_COLUMNS",
    "echo_json",
    "job_detail",
    "job_summary",
    "json_option",
    "queue_counts",
    "run_object",
    "schedule_object",
    "time_text",
    "worker_object",
]

F = TypeVar("F", bound=Callable[..., Any])

#: The keys of ``counts`` in ``queues --json``: the statuses, with ``claimed`` (held
#: ahead by a worker, not started) apart from ``running``.
JOB_STATUS_COLUMNS = (
    "queued",
    "claimed",
    "running",
    "succeeded",
    "failed",
    "cancelled",
    "partial_failure",
    "blocked",
)

_JSON_HELP = "Print one JSON document on stdout instead of a table (docs/operations.md, JSON output)."


def json_option(command: F) -> F:
    """Add ``--json`` to an inspection command; it receives the boolean parameter ``as_json``."""
    return click.option("--json", "as_json", is_flag=True, help=_JSON_HELP)(command)


def _json_escapes() -> dict[int, str]:
    marks = (*range(0x7F, 0xA0), 0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
    return {code: f"\\u{code:04x}" for code in (*marks, 0x2028, 0x2029)}


_JSON_VISIBLE = _json_escapes()


def echo_json(document: object) -> None:
    """Write ``document`` as one indented JSON document and a newline on stdout.

    Characters that could act on a terminal are written as ``\\uXXXX`` escapes
    (valid JSON: they only occur inside strings).

    Raises:
        TypeError: a value orjson cannot write (the builders here never produce one).
    """
    text = orjson.dumps(document, option=orjson.OPT_INDENT_2).decode("utf-8")
    click.echo(text.translate(_JSON_VISIBLE))


def time_text(value: dt.datetime | str | None) -> str | None:
    """An instant as ISO 8601 in UTC with its offset; ISO text (from a jsonb history)
    is read and written the same way; None stays None; other text is returned as is."""
    if value is None:
        return None
    instant = value
    if isinstance(value, str):
        try:
            instant = dt.datetime.fromisoformat(value)
        except ValueError:
            return value
    assert isinstance(instant, dt.datetime)
    if instant.tzinfo is None:
        return instant.isoformat()
    return instant.astimezone(dt.UTC).isoformat()


def _data(value: Any) -> Any:
    """A value as stored (`pgtasks.serialization.encode`), or its repr when it cannot be."""
    try:
        return encode(value)
    except PgtasksError:
        return repr(value)


def _error(error: Mapping[str, Any] | None, redactor: Redactor) -> dict[str, Any] | None:
    """An error record with its message and traceback masked (``redactor.text``)."""
    if not error:
        return None
    message, trace = error.get("message"), error.get("traceback")
    return {
        "type": error.get("type"),
        "code": error.get("code"),
        "class": error.get("class"),
        "message": None if message is None else redactor.text(str(message)),
        "traceback": None if trace is None else redactor.text(str(trace)),
    }


def job_summary(job: Job) -> dict[str, Any]:
    """A job as ``jobs list --json`` gives it (no arguments; the error's code, masked as the
    table masks it)."""
    code = (job.error or {}).get("code")
    return {
        "id": job.id,
        "task_name": job.task_name,
        "queue": job.queue,
        "tenant": job.tenant,
        "status": str(job.status),
        "phase": job.phase,
        "attempt": job.attempt,
        "attempt_number": job.attempt_number,
        "max_attempts": job.max_attempts,
        "priority": job.priority,
        "trigger": job.trigger,
        "run_at": time_text(job.run_at),
        "created_at": time_text(job.created_at),
        "started_at": time_text(job.started_at),
        "finished_at": time_text(job.finished_at),
        "worker_id": job.worker_id,
        "error_code": None if code is None else redact_text(str(code)),
    }


def _timeline_entry(entry: Attempt | Requeue, redactor: Redactor) -> dict[str, Any]:
    if isinstance(entry, Requeue):
        return {
            "kind": "requeue",
            "at": time_text(entry.at),
            "by": entry.by,
            "from_status": entry.from_status,
            "after_attempt": entry.after_attempt,
        }
    return {
        "kind": "attempt",
        "attempt": entry.attempt,
        "trigger": entry.trigger,
        "worker_id": entry.worker_id,
        "started_at": time_text(entry.started_at),
        "finished_at": time_text(entry.finished_at),
        "outcome": entry.outcome,
        "error": _error(entry.error, redactor),
    }


def job_detail(job: Job, redactor: Redactor) -> dict[str, Any]:
    """A job as ``jobs show --json`` gives it: the summary, every other column, the masked
    arguments, headers, progress, result and error, and the timeline of attempts and requeues.

    Args:
        job: the job.
        redactor: its task's masking rules (`pgtasks.cli.common.task_redactor`).
    """
    args, kwargs = redactor.call(job.args, job.kwargs)
    out = job_summary(job)
    out.update(
        {
            "schedule_name": job.schedule_name,
            "scheduled_for": time_text(job.scheduled_for),
            "heartbeat_at": time_text(job.heartbeat_at),
            "lock_key": job.lock_key,
            "unique_key": job.unique_key,
            "parent_id": job.parent_id,
            "correlation_id": job.correlation_id,
            "cancel_requested": bool(job.cancel_requested),
            "retry_on_worker_lost": bool(job.retry_on_worker_lost),
            "args": _data(args),
            "kwargs": _data(kwargs),
            "headers": _data(redact_data(job.headers or {}, redactor.redact)),
            "progress": None if job.progress is None else _data(redact_data(job.progress, redactor.redact)),
            "result": _data(redact_data(job.result, redactor.redact)),
            "error": _error(job.error, redactor),
            "timeline": [_timeline_entry(entry, redactor) for entry in job.timeline()],
        }
    )
    return out


def queue_counts(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``queues --json``: one object per queue, by name, from ``queue_stats`` rows."""
    by_queue: dict[str, dict[str, Any]] = {}
    for r in rows:
        q = by_queue.setdefault(
            str(r["queue"]), {"counts": dict.fromkeys(JOB_STATUS_COLUMNS, 0), "oldest_queued_run_at": None}
        )
        q["counts"][str(r["status"])] = int(r["jobs"]) - int(r["claimed"])
        q["counts"]["claimed"] += int(r["claimed"])
        if r["oldest_run_at"] is not None:
            q["oldest_queued_run_at"] = time_text(r["oldest_run_at"])
    return [{"queue": name, **value} for name, value in sorted(by_queue.items())]


def worker_object(w: WorkerInfo) -> dict[str, Any]:
    """A registered worker as ``workers --json`` gives it."""
    return {
        "id": w.id,
        "host": w.host,
        "pid": w.pid,
        "queues": list(w.queues),
        "pool": w.pool,
        "concurrency": w.concurrency,
        "running": w.running,
        "claimed": w.claimed,
        "started_at": time_text(w.started_at),
        "last_seen_at": time_text(w.last_seen_at),
        "lease_expires_at": time_text(w.lease_expires_at),
        "state": w.state,
    }


def schedule_state(s: Schedule) -> str:
    """``invalid``, ``paused`` or ``active``."""
    if s.invalid_reason:
        return "invalid"
    return "paused" if s.paused else "active"


def schedule_object(s: Schedule, redactor: Redactor) -> dict[str, Any]:
    """A schedule as ``schedules list --json`` and ``schedules show --json`` give it, its
    sensitive arguments masked as ``schedules show`` masks them."""
    args, kwargs = redactor.call(s.args, s.kwargs)
    last_run = None
    if s.last_run_id is not None:
        last_run = {
            "id": s.last_run_id,
            "at": time_text(s.last_run_at),
            "status": s.last_run_status,
            "trigger": s.last_run_trigger,
        }
    last_outcome = None
    if s.last_outcome is not None:
        last_outcome = {
            "outcome": s.last_outcome,
            "run_id": s.last_outcome_run_id,
            "at": time_text(s.last_outcome_at),
        }
    return {
        "name": s.name,
        "task_name": s.task_name,
        "cron": s.cron,
        "timezone": s.timezone,
        "after": list(s.after),
        "args": _data(args),
        "kwargs": _data(kwargs),
        "queue": s.queue,
        "tenant": s.tenant,
        "priority": s.priority,
        "lock_key": s.lock_key,
        "overlap": s.overlap,
        "misfire": s.misfire,
        "catch_up_limit": s.catch_up_limit,
        "max_retries": s.max_retries,
        "source": s.source,
        "state": schedule_state(s),
        "paused_by": s.paused_by if s.paused else None,
        "paused_at": time_text(s.paused_at) if s.paused else None,
        "invalid_reason": s.invalid_reason,
        "next_fire_at": time_text(s.next_fire_at),
        "last_fire_at": time_text(s.last_fire_at),
        "last_run": last_run,
        "last_outcome": last_outcome,
        "created_at": time_text(s.created_at),
        "updated_at": time_text(s.updated_at),
    }


def run_object(r: Run, redactor: Redactor) -> dict[str, Any]:
    """A run as ``schedules history --json`` gives it: the error message masked
    (`pgtasks.redaction.redact_text` and the task's names), progress masked by key."""
    error = None
    if r.error_code is not None or r.error_message is not None:
        error = {
            "code": r.error_code,
            "class": r.failure_class,
            "message": None if r.error_message is None else redactor.text(r.error_message),
        }
    return {
        "id": r.id,
        "schedule": r.schedule,
        "task_name": r.task_name,
        "trigger": r.trigger,
        "requested_by": r.requested_by,
        "attempt": r.attempt,
        "status": r.status,
        "outcome": r.outcome,
        "scheduled_for": time_text(r.scheduled_for),
        "created_at": time_text(r.created_at),
        "started_at": time_text(r.started_at),
        "finished_at": time_text(r.finished_at),
        "duration_seconds": r.duration,
        "error": error,
        "worker_id": r.worker_id,
        "progress": _data(redact_data(r.progress, redactor.redact)),
        "correlation_id": r.correlation_id,
        "parent_id": r.parent_id,
    }
