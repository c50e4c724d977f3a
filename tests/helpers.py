"""Test helpers: wait on conditions, not sleeps."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgtasks.worker import Worker

T = TypeVar("T")


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
