"""LISTEN/NOTIFY wake-ups for a worker, re-established whenever the connection drops.

NOTIFY only wakes: the worker polls on its own schedule too, so a lost or never
delivered notification delays a job by at most one poll interval.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg

from pgtasks.db import Database, JobStore
from pgtasks.errors import DatabaseError

__all__ = ["Listener"]

log = logging.getLogger("pgtasks.worker")


class Listener:
    """A thread holding a LISTEN connection for ``pgtasks_jobs`` and ``pgtasks_cancel``.

    Args:
        database: where to connect (a dedicated connection, outside the pool).
        jobs: the job store that issues the LISTEN statements on it.
        on_jobs: called with the payload of each "jobs enqueued" notification (a
            queue name, or ``queue:id`` for one job; see `pgtasks.worker.hints`).
        on_cancel: called with the job id of each cancellation request.
        on_reconnect: called after the connection was re-established (the worker
            polls then, to pick up anything enqueued while it was down).
    """

    def __init__(
        self,
        database: Database,
        jobs: JobStore,
        *,
        on_jobs: Callable[[str], None],
        on_cancel: Callable[[int], None],
        on_reconnect: Callable[[], None],
    ) -> None:
        self.database = database
        self.jobs = jobs
        self.on_jobs = on_jobs
        self.on_cancel = on_cancel
        self.on_reconnect = on_reconnect
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[object] | None = None
        self.connected = threading.Event()
        self.reconnects = 0
        self.backend_pid: int | None = None

    def start(self) -> None:
        """Start listening in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="pgtasks-listener", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop listening and close the connection."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _dispatch(self, channel: str, payload: str) -> None:
        """Hand one notification to its callback; a callback's error never stops the listener.

        Only the payload decides whether a cancel notification is malformed: an
        error raised by the callback itself is logged as what it is.
        """
        try:
            if channel != "pgtasks_cancel":
                self.on_jobs(payload)
                return
            try:
                job_id = int(payload)
            except ValueError:
                log.warning("ignored malformed cancel notification %r", payload)
                return
            self.on_cancel(job_id)
        except Exception:
            log.exception("handling the %s notification %r failed", channel, payload)

    def _connect(self) -> psycopg.Connection[object]:
        """A connection that LISTENs on both channels.

        Raises:
            DatabaseError: the connection failed or was lost while it was set up (it
                is closed).
        """
        conn = self.database.connect()
        try:
            self.jobs.listen_jobs(conn=conn)
            self.jobs.listen_cancel(conn=conn)
        except BaseException:
            conn.close()
            raise
        self.backend_pid = conn.info.backend_pid
        return conn

    def _run(self) -> None:
        delay = 0.1
        first = True
        while not self._stop.is_set():
            try:
                conn = self._connect()
            except DatabaseError as exc:
                log.warning("listener cannot connect (%s); retrying in %.1fs", exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)
                continue
            self.connected.set()
            if not first:
                self.reconnects += 1
                log.warning("listener reconnected (backend pid %s)", self.backend_pid)
                self.on_reconnect()
            first = False
            delay = 0.1
            try:
                with conn:
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self._dispatch(note.channel, note.payload)
            except psycopg.Error as exc:
                self.connected.clear()
                if not self._stop.is_set():
                    log.warning(
                        "listener connection lost (%s); reconnecting", str(exc).strip() or type(exc).__name__
                    )
                    self._stop.wait(delay)
