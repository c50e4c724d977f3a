"""``app.schedules``: define, change, pause, trigger and inspect schedules.

Schedules live in ``pgtasks.schedules``. Two kinds:

* **code-defined** (``@app.periodic_task``, ``app.add_periodic_task``): validated
  when defined, kept in memory, and written to the table by `Schedules.sync` (which
  the scheduler runs at start-up, and which the first database call through
  ``app.schedules`` in a process runs too). Sync replaces the stored definition
  with the code's and never touches the pause state an operator set, nor the
  history.
* **API-defined** (`Schedules.create`): written at once.

Either kind can be changed, paused, resumed, triggered and deleted at run time
(a code-defined schedule deleted or changed by hand comes back as the code
defines it at the next sync).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Protocol

from pgtasks.cron import CronSchedule
from pgtasks.db import AnyConnection, Stores
from pgtasks.errors import InvalidSchedule, RunAlreadyActive, ScheduleNotFound
from pgtasks.ports import Engine
from pgtasks.records import Run, Schedule
from pgtasks.result import AsyncResult
from pgtasks.scheduler.definitions import check_cycles, write_schedule
from pgtasks.scheduler.runs import RunEvent, emit, insert_run, requested_by_default
from pgtasks.scheduler.spec import (
    DEFAULT_CATCH_UP_LIMIT,
    INHERIT,
    ScheduleSpec,
    check_schedule_name,
)
from pgtasks.states import Trigger
from pgtasks.validation import MAX_INSTANT, check_instant, check_int, check_job_id, check_text

if TYPE_CHECKING:
    from pgtasks.task import Task

__all__ = ["Schedules", "SchedulesHost", "SyncResult"]

log = logging.getLogger("pgtasks.scheduler")

#: Options of ``periodic_task`` / ``add_periodic_task`` that belong to the schedule;
#: every other keyword of ``periodic_task`` is a task option.
SCHEDULE_OPTIONS: Final = frozenset(
    {
        "name",
        "timezone",
        "args",
        "kwargs",
        "queue",
        "tenant",
        "priority",
        "overlap",
        "misfire",
        "catch_up_limit",
        "max_retries",
        "after",
    }
)
#: Fields `Schedules.change` accepts.
CHANGEABLE: Final = frozenset(
    {
        "task",
        "cron",
        "timezone",
        "args",
        "kwargs",
        "queue",
        "tenant",
        "priority",
        "lock_key",
        "overlap",
        "misfire",
        "catch_up_limit",
        "max_retries",
        "after",
    }
)
_MAX_PAGE_SIZE = 1000
#: Most fire times `Schedules.next_fire_times` computes in one call.
MAX_FIRE_TIMES: Final = 1000


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What `Schedules.sync` did: names created, updated and left as they were."""

    created: tuple[str, ...]
    updated: tuple[str, ...]
    unchanged: tuple[str, ...]


class SchedulesHost(Engine, Protocol):
    """What `Schedules` needs of its application: an `pgtasks.ports.Engine` (tasks,
    plugin manager, stores, results) whose task mapping can drop a task again, which
    ``@periodic_task`` does when the schedule of a task it just registered is refused."""

    @property
    def tasks(self) -> MutableMapping[str, Task]:
        """Every registered task by its name."""


class Schedules:
    """The schedules of an app (``app.schedules``).

    Nothing is read from the database until the first call that needs it; the
    application's stores are opened then (`SchedulesHost.stores`).

    Args:
        app: the owning application (any `SchedulesHost`, e.g. a `pgtasks.App`).
    """

    def __init__(self, app: SchedulesHost) -> None:
        self._app = app
        self._code: dict[str, ScheduleSpec] = {}
        self._synced = False
        self._lock = threading.RLock()

    # -- code-defined schedules -------------------------------------------------------

    @property
    def code_defined(self) -> Mapping[str, ScheduleSpec]:
        """Schedules defined in code in this process, by name (a copy)."""
        with self._lock:
            return dict(self._code)

    def define(self, spec: ScheduleSpec) -> ScheduleSpec:
        """Register a code-defined schedule (written to the database by `sync`).

        Raises:
            InvalidSchedule: another code-defined schedule has this name with a
                different definition.
        """
        with self._lock:
            existing = self._code.get(spec.name)
            if existing is not None and existing != spec:
                raise InvalidSchedule(f"schedule {spec.name!r} is already defined in code differently")
            self._code[spec.name] = spec
            self._synced = False
        return spec

    def add(self, cron: str | None, task: Task | str, **options: Any) -> ScheduleSpec:
        """Define a schedule in code for a registered task (``app.add_periodic_task``).

        Args:
            cron: five-field cron, an ``@`` alias, or None (trigger-only, with ``after``).
            task: the `Task` or its registered name.
            options: ``name``, ``timezone``, ``args``, ``kwargs``, ``queue``,
                ``tenant``, ``priority``, ``overlap``, ``misfire``,
                ``catch_up_limit``, ``max_retries``, ``after`` (see `ScheduleSpec`).

        Raises:
            InvalidSchedule, SerializationError, ConfigurationError: refused definition.
            UnknownTask: ``task`` names no registered task.
        """
        unknown = sorted(set(options) - SCHEDULE_OPTIONS)
        if unknown:
            allowed = ", ".join(sorted(SCHEDULE_OPTIONS))
            raise InvalidSchedule(f"unknown schedule option(s) {', '.join(unknown)}; allowed: {allowed}")
        resolved = self._app.get_task(task) if isinstance(task, str) else task
        return self.define(ScheduleSpec.for_task(resolved, cron, **options))

    def periodic_task(self, cron: str | None, **options: Any) -> Callable[[Callable[..., Any]], Task]:
        """Decorator: register a function as a task and define its schedule (``@app.periodic_task``).

        Args:
            cron: five-field cron, an ``@`` alias, or None (trigger-only, with ``after``).
            options: the schedule options of `add` (``name`` is the schedule's
                name, default the task's; ``queue`` is also the task's queue); any
                other keyword is a task option of ``@app.task`` (``bind``,
                ``max_retries``, ``autoretry_for``, ...; ``task_name`` sets the
                task's registered name).

        Raises:
            InvalidSchedule, SerializationError, ConfigurationError: refused
                definition; the task is then not registered either.
        """
        schedule_options = {k: v for k, v in options.items() if k in SCHEDULE_OPTIONS}
        task_options = {k: v for k, v in options.items() if k not in SCHEDULE_OPTIONS}
        if "task_name" in task_options:
            task_options["name"] = task_options.pop("task_name")
        if "queue" in schedule_options:
            task_options["queue"] = schedule_options["queue"]

        def decorate(fn: Callable[..., Any]) -> Task:
            task = self._app.register_task(fn, **task_options)
            try:
                self.define(ScheduleSpec.for_task(task, cron, **schedule_options))
            except BaseException:
                self._app.tasks.pop(task.name, None)
                raise
            return task

        return decorate

    def sync(self, *, now: datetime | None = None) -> SyncResult:
        """Write the code-defined schedules to the database (idempotent, concurrency-safe).

        A new schedule gets its first fire time after ``now``. A changed one gets the
        code's definition, and a new next fire time when its cron expression or time
        zone changed. Pause state, last run and history are kept.

        Args:
            now: pinned time (aware), None for the database clock.

        Raises:
            InvalidSchedule: the code's schedules form a dependency cycle with the
                stored ones; nothing is written.
            DatabaseError: the database failed; nothing is written.
        """
        with self._lock:
            specs = sorted(self._code.values(), key=lambda s: s.name)
            created: list[str] = []
            updated: list[str] = []
            unchanged: list[str] = []
            if specs:
                with self._stores.database.transaction() as tx:
                    at = now or self._db_now(tx)
                    for spec in specs:
                        outcome = write_schedule(
                            self._stores.schedules, tx, spec, source="code", now=at, replace=True
                        )
                        {"created": created, "updated": updated, "unchanged": unchanged}[outcome].append(
                            spec.name
                        )
                    check_cycles(self._stores.schedules, tx, specs)
            self._synced = True
            return SyncResult(tuple(created), tuple(updated), tuple(unchanged))

    def resync(self) -> None:
        """Write the code-defined schedules again before the next call that reads the
        database (`pgtasks.App.use_database` calls it: the new database lacks them)."""
        with self._lock:
            self._synced = False

    def _ensure_synced(self) -> None:
        """Sync once per process before the first database call; a refused code
        definition is logged (an explicit `sync` raises it) so the API stays usable."""
        if self._synced:
            return
        try:
            self.sync()
        except InvalidSchedule as exc:
            log.error("code-defined schedules were not written: %s", exc)
            self._synced = True

    # -- run-time definitions ---------------------------------------------------------

    def create(
        self,
        name: str,
        task: Task | str,
        cron: str | None,
        *,
        timezone: str = "UTC",
        args: Iterable[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        priority: int | None = None,
        overlap: str = "skip",
        misfire: str = "skip",
        catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT,
        max_retries: Any = INHERIT,
        after: Iterable[str] | None = (),
        paused: bool = False,
        now: datetime | None = None,
    ) -> Schedule:
        """Create a schedule at run time (stored at once; ``source="api"``).

        Args:
            name: the schedule's name.
            task: a registered `Task` or its name.
            cron, timezone, args, kwargs, queue, tenant, priority, overlap, misfire,
            catch_up_limit, max_retries, after: see `ScheduleSpec.for_task`.
            paused: create it paused.
            now: pinned time (aware) for the first fire time; None for the database clock.

        Returns:
            The stored `Schedule`.

        Raises:
            InvalidSchedule: a refused definition, a name already taken, or a
                dependency cycle; nothing is written.
            UnknownTask: ``task`` names no registered task.
            SerializationError: arguments cannot be stored.
        """
        check_schedule_name(name)  # None would take the task's name: the API asks for one
        resolved = self._app.get_task(task) if isinstance(task, str) else task
        spec = ScheduleSpec.for_task(
            resolved,
            cron,
            name=name,
            timezone=timezone,
            args=args,
            kwargs=kwargs,
            queue=queue,
            tenant=tenant,
            priority=priority,
            overlap=overlap,
            misfire=misfire,
            catch_up_limit=catch_up_limit,
            max_retries=max_retries,
            after=after,
        )
        self._ensure_synced()
        with self._stores.database.transaction() as tx:
            at = now or self._db_now(tx)
            if (
                write_schedule(
                    self._stores.schedules, tx, spec, source="api", now=at, replace=False, paused=paused
                )
                != "created"
            ):
                raise InvalidSchedule(
                    f"a schedule named {spec.name!r} already exists; change() it or delete() it"
                )
            check_cycles(self._stores.schedules, tx, [spec])
        return self.get(spec.name)

    def change(self, name: str, /, *, now: datetime | None = None, **changes: Any) -> Schedule:
        """Change a stored schedule's definition; other fields keep their stored values.

        Args:
            name: the schedule.
            now: pinned time (aware) for a recomputed next fire time.
            changes: any of ``task`` (a `Task` or name), ``cron``, ``timezone``,
                ``args``, ``kwargs``, ``queue``, ``tenant``, ``priority``,
                ``lock_key``, ``overlap``, ``misfire``, ``catch_up_limit``,
                ``max_retries``, ``after``.

        Returns:
            The stored `Schedule`. A schedule the scheduler had stopped serving
            (``invalid_reason``) is served again.

        Raises:
            ScheduleNotFound: no such schedule.
            InvalidSchedule: ``name`` is not a schedule name (see `check_schedule_name`).
            InvalidSchedule, SerializationError, ConfigurationError: refused change
                (unknown field, bad value, arguments that do not fit the task's
                signature, dependency cycle); nothing is written.
        """
        check_schedule_name(name)
        unknown = sorted(set(changes) - CHANGEABLE)
        if unknown:
            raise InvalidSchedule(
                f"cannot change {', '.join(unknown)}; changeable: {', '.join(sorted(CHANGEABLE))}"
            )
        self._ensure_synced()
        with self._stores.database.transaction() as tx:
            row = self._stores.schedules.get_for_update(name=name, conn=tx)
            if row is None:
                raise ScheduleNotFound(name)
            fields = {key: row[key] for key in ScheduleSpec.__dataclass_fields__ if key in row}
            fields["after"] = tuple(row["after"])
            fields["args"] = tuple(row["args"])
            task = changes.pop("task", None)
            if task is not None:
                resolved = self._app.get_task(task) if isinstance(task, str) else task
                fields.update(
                    task_name=resolved.name,
                    retry_on_worker_lost=resolved.options.retry_on_worker_lost,
                    retry_policy={
                        "backoff": resolved.options.retry_backoff,
                        "backoff_max": resolved.options.retry_backoff_max,
                        "delay": resolved.options.default_retry_delay,
                        "jitter": resolved.options.retry_jitter,
                    },
                )
            if "args" in changes:
                changes["args"] = tuple(changes["args"])
            fields.update(changes)
            queue_lock = f"schedule:{name}"
            if "lock_key" not in changes:
                if fields["overlap"] == "queue" and fields["lock_key"] is None:
                    fields["lock_key"] = queue_lock
                elif fields["overlap"] != "queue" and fields["lock_key"] == queue_lock:
                    fields["lock_key"] = None
            spec = ScheduleSpec(**fields)
            known = self._app.tasks.get(spec.task_name)
            if known is not None:
                known.check_call(spec.args, spec.kwargs)
            at = now or self._db_now(tx)
            write_schedule(
                self._stores.schedules, tx, spec, source=row["source"], now=at, replace=True, force=True
            )
            check_cycles(self._stores.schedules, tx, [spec])
        return self.get(name)

    def delete(self, name: str) -> None:
        """Delete a schedule; its runs stay in the jobs table.

        Raises:
            ScheduleNotFound: no such schedule.
            InvalidSchedule: ``name`` is not a schedule name (see `check_schedule_name`).
        """
        check_schedule_name(name)
        self._ensure_synced()
        if not self._stores.schedules.delete(name=name):
            raise ScheduleNotFound(name)

    def pause(self, name: str, *, by: str | None = None, now: datetime | None = None) -> bool:
        """Pause a schedule: no cron, retry or dependency runs until resumed (manual runs still work).

        Args:
            name: the schedule.
            by: who paused it (default ``user@host`` of this process).
            now: pinned time.

        Returns:
            True if it was running and is now paused; False if it was already paused.

        Raises:
            ScheduleNotFound: no such schedule.
            InvalidSchedule: ``name`` is not a schedule name (see `check_schedule_name`).
            ConfigurationError: ``by`` is not text of at most
                `pgtasks.validation.MAX_KEY_BYTES` bytes, or ``now`` not an instant
                pgtasks stores.
        """
        check_schedule_name(name)
        if by is not None:
            check_text("by", by)
        if now is not None:
            check_instant("now", now)
        self._ensure_synced()
        if self._stores.schedules.pause(name=name, paused_by=by or requested_by_default(), now=now):
            return True
        self.get(name)
        return False

    def resume(self, name: str, *, now: datetime | None = None) -> bool:
        """Resume a paused schedule from its first fire time after now.

        Fire times that passed while it was paused are not misfires and get no run.

        Returns:
            True if it was paused and now runs; False if it was not paused.

        Raises:
            ScheduleNotFound: no such schedule.
            InvalidSchedule: ``name`` is not a schedule name (see `check_schedule_name`).
            InvalidSchedule: its stored cron expression or time zone is refused
                (fix it with `change`).
            ConfigurationError: ``now`` is not an instant pgtasks stores.
        """
        check_schedule_name(name)
        if now is not None:
            check_instant("now", now)
        self._ensure_synced()
        stores = self._stores
        with stores.database.transaction() as tx:
            row = stores.schedules.get_for_update(name=name, conn=tx)
            if row is None:
                raise ScheduleNotFound(name)
            if not row["paused"]:
                return False
            at = now or self._db_now(tx)
            cron = None if row["cron"] is None else CronSchedule.parse(row["cron"], row["timezone"])
            next_fire = None if cron is None else cron.next_fire(at)
            return stores.schedules.resume(name=name, next_fire_at=next_fire, now=now, conn=tx)

    # -- runs -----------------------------------------------------------------------

    def trigger(
        self, name: str, *, requested_by: str | None = None, now: datetime | None = None
    ) -> AsyncResult:
        """Run a schedule now (trigger ``manual``); the next scheduled fire time is not touched.

        Args:
            name: the schedule.
            requested_by: who asked (default ``user@host`` of this process); stored
                in the run's headers as ``requested_by``.
            now: pinned time (the run's run-at); None for the database clock.

        Returns:
            An `AsyncResult` for the new run.

        Raises:
            ScheduleNotFound: no such schedule.
            InvalidSchedule: ``name`` is not a schedule name (see `check_schedule_name`).
            RunAlreadyActive: ``overlap="skip"`` and a run is queued or running;
                ``run_id`` names it.
            ConfigurationError: ``requested_by`` is not text of at most
                `pgtasks.validation.MAX_KEY_BYTES` bytes, or ``now`` not an instant
                pgtasks stores (nothing is written).
        """
        check_schedule_name(name)
        if requested_by is not None:
            check_text("requested_by", requested_by)
        if now is not None:
            check_instant("now", now)
        self._ensure_synced()
        stores = self._stores
        with stores.database.transaction() as tx:
            row = stores.schedules.get_for_update(name=name, conn=tx)
            if row is None:
                raise ScheduleNotFound(name)
            made = insert_run(
                stores,
                self._app.plugin_manager,
                tx,
                row,
                trigger=Trigger.MANUAL,
                headers={"requested_by": requested_by or requested_by_default()},
                now=now,
            )
        emit(
            self._app.plugin_manager,
            [RunEvent(name, str(row["task_name"]), Trigger.MANUAL, made.job_id, None)],
        )
        if made.job_id is None:
            raise RunAlreadyActive(name, made.active_run_id if made.active_run_id is not None else -1)
        return AsyncResult(made.job_id, self._app)

    def history(
        self, name: str, *, page: int = 1, per_page: int = 20, before_id: int | None = None
    ) -> list[Run]:
        """A schedule's runs, newest first.

        Args:
            name: the schedule (runs of a deleted schedule are still found).
            page: 1-based page number (offset pagination).
            per_page: runs per page (1..1000).
            before_id: only runs with smaller ids (keyset pagination; combine with page=1).

        Raises:
            ScheduleNotFound: no such schedule and no runs under that name.
            InvalidSchedule: a page or page size out of range, or ``name`` is not a
                schedule name.
            ConfigurationError: ``before_id`` is not an int in PostgreSQL's bigint range.
        """
        check_schedule_name(name)
        if before_id is not None:
            check_job_id("before_id", before_id)
        if type(page) is not int or page < 1:
            raise InvalidSchedule(f"page must be an int >= 1, got {page!r}")
        if type(per_page) is not int or not 1 <= per_page <= _MAX_PAGE_SIZE:
            raise InvalidSchedule(f"per_page must be an int in 1..{_MAX_PAGE_SIZE}, got {per_page!r}")
        jobs = self._stores.schedules.history(
            name=name, limit=per_page, offset=(page - 1) * per_page, before_id=before_id
        )
        if not jobs and page == 1 and before_id is None:
            self.get(name)
        return [Run.from_job(job) for job in jobs]

    # -- reading --------------------------------------------------------------------

    def get(self, name: str) -> Schedule:
        """The stored schedule.

        Raises:
            ScheduleNotFound: no such schedule.
        """
        check_schedule_name(name)
        self._ensure_synced()
        schedule = self._stores.schedules.get(name=name)
        if schedule is None:
            raise ScheduleNotFound(name)
        return schedule

    def all(self) -> list[Schedule]:
        """Every stored schedule, by name."""
        self._ensure_synced()
        return self._stores.schedules.all()

    def next_fire_times(self, name: str, n: int = 10, *, after: datetime | None = None) -> list[datetime]:
        """The next ``n`` fire times of a stored schedule (what the scheduler will use).

        Args:
            name: the schedule.
            n: how many, 0..`MAX_FIRE_TIMES`.
            after: start (aware, exclusive, an instant pgtasks stores); default now
                (database clock).

        Returns:
            Aware UTC datetimes; empty for a trigger-only schedule; fewer than ``n``
            when the cron expression fires no more before
            `pgtasks.validation.MAX_INSTANT`.

        Raises:
            ScheduleNotFound: no such schedule.
            InvalidSchedule: the stored cron expression or time zone is refused.
            ConfigurationError: ``n`` or ``after`` out of range.
        """
        check_int("n", n, 0, MAX_FIRE_TIMES)
        if after is not None:
            check_instant("after", after)
        schedule = self.get(name)
        if schedule.cron is None:
            return []
        cron = CronSchedule.parse(schedule.cron, schedule.timezone)
        start = after or self._db_now(None)
        try:
            return [t for t in cron.fire_times(start, n) if t <= MAX_INSTANT]
        except (OverflowError, ValueError):  # croniter past year 9999: those before it
            times: list[datetime] = []
            while len(times) < n:
                try:
                    fire = cron.next_fire(times[-1] if times else start)
                except (OverflowError, ValueError):
                    break
                if fire > MAX_INSTANT:
                    break
                times.append(fire)
            return times

    #: The same as `next_fire_times` (the name of ``pgtasks schedules next``).
    next = next_fire_times

    # -- internals ------------------------------------------------------------------

    @property
    def _stores(self) -> Stores:
        """The application's stores (opened on first use)."""
        return self._app.stores

    def _db_now(self, conn: AnyConnection | None) -> datetime:
        return self._stores.database.now(conn=conn)
