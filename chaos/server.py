"""A private PostgreSQL server the chaos run starts, restarts and stops itself.

The harness restarts PostgreSQL as one of its faults, so it never uses a server it
did not start: it runs ``initdb`` into a temporary directory and ``pg_ctl`` on a
free port of 127.0.0.1, from the binaries of the machine's PostgreSQL
(``PGTASKS_CHAOS_PGBIN``, else the newest ``/usr/lib/postgresql/*/bin``). As root
(PostgreSQL refuses to run as root) every server command runs as the ``postgres``
user through ``runuser``, which owns the directory.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

__all__ = ["PrivatePostgres", "find_bindir"]

#: The database the run's app, workers and schedulers use.
DATABASE = "chaos"
#: Seconds ``pg_ctl`` waits for a start, stop or restart.
PG_CTL_WAIT = 60


def find_bindir() -> Path | None:
    """The PostgreSQL binaries to run (a directory with ``initdb`` and ``pg_ctl``), or None."""
    given = os.environ.get("PGTASKS_CHAOS_PGBIN")
    if given:
        return Path(given)
    found = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")]

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", path.parent.name)) or (0,)

    return max(found, key=version) if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePostgres:
    """One PostgreSQL server in a temporary directory, on a free local port.

    Args:
        bindir: directory of ``initdb`` and ``pg_ctl``.
        root: parent of the temporary directory (default: the system's).

    Raises:
        RuntimeError: a server command failed (its output is in the message).
    """

    def __init__(self, bindir: Path, root: Path | None = None) -> None:
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="pgtasks-chaos-", dir=root))
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self.port = _free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self.dir, user.pw_uid, user.pw_gid)
        os.chmod(self.dir, 0o700)

    def dsn(self, database: str = DATABASE) -> str:
        """A libpq URI for ``database`` on this server (superuser ``postgres``, trust)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *command: str) -> None:
        argv = [str(self.bindir / command[0]), *command[1:]]
        if self._as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=PG_CTL_WAIT + 30)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stdout}{done.stderr}")

    def start(self) -> None:
        """Initialise the data directory, start the server and create the run's database."""
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        settings = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.dir}'",
            "max_connections": "300",
            # Only the server process is crashed or restarted here, never the machine:
            # what it has written survives in the OS's cache.
            "fsync": "off",
            "full_page_writes": "off",
            "log_min_messages": "warning",
        }
        with (self.data / "postgresql.auto.conf").open("a") as conf:
            for name, value in settings.items():
                conf.write(f"{name} = {value}\n")
        self._pg_ctl("start")
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")

    def _pg_ctl(self, action: str, *extra: str) -> None:
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", str(PG_CTL_WAIT), action, *extra
        )

    def restart(self, mode: str = "fast") -> float:
        """Restart the server (``mode``: ``fast`` or ``immediate``, a crash); returns seconds taken."""
        began = time.monotonic()
        self._pg_ctl("restart", "-m", mode)
        return time.monotonic() - began

    def stop(self) -> None:
        """Stop the server (fast, else immediate) and remove its directory."""
        try:
            try:
                self._pg_ctl("stop", "-m", "fast")
            except RuntimeError:
                self._pg_ctl("stop", "-m", "immediate")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
