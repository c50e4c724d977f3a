"""`ScheduleStore`: schedules and their runs, one method per named query.

A schedule's full row (``SELECT *`` of ``pgtasks.schedules``) is what the scheduler
fires from; it comes back as a read-only `ScheduleRow` mapping. What users read
comes back as records (`pgtasks.records.Schedule`, `pgtasks.records.Job`).
Compare-and-set writes return whether they applied; the caller decides what a
stale write means.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Any

from pgtasks.db.database import AnyConnection, Database, Now, Row
from pgtasks.records import Job, Schedule

__all__ = ["ScheduleRow", "ScheduleStore"]

#: A schedule's stored row: every column of ``pgtasks.schedules`` by name.
ScheduleRow = Mapping[str, Any]


def _frozen(row: Row | None) -> ScheduleRow | None:
    return None if row is None else MappingProxyType(row)


class ScheduleStore:
    """Typed access to the schedules table and the runs (jobs) schedules made.

    Args:
        database: the `Database` that runs the statements.
    """

    def __init__(self, database: Database) -> None:
        self.database = database

    # -- reading -------------------------------------------------------------------

    def get(self, *, name: str) -> Schedule | None:
        """The schedule with the outcome of its last run, or None."""
        row = self.database.fetch_one("schedule_get", {"name": name})
        return None if row is None else Schedule.from_row(row)

    def all(self) -> list[Schedule]:
        """Every schedule, by name (``all``, not ``list``: a method named ``list`` would
        hide the builtin from the annotations of the methods after it)."""
        return [Schedule.from_row(r) for r in self.database.fetch_all("schedule_list")]

    def get_for_update(self, *, name: str, conn: AnyConnection | None = None) -> ScheduleRow | None:
        """The schedule's row, locked until ``conn``'s transaction ends; None if there is none."""
        return _frozen(self.database.fetch_one("schedule_get_for_update", {"name": name}, conn=conn))

    def dependency_edges(self, *, conn: AnyConnection | None = None) -> dict[str, list[str]]:
        """Every schedule's prerequisites: ``{name: [prerequisite, ...]}`` (those with any)."""
        rows = self.database.fetch_all("schedule_dependency_edges", conn=conn)
        return {str(r["name"]): list(r["after"]) for r in rows}

    def dependents(self, *, name: str, conn: AnyConnection | None = None) -> list[str]:
        """Names of the active schedules that list ``name`` as a prerequisite."""
        return [
            str(r["name"]) for r in self.database.fetch_all("schedule_dependents", {"name": name}, conn=conn)
        ]

    # -- definitions ---------------------------------------------------------------

    def insert(
        self,
        *,
        definition: Mapping[str, Any],
        source: str,
        paused: bool,
        paused_by: str | None,
        next_fire_at: datetime | None,
        now: Now = None,
        conn: AnyConnection | None = None,
    ) -> bool:
        """Create a schedule; False when its name is taken.

        Args:
            definition: the definition columns (`pgtasks.scheduler.ScheduleSpec.params`).
            source: ``code`` or ``api``.
            paused, paused_by: its pause state.
            next_fire_at: its first fire time (None for a trigger-only schedule).
        """
        params = dict(definition)
        params.update(source=source, paused=paused, paused_by=paused_by, next_fire_at=next_fire_at, now=now)
        return self.database.fetch_one("schedule_insert", params, conn=conn) is not None

    def update_definition(
        self,
        *,
        definition: Mapping[str, Any],
        source: str,
        next_fire_at: datetime | None,
        expected_next_fire_at: datetime | None,
        now: Now = None,
        conn: AnyConnection | None = None,
    ) -> bool:
        """Replace a schedule's definition if its next fire time is still
        ``expected_next_fire_at`` (compare-and-set); False otherwise."""
        params = dict(definition)
        params.update(
            source=source, next_fire_at=next_fire_at, expected_next_fire_at=expected_next_fire_at, now=now
        )
        return self.database.fetch_one("schedule_update_definition", params, conn=conn) is not None

    def pause(self, *, name: str, paused_by: str, now: Now = None) -> bool:
        """Pause a schedule; False if it was already paused or does not exist."""
        params = {"name": name, "paused_by": paused_by, "now": now}
        return self.database.fetch_one("schedule_pause", params) is not None

    def resume(
        self, *, name: str, next_fire_at: datetime | None, now: Now = None, conn: AnyConnection | None = None
    ) -> bool:
        """Resume a paused schedule from ``next_fire_at``; False if it was not paused."""
        params = {"name": name, "next_fire_at": next_fire_at, "now": now}
        return self.database.fetch_one("schedule_resume", params, conn=conn) is not None

    def delete(self, *, name: str) -> bool:
        """Delete a schedule (its runs stay); False if there was none."""
        return self.database.fetch_one("schedule_delete", {"name": name}) is not None

    # -- the scheduler's tick ------------------------------------------------------------

    def claim_due(self, *, now: datetime, exclude: Sequence[str], conn: AnyConnection) -> ScheduleRow | None:
        """Lock one due schedule (not in ``exclude``) for ``conn``'s transaction; None if none is."""
        params = {"now": now, "exclude": list(exclude)}
        return _frozen(self.database.fetch_one("schedule_claim_due", params, conn=conn))

    def advance(
        self,
        *,
        name: str,
        expected_next_fire_at: datetime | None,
        next_fire_at: datetime,
        fired_at: datetime | None,
        now: Now = None,
        conn: AnyConnection | None = None,
    ) -> bool:
        """Move the next fire time on if it still is ``expected_next_fire_at``; False if stale."""
        params = {
            "name": name, "expected_next_fire_at": expected_next_fire_at, "next_fire_at": next_fire_at,
            "fired_at": fired_at, "now": now,
        }  # fmt: skip
        return self.database.fetch_one("schedule_advance", params, conn=conn) is not None

    def mark_invalid(
        self, *, name: str, reason: str, cron: str | None, timezone: str, now: Now = None
    ) -> bool:
        """Stop serving a schedule whose stored ``cron``/``timezone`` is refused; False if
        its definition changed meanwhile (or it already was marked)."""
        params = {"name": name, "reason": reason, "cron": cron, "timezone": timezone, "now": now}
        return self.database.fetch_one("schedule_mark_invalid", params) is not None

    # -- runs --------------------------------------------------------------------------

    def run_insert(
        self,
        *,
        name: str,
        trigger: str,
        headers: str,
        scheduled_for: datetime | None = None,
        parent_id: int | None = None,
        correlation_id: str | None = None,
        now: Now = None,
        conn: AnyConnection | None = None,
    ) -> int | None:
        """Create a run from the schedule's row (``headers``: a JSON text); its job id, or
        None when the database refused it (fire time taken, or an active run holds
        the schedule's unique key)."""
        params = {
            "name": name, "trigger": trigger, "scheduled_for": scheduled_for, "parent_id": parent_id,
            "correlation_id": correlation_id, "headers": headers, "now": now,
        }  # fmt: skip
        row = self.database.fetch_one("schedule_run_insert", params, conn=conn)
        return None if row is None else int(row["id"])

    def run_retry_insert(
        self, *, parent_id: int, delay: float, now: Now = None, conn: AnyConnection | None = None
    ) -> int | None:
        """Create the retry run of failed run ``parent_id``, due in ``delay`` seconds; its
        job id, or None when an active run holds the schedule's unique key."""
        params = {"parent_id": parent_id, "delay": delay, "now": now}
        row = self.database.fetch_one("schedule_run_retry_insert", params, conn=conn)
        return None if row is None else int(row["id"])

    def fire_run(
        self, *, name: str, scheduled_for: datetime, conn: AnyConnection | None = None
    ) -> int | None:
        """The id of the run made for this fire time of the schedule, or None."""
        params = {"name": name, "scheduled_for": scheduled_for}
        row = self.database.fetch_one("schedule_fire_run", params, conn=conn)
        return None if row is None else int(row["id"])

    def history(self, *, name: str, limit: int, offset: int = 0, before_id: int | None = None) -> list[Job]:
        """A schedule's runs, newest first: one page."""
        params = {"name": name, "before_id": before_id, "limit": limit, "offset": offset}
        return [Job.from_row(r) for r in self.database.fetch_all("schedule_history", params)]

    def runs_to_follow_up(self, *, limit: int) -> list[int]:
        """Ids of finished runs whose follow-up is not done yet."""
        return [int(r["id"]) for r in self.database.fetch_all("schedule_runs_to_follow_up", {"limit": limit})]

    def run_lock_finished(self, *, id: int, conn: AnyConnection) -> Job | None:
        """Lock a finished run that still needs its follow-up; None if another process
        has it or it is done."""
        row = self.database.fetch_one("schedule_run_lock_finished", {"id": id}, conn=conn)
        return None if row is None else Job.from_row(row)

    def run_mark_followed_up(
        self, *, id: int, status: str, finished_at: datetime | None, conn: AnyConnection | None = None
    ) -> bool:
        """Record that run ``id`` was followed up, for the finish that was seen."""
        params = {"id": id, "status": status, "finished_at": finished_at}
        return self.database.fetch_one("schedule_run_mark_followed_up", params, conn=conn) is not None

    def record_outcome(
        self,
        *,
        name: str,
        outcome: str,
        run_id: int,
        finished_at: datetime | None,
        conn: AnyConnection | None = None,
    ) -> bool:
        """Record a finished run as the schedule's last outcome unless a later one is."""
        params = {"name": name, "outcome": outcome, "run_id": run_id, "finished_at": finished_at}
        return self.database.fetch_one("schedule_record_outcome", params, conn=conn) is not None
