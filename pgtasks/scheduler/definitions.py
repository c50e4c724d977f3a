"""Writing schedule definitions: insert or compare-and-set replace, and the refusal of cycles.

What `pgtasks.scheduler.Schedules` does inside the transactions of ``sync``,
``create`` and ``change``: each definition is written with its row locked, and the
dependency graph as stored then is checked before the transaction commits, so a
refused definition leaves nothing written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from pgtasks.cron import CronSchedule
from pgtasks.db import AnyConnection, ScheduleStore
from pgtasks.errors import InvalidSchedule
from pgtasks.scheduler.runs import requested_by_default
from pgtasks.scheduler.spec import ScheduleSpec
from pgtasks.validation import MAX_INSTANT, check_instant

__all__ = ["check_cycles", "find_cycle", "write_schedule"]


def write_schedule(
    schedules: ScheduleStore,
    tx: AnyConnection,
    spec: ScheduleSpec,
    *,
    source: str,
    now: datetime,
    replace: bool,
    paused: bool = False,
    force: bool = False,
) -> str:
    """Insert ``spec``, or replace the stored definition of its name, in ``tx``'s transaction.

    A new schedule gets its first fire time after ``now``; a replaced one keeps its
    next fire time unless its cron expression or time zone changed (or it had none).
    Pause state, last run and history are never touched by a replace.

    Args:
        schedules: the store.
        tx: a connection inside the caller's transaction (the row stays locked).
        spec: the definition.
        source: ``code`` or ``api``.
        now: the time (aware, between `pgtasks.validation.MIN_INSTANT` and
            `pgtasks.validation.MAX_INSTANT`) new fire times are computed from.
        replace: replace an existing definition (False: leave it, return ``exists``).
        paused: create it paused (by ``user@host`` of this process).
        force: write even an identical definition (every write clears ``invalid_reason``).

    Returns:
        ``created``, ``updated``, ``unchanged`` or (``replace=False``) ``exists``.

    Raises:
        ConfigurationError: ``now`` is naive or outside the instants PostgreSQL and
            Python both hold (nothing is written).
        InvalidSchedule: another process changed the schedule meanwhile; try
            again; or no fire time follows ``now`` before the end of those instants.
        DatabaseError: the database refused it.
    """
    check_instant("now", now)
    cron = spec.cron_schedule()
    for _ in range(2):
        row = schedules.get_for_update(name=spec.name, conn=tx)
        if row is None:
            created = schedules.insert(
                definition=spec.params(),
                source=source,
                paused=paused,
                paused_by=requested_by_default() if paused else None,
                next_fire_at=None if cron is None else _next_fire(cron, now, spec.name),
                now=now,
                conn=tx,
            )
            if created:
                return "created"
            continue  # created meanwhile by another process: now locked and replaced below
        if not replace:
            return "exists"
        same_time_rule = row["cron"] == spec.cron and row["timezone"] == spec.timezone
        if (
            not force
            and row["source"] == source
            and row["invalid_reason"] is None
            and spec.same_definition(row)
            and (row["next_fire_at"] is not None or cron is None)
        ):
            return "unchanged"
        if cron is None:
            next_fire = None
        elif same_time_rule and row["next_fire_at"] is not None:
            next_fire = row["next_fire_at"]
        else:
            next_fire = _next_fire(cron, now, spec.name)
        updated = schedules.update_definition(
            definition=spec.params(),
            source=source,
            next_fire_at=next_fire,
            expected_next_fire_at=row["next_fire_at"],
            now=now,
            conn=tx,
        )
        if not updated:
            raise InvalidSchedule(f"schedule {spec.name!r} changed while it was being written; try again")
        return "updated"
    raise InvalidSchedule(f"schedule {spec.name!r} could not be written; try again")


def _next_fire(cron: CronSchedule, now: datetime, name: str) -> datetime:
    """``cron``'s first fire time after ``now``, at most `pgtasks.validation.MAX_INSTANT`.

    Raises:
        InvalidSchedule: there is none before the end of the instants PostgreSQL
            and Python both hold (a pinned ``now`` near year 9999).
    """
    try:
        fire: datetime | None = cron.next_fire(now)
    except (OverflowError, ValueError):  # croniter past year 9999
        fire = None
    if fire is None or fire > MAX_INSTANT:
        raise InvalidSchedule(
            f"schedule {name!r} has no fire time after {now.isoformat()} "
            f"before {MAX_INSTANT.isoformat()}, the last instant pgtasks stores"
        )
    return fire


def check_cycles(schedules: ScheduleStore, tx: AnyConnection, specs: Iterable[ScheduleSpec]) -> None:
    """Refuse definitions that, as stored in ``tx``'s transaction, form a dependency cycle.

    Args:
        schedules: the store.
        tx: the connection of the transaction that wrote ``specs``.
        specs: the definitions just written.

    Raises:
        InvalidSchedule: one of ``specs`` is on a cycle (``a -> b -> a``).
    """
    edges = schedules.dependency_edges(conn=tx)
    for spec in specs:
        cycle = find_cycle(edges, spec.name)
        if cycle:
            raise InvalidSchedule(
                f"schedule {spec.name!r} would form a dependency cycle: {' -> '.join(cycle)}"
            )


def find_cycle(edges: Mapping[str, Iterable[str]], start: str) -> list[str] | None:
    """A dependency cycle through ``start`` (``[start, ..., start]``), or None."""
    path: list[str] = []
    seen: set[str] = set()

    def visit(node: str) -> list[str] | None:
        for nxt in edges.get(node, ()):
            if nxt == start:
                return [*path, nxt]
            if nxt not in seen:
                seen.add(nxt)
                path.append(nxt)
                found = visit(nxt)
                if found:
                    return found
                path.pop()
        return None

    path.append(start)
    return visit(start)
