"""Test helpers: wait on conditions, not sleeps."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgtasks
from pgtasks.worker import Worker, WorkerConfig

T = TypeVar("T")

# The most jobs of one key whose intervals in public.ledger (written by the tasks of
# apps.worker_app, the key in ``note``) overlap one job's start, itself included.
KEY_OVERLAP = """
SELECT coalesce(max(n), 0) FROM (
    SELECT a.id, count(*) AS n
    FROM public.ledger a
    JOIN public.ledger b ON b.note = a.note AND b.started_at <= a.started_at
        AND coalesce(b.finished_at, 'infinity') > a.started_at
    GROUP BY a.id) x
"""


def eventually(
    check: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.02, message: str = "condition"
) -> T:
    """Call ``check`` until it returns a truthy value (returned) or ``timeout`` seconds pass.

    Raises:
        AssertionError: the condition never held; the last value is shown.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} not met within {timeout}s (last value: {last!r})")
        time.sleep(interval)


def with_dbname(dsn: str, dbname: str) -> str:
    """``dsn`` with its database replaced by ``dbname``."""
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


@contextlib.contextmanager
def scratch_database(
    admin_dsn: str, *, template: str | None = None, prefix: str = "pgtasks_t"
) -> Iterator[str]:
    """A new database for the ``with`` block, dropped (even while connected) at its end.

    Args:
        admin_dsn: a DSN with the right to create databases.
        template: a database to clone (the session's migrated ``template_db``);
            None: an empty database.
        prefix: the start of its name (a random suffix follows).

    Yields:
        The DSN of the new database.
    """
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        create = sql.SQL("{} TEMPLATE {}").format(create, sql.Identifier(template))
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(create)
    try:
        yield with_dbname(admin_dsn, name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``node`` of an ``EXPLAIN (FORMAT JSON)`` plan and every node below it, depth first."""
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def on_store_call(worker: Worker, method: str, note: Callable[[str], None]) -> None:
    """Have ``worker.jobs.<method>`` call ``note`` with its query's name (``job_<method>``) first."""
    original = getattr(worker.jobs, method)

    def wrapped(*args: Any, **kw: Any) -> Any:
        note(f"job_{method}")
        return original(*args, **kw)

    setattr(worker.jobs, method, wrapped)


@contextlib.contextmanager
def in_process_worker(app: pgtasks.App, *, concurrency: int) -> Iterator[Worker]:
    """An in-process worker (threads pool) on ``app``'s queue ``default`` for the block,
    asked to stop at its end (and waited for, up to 30 s)."""
    worker = Worker(
        app, WorkerConfig(queues=("default",), concurrency=concurrency, poll_interval=0.1, lease_timeout=30)
    )
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.request_stop("test")
        thread.join(30)


def most_of_a_key_at_once(conn: psycopg.Connection[Any]) -> int:
    """The most ledger jobs of one key that ran at once (`KEY_OVERLAP`)."""
    row = conn.execute(KEY_OVERLAP).fetchone()
    assert row is not None
    return int(row[0])


def assert_all_ran_within_key_limit(conn: psycopg.Connection[Any], *, jobs: int, limit: int) -> None:
    """Every one of the ``jobs`` jobs succeeded and finished its ledger entry, and the
    most of one key that ran at once is exactly ``limit``: never over it, and reached
    (else the run proves nothing)."""
    statuses = conn.execute("SELECT status, count(*) FROM pgtasks.jobs GROUP BY status").fetchall()
    assert statuses == [("succeeded", jobs)], statuses
    row = conn.execute(
        "SELECT count(DISTINCT job_id) FROM public.ledger WHERE finished_at IS NOT NULL"
    ).fetchone()
    assert row == (jobs,), f"{row} jobs finished their ledger entry, of {jobs}"
    overlap = most_of_a_key_at_once(conn)
    assert overlap <= limit, f"{overlap} jobs of one key ran at once"
    assert overlap == limit, "the limit was never reached: the test proves nothing"
