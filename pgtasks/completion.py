"""The completer: the one component that writes how a running job ended.

Which code writes a job's status? This module, through `Completer`:

* successes and retries, batched (`Completer.add`, `Completer.add_retry`): a
  finished job's result or retry waits at most ``delay`` seconds (or until
  ``batch`` are pending) and is written with the others, one UPDATE for the
  successes and one for the retries, in the same thread. A job is reported
  succeeded or requeued only by that committed write; until then it stays
  ``running`` and is recovered by the reaper if the worker dies, so no guarantee
  is weakened (a retry whose write is lost this way is an attempt lost with its
  worker, as before). A retry batch PostgreSQL does not take is written again one
  job at a time through `Completer.set_state_if_running`;
* every other outcome of an attempt (failed, partial_failure, cancelled, before
  or while it ran), through one path, `Completer.set_state_if_running`:
  the write applies only while the job is ``running`` and held by this worker,
  and says whether it did. An outcome PostgreSQL refuses fails the job with
  ``OUTCOME_NOT_RECORDED`` instead;
* a claimed job handed back without using its attempt: `Completer.defer` (a task
  this worker does not know) and `Completer.release` (not started at shutdown);
* the recovery of lost workers' jobs (`Completer.reap_lost`, for
  `pgtasks.maintenance.Reaper`).

Logs and the plugin hooks ``pgtasks_job_succeeded``, ``pgtasks_job_retrying``,
``pgtasks_job_failed`` and ``pgtasks_job_reaped`` fire here, after the write.
What an attempt's outcome is (status, error record, delay) is decided in
`pgtasks.worker.outcome`; error records are built by `pgtasks.db.errors`.
This module imports neither the worker nor the application: the maintenance
services use it too.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pgtasks.db import AnyConnection, HeldTransaction, JobStore, Now, ReapedJob
from pgtasks.db.errors import first_line, plain_error
from pgtasks.errors import DatabaseError, SerializationError
from pgtasks.plugins import call_isolated
from pgtasks.serialization import dumps
from pgtasks.states import ErrorCode, JobStatus

if TYPE_CHECKING:
    import pluggy

    from pgtasks.context import Request

__all__ = ["Completer", "Completion", "Outcome"]

log = logging.getLogger("pgtasks.worker")
reaper_log = logging.getLogger("pgtasks.maintenance")

_TRANSIENT_TRIES = 5  # writes of one outcome tried on transient errors, 0.1 s doubling between


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an attempt ended, other than by success: what `Completer.set_state_if_running` writes.

    Attributes:
        status: the next status: ``queued`` (retry), ``failed``, ``partial_failure``,
            ``cancelled``.
        error: the error record (`pgtasks.db.errors`: type, message, code, class,
            traceback).
        delay: seconds until the retry (for ``queued``).
        max_attempts: attempts now allowed (raised by ``retry(max_retries=)``).
        result: stored result (``partial_failure``, or what a cancelled task
            returned); an object with a ``json`` attribute is stored as that text.
    """

    status: JobStatus
    error: dict[str, Any]
    delay: float = 0.0
    max_attempts: int = 1
    result: Any = None


@dataclass(slots=True)
class Completion:
    """A successful attempt waiting to be written (one per job: not frozen, see
    `pgtasks.worker.attempt.Success`).

    Attributes:
        job_id, task_name: the job. result_json: its result as JSON text.
        result: the result itself (for ``pgtasks_job_succeeded``).
        runtime: seconds the attempt ran.
        lock_key: the job's lock key; written, the job frees it for its next job.
        started, finished: when the body started and ended (Unix seconds, the worker's
            clock), written as the job's ``started_at`` and ``finished_at`` (None: the
            database clock at the write).
        attempt: the attempt the result is of (None: whichever the worker holds); the
            write leaves the job alone if it is at another attempt.
    """

    job_id: int
    task_name: str
    result_json: str
    result: Any
    runtime: float
    lock_key: str | None = None
    started: float | None = None
    finished: float | None = None
    attempt: int | None = None


@dataclass(slots=True, frozen=True)
class RetryCompletion:
    """A retry waiting to be written with the next batch (`Completer.add_retry`).

    Attributes:
        request: the attempt's request. outcome: its ``queued`` outcome (delay, error,
            attempts allowed). started: when its body started (Unix seconds, the
            worker's clock), None if it never did.
    """

    request: Request
    outcome: Outcome
    started: float | None


# Seconds a start waits for the successes queued before it to be written (then it is
# written anyway: the sync start of a non-idempotent task; or tried again: the batch).
START_WAIT = 1.0


class Completer:
    """Writes the outcomes of jobs (see the module docstring); successes from one thread.

    Args:
        jobs: the job store (over the worker's `pgtasks.db.Database`).
        worker_id: the worker whose jobs these are: only jobs it still holds are
            written. None for a completer that only reaps (`reap_lost`), as the
            scheduler's reaper uses.
        plugin_manager: where the ``pgtasks_job_*`` hooks go (None: no hooks).
        batch: most results per statement.
        delay: seconds a result may wait for company.
        on_written: called after each success batch commits with the completions
            written and the ids that were no longer held (reaped or cancelled
            meanwhile); the worker wakes its claim loop there.
        on_requeued: called after a retry batch commits (the jobs are due again,
            at once or later); the worker wakes its claim loop there.
    """

    def __init__(
        self,
        jobs: JobStore,
        worker_id: str | None = None,
        plugin_manager: pluggy.PluginManager | None = None,
        *,
        batch: int = 500,
        delay: float = 0.002,
        on_written: Callable[[list[Completion], set[int]], None] | None = None,
        on_requeued: Callable[[], None] | None = None,
    ) -> None:
        self.jobs = jobs
        self.worker_id = worker_id
        self.plugin_manager = plugin_manager
        self.batch = batch
        self.delay = delay
        self.on_written = on_written
        self.on_requeued = on_requeued
        # Pool threads append to a deque (atomic, no lock to contend for) and set an
        # event when the writer may be asleep; the writer drains up to a batch.
        self._pending: collections.deque[Completion | RetryCompletion] = collections.deque()
        self._ready = threading.Event()  # something may be pending
        self._full = threading.Event()  # a batch is full
        self._stop = False
        self._thread: threading.Thread | None = None
        self.written = 0
        # Batches taken and batches written (successes or not), under _batches: a start
        # is written only after every success queued before it (`_written_before`), so a
        # slot's previous job never shows running beside its next one.
        self._batches = threading.Condition()
        self._taken = 0
        self._done = 0
        self._in_flight = 0  # items of the batch being written

    def _owner(self) -> str:
        if self.worker_id is None:
            raise RuntimeError("this completer only reaps: it was made without a worker id")
        return self.worker_id

    def _hook(self, name: str, **kwargs: Any) -> None:
        if self.plugin_manager is not None:
            call_isolated(self.plugin_manager, name, **kwargs)

    # -- successes, batched ----------------------------------------------------------

    def start(self) -> None:
        """Start the thread writing successes."""
        self._thread = threading.Thread(target=self._run, name="pgtasks-completer", daemon=True)
        self._thread.start()

    def add(self, completion: Completion | RetryCompletion) -> None:
        """Queue a success (or a retry) for the next batch (safe from any thread, lock-free)."""
        self._pending.append(completion)
        if not self._ready.is_set():
            self._ready.set()
        if len(self._pending) >= self.batch and not self._full.is_set():
            self._full.set()

    def add_retry(self, request: Request, outcome: Outcome, started: float | None = None) -> None:
        """Queue a retry (``outcome.status`` is ``queued``) for the next batch: a failed
        attempt costs no commit of its own, and its pool slot does not wait for one.

        Args:
            request: the attempt's request. outcome: what to write (delay, error,
                attempts allowed). started: when its body started (Unix seconds).
        """
        self.add(RetryCompletion(request, outcome, started))

    def pending(self) -> int:
        """Successes and retries not yet written, the batch being written included (a
        worker that drains a queue must not think it idle while a retry is on its way
        back to the queue)."""
        with self._batches:
            return len(self._pending) + self._in_flight

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is pending, then stop the thread."""
        self._stop = True
        self._ready.set()
        self._full.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _take(self) -> list[Completion | RetryCompletion] | None:
        """The next batch to write; None once stopped with nothing pending."""
        pending = self._pending
        while True:
            self._ready.wait()
            if not pending:
                if self._stop:
                    return None
                self._clear_ready_if_empty()
                continue
            if len(pending) < self.batch and not self._stop:
                self._full.wait(self.delay)  # let results from other threads join
            self._full.clear()
            with self._batches:
                taken = [pending.popleft() for _ in range(min(len(pending), self.batch))]
                self._taken += 1
                self._in_flight = len(taken)
            self._clear_ready_if_empty()
            return taken

    def _clear_ready_if_empty(self) -> None:
        if not self._pending:
            self._ready.clear()
            if self._pending or self._stop:  # added or stopped meanwhile: its set() was lost
                self._ready.set()

    def _run(self) -> None:
        while (items := self._take()) is not None:
            try:
                successes = [c for c in items if isinstance(c, Completion)]
                if successes:
                    self._write_successes(successes)
                if len(successes) < len(items):
                    self._write_retries([c for c in items if isinstance(c, RetryCompletion)])
            finally:
                with self._batches:
                    self._done += 1
                    self._in_flight = 0
                    self._batches.notify_all()

    def _written_before(self, timeout: float) -> bool:
        """Wait until every success queued so far is written (or given up on); returns
        False if that took longer than ``timeout`` seconds. Pending successes are taken
        first in, first out, at most a batch at a time, so they are all in the next
        ``ceil(pending / batch)`` batches."""
        with self._batches:
            target = self._taken + -(-len(self._pending) // self.batch)
            return self._batches.wait_for(lambda: self._done >= target, timeout)

    def _write_successes(self, items: list[Completion]) -> None:
        # Rows are locked in id order by every batch write of this worker (successes,
        # retries, starts), so two of them that overlap wait for each other instead of
        # deadlocking.
        items = sorted(items, key=_job_id)
        worker_id = self._owner()
        base, spans = _spans(items)
        delay = 0.05
        while True:
            try:
                ids = self.jobs.succeed_batch(
                    worker_id=worker_id,
                    ids=[c.job_id for c in items],
                    results_json=[c.result_json for c in items],
                    base=base,
                    spans=spans,
                    attempts=[c.attempt for c in items],
                )
                break
            except DatabaseError as exc:
                if not exc.transient:
                    self._isolate_refused(items, exc)
                    return
                log.warning("recording results failed (%s); retrying in %.2fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        self._after_success(items, ids)

    def succeed_in(self, transaction: HeldTransaction, completion: Completion) -> bool:
        """Write one success in the job's own transaction (the task's writes,
        `pgtasks.context.TaskContext.transaction`) and commit both, now, from the
        calling thread; then as for a batch (``on_written``, hooks).

        Returns:
            Whether it committed; False when the job was no longer this worker's
            (the transaction, the task's writes with it, is rolled back).

        Raises:
            DatabaseError: the write or the commit failed; whether the commit
                happened is unknown (the caller checks the job).
        """
        worker_id = self._owner()
        base, spans = _spans([completion])

        def write(conn: AnyConnection) -> bool:
            ids = self.jobs.succeed_batch(
                worker_id=worker_id,
                ids=[completion.job_id],
                results_json=[completion.result_json],
                base=base,
                spans=spans,
                conn=conn,
                attempts=[completion.attempt],
            )
            return bool(ids)

        committed = transaction.commit_with(write)
        self._after_success([completion], [completion.job_id] if committed else [])
        return committed

    def _after_success(self, items: list[Completion], ids: Sequence[int]) -> None:
        """After successes were written: count them, report those no longer held, tell
        the worker (``on_written``) and the plugins (``pgtasks_job_succeeded``)."""
        done_ids = set(ids)
        lost = {c.job_id for c in items} - done_ids
        self.written += len(done_ids)
        if lost:
            log.warning("jobs %s were no longer held by this worker; results dropped", sorted(lost))
        done = [c for c in items if c.job_id in done_ids]
        if self.on_written is not None:
            self.on_written(done, lost)
        pm = self.plugin_manager
        if pm is None or not pm.hook.pgtasks_job_succeeded.get_hookimpls():
            return
        for c in done:
            call_isolated(
                pm,
                "pgtasks_job_succeeded",
                job_id=c.job_id,
                task_name=c.task_name,
                result=c.result,
                runtime=c.runtime,
            )

    def _isolate_refused(self, items: list[Completion], exc: DatabaseError) -> None:
        """A success batch PostgreSQL refused (not a lost connection): one row must be at
        fault, and it must not take the others down with it. Halves are written on
        their own until single successes remain; a single one still refused fails its
        job ``OUTCOME_NOT_RECORDED`` (permanent), so it neither stays ``running`` under
        this worker's live lease nor runs again after the lease."""
        if len(items) > 1:
            log.warning(
                "recording %d results was refused (%s); recording them in halves to find the job at fault",
                len(items),
                first_line(exc),
            )
            half = len(items) // 2
            self._write_successes(items[:half])
            self._write_successes(items[half:])
            return
        (c,) = items
        reason = first_line(exc)
        log.error("job %s (%s): its result cannot be stored (%s); failing it", c.job_id, c.task_name, reason)
        error = plain_error(
            type(exc).__name__,
            ErrorCode.OUTCOME_NOT_RECORDED,
            f"the attempt succeeded but its result cannot be stored: {reason}",
        )
        try:
            applied = self.jobs.finish(
                id=c.job_id,
                worker_id=self._owner(),
                status=str(JobStatus.FAILED),
                error=error,
                result_json=None,
                started=c.started,
            )
        except DatabaseError as again:
            log.error("cannot record even the failure of job %s (%s)", c.job_id, first_line(again))
            return
        if not applied:
            return
        if self.on_written is not None and c.lock_key is not None:
            self.on_written([c], set())  # its lock key is free: the key's next job may go
        self._hook(
            "pgtasks_job_failed", job_id=c.job_id, task_name=c.task_name, error=error, final_status="failed"
        )

    def _write_retries(self, items: list[RetryCompletion]) -> None:
        """One statement for a batch of retries; if PostgreSQL does not take it (a lost
        connection, a record it refuses), each is written on its own through
        `set_state_if_running`, which retries transient errors and fails a job whose
        outcome cannot be stored."""
        items = sorted(items, key=lambda r: r.request.id or 0)  # lock order: see _write_successes
        try:
            applied = set(
                self.jobs.retry_batch(
                    worker_id=self._owner(),
                    ids=[r.request.id for r in items],  # type: ignore[misc]  # claimed jobs have ids
                    delays=[r.outcome.delay for r in items],
                    max_attempts=[r.outcome.max_attempts for r in items],
                    errors=[r.outcome.error for r in items],
                    starts=[r.started for r in items],
                    attempts=[r.request.attempt for r in items],
                )
            )
        except (SerializationError, DatabaseError) as exc:
            log.warning(
                "recording %d retries failed (%s); recording them one by one", len(items), first_line(exc)
            )
            for r in items:
                self.set_state_if_running(r.request, r.outcome, r.started)
            applied = None
        if applied is not None:
            for r in items:
                if r.request.id in applied:
                    self._announce(r.request, r.outcome)
                else:
                    log.warning("job %s was no longer held by this worker; its retry dropped", r.request.id)
        if self.on_requeued is not None:
            self.on_requeued()

    # -- every other outcome: one path ------------------------------------------------

    def set_state_if_running(self, request: Request, outcome: Outcome, started: float | None = None) -> bool:
        """Write a non-success outcome if the job is still running and held by this worker.

        A retry puts the job back in the queue (``outcome.delay`` seconds on); any
        other status ends it. Transient database errors are retried a few times
        (then the job is left to the lease); an outcome PostgreSQL refuses (a
        record it cannot store) fails the job with ``OUTCOME_NOT_RECORDED``
        instead, or else the job would stay ``running`` under this worker's live
        lease until the worker stops.

        Args:
            request: the attempt's request (job id, task name, attempt number,
                attempts allowed).
            outcome: what to write.
            started: when the attempt's body started (Unix seconds), None if it never did.

        Returns:
            Whether the write applied (False: the job was no longer held, was
            reaped or cancelled meanwhile, or nothing could be written).
        """
        try:
            return self._write_state(request, outcome, started)
        except (SerializationError, DatabaseError) as exc:
            if outcome.error.get("code") == ErrorCode.OUTCOME_NOT_RECORDED:
                log.error("cannot record even the failure of job %s (%s)", request.id, exc)
                return False
            log.error(
                "job %s: its %s outcome cannot be stored (%s); failing it", request.id, outcome.status, exc
            )
            error = plain_error(
                type(exc).__name__,
                ErrorCode.OUTCOME_NOT_RECORDED,
                f"the attempt ended {outcome.status} but that cannot be stored: {exc}",
            )
            fallback = Outcome(JobStatus.FAILED, error, max_attempts=request.max_attempts)
            return self.set_state_if_running(request, fallback, started)

    def _write_state(self, request: Request, outcome: Outcome, started: float | None) -> bool:
        job_id: int = request.id  # type: ignore[assignment]  # a claimed job always has one
        worker_id = self._owner()
        for attempt in range(_TRANSIENT_TRIES):
            try:
                if outcome.status == JobStatus.QUEUED:
                    applied = self.jobs.retry(
                        id=job_id,
                        worker_id=worker_id,
                        delay=outcome.delay,
                        max_attempts=outcome.max_attempts,
                        error=outcome.error,
                        started=started,
                        attempt=request.attempt,
                    )
                else:
                    result = getattr(outcome.result, "json", None)
                    if result is None and outcome.result is not None:
                        result = dumps(outcome.result, "result")
                    applied = self.jobs.finish(
                        id=job_id,
                        worker_id=worker_id,
                        status=str(outcome.status),
                        error=outcome.error,
                        result_json=result,
                        started=started,
                        attempt=request.attempt,
                    )
            except DatabaseError as exc:
                if not exc.transient:
                    raise
                if attempt == _TRANSIENT_TRIES - 1:
                    log.error(
                        "cannot record outcome of job %s (%s); it will be recovered by lease", job_id, exc
                    )
                    return False
                time.sleep(0.1 * 2**attempt)
                continue
            if applied:
                self._announce(request, outcome)
            else:
                log.warning(
                    "job %s was no longer held by this worker; outcome %s dropped", job_id, outcome.status
                )
            return applied
        return False  # pragma: no cover - the loop returns

    def _announce(self, request: Request, outcome: Outcome) -> None:
        """Log a written outcome and call its hook."""
        name = request.task_name
        message = outcome.error.get("message")
        if outcome.status == JobStatus.QUEUED:
            log.info(
                "job %s (%s) attempt %d failed: %s; retry in %.1fs",
                request.id,
                name,
                request.attempt,
                message,
                outcome.delay,
            )
            self._hook(
                "pgtasks_job_retrying",
                job_id=request.id,
                task_name=name,
                error=outcome.error,
                delay=outcome.delay,
                attempt=request.attempt,
            )
            return
        level = logging.INFO if outcome.status == JobStatus.CANCELLED else logging.WARNING
        log.log(level, "job %s (%s) %s: %s", request.id, name, outcome.status, message)
        self._hook(
            "pgtasks_job_failed",
            job_id=request.id,
            task_name=name,
            error=outcome.error,
            final_status=str(outcome.status),
        )

    # -- rows that cannot be run at all (written by SQL, bypassing the enqueue checks) ----

    def fail_undecodable(self, request: Request, reason: str) -> bool:
        """Fail a claimed job whose stored values cannot be read (``UNDECODABLE``,
        permanent), through `set_state_if_running`; returns whether it applied.

        Args:
            request: the job as far as it could be read (id, task name, attempt,
                attempts allowed). reason: what could not be read, for people.
        """
        message = f"job {request.id} cannot be read: {reason}"
        error = plain_error("Undecodable", ErrorCode.UNDECODABLE, message)
        return self.set_state_if_running(
            request, Outcome(JobStatus.FAILED, error, max_attempts=request.max_attempts)
        )

    def fail_unclaimable(self, job_id: int, reason: str) -> bool:
        """Fail a queued job that no claim can take (``UNCLAIMABLE``, permanent; it never
        ran, so no attempt is used); returns whether it was still queued.

        Args:
            job_id: the job. reason: why the claim refused it (PostgreSQL's message).

        Raises:
            DatabaseError: the job could not be failed either (it stays queued).
        """
        message = f"job {job_id} cannot be claimed: {reason}"
        error = plain_error("Unclaimable", ErrorCode.UNCLAIMABLE, message)
        task_name = self.jobs.fail_unclaimable(id=job_id, error=error)
        if task_name is None:
            return False
        log.error("job %s (%s) failed without running: it cannot be claimed: %s", job_id, task_name, reason)
        self._hook(
            "pgtasks_job_failed", job_id=job_id, task_name=task_name, error=error, final_status="failed"
        )
        return True

    # -- starts (not a status: a held job's started_at) ------------------------------------

    def record_start(self, request: Request, started: float) -> bool:
        """Record, before its body runs, that a held job starts at ``started`` (Unix
        seconds): for tasks that must not run twice, so that a lost worker's job is
        known to have started. Returns whether the job was still held.

        Raises:
            DatabaseError: the start could not be recorded (the body must not run).
        """
        job_id: int = request.id  # type: ignore[assignment]  # a claimed job always has one
        if not self._written_before(START_WAIT):
            log.warning("job %s starts before earlier results are written", job_id)
        return self.jobs.start(id=job_id, worker_id=self._owner(), started=started)

    def record_starts(self, starts: Sequence[tuple[int, float]]) -> int | None:
        """Record the starts ``(job id, Unix seconds)`` of held jobs whose body runs, in
        one statement, once the successes queued before are written; returns how many
        were written, None if those successes are not written yet (call again later).

        Raises:
            DatabaseError: the statement failed (the next call writes them).
        """
        if not starts:
            return 0
        if not self._written_before(START_WAIT):
            return None
        starts = sorted(starts)  # lock order: see _write_successes
        return self.jobs.mark_started(
            worker_id=self._owner(), ids=[i for i, _ in starts], starts=[t for _, t in starts]
        )

    # -- handing claimed jobs back (the attempt is not used) -----------------------------

    def defer(self, request: Request, delay: float) -> bool:
        """Hand a claimed job back, due in ``delay`` seconds, without using an attempt
        (a task this worker does not know); returns whether it was still held.

        Raises:
            DatabaseError: the job could not be handed back (the lease recovers it).
        """
        job_id: int = request.id  # type: ignore[assignment]  # a claimed job always has one
        return self.jobs.defer(id=job_id, worker_id=self._owner(), delay=delay)

    def release(self, ids: Sequence[int], why: str) -> int:
        """Hand back claimed jobs that never started; returns how many were still held.

        A database error is logged, not raised: the jobs are recovered by lease then.
        """
        if not ids:
            return 0
        try:
            count = self.jobs.release(ids=ids, worker_id=self._owner())
        except DatabaseError as exc:
            log.warning("could not hand back jobs %s (%s); they will be recovered by lease", list(ids), exc)
            return 0
        log.info("handed back %d job(s) (%s)", count, why)
        return count

    # -- recovering lost workers' jobs ---------------------------------------------------

    def reap_lost(self, *, lease_timeout: float, limit: int, now: Now = None) -> list[ReapedJob]:
        """Recover up to ``limit`` running jobs whose worker's lease expired (retried,
        or failed ``WORKER_LOST``; see `JobStore.reap_lost`); returns them.

        Raises:
            DatabaseError: the statement failed (the next reaper run tries again).
        """
        reaped = self.jobs.reap_lost(lease_timeout=lease_timeout, limit=limit, now=now)
        for r in reaped:
            reaper_log.warning("reaped job %s (%s) of a lost worker: now %s", r.job_id, r.task_name, r.status)
            self._hook("pgtasks_job_reaped", job_id=r.job_id, task_name=r.task_name, new_status=r.status)
        return reaped


def _job_id(completion: Completion) -> int:
    return completion.job_id


def _spans(items: Sequence[Completion]) -> tuple[float | None, list[int]]:
    """(base, each completion's start and end in turn, in microseconds after base), as
    `JobStore.succeed_batch` takes them; (None, []) when one of them lacks either (the
    database clock then stands for every one)."""
    if not items or items[0].started is None:
        return None, []
    base = items[0].started
    spans: list[int] = []
    for c in items:
        if c.started is None or c.finished is None:
            return None, []
        spans += (round((c.started - base) * 1e6), round((c.finished - base) * 1e6))
    return base, spans
