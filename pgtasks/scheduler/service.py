"""The scheduler: a background service that turns due schedules and finished runs into runs.

Any number of scheduler processes (``pgtasks scheduler``, ``pgtasks worker --beat``)
may run against one database; none is a leader. One tick (`Scheduler.run_once`):

1. **reap**: running jobs whose worker's lease expired are recovered (the shared
   `pgtasks.maintenance.Reaper`); a schedule run is never retried in place, so it ends ``failed`` with
   ``WORKER_LOST`` (class ``transient``) and step 2 applies the retry policy;
2. **follow up** finished runs not yet followed up (their ``followed_up_at``
   differs from ``finished_at``): record the schedule's last outcome, create the
   retry run of a transient failure with retries left, and the dependency runs of
   a success (`pgtasks.scheduler.followup.RunFollowUp`). Each run is followed up in
   one transaction that also marks it, so a crash in between loses nothing and does
   nothing twice;
3. **fire** due schedules: each is locked (``FOR UPDATE SKIP LOCKED``: processes
   share the work), its runs are inserted, and its next fire time is advanced with
   a compare-and-set, all in one transaction. The unique index on
   ``(schedule_name, scheduled_for)`` for cron-made runs refuses a second run for
   the same fire time even from a process whose view is stale.

A schedule whose stored definition pgtasks refuses (a bad cron expression written
straight into the table, say) is marked with ``invalid_reason`` and logged; the
others are served as usual. A transient database error ends the tick early; the
next tick carries on.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from pgtasks.cron import CronSchedule
from pgtasks.db import AnyConnection, ScheduleRow
from pgtasks.errors import ConfigurationError, DatabaseError, InvalidSchedule
from pgtasks.maintenance import Reaper, ReaperConfig, Service
from pgtasks.ports import Hooks, StoreProvider
from pgtasks.scheduler.clock import Clock, DatabaseClock
from pgtasks.scheduler.firing import plan_fires
from pgtasks.scheduler.followup import RunFollowUp
from pgtasks.scheduler.runs import RunEvent, emit, insert_run
from pgtasks.states import Trigger
from pgtasks.validation import MAX_BATCH, check_bool, check_int, check_seconds

if TYPE_CHECKING:
    from pgtasks.scheduler.api import Schedules

__all__ = ["Scheduler", "SchedulerConfig", "SchedulerHost", "SchedulerResult", "beat"]

log = logging.getLogger("pgtasks.scheduler")


class SchedulerHost(Hooks, StoreProvider, Protocol):
    """What a `Scheduler` needs of an application: its stores, its plugin manager and
    its `Schedules` (whose code-defined schedules the first tick writes)."""

    @property
    def schedules(self) -> Schedules:
        """The application's schedules (``app.schedules``)."""


class _Stale(Exception):
    """Another process moved the schedule on first; roll this transaction back."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Scheduler settings.

    Attributes:
        interval: seconds between ticks (default 1.0). Runs are created at most
            this late after their fire time.
        batch: most schedules fired per tick (default 100); the rest wait one tick.
        followup_batch: most finished runs followed up per tick (default 100).
        reap: run the reaper in each tick (default True), so runs of vanished
            workers are recovered even when no worker is running.
        reaper: the reaper's settings.
        sync: write the app's code-defined schedules at the first tick (default True).

    Raises:
        ConfigurationError: ``interval`` not seconds in 0 (exclusive) to
            `pgtasks.validation.MAX_DELAY`, a batch not an int in 1 to
            `pgtasks.validation.MAX_BATCH`, or a flag not a bool.
    """

    interval: float = 1.0
    batch: int = 100
    followup_batch: int = 100
    reap: bool = True
    reaper: ReaperConfig = field(default_factory=ReaperConfig)
    sync: bool = True

    def __post_init__(self) -> None:
        check_seconds("interval", self.interval, positive=True)
        for name in ("batch", "followup_batch"):
            check_int(name, getattr(self, name), 1, MAX_BATCH)
        for name in ("reap", "sync"):
            check_bool(name, getattr(self, name))
        if not isinstance(self.reaper, ReaperConfig):
            raise ConfigurationError(f"reaper must be a ReaperConfig, got {type(self.reaper).__name__}")


@dataclass(slots=True)
class SchedulerResult:
    """Counts of one tick.

    Attributes:
        fired: runs created for fire times.
        skipped: fire times refused because the schedule had an active run
            (``overlap="skip"``).
        duplicates: fire times that already had their run (made by another process).
        missed: schedules whose misfire policy passed over older fire times.
        initialised: schedules given their first fire time (rows written by hand).
        stale: schedules another process moved on first (nothing written).
        invalid: schedules newly marked invalid.
        errors: schedules or runs left for the next tick after an error.
        followed_up: finished runs followed up.
        retries: retry runs created.
        dependencies: dependency runs created.
        reaped: running jobs of lost workers recovered.
    """

    fired: int = 0
    skipped: int = 0
    duplicates: int = 0
    missed: int = 0
    initialised: int = 0
    stale: int = 0
    invalid: int = 0
    errors: int = 0
    followed_up: int = 0
    retries: int = 0
    dependencies: int = 0
    reaped: int = 0


class Scheduler(Service):
    """Creates the runs of an app's schedules (see the module docstring).

    Args:
        app: the application (any `SchedulerHost`, e.g. a `pgtasks.App`): its
            stores, plugin manager and code-defined schedules are taken from it
            here, once.
        config: settings (default `SchedulerConfig()`).
        clock: where "now" comes from (default the database clock).

    Attributes:
        stores: the data layer's stores the ticks run on.
        plugin_manager: told of runs made (after commit) and of reaped jobs.
        schedules: the `Schedules` whose code-defined schedules the first tick writes.
        synced: whether the code-defined schedules have been written.
    """

    name = "scheduler"

    def __init__(
        self, app: SchedulerHost, config: SchedulerConfig | None = None, *, clock: Clock | None = None
    ) -> None:
        self.config = config or SchedulerConfig()
        super().__init__(self.config.interval)
        self.stores = app.stores
        self.plugin_manager = app.plugin_manager
        self.schedules = app.schedules
        self.clock: Clock = clock or DatabaseClock()
        self.synced = not self.config.sync
        self._follow_up = RunFollowUp(
            self.stores, self.plugin_manager, batch=self.config.followup_batch, rand=random.Random()
        )

    # -- one tick ---------------------------------------------------------------------

    def run_once(self, now: datetime | None = None) -> SchedulerResult:
        """Run one tick: reap, follow up finished runs, fire due schedules.

        Args:
            now: pinned time (aware) for every decision of this tick; None uses the
                clock (the database clock by default).

        Returns:
            The tick's counts.

        Raises:
            DatabaseError: a transient database error ended the tick early.
        """
        result = SchedulerResult()
        pinned = now or self.clock.now()
        if not self.synced:
            self._sync(pinned)
        if self.config.reap:
            reaped = Reaper(
                self.stores.jobs, self.stores.workers, self.config.reaper, self.plugin_manager, now=pinned
            ).run_once()
            result.reaped = reaped.requeued + reaped.failed
        at = pinned or self.stores.database.now()
        followed = self._follow_up.run_once(at)
        result.followed_up += followed.followed_up
        result.retries += followed.retries
        result.dependencies += followed.dependencies
        result.errors += followed.errors
        self._fire_all(at, result)
        return result

    def _sync(self, now: datetime | None) -> None:
        try:
            done = self.schedules.sync(now=now)
        except InvalidSchedule as exc:
            log.error("code-defined schedules were not written: %s", exc)
        else:
            if done.created or done.updated:
                log.info("schedules written: created %s, updated %s", list(done.created), list(done.updated))
        self.synced = True

    # -- firing -----------------------------------------------------------------------

    def _fire_all(self, at: datetime, result: SchedulerResult) -> None:
        exclude: list[str] = []
        for _ in range(self.config.batch):
            events: list[RunEvent] = []
            name: str | None = None
            row: ScheduleRow | None = None
            try:
                with self.stores.database.transaction() as tx:
                    row = self.stores.schedules.claim_due(now=at, exclude=exclude, conn=tx)
                    if row is None:
                        return
                    name = str(row["name"])
                    self._fire_one(tx, row, at, result, events)
            except _Stale:
                result.stale += 1
                exclude.append(str(name))
                continue
            except InvalidSchedule as exc:
                assert row is not None
                self._mark_invalid(row, str(exc), at, result)
                exclude.append(str(name))
                continue
            except DatabaseError as exc:
                if exc.transient or name is None:
                    raise
                log.error("schedule %r: database refused its tick, retrying next tick: %s", name, exc)
                result.errors += 1
                exclude.append(name)
                continue
            except Exception:
                if name is None:
                    raise
                log.exception("schedule %r: unexpected error, retrying next tick", name)
                result.errors += 1
                exclude.append(name)
                continue
            emit(self.plugin_manager, events)

    def _fire_one(
        self,
        tx: AnyConnection,
        row: ScheduleRow,
        at: datetime,
        result: SchedulerResult,
        events: list[RunEvent],
    ) -> None:
        """Create the due runs of one locked schedule row and advance it (raises `_Stale`)."""
        name = str(row["name"])
        cron = CronSchedule.parse(row["cron"], row["timezone"])
        expected = row["next_fire_at"]
        if expected is None:
            self._advance(tx, name, expected=expected, next_fire=cron.next_fire(at), fired_at=None, at=at)
            result.initialised += 1
            return
        plan = plan_fires(cron, expected, at, row["misfire"], row["catch_up_limit"])
        if plan.missed:
            result.missed += 1
            log.warning(
                "schedule %r missed fire times from %s; misfire=%s runs %d of them",
                name,
                expected.isoformat(),
                row["misfire"],
                len(plan.fires),
            )
        for fire in plan.fires:
            made = insert_run(
                self.stores,
                self.plugin_manager,
                tx,
                row,
                trigger=Trigger.SCHEDULE,
                scheduled_for=fire,
                now=at,
            )
            if made.job_id is not None:
                result.fired += 1
                log.info("schedule %r fired for %s: run %d", name, fire.isoformat(), made.job_id)
            elif made.duplicate:
                result.duplicates += 1
                continue
            else:
                result.skipped += 1
                log.info(
                    "schedule %r skipped its run for %s: run %s is still active (overlap=skip)",
                    name,
                    fire.isoformat(),
                    made.active_run_id,
                )
            events.append(RunEvent(name, str(row["task_name"]), Trigger.SCHEDULE, made.job_id, fire))
        last = plan.fires[-1] if plan.fires else None
        self._advance(tx, name, expected=expected, next_fire=plan.next_fire_at, fired_at=last, at=at)

    def _advance(
        self,
        tx: AnyConnection,
        name: str,
        *,
        expected: datetime | None,
        next_fire: datetime,
        fired_at: datetime | None,
        at: datetime,
    ) -> None:
        advanced = self.stores.schedules.advance(
            name=name,
            expected_next_fire_at=expected,
            next_fire_at=next_fire,
            fired_at=fired_at,
            now=at,
            conn=tx,
        )
        if not advanced:
            raise _Stale(name)

    def _mark_invalid(
        self, row: Mapping[str, object], reason: str, at: datetime, result: SchedulerResult
    ) -> None:
        marked = self.stores.schedules.mark_invalid(
            name=str(row["name"]),
            reason=reason,
            cron=None if row["cron"] is None else str(row["cron"]),
            timezone=str(row["timezone"]),
            now=at,
        )
        if marked:
            result.invalid += 1
            log.error("schedule %r is not served until it is changed: %s", row["name"], reason)


@contextmanager
def beat(app: SchedulerHost, config: SchedulerConfig | None = None) -> Iterator[Scheduler]:
    """Run a `Scheduler` in a background thread for the duration of the block.

    What ``pgtasks worker --beat`` does around the worker: the scheduler ticks in
    its own thread, on the app's connection pool, and stops when the block exits.

    Args:
        app: the application whose schedules to serve (a `SchedulerHost`).
        config: scheduler settings (default `SchedulerConfig()`).
    """
    scheduler = Scheduler(app, config)
    scheduler.start()
    log.info("scheduler (beat) started beside the worker: tick every %.2f s", scheduler.interval)
    try:
        yield scheduler
    finally:
        scheduler.stop()
