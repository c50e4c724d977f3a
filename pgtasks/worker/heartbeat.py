"""The worker's heartbeat: its lease and the cancellation requests of its jobs.

A maintenance service of the shared shape (`pgtasks.maintenance.Service`).
"""

from __future__ import annotations

import math
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
        lease_timeout: the worker's lease in seconds; with it the beat tells when the
            lease may have lapsed between two beats (``lapsed_at``).

    Attributes:
        extended_at: ``time.monotonic()`` when the last beat that extended the lease
            was sent (None before the first): the lease runs at least ``lease_timeout``
            seconds from then.
        lapsed_at: ``time.monotonic()`` when the last beat returned that landed
            ``lease_timeout`` seconds or more after the one before was sent (the process
            was stopped, the database unreachable, the beat starved or kept waiting
            for a connection): the lease may have
            expired in between and the reaper may have taken this worker's jobs. The
            beat extends the lease again without telling that, so the worker asks here.
            ``-inf`` if it never happened.
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
        lease_timeout: float | None = None,
    ) -> None:
        super().__init__(interval)
        self.workers = workers
        self.jobs = jobs
        self.worker_id = worker_id
        self.on_cancel = on_cancel
        self.on_lost = on_lost
        self.stopping = stopping
        self.clock = clock
        self.lease_timeout = lease_timeout
        self.extended_at: float | None = None
        self.lapsed_at = -math.inf

    def run_once(self) -> HeartbeatResult:
        """Beat once: extend the lease, then look for cancellation requests."""
        sent = time.monotonic()
        database_clock = self.workers.heartbeat(id=self.worker_id, stopping=self.stopping())
        extended = database_clock is not None
        if database_clock is None:
            self.on_lost()
        else:
            # Measured to when this beat's write returned, not to when it was asked for:
            # a beat that waited for a connection (the server or a pooler refusing
            # logins) may have landed a whole lease after the one before, and a job
            # claimed while it waited may have been handed back by the reaper.
            done, last = time.monotonic(), self.extended_at
            if last is not None and self.lease_timeout is not None and done - last >= self.lease_timeout:
                self.lapsed_at = done
            self.extended_at = sent
            if self.clock is not None:
                self.clock.sync(database_clock, sent, time.monotonic())
        cancels = self.jobs.cancel_requested(worker_id=self.worker_id)
        for c in cancels:
            self.on_cancel(c.job_id, c.terminate)
        return HeartbeatResult(extended=extended, cancel_requested=len(cancels))
