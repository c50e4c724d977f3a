"""Connection failures say whether retrying can help."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from helpers import eventually, in_process_worker
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgtasks
from pgtasks.db import Database, describe_dsn
from pgtasks.db.database import MAX_APPLICATION_NAME_BYTES, fit_application_name
from pgtasks.db.workers import worker_database
from pgtasks.errors import ConfigurationError, ConnectionFailed, DatabaseError

REPO = Path(__file__).resolve().parents[1]


def test_unreachable_server_is_transient() -> None:
    with pytest.raises(ConnectionFailed) as info:
        Database("postgresql://postgres@127.0.0.1:1/x", connect_timeout=2).connect()
    assert info.value.transient
    assert "127.0.0.1:1" in str(info.value)


def test_missing_database_is_permanent(admin_dsn: str) -> None:
    params = conninfo_to_dict(admin_dsn)
    params["dbname"] = "pgtasks_no_such_database"
    with pytest.raises(ConnectionFailed) as info:
        Database(make_conninfo("", **params)).connect()
    assert not info.value.transient
    assert "pgtasks_no_such_database" in str(info.value)


def test_embedded_status_names_an_unused_data_directory(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pgtasks", "embedded", "status"],
        env={"PGTASKS_EMBEDDED_DIR": str(tmp_path / "pg"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == f"not running (data directory {tmp_path / 'pg'})"


# -- a DSN libpq or psycopg refuses: a configuration error, at once ---------------------------

REFUSED_VALUES = {
    "connect_timeout=abc": "bad value for connect_timeout: 'abc'",  # psycopg's check
    "sslmode=bogus": 'invalid sslmode value: "bogus"',  # libpq, before any socket
    "keepalives=abc": 'invalid integer value "abc" for connection option "keepalives"',  # libpq, connecting
    "bogus=1": 'invalid URI query parameter: "bogus"',  # libpq's parser
}


def _uri(admin_dsn: str, password: str, query: str) -> str:
    """``admin_dsn`` as a URI with ``password`` and ``?query``."""
    params = conninfo_to_dict(admin_dsn)
    host, dbname = params.get("host", "127.0.0.1"), params.get("dbname", "postgres")
    user = params.get("user", "postgres")
    return f"postgresql://{user}:{password}@{host}:{params.get('port', 5432)}/{dbname}?{query}"


@pytest.mark.parametrize("query", sorted(REFUSED_VALUES))
def test_a_dsn_value_libpq_refuses_is_a_configuration_error_on_first_use(admin_dsn: str, query: str) -> None:
    app = pgtasks.App("bad-dsn", dsn=_uri(admin_dsn, "hunter22", query), load_entry_points=False)
    started = time.monotonic()
    with pytest.raises(ConfigurationError) as info:
        app.database.now()  # the pool's first use (it retried a refused DSN for 10 s)
    assert time.monotonic() - started < 3
    message = str(info.value)
    assert REFUSED_VALUES[query] in message and "hunter22" not in message
    assert "\n" not in message
    with pytest.raises(ConfigurationError):
        asyncio.run(app.database.connect_async())
    app.close()


@pytest.mark.parametrize(
    "command", [["worker", "--burst"], ["jobs", "list"], ["migrate"], ["queues"]], ids=" ".join
)
def test_every_command_reports_a_refused_dsn_at_once_without_a_traceback(
    admin_dsn: str, command: list[str]
) -> None:
    dsn = _uri(admin_dsn, "hunter22", "connect_timeout=abc")
    target = describe_dsn(dsn)
    started = time.monotonic()
    out = _pgtasks(dsn, *command)
    assert time.monotonic() - started < 8  # the import of the app included
    assert out.returncode == 1  # docs/workers.md, "Exit codes"
    last = out.stderr.strip().splitlines()[-1]
    assert last == f"Error: invalid PostgreSQL DSN ({target}): bad value for connect_timeout: 'abc'"
    assert "Traceback" not in out.stderr and "hunter22" not in out.stderr + out.stdout


def test_check_reports_a_refused_dsn_as_the_database_check_at_once(admin_dsn: str) -> None:
    started = time.monotonic()
    out = _pgtasks(_uri(admin_dsn, "hunter22", "connect_timeout=abc"), "check", "--json")
    assert time.monotonic() - started < 8
    assert out.returncode == 10  # docs/operations.md, "Health checks"
    database = orjson.loads(out.stdout)["checks"][0]
    assert database["status"] == "failed"
    assert "bad value for connect_timeout: 'abc'" in database["details"]["error"]
    assert "hunter22" not in out.stdout + out.stderr


def test_a_server_that_is_down_stays_a_transient_connection_failure_with_its_cause() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dsn = f"postgresql://postgres:hunter22@127.0.0.1:{port}/nowhere"
    with pytest.raises(ConnectionFailed) as info:
        Database(dsn, connect_timeout=2).connect()
    message = str(info.value)
    assert info.value.transient
    assert f"127.0.0.1:{port}" in message and "Connection refused" in message
    assert "\n" not in message and "\t" not in message and "  " not in message
    assert "hunter22" not in message
    out = _pgtasks(dsn, "jobs", "list")
    assert out.returncode == 1 and "Connection refused" in out.stderr and "\\t" not in out.stderr


@pytest.mark.parametrize("given", ["dsn", "environment"])
def test_a_connect_timeout_of_the_dsn_bounds_a_dedicated_connection(
    given: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that accepts the TCP connection and never answers: the DSN's (or
    PGCONNECT_TIMEOUT's) 2 s apply, as docs/configuration.md advises for failover, not
    the database's own 30 s."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)  # the kernel completes the handshake; nobody ever answers
        port = server.getsockname()[1]
        dsn = f"postgresql://postgres@127.0.0.1:{port}/silent"
        if given == "dsn":
            dsn += "?connect_timeout=2"
        else:
            monkeypatch.setenv("PGCONNECT_TIMEOUT", "2")
        began = time.monotonic()
        with pytest.raises(ConnectionFailed) as info:
            Database(dsn, connect_timeout=30).connect()
        waited = time.monotonic() - began
    assert info.value.transient
    assert 1.5 < waited < 10, f"waited {waited:.1f} s"


# -- a database without pgtasks' schema -------------------------------------------------------

NOT_INSTALLED = "pgtasks' schema is not installed in this database"


def test_a_worker_on_a_database_never_migrated_says_to_run_migrate(empty_dsn: str) -> None:
    out = _pgtasks(empty_dsn, "worker", "--burst")
    assert out.returncode == 1  # docs/workers.md: "... or is not migrated (the message says which)"
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: {NOT_INSTALLED}") and last.endswith("run `pgtasks migrate`")
    assert '"pgtasks.workers" does not exist' in last
    assert "LINE" not in out.stderr and "Traceback" not in out.stderr


def test_commands_and_the_api_on_a_database_never_migrated_say_to_run_migrate(empty_dsn: str) -> None:
    out = _pgtasks(empty_dsn, "jobs", "list")
    assert out.returncode == 1 and NOT_INSTALLED in out.stderr and "LINE" not in out.stderr
    app = pgtasks.App("unmigrated", dsn=empty_dsn, load_entry_points=False)

    @app.task
    def noop() -> None:
        return None

    with pytest.raises(DatabaseError) as info:
        noop.delay()
    assert NOT_INSTALLED in str(info.value) and "pgtasks migrate" in str(info.value)
    assert info.value.sqlstate == "42P01" and not info.value.transient
    assert app.migrate()  # the migrations themselves are not told to run themselves
    assert noop.delay().id
    app.close()


# -- application_name -------------------------------------------------------------------------


def _names(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute(
        "SELECT application_name FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid()"
    ).fetchall()
    return {r[0] for r in rows}


def test_a_worker_s_connections_are_named_after_it_and_the_app_s_pgtasks(dsn: str) -> None:
    app = pgtasks.App("named", dsn=dsn, load_entry_points=False)
    app.database.now()
    with psycopg.connect(dsn, autocommit=True) as conn, in_process_worker(app, concurrency=2) as worker:
        eventually(worker.started.is_set)
        expected = {"pgtasks", f"pgtasks worker {worker.id}"}
        eventually(lambda: _names(conn) == expected, message=f"connections named {expected}")
    app.close()


def test_an_application_name_of_the_dsn_is_kept(dsn: str) -> None:
    own = f"{dsn} application_name=billing-jobs"
    app = pgtasks.App("named", dsn=own, load_entry_points=False)
    app.database.now()
    with psycopg.connect(dsn, autocommit=True) as conn, in_process_worker(app, concurrency=2) as worker:
        eventually(worker.started.is_set)
        assert _names(conn) == {"billing-jobs"}
    app.close()


def test_a_long_worker_id_is_shortened_to_what_postgresql_keeps(dsn: str) -> None:
    worker_id = f"{'pod-' * 20}é:4242:abcdef"
    name = fit_application_name(f"pgtasks worker {worker_id}")
    assert len(name.encode("utf-8")) <= MAX_APPLICATION_NAME_BYTES
    assert name.startswith("pgtasks worker pod-pod-") and name.endswith("é:4242:abcdef")
    database = worker_database(dsn, max_size=1, prepare_threshold=None, worker_id=worker_id)
    with database.connect() as c:
        row = c.execute("SHOW application_name").fetchone()
    assert row is not None
    # The server shows each byte outside printable ASCII as "?"; nothing was cut off.
    assert row[0] == name.replace("é", "??")
    assert fit_application_name("pgtasks") == "pgtasks"


def _pgtasks(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``pgtasks -A tests.apps.worker_app:app ARGS`` in a process of its own, on ``dsn``."""
    env = {**os.environ, "PGTASKS_DSN": dsn, "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pgtasks", "-A", "tests.apps.worker_app:app", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
