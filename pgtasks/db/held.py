"""`HeldTransaction`: a transaction kept open across a task's body, committed with its job's outcome.

A task that writes with transactional completion (``with self.transaction() as
conn:``) writes in one transaction on a pooled connection of the app's database.
The transaction does not commit when the block ends: the worker writes the job's
success in it once the task has returned, then commits both at once
(`HeldTransaction.commit_with`). Any other end (the task raised, the job was no
longer the worker's, the worker died) rolls it back or leaves it uncommitted, so the
task's writes and the job's success are never apart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from psycopg_pool import ConnectionPool

from pgtasks.db.database import AnyConnection, translate_error

__all__ = ["HeldTransaction"]

log = logging.getLogger("pgtasks.db")


class HeldTransaction:
    """One job's transaction (see the module docstring); used from the job's thread.

    Args:
        pool: the pool the connection comes from, and goes back to at `close`.
        timeout: seconds to wait for a pooled connection.

    Raises:
        DatabaseError: (from `block`) no connection could be had, or a statement failed.
    """

    def __init__(self, pool: ConnectionPool[AnyConnection], *, timeout: float) -> None:
        self._pool = pool
        self._timeout = timeout
        self._conn: AnyConnection | None = None
        self._lock = threading.Lock()

    @property
    def open(self) -> bool:
        """Whether a transaction has begun and is neither committed nor rolled back."""
        return self._conn is not None

    def _connection(self) -> AnyConnection:
        if self._conn is None:
            try:
                conn = self._pool.getconn(timeout=self._timeout)
            except psycopg.Error as exc:
                raise translate_error(exc) from exc
            except Exception as exc:  # psycopg_pool.PoolTimeout is not a psycopg.Error
                raise translate_error(psycopg.OperationalError(str(exc))) from exc
            conn.autocommit = False  # the first statement opens the transaction
            self._conn = conn
        return self._conn

    @contextmanager
    def block(self) -> Iterator[AnyConnection]:
        """The transaction's connection for one block of the task's writes.

        Blocks of one job share the transaction. An exception out of a block rolls
        the transaction back (and is raised on): the job's writes so far are gone,
        and a later block starts a new transaction.
        """
        conn = self._connection()
        try:
            yield conn
        except BaseException:
            self.close()
            raise

    def commit_with(self, write: Callable[[AnyConnection], bool]) -> bool:
        """Run ``write`` (the job's outcome) in the transaction, then commit both.

        Args:
            write: runs the outcome's statement on the connection; returns whether
                the job was still this worker's (the statement found it).

        Returns:
            Whether it committed: False when ``write`` said the job was no longer
            the worker's (the transaction is rolled back: none of the task's writes
            stay).

        Raises:
            DatabaseError: a statement or the commit failed (the transaction is
                rolled back or its outcome is unknown: the job stays running, and its
                lease decides, as for a worker that died).
        """
        conn = self._connection()
        try:
            if not write(conn):
                conn.rollback()
                return False
            conn.commit()
            return True
        except psycopg.Error as exc:
            raise translate_error(exc) from exc
        finally:
            self._release(conn)

    def close(self) -> None:
        """Roll back what is open and give the connection back to the pool."""
        conn = self._conn
        if conn is None:
            return
        try:
            conn.rollback()
        except psycopg.Error as exc:
            log.warning("rolling back a job's transaction failed: %s", exc)
        self._release(conn)

    def _release(self, conn: AnyConnection) -> None:
        with self._lock:
            if self._conn is not conn:
                return
            self._conn = None
        try:
            if not conn.closed:
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.rollback()  # a statement failed inside: nothing of it stays
                conn.autocommit = True  # as the pool hands its connections out
        except psycopg.Error as exc:
            log.warning("a job's connection could not be reset (%s); closing it", exc)
            conn.close()
        finally:
            self._pool.putconn(conn)
