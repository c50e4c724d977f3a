"""The worker: claim jobs in batches, run them, record outcomes, recover the lost.

One `Worker` per process. Its threads:

* the claim loop (the thread calling `Worker.run`): claims batches sized to free
  capacity, hands them to the pool, and sleeps until woken by NOTIFY, by a
  finished job that may leave work behind, or by the poll timer (NOTIFY only
  wakes: polling always runs);
* the pool (``threads`` or ``processes``) running jobs;
* the completer (`pgtasks.completion`), the one writer of outcomes: successful
  results in batches from its thread, every other outcome from the thread
  where the attempt ended;
* the heartbeat (lease and cancellation requests), the reaper, the retention
  service (finished jobs the policy no longer keeps; one worker of the fleet at a
  time), the time-limit watchdog, and the listener.

Shutdown (SIGTERM/SIGINT, `Worker.request_stop`, or the end of a burst): stop
claiming, hand back claimed-but-unstarted jobs at once, let running jobs finish
within ``shutdown_timeout`` (heartbeats go on), write pending results,
unregister. Jobs still running then, and those of a second signal (which exits at
once, code 130), are recovered by lease like a lost worker's.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import FrameType
from typing import Any

from pgtasks.completion import Completer, Completion, Outcome
from pgtasks.context import (
    CLAIM_COLUMNS,
    TRANSACTION_NEEDS_THREADS,
    Request,
    TaskContext,
    request_from_claim,
    unreadable_claim,
)
from pgtasks.db import CancelRequest, HeldTransaction, JobStore, WorkerStore, text_array_literal
from pgtasks.db.errors import masked_record
from pgtasks.db.flow import FlowStore
from pgtasks.db.history import HistoryStore
from pgtasks.db.retention import RetentionStore
from pgtasks.db.workers import worker_database
from pgtasks.errors import ConfigurationError, DatabaseError, NotOwner, TimeLimitExceeded
from pgtasks.maintenance import (
    FlowPrune,
    History,
    HistoryConfig,
    Reaper,
    ReaperConfig,
    ReaperResult,
    Retention,
)
from pgtasks.plugins import call_isolated
from pgtasks.ports import Engine
from pgtasks.redaction import Redactor
from pgtasks.secret_ref import referenced_values
from pgtasks.states import JobStatus
from pgtasks.worker.attempt import Success, run_attempt
from pgtasks.worker.config import WorkerConfig
from pgtasks.worker.dbtime import DatabaseTime
from pgtasks.worker.heartbeat import Heartbeat
from pgtasks.worker.hints import WakeHints
from pgtasks.worker.isolation import LOCK_RACE, distinct_keys, find_unclaimable, first_line
from pgtasks.worker.listener import Listener
from pgtasks.worker.metrics import WorkerMetrics
from pgtasks.worker.outcome import cancelled_outcome, decide, unknown_task_outcome
from pgtasks.worker.pool import HeldJob, ThreadPool, deliver_pending_exception
from pgtasks.worker.routing import unrouted_queues_warning
from pgtasks.worker.starts import StartRecorder
from pgtasks.worker.timelimits import TimeLimitWatchdog

__all__ = ["EXIT_FORCED", "EXIT_OK", "Worker"]

log = logging.getLogger("pgtasks.worker")

EXIT_OK = 0
EXIT_FORCED = 130
UNKNOWN_TASK_DEFER = 60.0  # seconds a job of an unknown task waits before another try
# (tenant, priority) groups per queue that job_next_run_at probes one by one before it
# reads every queued entry instead: two index probes per group cost about as much as
# reading a few hundred entries, and a queue with more groups than this is rarely idle.
NEXT_RUN_AT_MAX_GROUPS = 100
# Seconds past the end of a full rate window before an idle worker claims again (the
# database and the worker round the instant differently).
RATE_WINDOW_SLACK = 0.005
# Seconds before claiming again after a transient failure: the first retry, and the cap of
# its doubling while the failures last (a server that is really down).
CLAIM_RETRY_FIRST = 0.05
CLAIM_RETRY_MAX = 1.0
_TASK_NAME = CLAIM_COLUMNS.index("task_name")
_TENANT = CLAIM_COLUMNS.index("tenant")
_QUEUE = CLAIM_COLUMNS.index("queue")
_DUE = len(CLAIM_COLUMNS)  # the claims' run-at (Unix seconds), after the claim columns
_SHARE = _DUE + 1  # job_claim_batch's tenant_share, after that
_KEYED = _SHARE + 1  # whether the job holds a concurrency slot (both claims), after that


def _level_name(level: int) -> str:
    """The name of a logging level, for a child process's `configure_logging`: a level
    without a name (``"Level 25"``) is taken as WARNING."""
    name = logging.getLevelName(level)
    return name if isinstance(name, str) and not name.startswith("Level ") else "WARNING"


class Worker:
    """Runs jobs of an app's tasks from the given queues until stopped.

    Args:
        app: what the worker runs jobs for (`pgtasks.ports.Engine`; a `pgtasks.App`
            is one): its tasks, its plugin manager, its settings and database DSN.
            The worker opens a `Database` of its own on that DSN.
        config: a `WorkerConfig` (default: one built from ``overrides``).
        overrides: `WorkerConfig` fields, when ``config`` is not given.

    Attributes:
        started: set once the worker is registered and claiming.
        stopped: set once it has shut down.
        database: the worker's own `Database` (generic plans, no JIT).
        jobs, workers: the typed stores over it.
    """

    def __init__(self, app: Engine, config: WorkerConfig | None = None, **overrides: Any) -> None:
        self.app = app
        self.config = config or WorkerConfig(**overrides)
        self.id = self.config.worker_id
        self.plugin_manager = app.plugin_manager
        self.database = worker_database(
            app.stores.database.dsn,
            max_size=min(self.config.concurrency + 4, 32),
            prepare_threshold=app.settings.prepare_threshold,
            worker_id=self.id,
        )
        self.jobs = JobStore(self.database)
        self.workers = WorkerStore(self.database)
        self.started = threading.Event()
        self.stopped = threading.Event()
        # Finished attempts, counted per thread (only the owning thread writes its
        # counter), so the pool threads share no lock for it; `processed` sums them.
        self._counts: list[list[int]] = []
        self._counts_lock = threading.Lock()
        self._local = threading.local()
        self._stopping = threading.Event()
        self._stop_reason = "signal"
        self._wake = threading.Event()
        # Held jobs by id. Only single dict operations touch it (atomic in CPython), so
        # the claim loop and the pool threads share no lock for it.
        self._held: dict[int, HeldJob] = {}
        # A claim failed in flight and may have committed (`_release_unknown_claims`).
        self._claim_unsure = False
        self._signals = 0
        self._cursor = ""
        self._low_water = max(self.config.concurrency, self.config.capacity // 2)
        # The queues as one text[] literal, built once: psycopg adapts a list per call.
        self._queues = text_array_literal(self.config.queues)
        # With --unknown-tasks defer, the task names this worker knows, the same way: its
        # claims take only their jobs and leave the others, untouched, to a worker that
        # knows them (a rolling deploy). None: every task (unknown ones are failed).
        self._tasks = (
            text_array_literal(sorted(self.app.tasks)) if self.config.unknown_tasks == "defer" else None
        )
        # Jobs named by enqueue notifications, claimed by id while the worker is idle;
        # by this time.monotonic() deadline the worker polls regardless (a full claim,
        # or with no job held, first the question whether any job is due).
        self._hints = WakeHints(self.config.queues, max_ids=self.config.capacity)
        self._full_claim_at = 0.0
        # When the next full rate window that due jobs wait on ends (job_next_run_at).
        self._opens_at: Any = None
        # Held jobs that hold a slot of a concurrency key: their end frees it, a reason
        # to claim (the key's next job may be waiting). Only single set operations.
        self._keyed: set[int] = set()
        # The last full claim saw every tenant with due jobs and still came back short:
        # nothing more to claim until a notification, the poll, or a freed lock key.
        self._drained = False
        # The last full claim may have left due jobs behind: it filled its limit, or
        # took a tenant's whole share of it (job_claim_batch).
        self._more = False
        self._pool: Any = None
        # Masking rules per task name (`_masked`), built on a task's first failure.
        self._redactors: dict[str, Redactor] = {}
        self._completer = Completer(
            self.jobs,
            self.id,
            self.plugin_manager,
            batch=self.config.completion_batch,
            delay=self.config.completion_delay,
            on_written=self._on_written,
            on_requeued=self._wake.set,
        )
        # Instants this worker records (a body's start and end), on the database clock.
        self._clock = DatabaseTime()
        self._heartbeat = Heartbeat(
            self.workers,
            self.jobs,
            self.id,
            self.config.heartbeat_every,
            on_cancel=self._on_cancel,
            on_lost=self._on_lost,
            stopping=self._stopping.is_set,
            clock=self._clock,
            lease_timeout=self.config.lease_timeout,
        )
        self._starts = StartRecorder(self._write_starts)
        # Counters served on /metrics (--metrics-port); None: nothing is counted.
        self.metrics: WorkerMetrics | None = None
        if self.config.metrics_port is not None:
            self.metrics = WorkerMetrics(
                worker_id=self.id,
                pool=self.config.pool,
                tenants=self.config.metrics_tenants,
                held=lambda: [h.started for h in self._held_jobs()],
            )
        self._reaper = Reaper(
            self.jobs,
            self.workers,
            ReaperConfig(interval=self.config.reap_interval, lease_timeout=self.config.lease_timeout),
            completer=self._completer,
            on_reaped=None if self.metrics is None else self._count_reaped,
        )
        # Finished jobs the app's retention policy no longer keeps (Settings.retention).
        policy = app.settings.retention
        self._retention = Retention(RetentionStore(self.database), policy) if policy.enabled else None
        # Finished jobs out of the hot table after Settings.history_after (migration 0009).
        after = app.settings.history_after
        self._history = (
            None if after is None else History(HistoryStore(self.database), HistoryConfig(after=after))
        )
        # Concurrency counters and rate windows of idle keys (migration 0008), always.
        self._flow_prune = FlowPrune(FlowStore(self.database))
        self._watchdog = TimeLimitWatchdog(
            self._held_jobs, on_hard_limit=self._on_hard_limit, soft_in_thread=self.config.pool == "threads"
        )
        self._listener: Listener | None = None
        if self.config.listen:
            self._listener = Listener(
                self.database,
                self.jobs,
                on_jobs=self._on_jobs_notified,
                on_cancel=self._on_cancel_notified,
                on_reconnect=self._on_listener_reconnected,
            )

    def __repr__(self) -> str:
        return f"<Worker {self.id} queues={','.join(self.config.queues)}>"

    # -- life cycle ----------------------------------------------------------------

    def run(self, *, install_signal_handlers: bool | None = None) -> int:
        """Register, run until stopped, shut down gracefully; returns the exit code.

        Args:
            install_signal_handlers: handle SIGTERM/SIGINT (default: when called in
                the main thread).
        """
        if install_signal_handlers is None:
            install_signal_handlers = threading.current_thread() is threading.main_thread()
        if install_signal_handlers:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        if self.metrics is not None:
            assert self.config.metrics_port is not None
            self.metrics.serve(self.config.metrics_host, self.config.metrics_port)
            log.info(
                "worker %s serves metrics on http://%s:%d/metrics",
                self.id,
                self.config.metrics_host,
                self.metrics.port,
            )
        try:
            self._register()
        except BaseException:
            if self.metrics is not None:
                self.metrics.stop()
            raise
        self._pool = self._make_pool()
        self._pool.start()
        self._completer.start()
        self._heartbeat.start()
        self._reaper.start()
        if self._retention is not None:
            self._retention.start()
        if self._history is not None:
            self._history.start()
        self._flow_prune.start()
        self._watchdog.start()
        self._starts.start()
        if self._listener is not None:
            self._listener.start()
        unrouted = unrouted_queues_warning(self.config.queues, self.app.tasks)
        if unrouted is not None:  # a typo in -Q would otherwise wait forever without a word
            log.warning("worker %s: %s", self.id, unrouted)
        log.info(
            "worker %s ready: queues=%s concurrency=%d pool=%s listen=%s",
            self.id,
            ",".join(self.config.queues),
            self.config.concurrency,
            self.config.pool,
            self.config.listen,
        )
        call_isolated(
            self.plugin_manager,
            "pgtasks_worker_started",
            worker_id=self.id,
            queues=list(self.config.queues),
            concurrency=self.config.concurrency,
        )
        self.started.set()
        try:
            self._loop()
        finally:
            self._shutdown()
        return EXIT_OK

    def request_stop(self, reason: str = "signal") -> None:
        """Stop claiming and shut down gracefully (safe from any thread)."""
        if not self._stopping.is_set():
            self._stop_reason = reason
            self._stopping.set()
            self._wake.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals == 1:
            log.warning(
                "received %s: finishing running jobs (up to %.0fs); signal again to exit at once",
                signal.Signals(signum).name,
                self.config.shutdown_timeout,
            )
            self.request_stop("signal")
        else:
            log.error("second signal: exiting now; running jobs will be recovered by lease")
            os._exit(EXIT_FORCED)

    def _register(self) -> None:
        with self.database.connection():
            pass  # the pool open before the clock reading, not inside its round trip
        sent = time.monotonic()
        database_clock = self.workers.register(
            id=self.id,
            host=self.id.split(":")[0],
            pid=os.getpid(),
            queues=self.config.queues,
            concurrency=self.config.concurrency,
            pool=self.config.pool,
            lease_timeout=self.config.lease_timeout,
        )
        self._clock.sync(database_clock, sent, time.monotonic())

    def _make_pool(self) -> Any:
        if self.config.pool == "processes":
            from pgtasks.worker.processes import ChildSpec, ProcessPool

            assert self.config.app_spec is not None  # WorkerConfig requires it for this pool
            spec = ChildSpec(
                app_spec=self.config.app_spec,
                plugins=self.config.plugins,
                dsn=self.database.dsn,
                prepare_threshold=self.app.settings.prepare_threshold,
                worker_id=self.id,
                max_tasks=self.config.max_tasks_per_child,
                loglevel=_level_name(logging.getLogger().getEffectiveLevel()),
            )
            return ProcessPool(spec, self.config.concurrency, self._finish, begin=self._begin)
        return ThreadPool(self.config.concurrency, self._execute)

    # -- claiming ------------------------------------------------------------------

    def _held_jobs(self) -> list[HeldJob]:
        return list(self._held.values())

    def _loop(self) -> None:
        polled = False  # the last wait ended by its timeout, not by a wake-up
        retry = 0.0  # seconds waited after the last claim, if it failed transiently
        while not self._stopping.is_set():
            self._wake.clear()
            held = len(self._held)
            # Claim when the local buffer is half empty: claims come in batches rather
            # than one job at a time, and the pool has work while a claim is in flight.
            limit = self.config.capacity - held if held <= self._low_water else 0
            if polled and not held and not self.config.burst:  # nothing held: limit is the capacity
                wait = self._wait_if_nothing_due()
                if wait is not None:
                    if self._claim_unsure:  # the database answered: hand back now, not at the next claim
                        self._release_unknown_claims()
                    polled = not self._wake.wait(wait)
                    continue
            polled = False
            claimed = 0
            named: list[int] | None = None
            if limit > 0:
                named = self._hints.take(held > 0, full=time.monotonic() >= self._full_claim_at)
                try:
                    claimed = self._claim(limit) if named is None else self._claim_named(named)
                except DatabaseError as exc:
                    if exc.sqlstate == LOCK_RACE:
                        # A job of a lock key this claim took started elsewhere while the
                        # claim ran (pgtasks.lock_key_free reads after the key's advisory
                        # lock, so only a writer that skips that lock gets here): the next
                        # claim sees it and passes over the key, so claim again at once.
                        log.debug("claim raced another worker for a lock key; claiming again")
                        self._hints.want_full()
                        continue
                    # Transient (the connection died in flight, the server restarts): claim
                    # again soon, backing off while it lasts, in full (the named jobs were
                    # taken from the hints). Anything else waits a poll interval.
                    wait = self.config.poll_interval
                    if exc.transient:
                        retry = min(max(2 * retry, CLAIM_RETRY_FIRST), CLAIM_RETRY_MAX, wait)
                        wait = retry
                        self._hints.want_full()
                        self._claim_unsure = True
                    log.warning("claim failed (%s); retrying after %.2fs", exc, wait)
                    polled = not self._wake.wait(wait)
                    continue
                retry = 0.0
                if self._claim_unsure:
                    self._release_unknown_claims()
                if named is None and self._more:
                    continue  # more may be waiting
            if limit <= 0:  # the buffer is full: a finishing job wakes the loop
                polled = not self._wake.wait(self.config.poll_interval)
                continue
            if named is not None and claimed == len(named):
                # Every named job claimed: what the last full claim learnt about future
                # jobs still holds, so sleep until its deadline without asking again.
                polled = not self._wake.wait(max(0.0, self._full_claim_at - time.monotonic()))
                continue
            idle = claimed == 0 and not self._held and self._completer.pending() == 0
            next_run_at, now = self._next_run_at()
            if (
                self.config.burst
                and idle
                and (next_run_at is None or next_run_at > now or self._rate_bound(now))
            ):
                self.request_stop("burst-done")
                break
            wait = self._idle_wait(next_run_at, now)
            if named is None:
                self._full_claim_at = time.monotonic() + wait
            else:
                wait = min(wait, max(0.0, self._full_claim_at - time.monotonic()))
            polled = not self._wake.wait(wait)

    def _release_unknown_claims(self) -> None:
        """After a claim failed in flight, hand back what it may have taken.

        A claim whose connection died after its commit (a failover: the server stopped
        while the commit waited for the synchronous standby, which had the WAL already)
        took jobs whose rows never reached this worker: they are ``running`` under its
        live lease, so the reaper leaves them, and nobody runs them until it stops. Once
        the database answers again (a claim, or an idle poll's look at what is due), the
        jobs this worker holds claimed, unstarted and unknown are handed back
        (``job_release_unknown``). It waits until no outcome is
        pending: the known ids are read first, and a job leaves them only after its
        outcome was queued, so every other running job of this worker is one of those.
        """
        known = list(self._held)  # first: a finishing job's outcome is queued before it leaves
        if self._completer.pending():
            return  # after the next claim
        try:
            released = self.jobs.release_unknown(worker_id=self.id, known=known)
        except DatabaseError as exc:
            log.warning("cannot check for jobs of a claim whose reply was lost (%s); trying again", exc)
            return
        self._claim_unsure = False
        if released:
            log.warning(
                "handed back %d job(s) a claim took whose reply was lost: %s", len(released), sorted(released)
            )

    def _claim(self, limit: int) -> int:
        start_tenant = self._cursor
        try:
            rows = self._claim_batch(limit, start_tenant)
        except DatabaseError as exc:
            if exc.transient:
                raise
            if exc.sqlstate != LOCK_RACE:  # a row the claim cannot take: fail it, go on
                suspects = self.jobs.claim_suspects(
                    queues=self._queues,
                    tasks=self._tasks,
                    limit=limit,
                    start_tenant=start_tenant,
                    max_tenants=self.config.max_tenants_per_claim,
                )
                if not self._isolate_unclaimable(exc, distinct_keys(suspects)):
                    raise
            # Two workers raced for one lock key, or the culprits are failed: claim again.
            rows = self._claim_batch(limit, start_tenant)
        per_tenant = Counter((r[_QUEUE], r[_TENANT]) for r in rows)
        tenants = {tenant for _, tenant in per_tenant}
        self._more = len(rows) >= limit or (bool(rows) and max(per_tenant.values()) >= rows[0][_SHARE])
        started_at_first_tenant = not start_tenant
        self._drained = (
            started_at_first_tenant and not self._more and len(tenants) < self.config.max_tenants_per_claim
        )
        if len(tenants) >= self.config.max_tenants_per_claim:
            # Many tenants: the next claim starts after the last one served (chr(1)
            # follows any tenant name in the byte order of the "C" collation).
            self._cursor = max(tenants) + "\x01"
        elif self._cursor and not rows:
            self._cursor = ""
            return self._claim(limit)
        else:
            self._cursor = ""
        for row in rows:
            self._dispatch(row)
        return len(rows)

    def _claim_batch(self, limit: int, start_tenant: str) -> list[tuple[Any, ...]]:
        began = time.perf_counter()
        rows = self.jobs.claim_batch(
            queues=self._queues,
            tasks=self._tasks,
            worker_id=self.id,
            limit=limit,
            start_tenant=start_tenant,
            max_tenants=self.config.max_tenants_per_claim,
            fair=self.config.tenant_fair,
        )
        if self.metrics is not None:
            self.metrics.claimed("batch", time.perf_counter() - began, len(rows))
        return rows

    def _claim_named(self, ids: list[int]) -> int:
        """Claim jobs named by notifications (`WakeHints`), by primary key; returns how many."""
        try:
            began = time.perf_counter()
            rows = self.jobs.claim_ids(ids=ids, queues=self._queues, tasks=self._tasks, worker_id=self.id)
            if self.metrics is not None:
                self.metrics.claimed("named", time.perf_counter() - began, len(rows))
        except DatabaseError as exc:
            if exc.sqlstate != LOCK_RACE and (exc.transient or not self._isolate_unclaimable(exc, ids)):
                raise
            # Another worker started a job with the same lock key meanwhile, or a job
            # no claim can take was failed: the full claim sorts the rest out, at once.
            self._hints.want_full()
            self._wake.set()
            return 0
        for row in rows:
            self._dispatch(row)
        return len(rows)

    def _wait_if_nothing_due(self) -> float | None:
        """At a poll with no job held: seconds to sleep on if no queued job is due yet.

        With nothing due a claim finds nothing, after its tenant skip scan, a probe
        per (tenant, priority) and a write transaction; `job_next_run_at` answers
        in a read of the same probes and also says how long to sleep. So a poll on
        an idle worker asks that first, and claims only when something is due.
        Returns None to claim: a job is due (or its lock key may be free now), or
        the question could not be answered.
        """
        next_run_at, now = self._next_run_at()
        if now is None or (next_run_at is not None and next_run_at <= now):
            return None
        wait = self._idle_wait(next_run_at, now)
        self._full_claim_at = time.monotonic() + wait
        return wait

    def _next_run_at(self) -> tuple[Any, Any]:
        """(earliest run-at of a queued job in our queues or None, database now);
        (None, None) when the database could not answer. Also notes when the next full
        rate window that queued jobs wait on opens (`_idle_wait` wakes then)."""
        try:
            run_at, now, self._opens_at = self.jobs.next_wake(
                queues=self._queues, tasks=self._tasks, max_groups=NEXT_RUN_AT_MAX_GROUPS
            )
        except DatabaseError:
            return None, None
        return run_at, now

    def _rate_bound(self, now: Any) -> bool:
        """Whether due jobs wait on a full rate window that ends later than a poll
        interval from ``now`` (a burst worker stops then rather than wait it out)."""
        opens_at = self._opens_at
        if opens_at is None or now is None:
            return False
        return bool((opens_at - now).total_seconds() > self.config.poll_interval)

    def _idle_wait(self, next_run_at: Any, now: Any) -> float:
        """Seconds to sleep after a claim that found less than it asked for.

        Until the next future job is due, at most one poll interval. Jobs already due
        but not claimed (their lock key is running, or another worker holds them)
        are not a reason to claim again at once: that would spin.
        """
        wait = self.config.poll_interval
        if next_run_at is not None and now is not None:
            until = (next_run_at - now).total_seconds()
            if until > 0:
                wait = min(wait, until)
        if self._opens_at is not None and now is not None:
            # Due jobs wait on a full rate window: claim again as it ends, not a poll later.
            wait = min(wait, max(0.0, (self._opens_at - now).total_seconds()) + RATE_WINDOW_SLACK)
        return wait

    def _on_listener_reconnected(self) -> None:
        if self.metrics is not None:
            self.metrics.listener_reconnected()
        # Notifications sent while the listener was down are lost: claim in full.
        self._hints.want_full()
        self._wake.set()

    def _on_jobs_notified(self, payload: str) -> None:
        if self._hints.note(payload):
            self._wake.set()

    def _isolate_unclaimable(self, exc: DatabaseError, ids: list[int]) -> bool:
        """After a claim failed with ``exc`` (not transient, not a lock-key race): find
        the jobs among ``ids`` the claim cannot take and fail them ``UNCLAIMABLE``
        (`pgtasks.worker.isolation`); returns whether any was failed.

        Raises:
            DatabaseError: a transient error while searching (the loop tries later).
        """
        log.warning("claim failed (%s); looking for the job at fault among %d", first_line(exc), len(ids))
        failed = 0
        for job_id, error in find_unclaimable(self._probe_claim, ids):
            try:
                failed += self._completer.fail_unclaimable(job_id, first_line(error))
            except DatabaseError as fail_exc:
                log.error(
                    "job %s cannot be claimed (%s) nor failed (%s)", job_id, first_line(error), fail_exc
                )
        if not failed:
            log.error("claim failed (%s) and no single job was found at fault", first_line(exc))
        return failed > 0

    def _probe_claim(self, ids: Sequence[int]) -> None:
        self.jobs.claim_probe(ids=ids, worker_id=self.id)

    def _dispatch(self, row: tuple[Any, ...]) -> None:
        problem = unreadable_claim(row)
        if problem is not None:  # a row written by SQL that cannot be read: it fails alone
            job_id, task_name, attempt, max_attempts, trigger = row[:5]  # CLAIM_COLUMNS' first five
            request = Request(job_id, task_name, attempt, max_attempts, trigger, worker_id=self.id)
            self._completer.fail_undecodable(request, problem)
            return
        task = self.app.tasks.get(row[_TASK_NAME])
        request = request_from_claim(row, self.id)
        held = HeldJob(task=task, request=request)
        held.due = row[_DUE]
        if row[_KEYED]:
            self._keyed.add(held.id)
        if task is None:
            self._unknown_task(held)
            return
        # A job this worker still runs at an older attempt (its lease lapsed, the job
        # was claimed again) is now this attempt's; the older one's writes are fenced.
        self._held[held.id] = held
        self._pool.submit(held)

    def _unknown_task(self, held: HeldJob) -> None:
        """A claimed job of a task this worker does not know: defer it or fail it
        (``config.unknown_tasks``).

        With ``defer`` the claims take only the tasks this worker knows (``_tasks``),
        so a job lands here only if the app's task registry changed after the worker
        started; it is put back for ``UNKNOWN_TASK_DEFER`` seconds, attempt not used.
        """
        name = held.request.task_name
        if self.config.unknown_tasks == "defer":
            log.warning(
                "job %s: task %r is not registered here; deferring it %.0fs for a worker that knows it",
                held.id,
                name,
                UNKNOWN_TASK_DEFER,
            )
            self._completer.defer(held.request, UNKNOWN_TASK_DEFER)
            return
        log.error("job %s: unknown task %r; failing it", held.id, name)
        self._completer.set_state_if_running(
            held.request, unknown_task_outcome(held.request, self.id, self.app.tasks)
        )

    # -- running -------------------------------------------------------------------

    def _forget(self, held: HeldJob) -> None:
        """Drop ``held`` from the held jobs, unless a newer attempt of its job holds
        the place (claimed again after this one's lease lapsed)."""
        if self._held.get(held.id) is held:
            del self._held[held.id]

    def _execute(self, held: HeldJob) -> None:
        """Run a held job in a pool thread (the threads pool)."""
        assert held.task is not None
        if not self._begin(held):
            return
        context = TaskContext(held.task, held.request, runtime=self)
        outcome: Success | Outcome | None = None
        while True:
            try:
                if outcome is None:
                    outcome = run_attempt(context)
                # The watchdog raises time limits only under this lock and only into
                # unfinished jobs. One it raised just before lands at the latest in the
                # Python call below, inside this try, never in the bookkeeping after it.
                with held.lock:
                    held.finished = True
                deliver_pending_exception()
                break
            except TimeLimitExceeded as exc:  # arrived after the task itself returned
                if outcome is None:
                    outcome = decide(exc, held.task.options, held.request)
        self._finish(held, outcome)

    def _begin(self, held: HeldJob) -> bool:
        """As a held job starts (its pool slot took it): record the start where it must be
        durable first; returns whether the body may run.

        A task that must not run twice after a lost worker (``retry_on_worker_lost=False``)
        has its start written now, one statement, before its body runs: the reaper fails
        it ``WORKER_LOST`` rather than run it again. Any other task's start costs no write
        of its own: it goes with the outcome, or with the start recorder's batch
        (`_write_starts`, `pgtasks.worker.starts`) while the body still runs, unless
        this worker's lease may have lapsed since the job was claimed (`_lease_lapsed`):
        then the reaper may have handed the job back and another worker may run it, so
        its start is written first too. If the start cannot be written, or the job is
        no longer held, the body does not run here (the job is handed back).
        """
        assert held.task is not None and held.started_at is not None
        metrics = self.metrics
        if metrics is not None:
            request = held.request
            wait = None if held.due is None else self._clock.at(held.started_at) - held.due
            metrics.job_started(request.task_name, request.queue, request.tenant, wait)
        if held.task.options.retry_on_worker_lost and not self._lease_lapsed(held):
            return True
        try:
            held.start_written = self._completer.record_start(held.request, self._clock.at(held.started_at))
        except DatabaseError as exc:
            log.warning("job %s: could not record its start (%s); handing it back", held.id, exc)
            self._completer.release([held.id], "start not recorded")
        if not held.start_written:
            log.warning("job %s was no longer held by this worker at its start; not run", held.id)
            self._forget(held)
            self._wake.set()
        return held.start_written

    def _lease_lapsed(self, held: HeldJob) -> bool:
        """Whether this worker's lease may have lapsed since ``held`` was claimed: no
        beat extended it for a whole lease until now, or a beat since the claim came a
        whole lease after the one before (`Heartbeat.lapsed_at`)."""
        beat, now = self._heartbeat, time.monotonic()
        extended = beat.extended_at if beat.extended_at is not None else held.claimed_at
        return now - extended >= self.config.lease_timeout or beat.lapsed_at >= held.claimed_at

    def _write_starts(self) -> int:
        """Record the starts of held jobs whose body runs and whose start is not yet
        written, in one statement (the start recorder's thread; nothing when there are
        none): views show them started, and the reaper counts them as lost attempts.
        Returns how many were written.

        Raises:
            DatabaseError: the statement failed (the next tick writes them).
        """
        pending = [h for h in self._held_jobs() if h.started and not h.finished and not h.start_written]
        starts = [(h.id, self._clock.at(h.started_at)) for h in pending if h.started_at is not None]
        if not starts:
            return 0
        written = self._completer.record_starts(starts)
        if written is None:  # earlier results still being written: next tick
            return 0
        for h in pending:
            h.start_written = True
        return written

    def _finish(self, held: HeldJob, outcome: Success | Outcome) -> None:
        """Record how an attempt ended; called from the pool."""
        held.finished = True
        if held.transaction is not None and not isinstance(outcome, Success):
            held.transaction.close()  # the task's writes go with the failed attempt
        if self.metrics is not None:
            self._count_finished_metric(held, outcome)
        try:
            if isinstance(outcome, Success):
                completion = Completion(
                    held.id,
                    held.request.task_name,
                    outcome.result_json,
                    outcome.result,
                    outcome.runtime,
                    held.request.lock_key,
                    None if held.started_at is None else self._clock.at(held.started_at),
                    self._clock.now(),
                    held.request.attempt,
                )
                if held.transaction is not None and held.transaction.open:
                    self._succeed_in_transaction(held, completion)
                else:
                    self._completer.add(completion)
            elif outcome.status == JobStatus.QUEUED:  # a retry: batched, as successes are
                self._completer.add_retry(
                    held.request,
                    self._masked(held, outcome),
                    None if held.started_at is None else self._clock.at(held.started_at),
                )
            else:
                self._completer.set_state_if_running(
                    held.request,
                    self._masked(held, outcome),
                    None if held.started_at is None else self._clock.at(held.started_at),
                )
        finally:
            if held.transaction is not None:
                held.transaction.close()  # what the success did not commit is rolled back
            self._forget(held)
            self._count_finished()
            if (
                len(self._held) <= self._low_water
                and not self._wake.is_set()
                and self._finish_wakes(held, outcome)
            ):
                self._wake.set()
            limit = self.config.max_tasks_per_child
            if limit is not None and self.config.pool == "threads" and self.processed >= limit:
                self.request_stop("max-tasks")

    def _succeed_in_transaction(self, held: HeldJob, completion: Completion) -> None:
        """Commit a success with the task's own writes (`TaskContext.transaction`).

        If the job was no longer this worker's, both are dropped. If the write or the
        commit fails, the attempt counts as failed with that error (a transient
        database error retries as the task's policy says); when the commit did happen
        after all, the job is no longer running and that write changes nothing.
        """
        assert held.transaction is not None and held.task is not None
        try:
            if not self._completer.succeed_in(held.transaction, completion):
                log.warning("job %s was no longer this worker's; its transaction was rolled back", held.id)
        except DatabaseError as exc:
            log.warning("job %s: committing its success with its writes failed (%s)", held.id, exc)
            outcome = self._masked(held, decide(exc, held.task.options, held.request))
            started = None if held.started_at is None else self._clock.at(held.started_at)
            if outcome.status == JobStatus.QUEUED:
                self._completer.add_retry(held.request, outcome, started)
            else:
                self._completer.set_state_if_running(held.request, outcome, started)

    def _count_finished_metric(self, held: HeldJob, outcome: Success | Outcome) -> None:
        """Count an attempt's end in the metrics (``--metrics-port`` only)."""
        assert self.metrics is not None
        request = held.request
        runtime: float | None
        if isinstance(outcome, Success):
            name, runtime = "succeeded", outcome.runtime
        else:
            name = "retried" if outcome.status == JobStatus.QUEUED else str(outcome.status)
            runtime = None if held.started_at is None else time.monotonic() - held.started_at
        self.metrics.job_finished(request.task_name, request.queue, request.tenant, name, runtime)

    def _count_reaped(self, result: ReaperResult) -> None:
        """Count the jobs the reaper recovered in the metrics (``--metrics-port`` only)."""
        if self.metrics is not None:
            self.metrics.reaped(result.requeued, result.failed)

    def _masked(self, held: HeldJob, outcome: Outcome) -> Outcome:
        """``outcome`` with the job's own secrets masked in its error's message and
        traceback before anything stores, logs or hands it to a hook: the values of its
        sensitive arguments (`pgtasks.redaction.Redactor`: built-in names and the
        task's ``redact``) and of the secret references it was given."""
        task = held.task
        if task is None:
            return outcome
        redactor = self._redactors.get(task.name)
        if redactor is None:
            redactor = Redactor.of(task.fn, task.options.redact, bind=task.options.bind)
            self._redactors[task.name] = redactor
        args, kwargs = held.request.args, held.request.kwargs
        values = [*redactor.secrets(args, kwargs), *referenced_values(args, kwargs)]
        return replace(outcome, error=masked_record(outcome.error, names=redactor.redact, values=values))

    def _finish_wakes(self, held: HeldJob, outcome: Success | Outcome) -> bool:
        """Whether a job finishing (with the buffer at low water) is a reason to claim now.

        It is when the last full claim may have left due jobs behind (it filled its
        limit, took a tenant's whole share of it, or stopped at its tenant bound),
        when the job's written outcome freed a lock key (its key's next job may be
        due; a success frees it once the completer has written it, see
        `_on_written`), and in burst mode (the loop decides to stop). Otherwise, on a
        drained queue, a claim would find nothing: new jobs come with a
        notification, future ones by the poll deadline.
        """
        if held.id in self._keyed:
            if isinstance(outcome, Success):  # its slot is free once written: _on_written wakes
                return not self._drained or self.config.burst
            self._keyed.discard(held.id)
            return True
        if not self._drained or self.config.burst:
            return True
        return held.request.lock_key is not None and not isinstance(outcome, Success)

    @property
    def processed(self) -> int:
        """Attempts finished by this worker (any outcome)."""
        return sum(c[0] for c in self._counts)

    def _count_finished(self) -> None:
        counter = getattr(self._local, "counter", None)
        if counter is None:
            counter = self._local.counter = [0]
            with self._counts_lock:  # once per thread
                self._counts.append(counter)
        counter[0] += 1

    def _on_written(self, done: list[Completion], lost: set[int]) -> None:
        """After a success batch committed (the completer's thread): their lock keys
        are free, so the keys' next jobs may be claimed now."""
        keyed = self._keyed
        freed = [c.job_id for c in done if c.job_id in keyed] if keyed else []
        for job_id in freed:
            keyed.discard(job_id)
        if freed or any(c.lock_key is not None for c in done):
            self._wake.set()

    # -- what a running task can ask (JobRuntime) ------------------------------------

    def report_progress(self, job_id: int, counters: Mapping[str, Any]) -> bool:
        """Store progress counters for a job this worker holds; returns whether it was cancelled.

        Raises:
            NotOwner: this worker does not hold the job (reaped, cancelled, finished).
        """
        requested = self.jobs.report_progress(id=job_id, worker_id=self.id, progress=counters)
        if requested:
            self._on_cancel(job_id, False)
        return requested

    def is_cancelled(self, job_id: int) -> bool:
        """Whether cancellation of a held job was requested."""
        held = self._held.get(job_id)
        return held is not None and held.cancelled

    def job_transaction(self, job_id: int, attempt: int) -> HeldTransaction:
        """The held job's transaction for its task's writes (`TaskContext.transaction`),
        opened on the app's pool at its first statement; `_finish` commits it with
        the job's success or rolls it back.

        Raises:
            ConfigurationError: the processes pool (the task runs in a child process,
                which cannot hand its transaction to this one).
            NotOwner: this worker does not hold attempt ``attempt`` of the job (it lost
                its lease, and the job may have been claimed again).
        """
        if self.config.pool != "threads":
            raise ConfigurationError(TRANSACTION_NEEDS_THREADS)
        held = self._held.get(job_id)
        if held is None or held.request.attempt != attempt:
            # Another attempt holds the job here now: this one lost its lease and the
            # job was claimed again; its writes must not join the newer attempt's.
            raise NotOwner(job_id, self.id)
        if held.transaction is None:
            held.transaction = self.app.stores.database.held_transaction()
        return held.transaction

    # -- events ----------------------------------------------------------------------

    def _on_cancel(self, job_id: int, terminate: bool) -> None:
        held = self._held.get(job_id)
        if held is None or (held.cancelled and not terminate):
            return
        held.cancelled = True
        held.terminate = held.terminate or terminate
        if held.try_revoke():
            log.info("job %s cancelled before it started", job_id)
            self._finish(held, cancelled_outcome(held.request, "cancelled before it started"))
        elif held.terminate and self._pool is not None:
            self._pool.terminate(held)
        else:
            log.info("job %s: cancellation requested; the task sees is_cancelled()", job_id)

    def _on_cancel_notified(self, job_id: int) -> None:
        """A cancellation notification: look up whether it asks to terminate (held jobs only)."""
        if job_id not in self._held:
            return
        try:
            requests = self.jobs.cancel_requested(worker_id=self.id)
        except DatabaseError:
            requests = [CancelRequest(job_id, False)]  # the heartbeat will see the rest
        for r in requests:
            self._on_cancel(r.job_id, r.terminate)

    def _on_hard_limit(self, job: HeldJob) -> None:
        if self.config.pool == "processes":
            # Only the child may be stopped; never raise in the parent's slot thread.
            if self._pool is None or not self._pool.terminate(job):
                job.hard_limit_fired = False  # not in a child yet: the next tick tries again
            return
        from pgtasks.worker.pool import raise_in_thread
        from pgtasks.worker.timelimits import HardTimeLimitExceeded

        if job.thread_id is not None:
            raise_in_thread(job.thread_id, HardTimeLimitExceeded)

    def _on_lost(self) -> None:
        log.error("worker %s was considered dead by the fleet (lease expired); registering again", self.id)
        self._register()

    # -- shutdown --------------------------------------------------------------------

    def _shutdown(self) -> None:
        log.info("worker %s stopping (%s)", self.id, self._stop_reason)
        call_isolated(
            self.plugin_manager, "pgtasks_worker_stopping", worker_id=self.id, reason=self._stop_reason
        )
        if self._listener is not None:
            self._listener.stop()
        unstarted = [h.id for h in self._held_jobs() if h.try_revoke()]
        self._completer.release(unstarted, "not started")
        for i in unstarted:
            self._held.pop(i, None)
        finished = self._pool.stop(self.config.shutdown_timeout) if self._pool is not None else True
        running = [] if finished else [h.id for h in self._held_jobs() if not h.finished]
        if running:
            # Not handed back: they did run (in a thread, possibly still), so they are
            # recovered like a lost worker's, by lease (WORKER_LOST, retried or failed
            # per retry_on_worker_lost), never re-run as if they had not started.
            log.warning(
                "jobs %s still running after %.0fs; they will be recovered by lease (%.0fs)",
                running,
                self.config.shutdown_timeout,
                self.config.lease_timeout,
            )
        self._completer.stop()
        self._watchdog.stop()
        self._starts.stop()
        self._reaper.stop()
        if self._retention is not None:
            self._retention.stop()
        if self._history is not None:
            self._history.stop()
        self._flow_prune.stop()
        self._heartbeat.stop()
        try:
            if not running:  # else the worker row stays, for its lease to expire
                self.workers.unregister(id=self.id)
        except DatabaseError as exc:
            log.warning("could not unregister worker %s (%s); its lease will expire", self.id, exc)
        self.database.close()
        if self.metrics is not None:
            self.metrics.stop()
        self.stopped.set()
        log.info("worker %s stopped after %d jobs", self.id, self.processed)
