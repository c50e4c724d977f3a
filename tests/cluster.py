"""Private PostgreSQL servers and a PgBouncer for the tests past one database server.

Built from the machine's own binaries (Debian's ``postgresql-15`` and ``pgbouncer``
packages; `.ci/run` installs both): a primary, a streaming standby cloned from it with
``pg_basebackup -R``, and a PgBouncer in transaction pooling in front of a server.
Each lives in a temporary directory on a free TCP port of 127.0.0.1, with ``trust``
authentication, and is stopped and removed on exit. PostgreSQL and PgBouncer refuse to
run as root: as root, every binary runs as the ``postgres`` system user (``runuser``).

`require_binaries` skips a test, naming what is missing, only when the binaries are
truly absent.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

__all__ = [
    "PgBouncer",
    "Server",
    "free_port",
    "multi_host_dsn",
    "pg_bin",
    "pgbouncer_bin",
    "primary_and_standby",
    "require_binaries",
    "running_pgbouncer",
]

#: Where Debian installs PostgreSQL's server binaries, newest first.
PG_BIN_CANDIDATES = tuple(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True))
#: The system user servers run as when the tests run as root.
SERVER_USER = "postgres"


def pg_bin() -> Path | None:
    """The directory of ``initdb``, ``pg_ctl`` and ``pg_basebackup`` (``PGTASKS_PG_BIN``, else
    Debian's newest ``/usr/lib/postgresql/N/bin``), or None."""
    given = os.environ.get("PGTASKS_PG_BIN")
    for candidate in ([Path(given)] if given else []) + list(PG_BIN_CANDIDATES):
        if all((candidate / tool).is_file() for tool in ("initdb", "pg_ctl", "pg_basebackup")):
            return candidate
    return None


def pgbouncer_bin() -> Path | None:
    """The ``pgbouncer`` executable, or None."""
    found = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if Path(p).is_file()), None
    )
    return Path(found) if found else None


def _as_root() -> bool:
    return os.geteuid() == 0


def require_binaries(*, pgbouncer: bool = False) -> Path:
    """PostgreSQL's binary directory; skips the test, saying what is missing, without them."""
    found = pg_bin()
    if found is None:
        pytest.skip(
            "no PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup): apt-get install postgresql"
        )
    if pgbouncer and pgbouncer_bin() is None:
        pytest.skip("no pgbouncer binary: apt-get install pgbouncer")
    if _as_root():
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            pytest.skip(f"running as root and there is no {SERVER_USER!r} user to run the servers as")
    return found


_GIVEN: set[int] = set()


def free_port() -> int:
    """A TCP port of 127.0.0.1 free right now, and not given before by this process (two
    servers set up together must not get the same one)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def _run(
    args: Sequence[str], *, check: bool = True, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run a server binary (as `SERVER_USER` when root); its output is in the error."""
    command = ["runuser", "-u", SERVER_USER, "--", *args] if _as_root() else list(args)
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}: {done.stdout}{done.stderr}")
    return done


def _own(path: Path) -> None:
    """Hand ``path`` to `SERVER_USER` when root (the servers write there)."""
    if _as_root():
        entry = pwd.getpwnam(SERVER_USER)
        os.chown(path, entry.pw_uid, entry.pw_gid)


@dataclass
class Server:
    """One private PostgreSQL server (a data directory and a port).

    Attributes:
        name: ``primary`` or ``standby``, for messages and the log file's name.
        bin: PostgreSQL's binary directory.
        data: the data directory.
        port: its TCP port on 127.0.0.1.
    """

    name: str
    bin: Path
    data: Path
    port: int
    running: bool = field(default=False)

    @property
    def log(self) -> Path:
        """The server's log file."""
        return self.data.parent / f"{self.name}.log"

    def dsn(self, dbname: str = "postgres") -> str:
        """A DSN of this server alone."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def start(self) -> None:
        """Start the server and wait until it accepts connections (up to 60 s)."""
        _run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start"])
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` (roll back sessions, checkpoint) or ``immediate``
        (no checkpoint: as a crash)."""
        if self.running:
            _run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"])
            self.running = False

    def promote(self) -> None:
        """Promote this standby and wait until it accepts writes (up to 60 s)."""
        _run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote"])

    def in_recovery(self) -> bool:
        """Whether the server is a standby (``pg_is_in_recovery()``)."""
        with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        assert row is not None
        return bool(row[0])

    def log_text(self) -> str:
        """What the server logged so far."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def _configure(data: Path, lines: Sequence[str]) -> None:
    """Append settings to ``data``'s postgresql.conf (later lines win)."""
    conf = data / "postgresql.conf"
    with conf.open("a") as f:
        f.write("\n# pgtasks tests\n" + "\n".join(lines) + "\n")


@contextmanager
def _workdir() -> Iterator[Path]:
    # Outside pytest's numbered temp dirs (a concurrent session prunes them), readable
    # by the server user.
    base = Path(tempfile.mkdtemp(prefix="pgtasks-cluster-"))
    base.chmod(0o755)
    _own(base)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextmanager
def primary_and_standby(*, synchronous: bool = True) -> Iterator[tuple[Server, Server]]:
    """A primary and a streaming standby on free ports, both running; stopped on exit.

    Args:
        synchronous: commits on the primary wait until the standby has flushed their
            WAL (``synchronous_standby_names = '*'``, ``synchronous_commit = on``),
            so a commit acknowledged to a client survives the primary's loss; False:
            asynchronous streaming, which can lose the last commits.

    Skips the test when the binaries are absent (`require_binaries`).
    """
    binaries = require_binaries()
    with _workdir() as base:
        primary = Server("primary", binaries, base / "primary", free_port())
        standby = Server("standby", binaries, base / "standby", free_port())
        try:
            _run(
                [
                    str(binaries / "initdb"),
                    "-D",
                    str(primary.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--no-sync",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ]
            )
            settings = [
                f"port = {primary.port}",
                "listen_addresses = '127.0.0.1'",
                "unix_socket_directories = ''",
                "wal_level = replica",
                "max_wal_senders = 5",
                "hot_standby = on",
                "max_connections = 200",
                "shared_buffers = 32MB",
                "fsync = off",  # a test's server: durability against the OS crash is not under test
                "wal_keep_size = 256MB",
                "logging_collector = off",
            ]
            if synchronous:
                settings += ["synchronous_standby_names = '*'", "synchronous_commit = on"]
            _configure(primary.data, settings)
            primary.start()
            _run(
                [
                    str(binaries / "pg_basebackup"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(primary.port),
                    "-U",
                    "postgres",
                    "-D",
                    str(standby.data),
                    "-R",
                    "-X",
                    "stream",
                    "--no-sync",
                ]
            )
            _configure(standby.data, [f"port = {standby.port}", "synchronous_standby_names = ''"])
            standby.start()
            _wait_streaming(primary, synchronous)
            yield primary, standby
        finally:
            for server in (standby, primary):
                with suppress(RuntimeError, subprocess.TimeoutExpired):
                    server.stop("immediate")


def _wait_streaming(primary: Server, synchronous: bool, timeout: float = 60.0) -> None:
    """Wait until the standby streams from ``primary`` (and is its synchronous standby)."""
    wanted = "sync" if synchronous else "async"
    deadline = time.monotonic() + timeout
    while True:
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            states = conn.execute("SELECT state, sync_state FROM pg_stat_replication").fetchall()
        if ("streaming", wanted) in states:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"standby not streaming ({wanted}) within {timeout}s: {states}")
        time.sleep(0.1)


def multi_host_dsn(servers: Sequence[Server], dbname: str, **options: str) -> str:
    """A libpq multi-host DSN over ``servers`` that connects to the one that accepts
    writes (``target_session_attrs=read-write``), trying each within 2 s."""
    hosts = ",".join("127.0.0.1" for _ in servers)
    ports = ",".join(str(s.port) for s in servers)
    extra = " ".join(f"{k}={v}" for k, v in options.items())
    return (
        f"host={hosts} port={ports} user=postgres dbname={dbname} "
        f"target_session_attrs=read-write connect_timeout=2 {extra}"
    ).strip()


def wait_replayed(primary_dsn: str, standby_dsn: str, timeout: float = 30.0) -> None:
    """Wait until the standby has replayed everything the primary has written so far."""
    with psycopg.connect(primary_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    target = row[0]
    deadline = time.monotonic() + timeout
    with psycopg.connect(standby_dsn, autocommit=True) as conn:
        while True:
            done = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)).fetchone()
            if done is not None and done[0]:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"standby has not replayed {target} within {timeout}s")
            time.sleep(0.05)


@dataclass
class PgBouncer:
    """A running PgBouncer in transaction pooling.

    Attributes:
        port: its TCP port on 127.0.0.1.
        pool_size: server connections per database and user (``default_pool_size``).
        version: what ``pgbouncer --version`` says first (``PgBouncer 1.18.0``).
    """

    port: int
    pool_size: int
    version: str
    log: Path

    def dsn(self, dbname: str) -> str:
        """A DSN of ``dbname`` through the pooler."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def show(self, what: str) -> list[tuple[object, ...]]:
        """Rows of the admin console's ``SHOW <what>`` (``POOLS``, ``SERVERS``, ...)."""
        # The console speaks the simple query protocol only: a client-side cursor.
        dsn = self.dsn("pgbouncer")
        with psycopg.connect(dsn, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
            return conn.execute(f"SHOW {what}").fetchall()


@contextmanager
def running_pgbouncer(
    server_port: int, *, pool_size: int = 8, max_client_conn: int = 400
) -> Iterator[PgBouncer]:
    """PgBouncer in transaction pooling in front of 127.0.0.1:``server_port`` (every
    database), with ``default_pool_size = pool_size``; stopped on exit.

    Skips the test when ``pgbouncer`` is not installed.
    """
    require_binaries(pgbouncer=True)
    executable = pgbouncer_bin()
    assert executable is not None
    version = subprocess.run(
        [str(executable), "--version"], capture_output=True, text=True, check=False
    ).stdout.splitlines()[0]
    with _workdir() as base:
        port = free_port()
        log = base / "pgbouncer.log"
        users = base / "users.txt"
        users.write_text('"postgres" ""\n')
        ini = base / "pgbouncer.ini"
        ini.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host=127.0.0.1 port={server_port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {users}",
                    "admin_users = postgres",
                    "pool_mode = transaction",
                    f"default_pool_size = {pool_size}",
                    "min_pool_size = 0",
                    "reserve_pool_size = 0",
                    f"max_client_conn = {max_client_conn}",
                    f"max_db_connections = {pool_size}",
                    "server_reset_query =",
                    "ignore_startup_parameters = extra_float_digits,options",
                    f"logfile = {log}",
                    f"pidfile = {base / 'pgbouncer.pid'}",
                    "",
                ]
            )
        )
        for path in (users, ini):
            _own(path)
        command = ["runuser", "-u", SERVER_USER, "--"] if _as_root() else []
        proc = subprocess.Popen(
            [*command, str(executable), str(ini)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1):
                        break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        text = log.read_text(errors="replace") if log.exists() else ""
                        raise RuntimeError(f"pgbouncer did not start: {text[-2000:]}") from None
                    time.sleep(0.05)
            yield PgBouncer(port=port, pool_size=pool_size, version=version, log=log)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
