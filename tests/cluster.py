"""Private PostgreSQL servers and a PgBouncer for the tests past one database server.

The servers and the pooler are `chaos.cluster`'s and `chaos.pooler`'s, which the
chaos harness uses as well; this module adds what tests need on top: a primary with
a streaming standby as one context manager, and a skip (naming what is missing) when
the machine's binaries (Debian's ``postgresql-15`` and ``pgbouncer`` packages;
`.ci/run` installs both) are truly absent. Each server and pooler lives in a
temporary directory on a free TCP port of 127.0.0.1, with ``trust`` authentication,
and is stopped and removed on exit.
"""

from __future__ import annotations

import pwd
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:  # `pytest` run without `python -m`: the repository's chaos/
    sys.path.insert(0, _ROOT)

from chaos import pooler  # noqa: E402
from chaos.cluster import (  # noqa: E402
    SERVER_USER,
    Server,
    as_root,
    clone_standby,
    free_port,
    init_primary,
    multi_host_dsn,
    pg_bin,
    wait_replayed,
    workdir,
)
from chaos.pooler import PgBouncer, pgbouncer_bin  # noqa: E402

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
    "wait_replayed",
]


def require_binaries(*, pgbouncer: bool = False) -> Path:
    """PostgreSQL's binary directory; skips the test, saying what is missing, without them."""
    found = pg_bin()
    if found is None:
        pytest.skip(
            "no PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup): apt-get install postgresql"
        )
    if pgbouncer and pgbouncer_bin() is None:
        pytest.skip("no pgbouncer binary: apt-get install pgbouncer")
    if as_root():
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            pytest.skip(f"running as root and there is no {SERVER_USER!r} user to run the servers as")
    return found


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
    with workdir() as base:
        primary = Server("primary", binaries, base / "primary", free_port())
        standby = Server("standby", binaries, base / "standby", free_port())
        try:
            init_primary(primary, synchronous=synchronous)
            clone_standby(primary, standby, synchronous=synchronous)
            yield primary, standby
        finally:
            for server in (standby, primary):
                with suppress(RuntimeError, subprocess.TimeoutExpired):
                    server.stop("immediate")


@contextmanager
def running_pgbouncer(
    server_port: int, *, pool_size: int = 8, max_client_conn: int = 400
) -> Iterator[PgBouncer]:
    """PgBouncer in transaction pooling in front of 127.0.0.1:``server_port`` (every
    database), with ``default_pool_size = pool_size``; stopped on exit.

    Skips the test when ``pgbouncer`` is not installed.
    """
    require_binaries(pgbouncer=True)
    with pooler.running_pgbouncer(
        server_port, pool_size=pool_size, max_client_conn=max_client_conn
    ) as bouncer:
        yield bouncer
