"""PgQueuer 1.x peer.

Enqueue one: ``await queries.enqueue("bench", payload)`` on an asyncpg connection.
Bulk: the same call with lists (PgQueuer's batch form: one INSERT ... unnest per
chunk of 10,000). Workers: 2 processes (one per core) running ``pgqueuer.run``
(what ``pgq run`` runs; see ``pgqueuer_app``) on uvloop, each pulling
batches of ``--batch-size`` jobs with unlimited async concurrency. PgQueuer deletes
a finished job from its queue table and logs it to ``pgqueuer_log`` (its default).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from benchmarks.systems.base import Driver, Params, SystemSpec
from benchmarks.systems.entry import main
from benchmarks.systems.records import Job, job_args

WORKER_PROCESSES = 2
BATCH_SIZE = int(os.environ.get("BENCH_PGQUEUER_BATCH", "100"))
BULK_CHUNK = 10_000
ENTRYPOINT = "bench"


class PgqueuerDriver(Driver):
    """PgQueuer through ``Queries`` on asyncpg; ``pending`` counts its queue table."""

    spec = SystemSpec(
        name="pgqueuer",
        requirements=("pgqueuer>=1,<2", "asyncpg>=0.29"),
        packages=("pgqueuer", "asyncpg"),
        settings=f"{WORKER_PROCESSES} processes x batch {BATCH_SIZE}, unlimited async concurrency",
        notes="asyncpg driver; list enqueue in chunks of 10,000; finished jobs move to pgqueuer_log",
    )

    def __init__(self, params: Params) -> None:
        super().__init__(params)
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries

        self.loop = asyncio.new_event_loop()
        self.connection = self.loop.run_until_complete(asyncpg.connect(params.dsn))
        self.queries = Queries(AsyncpgDriver(self.connection))

    def _run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def migrate(self) -> None:
        self._run(self.queries.install())

    def enqueue_one(self, kind: str, enqueued_at: float, tenant: str | None = None) -> None:
        self._run(self.queries.enqueue(ENTRYPOINT, json.dumps(job_args(kind, enqueued_at)).encode()))

    def enqueue_bulk(self, jobs: Sequence[Job], tenant: str | None = None) -> None:
        for start in range(0, len(jobs), BULK_CHUNK):
            chunk = jobs[start : start + BULK_CHUNK]
            payloads: list[bytes | None] = [json.dumps(job_args(k, t)).encode() for k, t in chunk]
            self._run(self.queries.enqueue([ENTRYPOINT] * len(chunk), payloads, [0] * len(chunk)))

    def analyze(self) -> None:
        self._run(self.connection.execute("ANALYZE"))

    def worker_commands(self) -> list[list[str]]:
        command = [sys.executable, "-m", "benchmarks.systems.pgqueuer_app", str(BATCH_SIZE)]
        return [command] * WORKER_PROCESSES

    def pending(self) -> int | None:
        return int(self._run(self.connection.fetchval("SELECT count(*) FROM pgqueuer")))

    def close(self) -> None:
        self._run(self.connection.close())
        self.loop.close()


SYSTEM = PgqueuerDriver.spec
DRIVER = PgqueuerDriver

if __name__ == "__main__":
    main(PgqueuerDriver)
