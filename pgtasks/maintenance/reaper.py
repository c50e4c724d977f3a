"""`Reaper`: recovers the running jobs of workers whose lease expired.

A maintenance service (`pgtasks.maintenance.Service`) that every worker runs; any
number of reapers may run at once (see `Reaper`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pluggy

from pgtasks.db import JobStore, Now, WorkerStore
from pgtasks.maintenance.service import Service
from pgtasks.plugins import call_isolated
from pgtasks.states import JobStatus

__all__ = ["Reaper", "ReaperConfig", "ReaperResult"]

log = logging.getLogger("pgtasks.maintenance")


@dataclass(frozen=True, slots=True)
class ReaperConfig:
    """Reaper settings.

    Attributes:
        interval: seconds between runs (default 5).
        lease_timeout: lease assumed for jobs whose worker row is gone (default 30 s).
        batch: most jobs recovered per run (default 1000).
        forget_workers_after: seconds after its lease expired that a dead worker's
            row is deleted (default 3600).
    """

    interval: float = 5.0
    lease_timeout: float = 30.0
    batch: int = 1000
    forget_workers_after: float = 3600.0


@dataclass(frozen=True, slots=True)
class ReaperResult:
    """One reaper run: jobs retried, jobs failed, worker rows forgotten."""

    requeued: int
    failed: int
    workers_forgotten: int


class Reaper(Service):
    """Recovers running jobs of workers whose lease expired (any worker may run it).

    Lost jobs are retried at once, or failed with ``WORKER_LOST`` for tasks with
    ``retry_on_worker_lost=False`` and jobs out of attempts. ``FOR UPDATE SKIP
    LOCKED`` and the status check in the UPDATE make concurrent reapers safe: a
    job that finished meanwhile is never touched.
    """

    name = "reaper"

    def __init__(
        self,
        jobs: JobStore,
        workers: WorkerStore,
        config: ReaperConfig,
        plugin_manager: pluggy.PluginManager | None = None,
        *,
        now: Now = None,
    ) -> None:
        super().__init__(config.interval)
        self.jobs = jobs
        self.workers = workers
        self.config = config
        self.plugin_manager = plugin_manager
        self.now = now

    def run_once(self) -> ReaperResult:
        """Reap once; returns counts."""
        reaped = self.jobs.reap_lost(
            lease_timeout=self.config.lease_timeout, limit=self.config.batch, now=self.now
        )
        requeued = sum(1 for r in reaped if r.status == JobStatus.QUEUED)
        for r in reaped:
            log.warning("reaped job %s (%s) of a lost worker: now %s", r.job_id, r.task_name, r.status)
            if self.plugin_manager is not None:
                call_isolated(
                    self.plugin_manager,
                    "pgtasks_job_reaped",
                    job_id=r.job_id,
                    task_name=r.task_name,
                    new_status=r.status,
                )
        forgotten = self.workers.prune_expired(older_than=self.config.forget_workers_after, now=self.now)
        return ReaperResult(requeued=requeued, failed=len(reaped) - requeued, workers_forgotten=forgotten)
