"""`run_until_idle`: run an app's due jobs in this process, through the real worker.

Each round runs a `pgtasks.worker.Worker` in burst mode in the calling thread
(one job at a time, no LISTEN, its own connections): the same claim, execution,
retry decision and completion code as ``pgtasks worker``, so a job's row ends as it
would in production. Between rounds the test clock (`pgtasks.testing.clock`) may
tick the scheduler and move time on.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pgtasks.errors import ConfigurationError, ResultTimeout, TaskFailed
from pgtasks.hookspecs import hookimpl
from pgtasks.validation import check_int, check_seconds, check_text, short

if TYPE_CHECKING:
    from pgtasks.app import App

__all__ = ["RunSummary", "run_until_idle"]

#: Statuses a job's attempt can end in, as `RunSummary.counts` names them.
OUTCOMES = ("succeeded", "retried", "failed", "cancelled", "partial_failure")
#: Seconds a job still running gets to finish once `run_until_idle` times out.
SHUTDOWN_GRACE = 1.0

# Apps whose jobs a `run_until_idle` call is running now: an eager enqueue from inside
# one of their tasks leaves its job to that call's next round (`pgtasks.testing.eager`).
_running: weakref.WeakSet[Any] = weakref.WeakSet()
_running_lock = threading.Lock()


def is_running(app: object) -> bool:
    """Whether a `run_until_idle` call is running ``app``'s jobs now."""
    with _running_lock:
        return app in _running


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What a `run_until_idle` call ran.

    Attributes:
        counts: attempts by how they ended: ``succeeded``, ``retried`` (failed, with
            a retry queued), ``failed``, ``cancelled``, ``partial_failure`` (every
            key is present).
        failures: a `pgtasks.errors.TaskFailed` per job that ended ``failed`` or
            ``partial_failure`` (its id, status and stored error record, with the
            traceback), in the order they ended.
        fired: runs the scheduler created (cron fire times, retry and dependency
            runs) during the call.
        advanced: how far the test clock moved on during the call.
        idle: True when the call stopped because nothing was due (within
            ``advance``); False when ``max_jobs`` stopped it first.
    """

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    failures: tuple[TaskFailed, ...] = ()
    fired: int = 0
    advanced: timedelta = timedelta(0)
    idle: bool = True

    @property
    def ran(self) -> int:
        """Attempts run (every outcome)."""
        return sum(self.counts.values())

    def __getattr__(self, name: str) -> int:
        # summary.succeeded, summary.failed, ...: the counts by name.
        if name in OUTCOMES:
            return self.counts[name]
        raise AttributeError(name)


class _Collector:
    """A plugin registered for the call: counts outcomes and collects failures."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = dict.fromkeys(OUTCOMES, 0)
        self.failures: list[TaskFailed] = []

    def _add(self, status: str) -> None:
        with self.lock:
            self.counts[status] = self.counts.get(status, 0) + 1

    @hookimpl
    def pgtasks_job_succeeded(self, job_id: int) -> None:
        self._add("succeeded")

    @hookimpl
    def pgtasks_job_retrying(self, job_id: int) -> None:
        self._add("retried")

    @hookimpl
    def pgtasks_job_failed(self, job_id: int, error: dict[str, Any], final_status: str) -> None:
        self._add(final_status)
        if final_status in ("failed", "partial_failure"):
            with self.lock:
                self.failures.append(TaskFailed(job_id, final_status, dict(error)))


def _check_queues(queues: Iterable[str] | None) -> tuple[str, ...] | None:
    if queues is None:
        return None
    if isinstance(queues, str | bytes) or not isinstance(queues, Iterable):
        raise ConfigurationError(f"queues must be a list of queue names or None, got {short(queues)}")
    names = tuple(queues)
    if not names:
        raise ConfigurationError("queues must name at least one queue (None: every queue)")
    for name in names:
        check_text("queue", name)
    return names


def _check_advance(advance: timedelta | float | None) -> float:
    if advance is None:
        return 0.0
    seconds = advance.total_seconds() if isinstance(advance, timedelta) else advance
    return check_seconds("advance", seconds)


def _due_queues(app: App) -> tuple[str, ...]:
    """Queues with queued jobs (due or not): what a round serves when no queues are given."""
    return tuple(sorted({str(row["queue"]) for row in app.queue_stats() if row["status"] == "queued"}))


def _burst(app: App, queues: tuple[str, ...], max_jobs: int, deadline: float) -> int:
    """Run one burst worker in this thread; returns the attempts it finished.

    Raises:
        ResultTimeout: ``deadline`` (time.monotonic()) passed first.
    """
    from pgtasks.worker import Worker
    from pgtasks.worker.config import WorkerConfig

    config = WorkerConfig(
        queues=queues,
        concurrency=1,
        prefetch_multiplier=1,
        burst=True,
        listen=False,
        poll_interval=0.01,
        completion_delay=0.0,
        max_tasks_per_child=max_jobs,
        shutdown_timeout=SHUTDOWN_GRACE,
    )
    worker = Worker(app, config)
    timed_out = threading.Event()

    def stop() -> None:
        timed_out.set()
        worker.request_stop("timeout")

    timer = threading.Timer(max(0.0, deadline - time.monotonic()), stop)
    timer.daemon = True
    timer.start()
    try:
        worker.run(install_signal_handlers=False)
    finally:
        timer.cancel()
        timer.join()
    if timed_out.is_set():
        raise ResultTimeout(
            f"run_until_idle: jobs were still due or running when the timeout ran out "
            f"({worker.processed} attempts finished in the last round)"
        )
    return worker.processed


def run_until_idle(
    app: App,
    *,
    queues: Iterable[str] | None = None,
    max_jobs: int = 1000,
    timeout: float = 30.0,
    advance: timedelta | float | None = None,
    schedules: bool = True,
    raise_on_failure: bool = False,
) -> RunSummary:
    """Run ``app``'s due jobs in this process until none is left; say how they ended.

    Jobs run one at a time through a burst `pgtasks.worker.Worker` in this thread:
    the real claim (due jobs only, lock keys, priorities, tenants), the real task
    execution (retries and backoff decided as in production) and the real
    completion writes. Jobs that the run makes due (retries without delay, jobs
    enqueued by tasks) run too. With ``schedules`` the scheduler ticks before and
    after each round at the test clock's time (`pgtasks.testing.clock_for`): due
    cron fire times make runs, finished runs are followed up.

    With ``advance`` the test clock then moves on, up to that far, from one due
    instant to the next (a countdown, a retry's backoff, a cron fire time), running
    what becomes due at each, as if that much time had passed: a retry with a
    10-minute backoff runs under ``advance=timedelta(minutes=10)``, with no sleep.

    Args:
        app: the application whose jobs to run.
        queues: queues to serve; None (default): every queue with queued jobs,
            looked up again each round.
        max_jobs: most attempts to run (>= 1, default 1000); the call returns
            (``idle`` False) when reached.
        timeout: seconds of real time the whole call may take (default 30).
        advance: how far the test clock may move on (a `timedelta` or seconds,
            >= 0); None: it does not move.
        schedules: tick the scheduler at the test clock's time (default True).
        raise_on_failure: raise the first job failure (`TaskFailed`) at the end
            instead of only reporting it; a failing task never raises out of the
            call otherwise.

    Returns:
        A `RunSummary` of the attempts run, by outcome.

    Raises:
        ConfigurationError: an argument of the wrong type or out of range (nothing
            runs).
        ResultTimeout: ``timeout`` ran out with jobs still due or running (a job
            still running is recovered by its lease like a lost worker's).
        TaskFailed: with ``raise_on_failure``, a job ended ``failed`` or
            ``partial_failure``.
    """
    from pgtasks.testing.clock import clock_for

    only = _check_queues(queues)
    check_int("max_jobs", max_jobs, 1, 2**31 - 1)
    check_seconds("timeout", timeout, positive=True)
    remaining = _check_advance(advance)
    if not isinstance(schedules, bool) or not isinstance(raise_on_failure, bool):
        raise ConfigurationError("schedules and raise_on_failure must be True or False")
    deadline = time.monotonic() + timeout
    clock = clock_for(app)
    collector = _Collector()
    app.plugin_manager.register(collector)
    with _running_lock:
        _running.add(app)
    ran = fired = 0
    moved = 0.0
    idle = True
    try:
        while True:
            if time.monotonic() > deadline:
                raise ResultTimeout("run_until_idle: the timeout ran out with jobs still due")
            fired_now = clock.tick() if schedules else 0
            served = only or _due_queues(app)
            ran_now = _burst(app, served, max_jobs - ran, deadline) if served else 0
            if schedules and ran_now:
                fired_now += clock.tick()  # follow up finished runs at once
            ran += ran_now
            fired += fired_now
            if ran >= max_jobs:
                idle = False
                break
            if ran_now or fired_now:
                continue  # what they made may be due
            if remaining <= 0:
                break
            step = clock.until_next_due(only, limit=remaining)
            clock.advance(timedelta(seconds=step))
            remaining -= step
            moved += step
    finally:
        with _running_lock:
            _running.discard(app)
        app.plugin_manager.unregister(collector)
    summary = RunSummary(
        counts=dict(collector.counts),
        failures=tuple(collector.failures),
        fired=fired,
        advanced=timedelta(seconds=moved),
        idle=idle,
    )
    if raise_on_failure and summary.failures:
        raise summary.failures[0]
    return summary
