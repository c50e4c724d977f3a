"""The worker's heartbeat: its lease and the cancellation requests of its jobs.

A maintenance service of the shared shape (`pgtasks.maintenance.Service`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pgtasks.db import JobStore, WorkerStore
from pgtasks.maintenance import Service
from pgtasks.worker.dbtime import DatabaseTime

__all__ = ["Heartbeat", "HeartbeatResult"]


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    """One heartbeat: whether the lease was extended, and jobs found cancelled."""

    extended: bool
    cancel_requested: int


class Heartbeat(Service):
    """Extends the worker's lease and picks up cancellation requests of its jobs.

    Args:
        workers, jobs: the worker's stores.
        worker_id: this worker.
        interval: seconds between beats (a third of the lease by default).
        on_cancel: called with ``(job_id, terminate)`` for each job someone asked to cancel.
        on_lost: called when the worker row is gone (it was considered dead).
        stopping: returns whether the worker is draining (shown to operators).
        clock: kept on the database clock by every beat (`DatabaseTime`), if given.
    """

    name = "heartbeat"

    def __init__(  # noqa: PLR0917
        self,
        workers: WorkerStore,
        jobs: JobStore,
        worker_id: str,
        interval: float,
        on_cancel: Callable[[int, bool], None],
        on_lost: Callable[[], None],
        stopping: Callable[[], bool],
        *,
        clock: DatabaseTime | None = None,
    ) -> None:
        super().__init__(interval)
        self.workers = workers
        self.jobs = jobs
        self.worker_id = worker_id
        self.on_cancel = on_cancel
        self.on_lost = on_lost
        self.stopping = stopping
        self.clock = clock

    def run_once(self) -> HeartbeatResult:
        """Beat once: extend the lease, then look for cancellation requests."""
        sent = time.monotonic()
        database_clock = self.workers.heartbeat(id=self.worker_id, stopping=self.stopping())
        extended = database_clock is not None
        if database_clock is None:
            self.on_lost()
        elif self.clock is not None:
            self.clock.sync(database_clock, sent, time.monotonic())
        cancels = self.jobs.cancel_requested(worker_id=self.worker_id)
        for c in cancels:
            self.on_cancel(c.job_id, c.terminate)
        return HeartbeatResult(extended=extended, cancel_requested=len(cancels))
