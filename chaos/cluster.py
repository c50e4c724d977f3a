"""Private PostgreSQL servers from the machine's binaries: a primary and its standbys.

Shared by the chaos harness and the tests past one database server (tests/cluster.py
wraps it): `init_primary` runs ``initdb`` into a directory and starts the server on a
free TCP port of 127.0.0.1 with ``trust`` authentication; `clone_standby` makes a
streaming standby of a running primary with ``pg_basebackup -R``. PostgreSQL refuses
to run as root: as root, every binary runs as the ``postgres`` system user
(``runuser``), which owns the directories.

The binaries are Debian's (``postgresql-15``): ``PGTASKS_PG_BIN`` (or
``PGTASKS_CHAOS_PGBIN``) names their directory, else the newest
``/usr/lib/postgresql/*/bin`` that has ``initdb``, ``pg_ctl`` and ``pg_basebackup``.
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

__all__ = [
    "SERVER_USER",
    "Server",
    "as_root",
    "clone_standby",
    "configure",
    "free_port",
    "init_primary",
    "multi_host_dsn",
    "own",
    "pg_bin",
    "run_binary",
    "wait_replayed",
    "wait_streaming",
    "workdir",
]

#: The system user servers run as when the caller is root.
SERVER_USER = "postgres"
#: Seconds ``pg_ctl`` waits for a start, stop, restart or promotion.
PG_CTL_WAIT = 60
#: The tools a directory of server binaries must have.
TOOLS = ("initdb", "pg_ctl", "pg_basebackup")


def pg_bin() -> Path | None:
    """The directory of ``initdb``, ``pg_ctl`` and ``pg_basebackup``, or None (see the module)."""
    given = [os.environ.get(name) for name in ("PGTASKS_PG_BIN", "PGTASKS_CHAOS_PGBIN")]

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", path.parent.name)) or (0,)

    found = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    for candidate in [Path(g) for g in given if g] + found:
        if all((candidate / tool).is_file() for tool in TOOLS):
            return candidate
    return None


def as_root() -> bool:
    """Whether this process runs as root (then servers run as `SERVER_USER`)."""
    return os.geteuid() == 0


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


def run_binary(
    args: Sequence[str], *, check: bool = True, timeout: float = PG_CTL_WAIT + 60.0
) -> subprocess.CompletedProcess[str]:
    """Run a server binary (as `SERVER_USER` when root).

    Raises:
        RuntimeError: it exited non-zero and ``check`` is set (its output is in the message).
    """
    command = ["runuser", "-u", SERVER_USER, "--", *args] if as_root() else list(args)
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}: {done.stdout}{done.stderr}")
    return done


def own(path: Path) -> None:
    """Hand ``path`` to `SERVER_USER` when root (the servers write there)."""
    if as_root():
        entry = pwd.getpwnam(SERVER_USER)
        os.chown(path, entry.pw_uid, entry.pw_gid)


@contextmanager
def workdir(prefix: str = "pgtasks-cluster-") -> Iterator[Path]:
    """A temporary directory the server user may write, removed on exit (outside
    pytest's numbered temp dirs, which a concurrent session prunes)."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o755)
    own(base)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def configure(data: Path, lines: Sequence[str]) -> None:
    """Append settings to ``data``'s postgresql.conf (later lines win)."""
    with (data / "postgresql.conf").open("a") as f:
        f.write("\n# pgtasks\n" + "\n".join(lines) + "\n")


@dataclass
class Server:
    """One private PostgreSQL server (a data directory and a port).

    Attributes:
        name: a name for messages and the log file (``primary``, ``standby``, ``pg1``).
        bin: PostgreSQL's binary directory.
        data: the data directory.
        port: its TCP port on 127.0.0.1.
        running: whether this object started it and has not stopped it.
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
        """A DSN of this server alone (superuser ``postgres``)."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def _pg_ctl(self, *args: str) -> None:
        run_binary([str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-t", str(PG_CTL_WAIT), *args])

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._pg_ctl("-l", str(self.log), "start")
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` (roll back sessions, checkpoint) or ``immediate``
        (no checkpoint: as a crash)."""
        if self.running:
            self._pg_ctl("-m", mode, "stop")
            self.running = False

    def restart(self, mode: str = "fast") -> float:
        """Restart the server (``mode``: ``fast``, or ``immediate``: a crash and recovery);
        returns the seconds it took."""
        began = time.monotonic()
        self._pg_ctl("-l", str(self.log), "-m", mode, "restart")
        self.running = True
        return time.monotonic() - began

    def promote(self) -> None:
        """Promote this standby and wait until it accepts writes."""
        self._pg_ctl("promote")

    def reload(self) -> None:
        """Make the server read its configuration files again."""
        self._pg_ctl("reload")

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


def init_primary(server: Server, settings: Sequence[str] = (), *, synchronous: bool = False) -> None:
    """``initdb`` into ``server.data`` (which must not exist), configure it for streaming
    replication, and start it.

    Args:
        server: where and on which port.
        settings: more postgresql.conf lines (after the defaults, so they win).
        synchronous: commits wait until a standby has flushed their WAL
            (``synchronous_standby_names = '*'``), so a commit acknowledged to a client
            survives the primary's loss; with no standby streaming, commits wait.
    """
    run_binary(
        [
            str(server.bin / "initdb"),
            *("-D", str(server.data), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"),
            "--locale=C",
        ]
    )
    lines = [
        f"port = {server.port}",
        "listen_addresses = '127.0.0.1'",
        "unix_socket_directories = ''",
        "wal_level = replica",
        "max_wal_senders = 5",
        "hot_standby = on",
        "max_connections = 300",
        "shared_buffers = 32MB",
        # Only server processes crash here, never the machine: what a server wrote
        # survives in the OS's cache. Full page writes stay on: base backups need them.
        "fsync = off",
        "wal_keep_size = 256MB",
        "logging_collector = off",
        "log_min_messages = warning",
    ]
    if synchronous:
        lines += ["synchronous_standby_names = '*'", "synchronous_commit = on"]
    configure(server.data, [*lines, *settings])
    server.start()


def clone_standby(primary: Server, standby: Server, *, synchronous: bool) -> None:
    """Make ``standby`` a streaming standby of the running ``primary`` and start it.

    ``standby.data`` must not exist (or be empty). ``pg_basebackup -R`` copies the
    primary's data directory and configuration and writes its ``primary_conninfo``;
    the copy gets its own port and, until it is promoted and given a standby of its
    own, no synchronous standby of its own. Waits until it streams (as the
    synchronous standby when ``synchronous``).
    """
    run_binary(
        [
            str(primary.bin / "pg_basebackup"),
            *("-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres", "-D", str(standby.data)),
            *("-R", "-X", "stream", "-c", "fast", "--no-sync"),
        ]
    )
    configure(standby.data, [f"port = {standby.port}", "synchronous_standby_names = ''"])
    standby.start()
    wait_streaming(primary, synchronous)


def wait_streaming(primary: Server, synchronous: bool, timeout: float = 60.0) -> None:
    """Wait until a standby streams from ``primary`` (and is its synchronous standby).

    Raises:
        AssertionError: none did within ``timeout`` seconds.
    """
    wanted = "sync" if synchronous else "async"
    deadline = time.monotonic() + timeout
    while True:
        with psycopg.connect(primary.dsn(), autocommit=True, connect_timeout=5) as conn:
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
    """Wait until the standby has replayed everything the primary has written so far.

    Raises:
        AssertionError: it has not within ``timeout`` seconds.
    """
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
