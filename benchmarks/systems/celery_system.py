"""Celery 5.x peer, Redis broker on 127.0.0.1:6379, no result backend.

Enqueue one: ``task.delay(k, t)``. Bulk: Celery has no bulk insert; its documented
way to send many tasks at once is a ``group`` (one producer, one connection, one
message per task), sent here in chunks of 1,000 signatures. Workers: one
``celery worker`` node with the prefork pool and ``--concurrency 2`` (Celery's default
for 2 cores), default prefetch multiplier 4, gossip/mingle/heartbeat off as the
Celery docs advise for large fleets. Backlogs for the fairness and deep-queue figures
are filled by copying one message that ``delay`` produced, with fresh ids, into the
queue list through a Redis pipeline (group would take minutes per million). Jobs
live in Redis, so there is no PostgreSQL
table to measure, and ``pending`` cannot tell completions (none are stored): the task
files are the only completion signal.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Sequence
from urllib.parse import urlsplit

from benchmarks.systems.base import Driver, Params, SystemSpec
from benchmarks.systems.entry import main
from benchmarks.systems.records import NOOP, Job

CONCURRENCY = int(os.environ.get("BENCH_CELERY_CONCURRENCY", "2"))
PREFETCH = os.environ.get("BENCH_CELERY_PREFETCH", "4")
GROUP_CHUNK = 1_000
FILL_CHUNK = 10_000
QUEUE = "bench"


class CeleryDriver(Driver):
    """Celery through ``delay`` and ``group``; FLUSHDB of its Redis database per figure."""

    spec = SystemSpec(
        name="celery",
        requirements=("celery[redis]>=5,<6",),
        packages=("celery", "kombu", "redis"),
        settings=f"1 node x prefork concurrency {CONCURRENCY}, prefetch multiplier {PREFETCH}",
        services=("redis",),
        has_tables=False,
        notes="Redis broker, no result backend (task_ignore_result); bulk = group in chunks of 1,000; "
        "no PostgreSQL tables",
    )

    def __init__(self, params: Params) -> None:
        super().__init__(params)
        import redis

        from benchmarks.systems import celery_app

        self.task = celery_app.bench
        self.app = celery_app.app
        self.redis = redis.Redis.from_url(params.redis_url)

    def migrate(self) -> None:
        """Nothing: Celery keeps no schema."""

    def reset(self) -> None:
        self.redis.flushdb()

    def enqueue_one(self, kind: str, enqueued_at: float, tenant: str | None = None) -> None:
        self.task.delay(kind, enqueued_at)

    def enqueue_bulk(self, jobs: Sequence[Job], tenant: str | None = None) -> None:
        from celery import group

        for start in range(0, len(jobs), GROUP_CHUNK):
            group(self.task.s(k, t) for k, t in jobs[start : start + GROUP_CHUNK]).apply_async()

    def fill(self, n: int, tenant: str | None = None) -> None:
        self.task.delay(NOOP, 0.0)
        template = json.loads(self.redis.rpop(QUEUE))
        pipeline = self.redis.pipeline(transaction=False)
        for i in range(n):
            task_id = str(uuid.uuid4())
            template["headers"]["id"] = template["headers"]["root_id"] = task_id
            template["properties"]["correlation_id"] = task_id
            template["properties"]["delivery_tag"] = str(uuid.uuid4())
            pipeline.lpush(QUEUE, json.dumps(template))
            if (i + 1) % FILL_CHUNK == 0:
                pipeline.execute()
        pipeline.execute()

    def worker_commands(self) -> list[list[str]]:
        database = urlsplit(self.params.redis_url).path.strip("/") or "0"
        return [
            [
                sys.executable, "-m", "celery", "-A", "benchmarks.systems.celery_app", "worker",
                "--pool", "prefork", "--concurrency", str(CONCURRENCY),
                "--prefetch-multiplier", PREFETCH, "--queues", "bench",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
                "--loglevel", "WARNING", "--hostname", f"bench-{database}@%h",
            ]
        ]  # fmt: skip

    def pending(self) -> int | None:
        return None

    def close(self) -> None:
        self.redis.flushdb()  # a deep backlog left in Redis would hold gigabytes of memory
        self.redis.close()


SYSTEM = CeleryDriver.spec
DRIVER = CeleryDriver

if __name__ == "__main__":
    main(CeleryDriver)
