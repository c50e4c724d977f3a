"""Raw-SQL reference: the practical limit of Python + PostgreSQL on this machine.

Plain psycopg 3, no framework: a tiny table with a partial index on queued rows;
single-row INSERT per enqueue (autocommit); COPY for bulk, and beside it a multi-row
INSERT of the same jobs (1,000 rows per statement, one transaction) into a scratch
copy of the table, reported as a second bulk reference; a worker claims 100 rows
at a time through a CTE with ``FOR UPDATE SKIP LOCKED`` and completes the whole batch
with one ``UPDATE ... WHERE id = ANY(%s)``. Two worker processes (2 cores); an idle
worker polls every 10 ms. Finished rows are kept (status ``done``), so the deep-queue
sizes show the table a system that keeps history would have.

Claim-path references: bulk in calls of 1,000 is one multi-row ``INSERT`` of 1,000
rows per statement into ``bench_jobs``, each statement its own commit (autocommit);
concurrent enqueue is the single-row ``INSERT`` from each thread on a psycopg
connection of its own (as a pool sized to the threads would hand out).

Mixed work (`benchmarks.systems.ops.figure_mixed`): the same worker, given the least
SQL that does that work correctly, so that what the work itself costs shows beside
pgtasks' figure. The table gains a lock key and an attempt counter (nullable
columns, added when the mixed jobs are enqueued) and a unique index of running lock
keys; a claim skips a locked job whose key runs or is being claimed by the other
worker (a transaction-level advisory lock on the key, as pgtasks takes), takes at
most one job per key, and counts the attempt; a failing first attempt goes back to
``queued`` (retried at once), the rest are completed as in plain processing. A claim
that still meets a running key (the unique index) is retried at once. The tenant is
stored but not served in turn: this reference has no fairness.

Runs in its own virtual environment holding psycopg.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.systems.base import Driver, MixedJob, Params, Producers, SystemSpec
from benchmarks.systems.entry import main
from benchmarks.systems.records import (
    FAIL_ONCE,
    Job,
    committed_count,
    record_committed,
    record_failed_attempt,
    run_task,
)

WORKER_PROCESSES = 2
CLAIM_BATCH = 100
IDLE_POLL_SECONDS = 0.01

SCHEMA = """
CREATE TABLE bench_jobs (
    id bigserial PRIMARY KEY,
    args jsonb NOT NULL,
    status text NOT NULL DEFAULT 'queued' CHECK (status IN ('queued', 'running', 'done')),
    enqueued_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX bench_jobs_queued ON bench_jobs (id) WHERE status = 'queued';
"""

INSERT = "INSERT INTO bench_jobs (args) VALUES (%s::jsonb)"
COPY = "COPY bench_jobs (args) FROM STDIN"
# The multi-row INSERT reference writes into a scratch table shaped like bench_jobs
# (same columns, defaults, constraints and indexes), dropped before the COPY is timed.
SCRATCH_CREATE = "CREATE TABLE bench_jobs_insert (LIKE bench_jobs INCLUDING ALL)"
SCRATCH_DROP = "DROP TABLE bench_jobs_insert"
INSERT_MANY_ROWS = 1000
INSERT_MANY = "INSERT INTO bench_jobs_insert (args) VALUES "
INSERT_CHUNK = "INSERT INTO bench_jobs (args) VALUES "
CLAIM = """
WITH c AS (
    SELECT id FROM bench_jobs WHERE status = 'queued' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
)
UPDATE bench_jobs j SET status = 'running' FROM c WHERE j.id = c.id RETURNING j.id, j.args
"""
COMPLETE = "UPDATE bench_jobs SET status = 'done' WHERE id = ANY(%s) AND status = 'running'"
MIXED_SCHEMA = """
ALTER TABLE bench_jobs ADD COLUMN tenant text, ADD COLUMN lock_key text, ADD COLUMN attempt integer;
CREATE UNIQUE INDEX bench_jobs_lock_running ON bench_jobs (lock_key)
    WHERE status = 'running' AND lock_key IS NOT NULL;
"""
MIXED_COPY = "COPY bench_jobs (args, tenant, lock_key) FROM STDIN"
MIXED_CLAIM = """
WITH c AS (
    SELECT id, lock_key FROM bench_jobs j
    WHERE status = 'queued'
      AND (lock_key IS NULL OR (
            NOT EXISTS (SELECT 1 FROM bench_jobs r WHERE r.lock_key = j.lock_key AND r.status = 'running')
            AND pg_try_advisory_xact_lock(hashtext(lock_key))))
    ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
), one_per_key AS (
    SELECT id FROM c WHERE lock_key IS NULL
    UNION ALL
    SELECT DISTINCT ON (lock_key) id FROM c WHERE lock_key IS NOT NULL
)
UPDATE bench_jobs j SET status = 'running', attempt = coalesce(j.attempt, 0) + 1
FROM one_per_key o WHERE j.id = o.id RETURNING j.id, j.args, j.attempt
"""
RETRY = "UPDATE bench_jobs SET status = 'queued' WHERE id = ANY(%s) AND status = 'running'"
PLAIN_OUTCOME = (
    "SELECT count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status <> 'done') FROM bench_jobs"
)
MIXED_OUTCOME = (
    "SELECT count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status <> 'done'),"
    " count(*) FILTER (WHERE attempt > 1) FROM bench_jobs"
)
PENDING = "SELECT count(*) FROM bench_jobs WHERE status IN ('queued', 'running')"


def _multi_row_insert(conn: Any, statement: str, jobs: Sequence[Job]) -> None:
    """One ``statement || (%s::jsonb), ...`` of ``jobs``; the rows travel as parameters."""
    values = ", ".join(["(%s::jsonb)"] * len(jobs))
    conn.execute(
        statement + values, [json.dumps({"k": kind, "t": enqueued_at}) for kind, enqueued_at in jobs]
    )


class RawProducers(Producers):
    """The single-row ``INSERT`` from each thread on a psycopg connection of its own."""

    def __init__(self, dsn: str, threads: int) -> None:
        import psycopg

        self.conns = [psycopg.connect(dsn, autocommit=True) for _ in range(threads)]
        self.args = json.dumps({"k": "n", "t": 0.0})

    def call(self, index: int) -> None:
        self.conns[index].execute(INSERT, (self.args,))

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


class RawDriver(Driver):
    """psycopg 3 with autocommit; see the module docstring for the SQL."""

    spec = SystemSpec(
        name="raw",
        requirements=("psycopg[binary]>=3.2",),
        packages=("psycopg", "psycopg-binary"),
        settings=(
            f"2 processes x 1 loop, claim batch {CLAIM_BATCH}, idle poll {IDLE_POLL_SECONDS * 1000:.0f} ms"
        ),
        notes="reference: plain psycopg 3, CTE claim with SKIP LOCKED, COPY for bulk",
    )

    def __init__(self, params: Params) -> None:
        super().__init__(params)
        import psycopg

        self.conn = psycopg.connect(params.dsn, autocommit=True)
        self.mixed = False

    def migrate(self) -> None:
        self.conn.execute(SCHEMA)

    def enqueue_one(self, kind: str, enqueued_at: float, tenant: str | None = None) -> None:
        self.conn.execute(INSERT, (json.dumps({"k": kind, "t": enqueued_at}),))

    def enqueue_bulk(self, jobs: Sequence[Job], tenant: str | None = None) -> None:
        with self.conn.cursor() as cur, cur.copy(COPY) as copy:
            for kind, enqueued_at in jobs:
                copy.write_row((json.dumps({"k": kind, "t": enqueued_at}),))

    def bulk_references(self, jobs: Sequence[Job]) -> dict[str, float]:
        """The multi-row INSERT reference: ``bulk_insert_jobs_per_s`` over ``jobs``."""
        self.conn.execute(SCRATCH_CREATE)
        start = time.perf_counter()
        with self.conn.transaction():
            for first in range(0, len(jobs), INSERT_MANY_ROWS):
                _multi_row_insert(self.conn, INSERT_MANY, jobs[first : first + INSERT_MANY_ROWS])
        seconds = time.perf_counter() - start
        self.conn.execute(SCRATCH_DROP)
        return {"bulk_insert_jobs_per_s": len(jobs) / seconds}

    def enqueue_chunk(self, jobs: Sequence[Job]) -> None:
        """One multi-row ``INSERT`` of ``jobs`` into the queue, its own commit (autocommit)."""
        _multi_row_insert(self.conn, INSERT_CHUNK, jobs)

    def producers(self, threads: int) -> Producers:
        return RawProducers(self.params.dsn, threads)

    def enqueue_mixed(self, jobs: Sequence[MixedJob]) -> None:
        """Add the mixed-work columns and index, then COPY ``jobs`` (see the module docstring);
        the workers started after this claim them as mixed work. Jobs with neither a
        lock key nor a planned failure are plain processing, enqueued and claimed as such."""
        if all(kind != FAIL_ONCE and lock is None for kind, _, lock in jobs):
            self.enqueue_bulk([(kind, 0.0) for kind, _, _ in jobs])
            return
        self.conn.execute(MIXED_SCHEMA)
        with self.conn.cursor() as cur, cur.copy(MIXED_COPY) as copy:
            for kind, tenant, lock in jobs:
                copy.write_row((json.dumps({"k": kind, "t": 0.0}), tenant, lock))
        self.mixed = True

    def mixed_outcome(self) -> dict[str, int]:
        if not self.mixed:  # plain processing: no attempt column, no retries
            row = self.conn.execute(PLAIN_OUTCOME).fetchone()
            assert row is not None  # an aggregate returns one row
            return {"succeeded": int(row[0]), "other": int(row[1]), "retried": 0}
        row = self.conn.execute(MIXED_OUTCOME).fetchone()
        assert row is not None  # an aggregate returns one row
        return {"succeeded": int(row[0]), "other": int(row[1]), "retried": int(row[2])}

    def worker_commands(self) -> list[list[str]]:
        command = [sys.executable, "-m", "benchmarks.systems.raw_system", "worker"]
        if self.mixed:
            command.append(json.dumps({"args": {"mixed": True}}))
        return [command] * WORKER_PROCESSES

    def pending(self) -> int | None:
        row = self.conn.execute(PENDING).fetchone()
        return int(row[0]) if row else 0

    def finished(self) -> int | None:
        # The workers tally each batch once its COMPLETE has committed (autocommit).
        return committed_count(self.record_dir)

    @classmethod
    def serve_worker(cls, params: Params) -> None:
        import psycopg

        if params.args.get("mixed"):
            cls._serve_mixed(params)
            return
        with psycopg.connect(params.dsn, autocommit=True) as conn:
            while True:
                rows: list[tuple[int, Any]] = conn.execute(CLAIM, (CLAIM_BATCH,)).fetchall()
                if not rows:
                    time.sleep(IDLE_POLL_SECONDS)
                    continue
                for _, args in rows:
                    run_task(args["k"], args["t"])
                conn.execute(COMPLETE, ([row[0] for row in rows],))
                record_committed(len(rows))

    @classmethod
    def _serve_mixed(cls, params: Params) -> None:
        """The worker loop of mixed work (see the module docstring)."""
        import psycopg

        with psycopg.connect(params.dsn, autocommit=True) as conn:
            while True:
                try:
                    rows: list[tuple[int, Any, int]] = conn.execute(MIXED_CLAIM, (CLAIM_BATCH,)).fetchall()
                except psycopg.errors.UniqueViolation:
                    continue  # a key's job committed running after this claim's snapshot
                if not rows:
                    time.sleep(IDLE_POLL_SECONDS)
                    continue
                done: list[int] = []
                retry: list[int] = []
                for job_id, args, attempt in rows:
                    if args["k"] == FAIL_ONCE and attempt == 1:
                        record_failed_attempt()
                        retry.append(job_id)
                    else:
                        run_task(args["k"], args["t"])
                        done.append(job_id)
                if retry:
                    conn.execute(RETRY, (retry,))
                if done:
                    conn.execute(COMPLETE, (done,))
                    record_committed(len(done))

    def close(self) -> None:
        self.conn.close()


SYSTEM = RawDriver.spec
DRIVER = RawDriver

if __name__ == "__main__":
    main(RawDriver)
