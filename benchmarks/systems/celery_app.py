"""Worker-side Celery app of the benchmark (``celery -A benchmarks.systems.celery_app``).

Broker: Redis at ``BENCH_REDIS_URL``. No result backend: results are ignored
(``task_ignore_result``), as is usual for fire-and-forget jobs; the benchmark learns
of completions from :func:`~benchmarks.systems.records.run_task`'s files, like for every
other system. Everything else is Celery's default (acks early, prefetch multiplier 4).
"""

from __future__ import annotations

import os

from celery import Celery

from benchmarks.systems.base import REDIS_ENV
from benchmarks.systems.records import run_task

QUEUE = "bench"

app = Celery("bench", broker=os.environ.get(REDIS_ENV) or "redis://127.0.0.1:6379/9")
app.conf.update(
    task_ignore_result=True,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="bench")  # type: ignore[untyped-decorator]  # the peer ships no stubs
def bench(k: str, t: float) -> None:
    """The benchmark job: ``k`` is the job kind, ``t`` the producer's enqueue time (s)."""
    run_task(k, t)
