"""`Reaper`: recovers the running jobs of workers whose lease expired.

A maintenance service (`pgtasks.maintenance.Service`) that every worker runs; any
number of reapers may run at once (see `Reaper`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pgtasks.completion import Completer
from pgtasks.db import JobStore, Now, WorkerStore
from pgtasks.maintenance.service import Service
from pgtasks.states import JobStatus
from pgtasks.validation import MAX_BATCH, check_int, check_seconds

if TYPE_CHECKING:
    import pluggy

__all__ = ["Reaper", "ReaperConfig", "ReaperResult"]


@dataclass(frozen=True, slots=True)
class ReaperConfig:
    """Reaper settings.

    Attributes:
        interval: seconds between runs (default 5).
        lease_timeout: lease assumed for jobs whose worker row is gone (default 30 s).
        batch: most jobs recovered per run (default 1000).
        forget_workers_after: seconds after its lease expired that a dead worker's
            row is deleted (default 3600).

    Raises:
        ConfigurationError: a time not seconds in 0 (exclusive) to
            `pgtasks.validation.MAX_DELAY`, or ``batch`` not an int in 1 to
            `pgtasks.validation.MAX_BATCH`.
    """

    interval: float = 5.0
    lease_timeout: float = 30.0
    batch: int = 1000
    forget_workers_after: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("interval", "lease_timeout", "forget_workers_after"):
            check_seconds(name, getattr(self, name), positive=True)
        check_int("batch", self.batch, 1, MAX_BATCH)


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
    job that finished meanwhile is never touched. The write, its log and the
    ``pgtasks_job_reaped`` hook go through `pgtasks.completion.Completer`, the one
    writer of job outcomes.

    Args:
        jobs: the job store (used through a reaping `Completer` when ``completer``
            is not given).
        workers: the worker registry (expired rows are forgotten).
        config: the reaper's settings.
        plugin_manager: where ``pgtasks_job_reaped`` goes (None: no hook), when
            ``completer`` is not given.
        now: pinned time for every run (tests); None: the database clock.
        completer: the completer to write through (the worker passes its own).
        on_reaped: called with each run's result (the worker's metrics count it).
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
        completer: Completer | None = None,
        on_reaped: Callable[[ReaperResult], None] | None = None,
    ) -> None:
        super().__init__(config.interval)
        self.completer = (
            completer if completer is not None else Completer(jobs, plugin_manager=plugin_manager)
        )
        self.workers = workers
        self.config = config
        self.now = now
        self.on_reaped = on_reaped

    def run_once(self) -> ReaperResult:
        """Reap once; returns counts.

        Raises:
            DatabaseError: a statement failed (the service retries on its next tick).
        """
        reaped = self.completer.reap_lost(
            lease_timeout=self.config.lease_timeout, limit=self.config.batch, now=self.now
        )
        requeued = sum(1 for r in reaped if r.status == JobStatus.QUEUED)
        forgotten = self.workers.prune_expired(older_than=self.config.forget_workers_after, now=self.now)
        result = ReaperResult(requeued=requeued, failed=len(reaped) - requeued, workers_forgotten=forgotten)
        if self.on_reaped is not None and reaped:
            self.on_reaped(result)
        return result
