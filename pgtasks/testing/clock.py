"""`TestClock`: time that tests move on, for countdowns, retry backoff and cron.

PostgreSQL's clock cannot be set, and workers read only that clock (they never
use their own). A test clock is therefore the database clock plus an offset that
only grows:

* moving it on by ``d`` brings every queued job's run-at ``d`` earlier (one
  UPDATE, `pgtasks.db.JobStore.shift_run_at`), so a worker on the real clock finds
  due exactly the jobs that are due at the test clock's time; jobs enqueued later
  get their run-at from the real clock plus their countdown, which is the same
  rule;
* the scheduler ticks at the test clock's time (`tick`, pinned ``now``), so cron
  fire times, ``scheduled_for``, next fire times and retry runs are on the test
  clock; the runs it makes are then brought back onto the real clock like the
  rest.

What moves is the run-at of queued jobs; instants written as things happen
(``started_at``, ``finished_at``, attempt times) stay on the real clock.
"""

from __future__ import annotations

import threading
import weakref
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pgtasks.errors import ConfigurationError
from pgtasks.hookspecs import hookimpl
from pgtasks.validation import check_instant, check_seconds, short

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pgtasks.app import App
    from pgtasks.scheduler import Scheduler

__all__ = ["TestClock", "clock_for", "forget_clock"]

_clocks: weakref.WeakKeyDictionary[Any, TestClock] = weakref.WeakKeyDictionary()
_clocks_lock = threading.Lock()


class _RunsMade:
    """A plugin registered during a tick: the ids of the runs the scheduler made."""

    def __init__(self) -> None:
        self.ids: list[int] = []

    @hookimpl
    def pgtasks_schedule_fired(self, job_id: int | None) -> None:
        if job_id is not None:
            self.ids.append(job_id)


class TestClock:
    """The test clock of one app: the database clock plus `offset` (see the module
    docstring). Get it with `clock_for` (the ``pgtasks_clock`` fixture), so that
    `pgtasks.testing.run_until_idle` and the test share it.

    Args:
        app: the application whose jobs and schedules follow this clock.

    Attributes:
        offset: how far the clock has been moved on so far (>= 0).
    """

    __test__ = False  # a class named Test*, not a test class for pytest to collect

    def __init__(self, app: App) -> None:
        self.app = app
        self.dsn = app.settings.dsn  # the database whose jobs it moved (see clock_for)
        self.offset = timedelta(0)
        self._lock = threading.RLock()
        self._scheduler: Scheduler | None = None

    def __repr__(self) -> str:
        return f"<TestClock of {self.app!r} offset={self.offset}>"

    def now(self) -> datetime:
        """The test clock's time (aware): the database clock plus `offset`."""
        return self.app.database.now() + self.offset

    def advance(self, by: timedelta | float) -> int:
        """Move the clock on by ``by`` (a `timedelta` or seconds, >= 0): queued jobs
        due within it become due now, in their order. The scheduler sees the new
        time at its next `tick` (`run_until_idle` ticks it).

        Returns:
            How many queued jobs moved.

        Raises:
            ConfigurationError: ``by`` is negative, not finite or not a duration
                (the clock only moves on).
        """
        if isinstance(by, timedelta):
            seconds = by.total_seconds()
        elif isinstance(by, int | float) and not isinstance(by, bool):
            seconds = float(by)
        else:
            raise ConfigurationError(f"advance the clock by a timedelta or seconds, got {short(by)}")
        check_seconds("advance", seconds)
        if seconds == 0:
            return 0
        with self._lock:
            moved = self.app.stores.jobs.shift_run_at(seconds=seconds)
            self.offset += timedelta(seconds=seconds)
            return moved

    def move_to(self, instant: datetime) -> int:
        """Move the clock on to ``instant`` (aware); see `advance`.

        Raises:
            ConfigurationError: ``instant`` is naive, out of range, or before the
                clock's time (the clock only moves on).
        """
        check_instant("instant", instant)
        with self._lock:
            by = (instant - self.now()).total_seconds()
            if by < 0:
                raise ConfigurationError(
                    f"the test clock only moves on: {instant.isoformat()} is {-by:.3f}s before its time"
                )
            return self.advance(by)

    def tick(self) -> int:
        """Run one scheduler tick at the clock's time: due cron fire times make runs,
        finished runs are followed up (last outcome, retry and dependency runs). The
        first tick writes the app's code-defined schedules; the reaper is not run.

        Returns:
            How many runs the tick made.
        """
        from pgtasks.scheduler import Scheduler, SchedulerConfig

        with self._lock:
            if self._scheduler is None:
                self._scheduler = Scheduler(self.app, SchedulerConfig(reap=False))
            made = _RunsMade()
            self.app.plugin_manager.register(made)
            try:
                self._scheduler.run_once(now=self.now())
            finally:
                self.app.plugin_manager.unregister(made)
            if made.ids and self.offset:
                # Their run-at is on this clock; stored run-ats are on the real one.
                self.app.stores.jobs.shift_run_at(seconds=self.offset.total_seconds(), ids=made.ids)
            return len(made.ids)

    def until_next_due(self, queues: Sequence[str] | None = None, *, limit: float) -> float:
        """Seconds from the clock's time to the next instant something becomes due: a
        queued job (of ``queues``; None: any) or an enabled schedule's next fire time;
        ``limit`` when nothing does before that. Due-but-waiting jobs (a lock key
        held) are not counted."""
        with self._lock:
            now = self.app.database.now()
            virtual = now + self.offset
            waits = [limit]
            for row in self.app.queue_stats():
                at = row["oldest_run_at"]
                if (
                    row["status"] == "queued"
                    and at is not None
                    and (queues is None or row["queue"] in queues)
                ):
                    waits.append((at - now).total_seconds())
            for schedule in self.app.stores.schedules.all():
                if not schedule.paused and schedule.invalid_reason is None and schedule.next_fire_at:
                    waits.append((schedule.next_fire_at - virtual).total_seconds())
            future = [w for w in waits if w > 0]
            return min(future) if future else limit


def clock_for(app: App) -> TestClock:
    """The `TestClock` of ``app``: made on first use, then the same one until
    `forget_clock`, or until the app uses another database (`pgtasks.App.use_database`:
    a new database starts on the real clock)."""
    with _clocks_lock:
        clock = _clocks.get(app)
        if clock is None or clock.dsn != app.settings.dsn:
            clock = _clocks[app] = TestClock(app)
        return clock


def forget_clock(app: App) -> None:
    """Drop ``app``'s test clock (the fixtures do it after each test: a new database
    starts on the real clock)."""
    with _clocks_lock:
        _clocks.pop(app, None)
