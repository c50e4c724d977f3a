"""Background services of a worker, all of one shape (River's maintenance services).

Each service has a frozen config with named defaults, a ``run_once()`` returning
a small result of counts (what tests call), and start/stop from `Service`. A
transient database error in one tick is logged and retried on the next tick;
it is never fatal.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pluggy

from pgtasks.errors import DatabaseError
from pgtasks.plugins import call_isolated
from pgtasks.store import Store

__all__ = ["Heartbeat", "HeartbeatResult", "Reaper", "ReaperConfig", "ReaperResult", "Service"]

log = logging.getLogger("pgtasks.worker")


class Service:
    """A thread that calls `run_once` every ``interval`` seconds until stopped.

    Subclasses implement `run_once`. ``DatabaseError`` in a tick is logged (a
    warning for transient errors, an error otherwise) and the next tick runs as
    usual.
    """

    name = "service"

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks = 0
        self.failures = 0

    def run_once(self) -> Any:
        """Do one round of work; return a small result of counts."""
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
                self.ticks += 1
            except DatabaseError as exc:
                self.failures += 1
                level = logging.WARNING if exc.transient else logging.ERROR
                log.log(level, "%s: database error, retrying next tick: %s", self.name, exc)
            except Exception:
                self.failures += 1
                log.exception("%s: unexpected error, retrying next tick", self.name)
            self._stop.wait(self.interval)

    def start(self) -> None:
        """Start the service thread (daemon)."""
        self._thread = threading.Thread(target=self._loop, name=f"pgtasks-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to stop and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    """One heartbeat: whether the lease was extended, and jobs found cancelled."""

    extended: bool
    cancel_requested: int


class Heartbeat(Service):
    """Extends the worker's lease and picks up cancellation requests of its jobs.

    Args:
        store: the worker's store.
        worker_id: this worker.
        interval: seconds between beats (a third of the lease by default).
        on_cancel: called with ``(job_id, terminate)`` for each job someone asked to cancel.
        on_lost: called when the worker row is gone (it was considered dead).
        stopping: returns whether the worker is draining (shown to operators).
    """

    name = "heartbeat"

    def __init__(  # noqa: PLR0917
        self,
        store: Store,
        worker_id: str,
        interval: float,
        on_cancel: Callable[[int, bool], None],
        on_lost: Callable[[], None],
        stopping: Callable[[], bool],
    ) -> None:
        super().__init__(interval)
        self.store = store
        self.worker_id = worker_id
        self.on_cancel = on_cancel
        self.on_lost = on_lost
        self.stopping = stopping

    def run_once(self) -> HeartbeatResult:
        """Beat once: extend the lease, then look for cancellation requests."""
        row = self.store.fetch_one(
            "worker_heartbeat", {"id": self.worker_id, "now": None, "stopping": self.stopping()}
        )
        if row is None:
            self.on_lost()
        cancels = self.store.fetch_all("job_cancel_requested", {"worker_id": self.worker_id})
        for c in cancels:
            self.on_cancel(int(c["id"]), bool(c["terminate"]))
        return HeartbeatResult(extended=row is not None, cancel_requested=len(cancels))


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
        store: Store,
        config: ReaperConfig,
        plugin_manager: pluggy.PluginManager | None = None,
        *,
        now: Any = None,
    ) -> None:
        super().__init__(config.interval)
        self.store = store
        self.config = config
        self.plugin_manager = plugin_manager
        self.now = now

    def run_once(self) -> ReaperResult:
        """Reap once; returns counts."""
        rows = self.store.fetch_all(
            "job_reap_lost",
            {"now": self.now, "lease_timeout": self.config.lease_timeout, "limit": self.config.batch},
        )
        requeued = sum(1 for r in rows if r["status"] == "queued")
        for r in rows:
            log.warning("reaped job %s (%s) of a lost worker: now %s", r["id"], r["task_name"], r["status"])
            if self.plugin_manager is not None:
                call_isolated(
                    self.plugin_manager,
                    "pgtasks_job_reaped",
                    job_id=int(r["id"]),
                    task_name=str(r["task_name"]),
                    new_status=str(r["status"]),
                )
        forgotten = self.store.fetch_all(
            "worker_prune_expired", {"now": self.now, "older_than": self.config.forget_workers_after}
        )
        return ReaperResult(requeued=requeued, failed=len(rows) - requeued, workers_forgotten=len(forgotten))
