"""Creating runs of schedules: one job row per run, refused by the database when it must be.

Every run is inserted by one statement that reads the schedule's row (or, for a
retry, the failed run's row) and does ``ON CONFLICT DO NOTHING``. PostgreSQL then
refuses, whatever the number of scheduler processes:

* a second unfinished run of a schedule with ``overlap="skip"`` (its runs share the
  unique key ``schedule:<name>``; see ``jobs_unique_key_idx``);
* a second cron-made run for one fire time (``jobs_schedule_fire_idx`` on
  ``(schedule_name, scheduled_for) WHERE trigger = 'schedule'``).

Notification hooks (``pgtasks_after_enqueue``, ``pgtasks_schedule_fired``) are
collected as `RunEvent` values and sent by the caller once its transaction
committed, so no plugin hears of a run that was rolled back.
"""

from __future__ import annotations

import getpass
import logging
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pluggy

from pgtasks.db import AnyConnection, Stores
from pgtasks.plugins import call_isolated
from pgtasks.serialization import dumps
from pgtasks.states import Trigger

__all__ = ["RunEvent", "RunInsert", "emit", "insert_retry_run", "insert_run", "requested_by_default"]

log = logging.getLogger("pgtasks.scheduler")

_ATTEMPTS_ON_CONFLICT = 3  # the holder may finish between the refused insert and the look-up


def requested_by_default() -> str:
    """``user@host`` of this process, recorded on manual runs."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name (containers without a passwd entry)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True, slots=True)
class RunEvent:
    """A run made or refused, to announce after commit.

    Attributes:
        schedule: schedule name.
        task_name: the task of the run.
        trigger: ``schedule``, ``manual``, ``retry`` or ``dependency``.
        job_id: the new run's id, or None when it was refused.
        scheduled_for: the fire time, or None.
    """

    schedule: str
    task_name: str
    trigger: str
    job_id: int | None
    scheduled_for: datetime | None


@dataclass(frozen=True, slots=True)
class RunInsert:
    """What an insert did.

    Attributes:
        job_id: the new run's id, or None when refused.
        active_run_id: when refused by ``overlap="skip"``, the active run holding the
            schedule's unique key (-1 if it finished before it could be read).
        duplicate: when refused because this fire time already has its run.
    """

    job_id: int | None
    active_run_id: int | None = None
    duplicate: bool = False


def _before_enqueue(pm: pluggy.PluginManager, schedule: Mapping[str, Any], headers: dict[str, Any]) -> None:
    if not pm.hook.pgtasks_before_enqueue.get_hookimpls():
        return
    options = {
        "queue": schedule["queue"],
        "priority": schedule["priority"],
        "tenant": schedule["tenant"],
        "lock": schedule["lock_key"],
        "unique_key": f"schedule:{schedule['name']}" if schedule["overlap"] == "skip" else None,
        "countdown": None,
        "eta": None,
    }
    pm.hook.pgtasks_before_enqueue(task_name=schedule["task_name"], options=options, headers=headers)


def insert_run(
    stores: Stores,
    pm: pluggy.PluginManager,
    conn: AnyConnection,
    schedule: Mapping[str, Any],
    *,
    trigger: str,
    scheduled_for: datetime | None = None,
    parent_id: int | None = None,
    correlation_id: str | None = None,
    headers: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> RunInsert:
    """Insert a run of ``schedule`` (its stored row, `pgtasks.db.ScheduleRow`) in ``conn``'s transaction.

    Args:
        stores: the stores that run the statements (``schedules``; ``jobs`` to name
            the active run that refused it).
        pm: the app's plugin manager (``pgtasks_before_enqueue`` may add headers).
        conn: a connection inside the caller's transaction.
        schedule: the schedule's row.
        trigger: ``schedule``, ``manual`` or ``dependency``.
        scheduled_for: the fire time (trigger ``schedule``), else None.
        parent_id: the run that caused this one (trigger ``dependency``).
        correlation_id: shared with related runs; None makes a new UUID.
        headers: stored with the job (e.g. ``requested_by``).
        now: pinned time (run-at), None for the database clock.

    Returns:
        The `RunInsert`; ``job_id`` is None when the database refused the run.

    Raises:
        DatabaseError: the statement failed (the caller's transaction is aborted).
        SerializationError: a plugin added headers that cannot be stored.
    """
    job_headers = dict(headers or {})
    _before_enqueue(pm, schedule, job_headers)
    name = str(schedule["name"])
    encoded = dumps(job_headers, "headers")
    for _ in range(_ATTEMPTS_ON_CONFLICT):
        job_id = stores.schedules.run_insert(
            name=name,
            trigger=trigger,
            headers=encoded,
            scheduled_for=scheduled_for,
            parent_id=parent_id,
            correlation_id=correlation_id,
            now=now,
            conn=conn,
        )
        if job_id is not None:
            return RunInsert(job_id)
        if (
            trigger == Trigger.SCHEDULE
            and scheduled_for is not None
            and stores.schedules.fire_run(name=name, scheduled_for=scheduled_for, conn=conn) is not None
        ):
            return RunInsert(None, duplicate=True)
        if schedule["overlap"] != "skip":
            break
        holder = stores.jobs.find_unique(unique_key=f"schedule:{name}", conn=conn)
        if holder is not None:
            return RunInsert(None, active_run_id=holder)
    return RunInsert(None, active_run_id=-1)


def insert_retry_run(
    stores: Stores, conn: AnyConnection, failed_run_id: int, *, delay: float, now: datetime | None = None
) -> RunInsert:
    """Insert the retry run of a failed run (attempt n+1, trigger ``retry``), due in ``delay`` seconds.

    The retry copies the failed run's task, arguments, keys, headers, fire time and
    correlation id, and links to it through ``parent_id``.

    Args:
        stores: the stores that run the statement (``schedules``).
        conn: a connection inside the caller's transaction.
        failed_run_id: the failed run's job id.
        delay: seconds from ``now`` until the retry is due (>= 0).
        now: pinned time, None for the database clock.

    Returns:
        The `RunInsert`; ``job_id`` is None when another active run holds the
        schedule's unique key (``active_run_id`` is then -1: not looked up).

    Raises:
        DatabaseError: the statement failed.
    """
    job_id = stores.schedules.run_retry_insert(parent_id=failed_run_id, delay=delay, now=now, conn=conn)
    if job_id is not None:
        return RunInsert(job_id)
    return RunInsert(None, active_run_id=-1)


def emit(pm: pluggy.PluginManager, events: Iterable[RunEvent]) -> None:
    """Announce runs after commit: ``pgtasks_after_enqueue`` and ``pgtasks_schedule_fired``."""
    for event in events:
        if event.job_id is not None:
            call_isolated(
                pm,
                "pgtasks_after_enqueue",
                task_name=event.task_name,
                job_ids=[event.job_id],
                in_transaction=False,
            )
        call_isolated(
            pm,
            "pgtasks_schedule_fired",
            schedule_name=event.schedule,
            job_id=event.job_id,
            trigger=event.trigger,
            scheduled_for=event.scheduled_for,
        )
