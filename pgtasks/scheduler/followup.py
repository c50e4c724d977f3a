"""Follow-up of finished runs: last outcome, retry runs, dependency runs.

A run is followed up once per finish (its ``followed_up_at`` differs from
``finished_at`` until then). `RunFollowUp.run_once` takes a batch of such runs and
follows each up in one transaction that also marks it:

* the schedule's last outcome is recorded, unless a later-finished run's already is;
* a ``failed`` run whose failure is transient (`pgtasks.states.FailureClass`) gets
  a retry run while the schedule's ``max_retries`` allows, after the schedule's
  backoff; a run whose worker was lost (`pgtasks.states.ErrorCode.WORKER_LOST`)
  only when its task is idempotent (``retry_on_worker_lost``);
* a ``succeeded`` run triggers one run of each active schedule that lists it in
  ``after`` (trigger ``dependency``, same correlation id).

A crash in between loses nothing and does nothing twice: the marking commits with
the runs it made. Any number of scheduler processes may follow up at once; each
run is locked by one of them (``SKIP LOCKED``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pluggy

from pgtasks.db import AnyConnection, Stores
from pgtasks.errors import ConfigurationError, DatabaseError
from pgtasks.records import Job
from pgtasks.scheduler.runs import RunEvent, emit, insert_retry_run, insert_run
from pgtasks.states import ErrorCode, FailureClass, JobStatus, Trigger
from pgtasks.task import TaskOptions, backoff_delay

__all__ = ["FollowUpResult", "RunFollowUp"]

log = logging.getLogger("pgtasks.scheduler")


@dataclass(slots=True)
class FollowUpResult:
    """Counts of one follow-up pass.

    Attributes:
        followed_up: finished runs followed up.
        retries: retry runs created.
        dependencies: dependency runs created.
        errors: runs left for the next pass after a database refusal, or marked
            followed up after an unexpected error.
    """

    followed_up: int = 0
    retries: int = 0
    dependencies: int = 0
    errors: int = 0


class RunFollowUp:
    """Follows up finished schedule runs (see the module docstring).

    Args:
        stores: the stores (``schedules`` and ``jobs``; ``database`` for transactions).
        plugin_manager: told of the runs made, after commit (`pgtasks.scheduler.runs.emit`).
        batch: most runs followed up per pass (>= 1).
        rand: the source of backoff jitter (default a fresh ``random.Random``).
    """

    def __init__(
        self,
        stores: Stores,
        plugin_manager: pluggy.PluginManager,
        *,
        batch: int,
        rand: random.Random | None = None,
    ) -> None:
        self.stores = stores
        self.plugin_manager = plugin_manager
        self.batch = batch
        self._rand = rand or random.Random()

    def run_once(self, at: datetime) -> FollowUpResult:
        """Follow up at most ``batch`` finished runs.

        Args:
            at: the tick's time (aware): run-at of the runs made, base of retry delays.

        Returns:
            The pass's counts.

        Raises:
            DatabaseError: a transient database error ended the pass early.
        """
        result = FollowUpResult()
        database = self.stores.database
        for run_id in self.stores.schedules.runs_to_follow_up(limit=self.batch):
            events: list[RunEvent] = []
            try:
                with database.transaction() as tx:
                    run = self.stores.schedules.run_lock_finished(id=run_id, conn=tx)
                    if run is None:
                        continue  # another process has it, or it is done
                    self._follow_up(tx, run, at, result, events)
            except DatabaseError as exc:
                if exc.transient:
                    raise
                log.error("run %d: follow-up refused by the database, retrying next tick: %s", run_id, exc)
                result.errors += 1
                continue
            except Exception:
                log.exception("run %d: follow-up failed; marking it followed up to move on", run_id)
                result.errors += 1
                self._force_followed_up(run_id)
                continue
            result.followed_up += 1
            emit(self.plugin_manager, events)
        return result

    def _force_followed_up(self, run_id: int) -> None:
        job = self.stores.jobs.get(id=run_id)
        self.stores.schedules.run_mark_followed_up(
            id=run_id, status=str(job.status), finished_at=job.finished_at
        )

    def _follow_up(
        self, tx: AnyConnection, run: Job, at: datetime, result: FollowUpResult, events: list[RunEvent]
    ) -> None:
        schedules = self.stores.schedules
        name = str(run.schedule_name)
        schedules.record_outcome(
            name=name, outcome=str(run.status), run_id=run.id, finished_at=run.finished_at, conn=tx
        )
        schedule = schedules.get_for_update(name=name, conn=tx)
        if run.status == JobStatus.FAILED and schedule is not None:
            self._maybe_retry(tx, run, schedule=schedule, at=at, result=result, events=events)
        if run.status == JobStatus.SUCCEEDED:
            self._trigger_dependents(tx, run, at=at, result=result, events=events)
        schedules.run_mark_followed_up(
            id=run.id, status=str(run.status), finished_at=run.finished_at, conn=tx
        )

    def _trigger_dependents(
        self, tx: AnyConnection, run: Job, *, at: datetime, result: FollowUpResult, events: list[RunEvent]
    ) -> None:
        """Create one dependency run of each active schedule that waits for ``run``'s schedule."""
        schedules = self.stores.schedules
        name = str(run.schedule_name)
        for dependent_name in schedules.dependents(name=name, conn=tx):
            dependent = schedules.get_for_update(name=dependent_name, conn=tx)
            if dependent is None or dependent["paused"] or dependent["invalid_reason"] is not None:
                continue
            made = insert_run(
                self.stores,
                self.plugin_manager,
                tx,
                dependent,
                trigger=Trigger.DEPENDENCY,
                parent_id=run.id,
                correlation_id=run.correlation_id,
                now=at,
            )
            events.append(
                RunEvent(dependent_name, str(dependent["task_name"]), Trigger.DEPENDENCY, made.job_id, None)
            )
            if made.job_id is not None:
                result.dependencies += 1
                log.info(
                    "run %d of %r succeeded: dependency run %d of %r",
                    run.id,
                    name,
                    made.job_id,
                    dependent_name,
                )
            else:
                log.info(
                    "run %d of %r succeeded: dependent %r skipped, run %s is active (overlap=skip)",
                    run.id,
                    name,
                    dependent_name,
                    made.active_run_id,
                )

    def _maybe_retry(
        self,
        tx: AnyConnection,
        run: Job,
        *,
        schedule: Mapping[str, Any],
        at: datetime,
        result: FollowUpResult,
        events: list[RunEvent],
    ) -> None:
        """Create the retry run of a failed run when its failure is transient and retries are left."""
        error = run.error or {}
        name = str(schedule["name"])
        if error.get("class") != FailureClass.TRANSIENT:
            return
        if error.get("code") == ErrorCode.WORKER_LOST and not run.retry_on_worker_lost:
            log.warning("run %d of %r: worker lost; not retried (the task is not idempotent)", run.id, name)
            return
        if schedule["paused"] or schedule["invalid_reason"] is not None:
            return
        attempt = max(run.attempt, 1)
        max_retries = schedule["max_retries"]
        if max_retries is not None and attempt > max_retries:
            log.warning("run %d of %r failed (attempt %d): no retries left", run.id, name, attempt)
            return
        delay = backoff_delay(retry_options(schedule), attempt - 1, lambda hi: self._rand.uniform(0.0, hi))
        made = insert_retry_run(self.stores, tx, run.id, delay=delay, now=at)
        events.append(RunEvent(name, run.task_name, Trigger.RETRY, made.job_id, run.scheduled_for))
        if made.job_id is not None:
            result.retries += 1
            log.info(
                "run %d of %r failed (%s): retry run %d, attempt %d, in %.1f s",
                run.id,
                name,
                error.get("code"),
                made.job_id,
                attempt + 1,
                delay,
            )
        else:
            log.info("run %d of %r failed: retry skipped, another run is active (overlap=skip)", run.id, name)


def retry_options(schedule: Mapping[str, Any]) -> TaskOptions:
    """The schedule's retry backoff as `TaskOptions`; the defaults for a hand-written bad policy.

    Args:
        schedule: the schedule's stored row (``name``, ``task_name``, ``retry_policy``:
            a mapping with ``backoff``, ``backoff_max`` and ``delay`` in seconds,
            ``jitter``; or None).
    """
    policy = schedule["retry_policy"] or {}
    mapping = {
        "retry_backoff": policy.get("backoff", False),
        "retry_backoff_max": policy.get("backoff_max", 600.0),
        "default_retry_delay": policy.get("delay", 180.0),
        "retry_jitter": policy.get("jitter", True),
    }
    try:
        return TaskOptions(name=str(schedule["task_name"]), **mapping)
    except (ConfigurationError, TypeError):
        log.warning("schedule %r has an unusable retry policy %r; using defaults", schedule["name"], policy)
        return TaskOptions(name=str(schedule["task_name"]))
