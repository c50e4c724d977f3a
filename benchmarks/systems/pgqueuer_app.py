"""Worker-side PgQueuer factory of the benchmark, and its worker entry point.

``python -m benchmarks.systems.pgqueuer_app BATCH_SIZE`` runs
``pgqueuer.run(create, batch_size=...)`` on uvloop, which is what ``pgq run`` does;
the CLI itself is not used because ``pgq run`` of PgQueuer 1.6 with typer 0.29
fails while parsing its default ``--log-level``.

One asyncpg connection per worker process (PgQueuer's default driver), the figure's
database from ``BENCH_DSN``, one async entrypoint whose body is the shared no-op
:func:`~benchmarks.systems.records.run_task`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pgqueuer
from pgqueuer import Job, PgQueuer

from benchmarks.systems.base import DSN_ENV
from benchmarks.systems.records import run_task

ENTRYPOINT = "bench"


@asynccontextmanager
async def create() -> AsyncIterator[PgQueuer]:
    """The PgQueuer instance a ``pgq run`` worker serves."""
    connection = await asyncpg.connect(os.environ[DSN_ENV])
    pgq = PgQueuer.from_asyncpg_connection(connection)

    @pgq.entrypoint(ENTRYPOINT)  # type: ignore[untyped-decorator]  # the peer ships no stubs
    async def bench(job: Job) -> None:
        args = json.loads(job.payload or b"{}")
        run_task(args["k"], args["t"])

    try:
        yield pgq
    finally:
        await connection.close()


def serve(batch_size: int) -> None:
    """Run one worker until SIGTERM/SIGINT; ``batch_size`` jobs are pulled at once."""
    logging.basicConfig(level=logging.WARNING)
    worker = pgqueuer.run(create, batch_size=batch_size)
    try:
        import uvloop
    except ImportError:
        asyncio.run(worker)
    else:
        uvloop.run(worker)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
