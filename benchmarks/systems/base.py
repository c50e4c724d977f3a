"""The base class of a benchmarked system's driver, and what the harness knows of a system.

A *driver* is a module under ``benchmarks/systems/`` named ``<name>_system.py`` that
subclasses :class:`Driver` and ends with ``main(<Driver>)`` (`benchmarks.systems.entry`).
A system implements the primitives of :class:`Driver` (``migrate``, ``enqueue_one``,
``enqueue_bulk``, ``worker_commands``, ``pending``; optionally ``fill``, ``reset``,
``serve_worker``, ``close``, and the claim-path primitives ``enqueue_chunk``,
``producers``, ``enqueue_mixed`` and ``mixed_outcome``) and the figures
(`benchmarks.systems.ops`) are measured the same way for all of them. A figure whose
primitive a system lacks is n/a for it, with the reason (`Unsupported`).

Driver-side modules run inside every system's virtual environment, so they import
nothing but the standard library.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from benchmarks.systems.clock import Unsupported
from benchmarks.systems.fleet import WorkerFleet
from benchmarks.systems.records import NOOP, RECORD_DIR_ENV, Job

# One job of the mixed-work figure: (kind, tenant, lock key or None); the kind is
# NOOP or FAIL_ONCE (`benchmarks.systems.records`).
MixedJob = tuple[str, str, str | None]

# What a worker process inherits from its driver besides ``BENCH_RECORD_DIR``.
DSN_ENV = "BENCH_DSN"
REDIS_ENV = "BENCH_REDIS_URL"


@dataclass(frozen=True, slots=True)
class SystemSpec:
    """What the harness needs to know about a system before running its driver.

    ``requirements`` are pip requirement strings installed into
    ``benchmarks/.venvs/<name>``; with none (and no ``project_dependencies``) the
    driver runs in the harness's own interpreter. ``packages`` are distribution
    names whose installed versions the report lists. ``project_dependencies`` adds the
    project's own dependencies (``pyproject.toml``) to ``requirements``: pgtasks' code
    runs from the source tree, in an environment holding what ``pip install pgtasks``
    brings. ``services`` names local services the system needs besides PostgreSQL
    (only ``"redis"`` is known). ``settings`` says, in words, the worker setting used
    for 2 cores (processes x concurrency).
    ``has_tables`` is False for a system that keeps its jobs outside PostgreSQL
    (its table sizes are then n/a, not 0).
    """

    name: str
    requirements: tuple[str, ...]
    packages: tuple[str, ...]
    settings: str
    services: tuple[str, ...] = ()
    notes: str = ""
    has_tables: bool = True
    project_dependencies: bool = False


class Producers:
    """One-call enqueue from many threads at once: what `Driver.producers` opens.

    `call` enqueues one no-op job with the system's single-job API, one call and one
    commit, on the connection of thread ``index`` (0-based, below the thread count
    the producers were opened for); different indexes may call at the same time.
    `close` releases the connections.
    """

    def call(self, index: int) -> None:
        """Enqueue one job from thread ``index``."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the connections (no call may run any more)."""


@dataclass(slots=True)
class Params:
    """Parameters of one driver invocation, as sent by the harness.

    ``dsn`` names the figure's own fresh database; ``workdir`` is an empty directory
    the driver may use; ``deadline`` is the number of seconds after which the figure
    gives up; ``args`` holds the figure's own sizes.
    """

    dsn: str
    workdir: Path
    deadline: float
    redis_url: str = ""
    args: dict[str, Any] = field(default_factory=dict)


class Driver:
    """Primitives a system implements; the figures (`benchmarks.systems.ops`) are built from them.

    Subclasses set ``spec`` and implement the primitives. Each primitive documents
    what "one job" means; ``tenant`` is ``"a"`` for tenant A's backlog and ``"b"``
    for tenant B's jobs in the fairness figure, ``None`` elsewhere. Systems without a
    tenant notion ignore it and queue everything FIFO in one queue, as their users do.
    """

    spec: ClassVar[SystemSpec]

    def __init__(self, params: Params) -> None:
        self.params = params
        self.record_dir = params.workdir / "records"
        self.record_dir.mkdir(parents=True, exist_ok=True)
        os.environ[DSN_ENV] = params.dsn
        os.environ[REDIS_ENV] = params.redis_url
        os.environ[RECORD_DIR_ENV] = str(self.record_dir)

    # -- primitives -----------------------------------------------------------------

    def migrate(self) -> None:
        """Create the system's schema in the (empty) database ``params.dsn``."""
        raise NotImplementedError

    def reset(self) -> None:
        """Empty any state kept outside PostgreSQL (the database is always fresh)."""

    def enqueue_one(self, kind: str, enqueued_at: float, tenant: str | None = None) -> None:
        """Enqueue one job with the system's single-job API (one call, one commit)."""
        raise NotImplementedError

    def enqueue_bulk(self, jobs: Sequence[Job], tenant: str | None = None) -> None:
        """Enqueue all ``jobs`` with the system's best bulk API (chunking is its call)."""
        raise NotImplementedError

    def bulk_references(self, jobs: Sequence[Job]) -> dict[str, float]:
        """Further bulk-enqueue references timed on ``jobs``: {result field: jobs/s}.

        Runs before the timed bulk enqueue of the throughput figure and must leave the
        queue as it found it. Only the raw-SQL reference has any (its multi-row INSERT
        beside its COPY); systems keep the default, none.
        """
        return {}

    def enqueue_chunk(self, jobs: Sequence[Job]) -> None:
        """Enqueue ``jobs`` (at most 1,000 here) with one call of the bulk API, one commit.

        The bulk figure in calls of 1,000 calls it once per chunk. The default is one
        `enqueue_bulk` call (every system's bulk chunk is larger than 1,000); the raw
        reference overrides it with its multi-row ``INSERT``.
        """
        self.enqueue_bulk(jobs)

    def producers(self, threads: int) -> Producers:
        """`Producers` for ``threads`` threads, each with its own pooled connection.

        Raises:
            Unsupported: the system does not run the concurrent-enqueue figure.
        """
        raise Unsupported(f"{self.spec.name} does not run the concurrent-enqueue figure")

    def enqueue_mixed(self, jobs: Sequence[MixedJob]) -> None:
        """Enqueue the mixed-work figure's ``jobs``: each in its tenant, with its lock key.

        A job of kind ``FAIL_ONCE`` must fail its first attempt (calling
        ``record_failed_attempt()`` first) and be retried with no delay; every job's
        successful attempt calls ``run_task(k, t)``.

        Raises:
            Unsupported: the system lacks tenants, lock keys or retries.
        """
        raise Unsupported(f"{self.spec.name} has no tenants, lock keys and retries to run mixed work with")

    def mixed_outcome(self) -> dict[str, int]:
        """After the mixed-work figure, the system's own record of its jobs.

        ``{"succeeded": jobs that ended succeeded, "other": jobs in any other state,
        "retried": jobs that took more than one attempt}``.
        """
        raise Unsupported(f"{self.spec.name} does not run the mixed-work figure")

    def fill(self, n: int, tenant: str | None = None) -> None:
        """Put ``n`` due no-op jobs in the queue by the fastest documented way."""
        self.enqueue_bulk([(NOOP, 0.0)] * n, tenant)

    def analyze(self) -> None:
        """Refresh the planner statistics of the system's tables (``ANALYZE``).

        Called after a backlog is filled and before the workers start: every figure
        runs in a fresh database whose tables were never analyzed, and a long-lived
        queue table would have statistics from autovacuum. Without them the planner
        may sort the whole queue for every claim (seen with procrastinate: 11 ms
        instead of 0.08 ms per fetch with 20,000 queued jobs, 60 instead of 900
        jobs/s). The default runs ``ANALYZE`` on ``params.dsn`` with psycopg; a
        system whose venv lacks psycopg overrides it. Raises ImportError then.
        """
        if not self.spec.has_tables:
            return
        import psycopg  # the system's venv has it unless the system overrides this method

        with psycopg.connect(self.params.dsn, autocommit=True) as conn:
            conn.execute("ANALYZE")

    def worker_commands(self) -> list[list[str]]:
        """One argv per worker process, for the 2-core setting named in ``spec.settings``."""
        raise NotImplementedError

    def pending(self) -> int | None:
        """Jobs the system itself still counts as not finished, or None if it cannot tell."""
        raise NotImplementedError

    def finished(self) -> int | None:
        """Jobs the system has recorded as finished in this figure's database, or None.

        Optional: a system whose schema counts its finished jobs cheaply (an index, a
        worker-side tally written after each commit) returns that count, and the
        harness waits on it instead of :meth:`pending`. Counting what is still
        unfinished reads the whole backlog, about 0.3 s per count with 1,000,000 jobs
        queued here, and the last such count before the system agreed lands inside the
        timed window of the deep-queue figure.
        """
        return None

    @classmethod
    def serve_worker(cls, params: Params) -> None:
        """Run a worker in this process (only for systems whose worker is the driver module)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release connections."""

    # -- helpers ----------------------------------------------------------------------

    def fleet(self, processes: int | None = None) -> WorkerFleet:
        """A not yet started fleet running :meth:`worker_commands` (the first ``processes`` of them)."""
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        return WorkerFleet(self.worker_commands()[:processes], env, self.params.workdir)
