"""The ``threads`` executor pool and the bookkeeping of held jobs.

A `HeldJob` is a job this worker claimed. It waits in the pool's queue
(claimed-but-not-started, handed back at shutdown) until a pool thread starts
it. Starting and revoking are decided under one lock, so a job is either run or
handed back, never both.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
import time
from collections.abc import Callable

from pgtasks.context import Request
from pgtasks.db import HeldTransaction
from pgtasks.task import Task

__all__ = ["HeldJob", "ThreadPool", "deliver_pending_exception", "raise_in_thread"]

log = logging.getLogger("pgtasks.worker")


class HeldJob:
    """A claimed job and its run-time state (mutable; decisions guarded by ``lock``).

    Args:
        task: the registered task, or None when this worker does not know it.
        request: the job's `Request`.
    """

    __slots__ = (
        "cancelled",
        "claimed_at",
        "due",
        "finished",
        "hard_limit_fired",
        "id",
        "lock",
        "request",
        "revoked",
        "soft_limit_fired",
        "start_written",
        "started",
        "started_at",
        "task",
        "terminate",
        "thread_id",
        "transaction",
    )

    def __init__(self, task: Task | None, request: Request) -> None:
        self.task = task
        self.request = request
        self.id: int = request.id  # type: ignore[assignment]  # a claimed job always has one
        # Start, revoke and finish are decided under this lock. One per job: a lock
        # shared by all jobs was contended by the pool threads.
        self.lock = threading.Lock()
        self.cancelled = False  # cancellation was requested
        self.terminate = False
        self.started = False
        self.revoked = False
        self.finished = False
        self.thread_id: int | None = None
        self.started_at: float | None = None  # time.monotonic(); recorded through `DatabaseTime`
        self.start_written = False  # the database has it (job_start, job_mark_started)
        self.soft_limit_fired = False
        self.hard_limit_fired = False
        self.due: float | None = None  # its run-at, Unix seconds on the database clock
        self.claimed_at = time.monotonic()  # made as its claim returns
        # The task's own writes, committed with its success (TaskContext.transaction).
        self.transaction: HeldTransaction | None = None

    def __repr__(self) -> str:
        return f"<HeldJob {self.id} started={self.started} finished={self.finished}>"

    def try_start(self) -> bool:
        """Mark as started unless it was revoked (handed back or cancelled) first."""
        with self.lock:
            if self.revoked:
                return False
            self.started = True
            self.thread_id = threading.get_ident()
            self.started_at = time.monotonic()
            return True

    def try_revoke(self) -> bool:
        """Take the job back if it has not started; True when it will never run here."""
        with self.lock:
            if self.started:
                return False
            self.revoked = True
            return True


def raise_in_thread(thread_id: int, exc_type: type[BaseException]) -> bool:
    """Raise ``exc_type`` asynchronously in another Python thread (best effort).

    Uses CPython's ``PyThreadState_SetAsyncExc``: the exception arrives at the
    thread's next bytecode boundary, so a thread blocked in C code (a long
    ``sleep``, a socket read) sees it only when that call returns.
    """
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc_type))
    if done > 1:  # pragma: no cover - would mean several threads were hit; undo
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), None)
        return False
    return bool(done)


def deliver_pending_exception() -> None:
    """Do nothing, as a Python call: an exception raised into this thread lands here.

    CPython delivers asynchronous exceptions when a Python function starts (and at
    backward jumps); calling this inside a ``try`` makes one that is pending arrive
    there rather than later. (Withdrawing one instead, with
    ``PyThreadState_SetAsyncExc(id, NULL)``, leaves CPython 3.11's eval breaker set
    and spins the thread.)
    """


class ThreadPool:
    """``size`` daemon threads running held jobs in claim order.

    Args:
        size: threads (the worker's concurrency).
        run: called in a pool thread for each job that could be started.
        prepare: called in the pool thread as it takes a job, before the job is marked
            started (the processes pool starts the thread's child there, so a job's
            start is when its body can run, not when a child began to load the app).
            An error it raises is logged, and the job then runs as it would without it.
    """

    def __init__(
        self, size: int, run: Callable[[HeldJob], None], prepare: Callable[[], None] | None = None
    ) -> None:
        self.size = size
        self._run = run
        self._prepare = prepare
        self._queue: queue.SimpleQueue[HeldJob | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._loop, name=f"pgtasks-job-{i}", daemon=True) for i in range(size)
        ]

    def start(self) -> None:
        """Start the threads."""
        for t in self._threads:
            t.start()

    def submit(self, job: HeldJob) -> None:
        """Queue a job for the next free thread."""
        self._queue.put(job)

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if self._prepare is not None:
                try:
                    self._prepare()
                except Exception:  # the run meets the same failure and reports it for the job
                    log.exception("job %s: could not prepare its slot", job.id)
            if job.try_start():
                try:
                    self._run(job)
                except Exception:  # keep the slot: one job's bookkeeping error must not shrink the pool
                    log.exception("job %s: unexpected error after it ran", job.id)

    def stop(self, timeout: float) -> bool:
        """Let the threads finish their current job and exit; True if all did in time."""
        for _ in self._threads:
            self._queue.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def terminate(self, job: HeldJob) -> bool:
        """Threads cannot be killed: returns False (the job is only flagged cancelled)."""
        return False
