"""The ``processes`` pool: each slot owns a child process that runs one job at a time.

Use it for CPU-bound tasks and when hard time limits or ``revoke(terminate=True)``
must be enforced: the parent kills the child (SIGKILL) and starts a fresh one.
Children are started with the ``spawn`` method and load the app from its path
(``-A module:app``) with the worker's plugin modules (`ChildSpec`), so no
connection or thread of the parent leaks into them.

A child that dies mid-job (killed, crashed, out of memory) ends the attempt as
``WORKER_LOST`` (transient), ``TIME_LIMIT`` when the parent killed it at the
task's ``time_limit``, or ``cancelled`` when killed for a revoke.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from types import FrameType
from typing import Any, Final

from pgtasks.completion import Outcome
from pgtasks.context import TRANSACTION_NEEDS_THREADS, TaskContext
from pgtasks.db import HeldTransaction, JobStore
from pgtasks.db.workers import worker_database
from pgtasks.errors import ConfigurationError, SoftTimeLimitExceeded
from pgtasks.serialization import loads_json
from pgtasks.states import ErrorCode, FailureClass, JobStatus
from pgtasks.worker.attempt import Success, run_attempt
from pgtasks.worker.outcome import cancelled_outcome, decide
from pgtasks.worker.pool import HeldJob, ThreadPool

__all__ = ["ChildSpec", "ProcessPool"]

log = logging.getLogger("pgtasks.worker")

_CTX = multiprocessing.get_context("spawn")
# What a child sends once it has loaded the app and can take a job.
READY: Final = "ready"


class WorkerLost(Exception):
    """The child process running a job died (killed, crashed, out of memory)."""

    failure_class = FailureClass.TRANSIENT
    code = ErrorCode.WORKER_LOST


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """Everything a child process needs, sent to it when it starts (picklable).

    Attributes:
        app_spec: ``module:attribute`` of the app (``-A``).
        plugins: plugin modules (``--plugin``) to register in the child's app too.
        dsn: the database (the worker's, already resolved).
        prepare_threshold: psycopg's prepare threshold for the child's connections.
        worker_id: the worker the child runs jobs for (progress reports are checked
            against it).
        max_tasks: jobs after which a child exits and is replaced (None: never).
        loglevel: the level the child logs at, through pgtasks' handler
            (`pgtasks.loader.configure_logging`: escaped, secrets masked); a spawned
            child starts with no logging set up, and Python's last-resort handler
            would write a task's warnings raw.
    """

    app_spec: str
    plugins: tuple[str, ...]
    dsn: str = field(repr=False)  # may hold a password
    prepare_threshold: int | None
    worker_id: str
    max_tasks: int | None = None
    loglevel: str = "WARNING"


class _Slot:
    """One child process and the pipe to it."""

    def __init__(self, pool: ProcessPool, index: int) -> None:
        self.pool = pool
        self.index = index
        self.process: Any = None
        self.conn: multiprocessing.connection.Connection | None = None
        self.cancel_flag: Synchronized[int] = _CTX.Value("i", 0)
        self.current: HeldJob | None = None
        self.killed_for: str | None = None
        self.jobs = 0  # jobs the current child has finished
        self.lock = threading.Lock()

    def ensure_child(self) -> None:
        if self.process is not None and self.process.is_alive():
            return
        parent_conn, child_conn = _CTX.Pipe()
        process = _CTX.Process(
            target=_child_main,
            args=(self.pool.spec, child_conn, self.cancel_flag),
            name=f"pgtasks-child-{self.index}",
            daemon=True,
        )
        process.start()
        child_conn.close()
        with self.lock:
            self.process = process
        self.conn = parent_conn
        self.jobs = 0
        # Until the child has loaded the app (its READY), a job sent to it would wait there
        # while it counted as started. A child that dies first is found by the job's run.
        while not parent_conn.poll(0.05):
            if not process.is_alive():
                return
        with contextlib.suppress(EOFError, OSError):
            parent_conn.recv()

    def kill(self, why: str, job: HeldJob | None = None) -> bool:
        """Kill the child (only while it runs ``job``, when given); False if there was none.

        Another thread (the listener, the time-limit watchdog) calls this while the
        slot's own thread may be closing the child or starting the next one: the
        lock keeps it from touching a closed process or killing the next job's child.
        """
        with self.lock:
            if job is not None and self.current is not job:
                return False
            if self.process is None or not self.process.is_alive():
                return False
            self.killed_for = why
            self.process.kill()
            return True

    def close(self) -> None:
        process = self.process
        if process is None:
            return
        if process.is_alive() and self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.send(None)
            process.join(2.0)
        if process.is_alive():
            process.kill()
        process.join(2.0)
        with self.lock:
            process.close()
            self.process = None


class ProcessPool:
    """``size`` slots, each a parent thread driving its own child process.

    Args:
        spec: what the children need (app, plugins, database, worker id).
        size: slots (the worker's concurrency).
        finish: called with ``(held, Success | Outcome)`` when an attempt ends.
        begin: called as a job starts, before it is sent to a child; when it returns
            False the job does not run here (its start could not be recorded).
    """

    def __init__(
        self,
        spec: ChildSpec,
        size: int,
        finish: Callable[[HeldJob, Success | Outcome], None],
        begin: Callable[[HeldJob], bool] | None = None,
    ) -> None:
        self.spec = spec
        self.finish = finish
        self.begin = begin
        self._slots = [_Slot(self, i) for i in range(size)]
        self._free: list[_Slot] = list(self._slots)
        self._free_lock = threading.Lock()
        self._local = threading.local()  # each driving thread's own slot
        self._threads = ThreadPool(size, self._run, prepare=self._prepare)

    def start(self) -> None:
        """Start the driving threads; children start on first use."""
        self._threads.start()

    def submit(self, job: HeldJob) -> None:
        """Queue a job for the next free slot."""
        self._threads.submit(job)

    def _slot(self) -> _Slot:
        """The calling driving thread's slot, the same for every job it runs."""
        slot: _Slot | None = getattr(self._local, "slot", None)
        if slot is None:
            with self._free_lock:
                slot = self._local.slot = self._free.pop()
        return slot

    def _prepare(self) -> None:
        """Before a job is marked started: its slot's child runs (spawned and the app
        loaded, about a second for a fresh one), so the job's ``started_at`` and time
        limits count from when its body can start.

        Raises:
            OSError: the child could not be started.
        """
        self._slot().ensure_child()

    def _run(self, held: HeldJob) -> None:
        if self.begin is not None and not self.begin(held):
            return
        slot = self._slot()
        try:
            self.finish(held, self._run_in(slot, held))
        finally:
            slot.current = None

    def _run_in(self, slot: _Slot, held: HeldJob) -> Success | Outcome:
        slot.ensure_child()
        assert slot.conn is not None
        slot.killed_for = None
        slot.cancel_flag.value = 0
        slot.current = held
        if held.cancelled:
            slot.cancel_flag.value = 1
        try:
            slot.conn.send(held.request)
            while True:
                if slot.conn.poll(0.05):
                    reply = slot.conn.recv()
                    break
                if held.cancelled:
                    slot.cancel_flag.value = 1
                if not slot.process.is_alive():
                    raise EOFError
        except (EOFError, OSError, BrokenPipeError):
            return self._child_died(slot, held)
        slot.jobs += 1
        limit = self.spec.max_tasks
        if limit is not None and slot.jobs >= limit:
            # The child exits by itself after this reply: wait for it here, or the next
            # job could be sent to a child that is already on its way out.
            slot.close()
        if isinstance(reply, Success):
            return Success(loads_json(reply.result_json.encode()), reply.result_json, reply.runtime)
        return reply  # type: ignore[no-any-return]

    def _child_died(self, slot: _Slot, held: HeldJob) -> Outcome:
        code = slot.process.exitcode if slot.process is not None else None
        slot.close()
        assert held.task is not None
        if slot.killed_for == "cancel":
            return cancelled_outcome(held.request, "terminated on request")
        if slot.killed_for == "time_limit":
            from pgtasks.worker.timelimits import HardTimeLimitExceeded

            exc: BaseException = HardTimeLimitExceeded(held.id)
        else:
            exc = WorkerLost(f"child process died with exit code {code} while running job {held.id}")
            outcome = decide(exc, held.task.options, held.request)
            if held.task.options.retry_on_worker_lost and held.request.attempt < held.request.max_attempts:
                # As the reaper treats a lost worker: run again unless the task is non-idempotent.
                return Outcome(JobStatus.QUEUED, outcome.error, max_attempts=held.request.max_attempts)
            return outcome
        return decide(exc, held.task.options, held.request)

    def terminate(self, job: HeldJob) -> bool:
        """Kill the child running ``job`` (cancel with terminate, or a hard time limit)."""
        why = "cancel" if job.cancelled else "time_limit"
        return any(slot.kill(why, job) for slot in self._slots)

    def stop(self, timeout: float) -> bool:
        """Let running jobs finish within ``timeout``, then stop every child."""
        done = self._threads.stop(timeout)
        if not done:
            for slot in self._slots:
                slot.kill("shutdown")
        for slot in self._slots:
            slot.close()
        return done


# -- the child side --------------------------------------------------------------------


class _ChildRuntime:
    """`JobRuntime` inside a child: progress through its own store, cancel flag from the parent."""

    def __init__(self, jobs: JobStore, worker_id: str, flag: Synchronized[int]) -> None:
        self.jobs = jobs
        self.worker_id = worker_id
        self.flag = flag

    def report_progress(self, job_id: int, counters: Mapping[str, Any]) -> bool:
        """Store progress counters (see `pgtasks.worker.Worker.report_progress`).

        Raises:
            NotOwner: the worker no longer holds the job.
        """
        requested = self.jobs.report_progress(id=job_id, worker_id=self.worker_id, progress=counters)
        if requested:
            self.flag.value = 1
        return requested

    def is_cancelled(self, job_id: int) -> bool:
        return bool(self.flag.value)

    def job_transaction(self, job_id: int, attempt: int) -> HeldTransaction:
        """Refused: the parent writes the outcome, so it cannot commit with a
        transaction of this process.

        Raises:
            ConfigurationError: always (the attempt fails with it).
        """
        raise ConfigurationError(TRANSACTION_NEEDS_THREADS)


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise SoftTimeLimitExceeded()


def _die_with_parent() -> None:
    """Have the kernel SIGKILL this child when the worker dies, even by ``kill -9``.

    An orphaned child would finish its job while the fleet, seeing the worker's
    lease expire, runs it again. Linux only (``prctl(PR_SET_PDEATHSIG)``, prctl(2));
    the signal comes when the parent *thread* that started the child ends, which
    for the pool is the slot's thread, alive as long as the slot.
    """
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1  # <linux/prctl.h>
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os._exit(1)  # the parent died before the request took effect


def _child_main(
    spec: ChildSpec, conn: multiprocessing.connection.Connection, flag: Synchronized[int]
) -> None:
    """Run jobs sent by the parent until told to stop (None) or ``spec.max_tasks`` is reached."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides about shutdown
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, _on_alarm)
    _die_with_parent()
    from pgtasks.loader import AppLoader, configure_logging  # the child's own entry point

    configure_logging(spec.loglevel)
    app = AppLoader(app_spec=spec.app_spec, dsn=spec.dsn, plugins=spec.plugins).get()
    database = worker_database(
        spec.dsn, max_size=2, prepare_threshold=spec.prepare_threshold, worker_id=spec.worker_id
    )
    runtime = _ChildRuntime(JobStore(database), spec.worker_id, flag)
    conn.send(READY)
    max_tasks = spec.max_tasks
    done = 0
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        task = app.tasks[request.task_name]
        context = TaskContext(task, request, runtime=runtime)
        soft = task.options.soft_time_limit
        if soft:
            signal.setitimer(signal.ITIMER_REAL, soft)
        try:
            outcome = run_attempt(context)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if isinstance(outcome, Success):
            outcome = Success(None, outcome.result_json, outcome.runtime)
        conn.send(outcome)
        done += 1
        if max_tasks is not None and done >= max_tasks:
            return
