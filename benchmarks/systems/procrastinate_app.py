"""Worker-side procrastinate app of the benchmark (imported by ``procrastinate worker``).

Reads the figure's database from ``BENCH_DSN``. The task is async, procrastinate's
recommended kind for I/O-light work, and its body is the shared no-op
:func:`~benchmarks.systems.records.run_task`.
"""

from __future__ import annotations

import os

import procrastinate

from benchmarks.systems.base import DSN_ENV
from benchmarks.systems.records import run_task

QUEUE = "bench"

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get(DSN_ENV, "")))


@app.task(name="bench", queue=QUEUE)  # type: ignore[untyped-decorator]  # the peer ships no stubs
async def bench(k: str, t: float) -> None:
    """The benchmark job: ``k`` is the job kind, ``t`` the producer's enqueue time (s)."""
    run_task(k, t)
