"""A private PgBouncer in transaction pooling, from the machine's ``pgbouncer`` binary.

Shared by the chaos harness, the pooler tests (tests/cluster.py wraps it) and the
pooler benchmark (`benchmarks.pooler`). It listens on a free port of 127.0.0.1 with
``trust`` authentication for one user and sends every database to one PostgreSQL
server (127.0.0.1 unless told otherwise); `PgBouncer.retarget` points it at another (the
new primary after a failover) by rewriting its ``[databases]`` entry and issuing
``RELOAD`` on the admin console, which is what a failover manager's hook does for a
PgBouncer that stays in place. PgBouncer refuses to run as root: as root it runs as
the ``postgres`` system user.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from chaos.cluster import SERVER_USER, as_root, free_port, own, workdir

__all__ = ["PgBouncer", "pgbouncer_bin", "running_pgbouncer"]


def pgbouncer_bin() -> Path | None:
    """The ``pgbouncer`` executable (Debian's ``/usr/sbin/pgbouncer``), or None."""
    found = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if Path(p).is_file()), None
    )
    return Path(found) if found else None


@dataclass
class PgBouncer:
    """A running PgBouncer in transaction pooling.

    Attributes:
        port: its TCP port on 127.0.0.1.
        pool_size: server connections per database and user (``default_pool_size``).
        version: what ``pgbouncer --version`` says first (``PgBouncer 1.18.0``).
        log: its log file.
        ini: its configuration file.
        server_port: the port of the PostgreSQL server it sends every database to.
        server_host: that server's host (or socket directory).
        user: the one user it lets in (without a password) and its admin.
    """

    port: int
    pool_size: int
    version: str
    log: Path
    ini: Path
    server_port: int
    server_host: str = "127.0.0.1"
    user: str = "postgres"

    def dsn(self, dbname: str) -> str:
        """A DSN of ``dbname`` through the pooler."""
        return f"host=127.0.0.1 port={self.port} user={self.user} dbname={dbname}"

    def show(self, what: str) -> list[tuple[object, ...]]:
        """Rows of the admin console's ``SHOW <what>`` (``POOLS``, ``SERVERS``, ...)."""
        return self.console(f"SHOW {what}")

    def console(self, command: str) -> list[tuple[object, ...]]:
        """Run ``command`` on the admin console; its rows (none for ``RELOAD``)."""
        # The console speaks the simple query protocol only: a client-side cursor.
        dsn = self.dsn("pgbouncer") + " connect_timeout=5"
        with psycopg.connect(dsn, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
            cur = conn.execute(command)
            return cur.fetchall() if cur.description else []

    def retarget(self, server_port: int) -> None:
        """Send every database to 127.0.0.1:``server_port`` from now on: rewrite the
        ``[databases]`` entry and ``RELOAD``. PgBouncer closes the server connections
        of the old target as they come back to the pool; new ones go to the new one."""
        text = self.ini.read_text()
        old, new = _target(self.server_host, self.server_port), _target(self.server_host, server_port)
        self.ini.write_text(text.replace(old, new))
        self.server_port = server_port
        self.console("RELOAD")


def _target(server_host: str, server_port: int) -> str:
    return f"* = host={server_host} port={server_port}\n"


@contextmanager
def running_pgbouncer(
    server_port: int,
    *,
    pool_size: int = 8,
    max_client_conn: int = 400,
    server_login_retry: float | None = None,
    server_host: str = "127.0.0.1",
    user: str = "postgres",
) -> Iterator[PgBouncer]:
    """PgBouncer in transaction pooling in front of ``server_host``:``server_port``
    (every database), with ``default_pool_size = pool_size``; stopped on exit.

    Args:
        server_port: the PostgreSQL server's port.
        server_host: the server's host or socket directory.
        user: the one user clients connect as (it must reach the server without a
            password); also the admin console's.
        pool_size: server connections per database and user.
        max_client_conn: client connections it accepts.
        server_login_retry: seconds it waits after a failed server login before it
            tries again (PgBouncer's default: 15), while clients are refused.

    Raises:
        RuntimeError: ``pgbouncer`` is not installed or did not start.
    """
    executable = pgbouncer_bin()
    if executable is None:
        raise RuntimeError("no pgbouncer binary: apt-get install pgbouncer")
    said = subprocess.run([str(executable), "--version"], capture_output=True, text=True, check=False)
    version = next(iter(said.stdout.splitlines()), "pgbouncer")
    with workdir("pgtasks-pgbouncer-") as base:
        port = free_port()
        log = base / "pgbouncer.log"
        users = base / "users.txt"
        users.write_text(f'"{user}" ""\n')
        ini = base / "pgbouncer.ini"
        settings = [
            "[databases]",
            _target(server_host, server_port).rstrip("\n"),
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {users}",
            f"admin_users = {user}",
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
        ]
        if server_login_retry is not None:
            settings.append(f"server_login_retry = {server_login_retry:g}")
        ini.write_text("\n".join([*settings, ""]))
        for path in (users, ini):
            own(path)
        command = ["runuser", "-u", SERVER_USER, "--"] if as_root() else []
        proc = subprocess.Popen(
            [*command, str(executable), str(ini)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            _wait_listening(port, proc, log)
            yield PgBouncer(port, pool_size, version, log, ini, server_port, server_host, user)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                text = log.read_text(errors="replace") if log.exists() else ""
                raise RuntimeError(f"pgbouncer did not start: {text[-2000:]}") from None
            time.sleep(0.05)
