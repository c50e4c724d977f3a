"""Enqueue wake-ups sent after the jobs committed, coalesced, from one connection.

PostgreSQL serialises the commits of transactions that sent a notification: each
takes one lock on the notification queue from its pre-commit to the end of its
commit, WAL flush included. A wake-up sent inside every enqueue's own transaction
therefore makes concurrent producers commit one at a time (measured in
docs/benchmarks.md: with 16 threads, 0.56x the same INSERT without it).

An enqueue that commits on its own (a pooled connection, no caller transaction)
and follows another within `MIN_INTERVAL` writes its row without notifying and
hands the wake-up to this sender; the first after a quiet spell notifies inside its
own commit (`WakeupSender.leads`), as nothing is then in flight to serialise with,
and the worker hears of the job at once. A background
thread sends what is pending, as one statement on a dedicated connection
(``job_wake``), whose commit does not wait for the WAL flush: a wake-up is only a
hint, so one lost in a server crash costs a poll interval, never a job. While one
send is on its way, and for the rest of a short interval after it (`MIN_INTERVAL`),
further wake-ups gather and leave together with the next, so under load the
notifications coalesce and the producers' commits never take the notification
lock. The first wake-up handed over after a quiet spell of sends leaves at once.

Wake-ups inside a caller's transaction (``connection=``) are still sent by the
enqueue statement itself: only PostgreSQL knows when that transaction commits.

Payloads are those of `pgtasks.worker.hints`: ``queue:id`` names a job; a bare
``queue`` (many jobs, or a bulk enqueue) asks the worker for a full claim.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Final

import psycopg

if TYPE_CHECKING:
    from pgtasks.db.database import AnyConnection
    from pgtasks.db.jobs import JobStore

__all__ = ["WakeupSender"]

log = logging.getLogger("pgtasks.wakeups")

#: Most jobs of one queue named in one send; more than this sends the bare queue name
#: (a worker's claim by id takes only a few; beyond that it claims in full anyway).
MAX_NAMED: Final = 16
#: Least seconds between two sends: the first wake-up after a quiet spell leaves at
#: once, later ones gather for the rest of the interval (a steady stream of enqueues
#: costs at most 1 / MIN_INTERVAL notifying commits a second, whatever its rate).
MIN_INTERVAL: Final = 0.002
#: Seconds without a wake-up after which the sender closes its connection and its
#: thread ends (the next wake-up starts them again).
IDLE_CLOSE: Final = 5.0
#: Seconds to wait after a failed send before trying a new connection.
RETRY_AFTER: Final = 0.5
#: Seconds a process at exit, or `WakeupSender.close`, waits for pending wake-ups.
FLUSH_TIMEOUT: Final = 2.0

_senders: weakref.WeakSet[WakeupSender] = weakref.WeakSet()


@atexit.register
def _flush_all() -> None:
    """Send what is pending before the interpreter exits (a script that enqueues and ends)."""
    for sender in list(_senders):
        sender.flush(FLUSH_TIMEOUT)


class WakeupSender:
    """Sends the wake-ups of committed enqueues in the background (one per `Stores`).

    Args:
        jobs: the job store whose database receives them; the sender opens its own
            connection (`Database.connect`), so a pool busy with producers never
            delays it.
        max_named: most jobs of one queue named per send (more: the bare queue).

    `wake` never blocks on the database and never raises: a wake-up that cannot be
    sent is dropped (logged once per outage), and workers find the job on their
    next poll. Safe to call from any thread; after `os.fork` the child starts its
    own thread and connection.
    """

    def __init__(self, jobs: JobStore, *, max_named: int = MAX_NAMED) -> None:
        if max_named < 1:
            raise ValueError(f"max_named must be at least 1, got {max_named}")
        self._jobs = jobs
        self._max_named = max_named
        self._reset()
        _senders.add(self)

    def _reset(self) -> None:
        """Fresh state (at start, and in a forked child, which has no sending thread)."""
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._pending: dict[str, list[int] | None] = {}  # queue -> named ids; None: bare
        self._sending = False
        self._last_send = -MIN_INTERVAL
        self._last_asked = -MIN_INTERVAL  # when an enqueue last asked `leads`
        self._thread: threading.Thread | None = None
        self._conn: AnyConnection | None = None
        self._failing = False

    def leads(self) -> bool:
        """Whether an enqueue about to commit on its own should notify inside its own
        commit instead: the first after a quiet spell (no enqueue within `MIN_INTERVAL`,
        nothing pending or being sent). Then no other notifying commit is likely to be
        in flight to serialise with, and the worker hears of the job at the commit
        itself, without the sender's extra hop. Every call counts as an enqueue.
        """
        if self._pid != os.getpid():
            self._reset()
        now = time.monotonic()
        last, self._last_asked = self._last_asked, now  # a race only makes two lead
        return now - last >= MIN_INTERVAL and not self._pending and not self._sending

    def wake(self, queue: str, job_id: int | None = None) -> None:
        """Ask for the workers of ``queue`` to be woken for ``job_id`` (None: any job).

        Call it only after the job's transaction committed.
        """
        if self._pid != os.getpid():
            self._reset()
        with self._cond:
            first = not self._pending  # only then may the thread be waiting for work
            if queue in self._pending:
                ids = self._pending[queue]
                if ids is not None:
                    if job_id is None or len(ids) >= self._max_named:
                        self._pending[queue] = None
                    else:
                        ids.append(job_id)
            else:
                self._pending[queue] = None if job_id is None else [job_id]
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pgtasks-wakeups", daemon=True)
                self._thread.start()
            elif first:
                self._cond.notify_all()  # flush() may wait on the same condition

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> bool:
        """Wait up to ``timeout`` seconds until nothing is pending or being sent.

        Returns:
            True when everything asked for before the call was sent (or dropped
            after a failure), False on timeout.
        """
        if self._pid != os.getpid():
            return True
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._sending:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None:
                    return not (self._pending or self._sending)
                self._cond.wait(left)
        return True

    def close(self) -> None:
        """Send what is pending (up to `FLUSH_TIMEOUT` seconds), then close the connection.

        A later `wake` starts the sender again.
        """
        self.flush()
        with self._cond:
            deadline = time.monotonic() + FLUSH_TIMEOUT
            while self._sending and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            if self._sending:
                return  # the thread closes it when it goes idle
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # -- the sending thread ----------------------------------------------------------

    def _payloads(self, pending: dict[str, list[int] | None]) -> list[str]:
        payloads: list[str] = []
        for queue, ids in pending.items():
            if ids is None:
                payloads.append(queue)
            else:
                payloads.extend(f"{queue}:{job_id}" for job_id in ids)
        return payloads

    def _take_pending(self) -> dict[str, list[int] | None] | None:
        """What to send next, waiting for it; None after `IDLE_CLOSE` seconds without
        any (the thread then ends). Called with the condition held."""
        idle_since = time.monotonic()
        while not self._pending:
            left = IDLE_CLOSE - (time.monotonic() - idle_since)
            if left <= 0:
                return None
            self._cond.wait(left)
        # Within MIN_INTERVAL of the last send: let more gather until the interval ends.
        while (gap := self._last_send + MIN_INTERVAL - time.monotonic()) > 0:
            self._cond.wait(gap)
        pending, self._pending = self._pending, {}
        self._last_send = time.monotonic()
        return pending

    def _run(self) -> None:
        while True:
            with self._cond:
                pending = self._take_pending()
                if pending is None:
                    self._thread = None
                    conn, self._conn = self._conn, None
                    self._cond.notify_all()
                else:
                    self._sending = True
            if pending is None:
                if conn is not None:
                    conn.close()
                return
            try:
                self._send(self._payloads(pending))
            finally:
                with self._cond:
                    self._sending = False
                    self._cond.notify_all()

    def _send(self, payloads: list[str]) -> None:
        """One ``job_wake`` statement; on failure drop the payloads and back off."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._jobs.database.connect()
            self._jobs.wake(payloads=payloads, conn=self._conn)
        except Exception as exc:  # never let the thread die: later wake-ups need it
            if not self._failing:
                log.warning("cannot send job wake-ups (workers will poll): %s", exc)
            self._failing = True
            conn, self._conn = self._conn, None
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    conn.close()
            time.sleep(RETRY_AFTER)
            return
        if self._failing:
            log.info("job wake-ups are sent again")
        self._failing = False
