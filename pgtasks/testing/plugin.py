"""The pytest plugin of the testing kit (entry point ``pytest11``: loaded by pytest
wherever pgtasks is installed; ``-p no:pgtasks`` turns it off).

Fixtures (every name starts with ``pgtasks_``):

* ``pgtasks_server_dsn`` (session): a PostgreSQL server where databases may be
  created: ``--pgtasks-dsn``, else ``PGTASKS_TEST_DSN``, else the embedded
  PostgreSQL started in a temporary directory for the session;
* ``pgtasks_target_app`` (session): the app under test, from the ``pgtasks_app``
  ini option (``module:attribute``, as ``-A``) or ``--pgtasks-app``; None for a
  fresh app per test. Override it in a conftest.py to hand over the app yourself;
* ``pgtasks_template_db`` (session): a database migrated once with the app's
  migrations and its plugins', the template of every test's database;
* ``pgtasks_dsn``: a database of this test only, cloned from the template
  (``CREATE DATABASE ... TEMPLATE``), dropped after it;
* ``pgtasks_app``: the app under test pointed at that database
  (`pgtasks.App.use_database`), or a fresh ``pgtasks.App`` on it (no plugins
  autoloaded) when there is none;
* ``pgtasks_clock``: the app's `pgtasks.testing.TestClock`;
* ``pgtasks_eager``: the app, with jobs run as soon as they are enqueued
  (`pgtasks.testing.eager`) during the test.

Loading this module imports the ``pgtasks`` package (as ``import pgtasks`` does);
the worker, the scheduler and the embedded server are imported by the fixtures
and functions that use them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import pgtasks
    from pgtasks.testing.clock import TestClock

__all__ = [
    "pgtasks_app",
    "pgtasks_clock",
    "pgtasks_dsn",
    "pgtasks_eager",
    "pgtasks_server_dsn",
    "pgtasks_target_app",
    "pgtasks_template_db",
]

ENV_DSN = "PGTASKS_TEST_DSN"


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--pgtasks-dsn`` and ``--pgtasks-app`` (also the ini option ``pgtasks_app``)."""
    group = parser.getgroup("pgtasks", "pgtasks testing kit")
    group.addoption(
        "--pgtasks-dsn",
        dest="pgtasks_dsn",
        default=None,
        help=f"PostgreSQL server where test databases are created (default: ${ENV_DSN}, else embedded)",
    )
    group.addoption(
        "--pgtasks-app",
        dest="pgtasks_app",
        default=None,
        help="module:attribute of the pgtasks.App under test (default: the pgtasks_app ini option)",
    )
    parser.addini("pgtasks_app", "module:attribute of the pgtasks.App under test", default="")


def _with_db(dsn: str, dbname: str) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


def _admin(dsn: str, statement: str, *names: str) -> None:
    """Run a database-level statement (CREATE / DROP DATABASE) with quoted names."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(statement).format(*(sql.Identifier(n) for n in names)))


@pytest.fixture(scope="session")
def pgtasks_server_dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """DSN of a server where the kit may create and drop databases."""
    dsn = request.config.getoption("pgtasks_dsn") or os.environ.get(ENV_DSN)
    if dsn:
        yield dsn
        return
    from pgtasks.embedded import embedded_dsn, stop_embedded

    # Outside pytest's numbered temp dirs: another pytest session prunes old ones.
    base = Path(tempfile.mkdtemp(prefix="pgtasks-kit-embedded-"))
    data_dir = base / "pg"
    try:
        yield embedded_dsn(data_dir, database="postgres")
    finally:
        stop_embedded(data_dir)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def pgtasks_target_app(request: pytest.FixtureRequest) -> pgtasks.App | None:
    """The app under test (``--pgtasks-app`` or the ``pgtasks_app`` ini option), or None."""
    spec = request.config.getoption("pgtasks_app") or request.config.getini("pgtasks_app")
    if not spec:
        return None
    from pgtasks.loader import load_app

    return load_app(str(spec))


def _fresh_app(dsn: str) -> pgtasks.App:
    import pgtasks

    return pgtasks.App("pgtasks-test", dsn=dsn, load_entry_points=False)


@pytest.fixture(scope="session")
def pgtasks_template_db(pgtasks_server_dsn: str, pgtasks_target_app: pgtasks.App | None) -> Iterator[str]:
    """Name of a database migrated once (pgtasks' migrations and the app's plugins')."""
    name = f"pgtasks_kit_tpl_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    _admin(pgtasks_server_dsn, "CREATE DATABASE {}", name)
    try:
        dsn = _with_db(pgtasks_server_dsn, name)
        if pgtasks_target_app is None:
            app = _fresh_app(dsn)
            app.migrate()
            app.close()
        else:
            pgtasks_target_app.use_database(dsn)
            pgtasks_target_app.migrate()
            pgtasks_target_app.close()  # no connection left open: a template must have none
        yield name
    finally:
        _admin(pgtasks_server_dsn, "DROP DATABASE IF EXISTS {} WITH (FORCE)", name)


@pytest.fixture
def pgtasks_dsn(pgtasks_server_dsn: str, pgtasks_template_db: str) -> Iterator[str]:
    """DSN of a fresh, migrated database for this test only."""
    name = f"pgtasks_kit_{uuid.uuid4().hex[:12]}"
    _admin(pgtasks_server_dsn, "CREATE DATABASE {} TEMPLATE {}", name, pgtasks_template_db)
    try:
        yield _with_db(pgtasks_server_dsn, name)
    finally:
        _admin(pgtasks_server_dsn, "DROP DATABASE IF EXISTS {} WITH (FORCE)", name)


@pytest.fixture
def pgtasks_app(pgtasks_dsn: str, pgtasks_target_app: pgtasks.App | None) -> Iterator[pgtasks.App]:
    """The app under test on this test's database (a fresh app if there is none)."""
    from pgtasks.testing.clock import forget_clock

    app = _fresh_app(pgtasks_dsn) if pgtasks_target_app is None else pgtasks_target_app
    if pgtasks_target_app is not None:
        app.use_database(pgtasks_dsn)
    try:
        yield app
    finally:
        forget_clock(app)
        app.close()


@pytest.fixture
def pgtasks_clock(pgtasks_app: pgtasks.App) -> TestClock:
    """The test clock of ``pgtasks_app`` (the one `run_until_idle` moves on)."""
    from pgtasks.testing.clock import clock_for

    return clock_for(pgtasks_app)


@pytest.fixture
def pgtasks_eager(pgtasks_app: pgtasks.App) -> Iterator[pgtasks.App]:
    """``pgtasks_app`` with its jobs run as soon as they are enqueued (`pgtasks.testing.eager`)."""
    from pgtasks.testing.eager import eager

    with eager(pgtasks_app):
        yield pgtasks_app
