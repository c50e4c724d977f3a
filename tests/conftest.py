"""Shared fixtures: a real PostgreSQL, one fresh database per test, leak checks.

``PGTASKS_TEST_DSN`` names a server where the tests may create databases (on this
project's CI: ``postgresql://postgres@127.0.0.1:5432/test``). Without it the
embedded PostgreSQL is started in a temporary directory. Each test gets its own
database, cloned from a template migrated once per session.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
from helpers import scratch_database, with_dbname
from psycopg import sql

import pgtasks
from pgtasks.migrate import migrations

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def admin_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A DSN with the right to create databases."""
    dsn = os.environ.get("PGTASKS_TEST_DSN")
    if dsn:
        yield dsn
        return
    from pgtasks.embedded import embedded_dsn, stop_embedded

    # Outside pytest's numbered temp dirs: a concurrent pytest session prunes old
    # ones, which would pull the data directory from under a running server.
    base = Path(tempfile.mkdtemp(prefix="pgtasks-test-embedded-"))
    data_dir = base / "pg"
    yield embedded_dsn(data_dir, database="postgres")
    stop_embedded(data_dir)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(admin_dsn: str) -> Iterator[str]:
    """Name of a database migrated to the current schema, used as a template."""
    digest = hashlib.sha1("".join(m.sql for m in migrations()).encode()).hexdigest()[:10]
    name = f"pgtasks_tpl_{digest}_{os.getpid()}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    app = pgtasks.App("template", dsn=with_dbname(admin_dsn, name), load_entry_points=False)
    app.migrate()
    app.close()
    yield name
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def dsn(admin_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for this test only."""
    with scratch_database(admin_dsn, template=template_db) as url:
        yield url


@pytest.fixture
def empty_dsn(admin_dsn: str) -> Iterator[str]:
    """A fresh database without the pgtasks schema."""
    with scratch_database(admin_dsn, prefix="pgtasks_e") as url:
        yield url


@pytest.fixture
def app(dsn: str) -> Iterator[pgtasks.App]:
    """An app on a fresh database, without auto-loaded plugins."""
    application = pgtasks.App("test", dsn=dsn, load_entry_points=False)
    yield application
    application.close()


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A plain connection to the test database, for side checks and caller transactions."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        yield connection


# Processes started once per session or module, which start helpers of their own as they
# go: the embedded PostgreSQL, and the Chromium of the dashboard's browser tests (a
# renderer per page it opens, kept for reuse; chromedriver stops them all at the end).
_LONG_LIVED = ("postgres", "chromium", "chrome", "chromedriver")


def _is_leak(proc: psutil.Process) -> bool:
    """A child left running, other than those of `_LONG_LIVED`."""
    try:
        return (
            proc.is_running()
            and proc.status() != psutil.STATUS_ZOMBIE
            and not proc.name().startswith(_LONG_LIVED)
        )
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Fail a test that leaves threads or child processes behind."""
    threads_before = {t.ident for t in threading.enumerate()}
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    deadline = time.monotonic() + 5.0
    while True:
        extra_threads = [t for t in threading.enumerate() if t.ident not in threads_before and t.is_alive()]
        extra_children = [
            p
            for p in psutil.Process().children(recursive=True)
            if p.pid not in children_before and _is_leak(p)
        ]
        if not extra_threads and not extra_children:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for p in extra_children:
        p.kill()
    pytest.fail(
        f"leaked threads {[t.name for t in extra_threads]} / processes {[p.pid for p in extra_children]}"
    )


@pytest.fixture
def wdsn(dsn: str) -> str:
    """The test database with the ledger tables of the worker test app (``apps/worker_app.py``)."""
    from apps.worker_app import setup_ledger

    setup_ledger(dsn)
    return dsn


@pytest.fixture
def client(wdsn: str) -> Iterator[pgtasks.App]:
    """The worker test app on that database (it enqueues the jobs the worker processes run)."""
    from apps.worker_app import make_app

    application = make_app(wdsn)
    yield application
    application.close()


# Files whose tests also run on the embedded PostgreSQL 18 in CI (``pytest -m smoke``):
# the schema, enqueue, results, named queries and an in-process worker.
SMOKE_FILES = frozenset(
    {"test_migrate.py", "test_enqueue.py", "test_results.py", "test_queries.py", "test_worker_units.py"}
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the smoke files' tests with ``smoke``."""
    for item in items:
        if item.path.name in SMOKE_FILES:
            item.add_marker(pytest.mark.smoke)
