"""The run's database servers: a primary, its synchronous standby, optionally a PgBouncer.

The harness restarts and fails over PostgreSQL as faults, so it never uses a server
it did not start. `Servers` builds them with `chaos.cluster` (the tests' mechanisms)
in one temporary directory: two PostgreSQL servers on fixed ports of 127.0.0.1, one
the primary and one a streaming standby that every commit waits for
(``synchronous_standby_names = '*'``), so an acknowledged commit survives the
primary's loss. Every client reaches the primary through one libpq multi-host DSN
(``host=127.0.0.1,127.0.0.1 port=P1,P2 ... target_session_attrs=read-write``): its
ports never change, only which of the two servers accepts writes.

`Servers.failover` stops the primary (``fast`` or ``immediate``), promotes the
standby, points the pooler at it, then rebuilds the old primary as the new
primary's standby (``pg_basebackup`` on the same port: the old primary's data,
including any WAL it wrote that was never acknowledged, is discarded) and makes it
synchronous again. Between the promotion and that moment the new primary commits
without a standby; no failover is made in that window (the injector waits for the
rebuild), so no acknowledged commit can be lost. A restart always restarts whichever
server is the primary then.

With ``pooler``, the fleet goes through a PgBouncer in transaction pooling in front
of the primary, as docs/operations.md says to deploy it: ``PGTASKS_LISTEN=off`` and
``PGTASKS_PREPARE_THRESHOLD=off`` (PgBouncer 1.18 keeps no prepared statements). After
a failover, PgBouncer is pointed at the new primary and reloaded, as a failover
manager's hook does. The harness's own reads and checks go to the servers directly.
"""

from __future__ import annotations

import shutil
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import psycopg

from chaos.cluster import (
    Server,
    clone_standby,
    configure,
    free_port,
    init_primary,
    multi_host_dsn,
    pg_bin,
    wait_streaming,
    workdir,
)
from chaos.pooler import PgBouncer, pgbouncer_bin, running_pgbouncer

__all__ = ["DATABASE", "POOLED_ENV", "Failover", "Servers", "find_bindir", "pgbouncer_bin"]

#: The database the run's app, workers and schedulers use.
DATABASE = "chaos"
#: What every process through the pooler sets (docs/operations.md, PgBouncer).
POOLED_ENV = {"PGTASKS_PREPARE_THRESHOLD": "off", "PGTASKS_LISTEN": "off"}
#: Server connections PgBouncer opens to the database (more than the fleet's job
#: slots: an open ``self.transaction()`` holds one while its body runs).
POOL_SIZE = 24
#: Seconds PgBouncer waits after a failed server login before it tries again.
SERVER_LOGIN_RETRY = 1.0

#: The server binaries, or None (``PGTASKS_PG_BIN``/``PGTASKS_CHAOS_PGBIN``, else Debian's newest).
find_bindir = pg_bin


@dataclass(frozen=True)
class Failover:
    """A failover as it happened (Unix seconds): the primary's stop began, the standby
    accepted writes (and the pooler followed it), and the new standby streamed
    synchronously again."""

    began: float
    promoted: float
    rebuilt: float
    old_port: int
    new_port: int


def _make_synchronous(primary: Server) -> None:
    """From now on every commit on ``primary`` waits for its standby's flush; returns once
    the standby streams as the synchronous one (commits made before did not wait)."""
    configure(primary.data, ["synchronous_standby_names = '*'", "synchronous_commit = on"])
    primary.reload()
    wait_streaming(primary, synchronous=True)


class Servers:
    """The run's primary and synchronous standby, and with ``pooler`` a PgBouncer.

    Args:
        bindir: PostgreSQL's binary directory (``initdb``, ``pg_ctl``, ``pg_basebackup``).
        pooler: run the fleet through PgBouncer in transaction pooling.

    Raises:
        RuntimeError: a server command failed (its output is in the message), or
            ``pooler`` is set and ``pgbouncer`` is not installed.
    """

    def __init__(self, bindir: Path, *, pooler: bool = False) -> None:
        self.bindir = bindir
        self.pooled = pooler
        self.bouncer: PgBouncer | None = None
        self._stack = ExitStack()
        base = self._stack.enter_context(workdir("pgtasks-chaos-"))
        self.primary = Server("pg1", bindir, base / "pg1", free_port())
        self.standby = Server("pg2", bindir, base / "pg2", free_port())
        self._ports = (self.primary.port, self.standby.port)

    def start(self) -> None:
        """Start the primary, create the run's database, clone the standby and wait
        until it streams synchronously; start the pooler when asked for."""
        try:
            init_primary(self.primary)
            with psycopg.connect(self.primary.dsn(), autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {DATABASE}")
            clone_standby(self.primary, self.standby, synchronous=False)
            _make_synchronous(self.primary)
            if self.pooled:
                self.bouncer = self._stack.enter_context(
                    running_pgbouncer(
                        self.primary.port, pool_size=POOL_SIZE, server_login_retry=SERVER_LOGIN_RETRY
                    )
                )
        except BaseException:
            self.stop()
            raise

    def admin_dsn(self) -> str:
        """The multi-host DSN of the run's database on whichever server is the primary
        (the harness's own reads, checks and migration: never through the pooler)."""
        hosts = [self.primary, self.standby]
        hosts.sort(key=lambda s: self._ports.index(s.port))  # fixed order: the ports never change
        return multi_host_dsn(hosts, DATABASE)

    def fleet_dsn(self) -> str:
        """The DSN the fleet and the producer use: PgBouncer's, else `admin_dsn`."""
        return self.bouncer.dsn(DATABASE) if self.bouncer is not None else self.admin_dsn()

    def fleet_env(self) -> dict[str, str]:
        """Environment every process of the fleet gets on top of the harness's."""
        return dict(POOLED_ENV) if self.pooled else {}

    def describe(self) -> str:
        """One line for the report: the servers and how the fleet reaches them."""
        way = (
            f"through {self.bouncer.version if self.bouncer else 'PgBouncer'} (transaction pooling)"
            if self.pooled
            else "directly (libpq multi-host DSN, target_session_attrs=read-write)"
        )
        return f"primary + synchronous standby, fleet connects {way}"

    def restart(self, mode: str) -> float:
        """Restart the current primary (``fast``, or ``immediate``: a crash); returns seconds."""
        return self.primary.restart(mode)

    def failover(self, mode: str) -> Failover:
        """Stop the primary (``mode``), promote the standby, point the pooler at it,
        rebuild the old primary as its synchronous standby; see the module docstring."""
        old, new = self.primary, self.standby
        began = time.time()
        old.stop(mode)
        new.promote()
        if self.bouncer is not None:
            self.bouncer.retarget(new.port)
        promoted = time.time()
        self.primary, self.standby = new, old
        shutil.rmtree(old.data)
        clone_standby(new, old, synchronous=False)
        _make_synchronous(new)
        return Failover(began, promoted, time.time(), old.port, new.port)

    def stop(self) -> None:
        """Stop the pooler and both servers (fast, else immediate); remove their directory."""
        try:
            for server in (self.primary, self.standby):
                try:
                    server.stop("fast")
                except Exception:
                    try:
                        server.stop("immediate")
                    except Exception:
                        server.running = False
        finally:
            self._stack.close()
