"""Schedules and the scheduler: cron in real time zones, one run per fire time, runs with triggers.

* `Schedules` (``app.schedules``): define, change, pause, resume, trigger, delete
  and inspect schedules;
* `Scheduler`: the service that creates runs (``pgtasks scheduler``,
  ``pgtasks worker --beat``);
* `Schedule`, `Run`: what the API returns;
* `ScheduleSpec`: a validated definition.

Fire times come from `pgtasks.cron.CronSchedule` only. See ``docs/scheduling.md``.
"""

from __future__ import annotations

from pgtasks.records import Run, Schedule
from pgtasks.scheduler.api import Schedules, SyncResult
from pgtasks.scheduler.clock import Clock, DatabaseClock, SimulatedClock
from pgtasks.scheduler.service import Scheduler, SchedulerConfig, SchedulerResult, beat
from pgtasks.scheduler.spec import INHERIT, MISFIRE_POLICIES, OVERLAP_POLICIES, ScheduleSpec

__all__ = [
    "INHERIT",
    "MISFIRE_POLICIES",
    "OVERLAP_POLICIES",
    "Clock",
    "DatabaseClock",
    "Run",
    "Schedule",
    "ScheduleSpec",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerResult",
    "Schedules",
    "SimulatedClock",
    "SyncResult",
    "beat",
]
