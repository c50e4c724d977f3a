"""The figures, one function per driver op, built from the primitives of `Driver`.

Each takes the driver, the op's `Clock` and the op's own sizes (``Params.args``, from
`benchmarks.figures.RUNS`), and returns the op's result fields. `FIGURES` maps op
names to them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.systems.base import Driver
from benchmarks.systems.clock import Clock
from benchmarks.systems.drain import wait_processed
from benchmarks.systems.records import (
    LATENCY,
    NOOP,
    TENANT_A,
    TENANT_B,
    TENANT_B_NAME,
    WARMUP,
    progress_count,
    read_records,
)


def figure_enqueue_one(driver: Driver, clock: Clock, n: int) -> dict[str, Any]:
    """Enqueue ``n`` jobs one call each; ``jobs_per_s`` is n over the wall time."""
    start = time.perf_counter()
    for i in range(n):
        driver.enqueue_one(NOOP, time.time())
        if i % 500 == 0:
            clock.check(f"enqueueing one by one ({i} of {n})")
    seconds = time.perf_counter() - start
    return {"jobs": n, "seconds": seconds, "jobs_per_s": n / seconds}


# The planner statistics a processing figure's queue has when the workers start (each
# figure's database is a fresh clone whose tables were never analyzed):
# - "none": no ANALYZE after the fill: a queue table freshly deployed, as users meet it;
# - "empty": ANALYZE while the table was empty, then the fill: a queue that autovacuum
#   analyzed while it was (nearly) empty and that then receives a burst;
# - "analyzed": ANALYZE after the fill, the statistics describing the backlog.
STATISTICS = ("none", "empty", "analyzed")


def figure_throughput(
    driver: Driver, clock: Clock, n: int, cap: float | None = None, stats: str = "none"
) -> dict[str, Any]:
    """Bulk-enqueue ``n`` jobs (timed), then process them with the workers (timed).

    The driver's `Driver.bulk_references` are timed first, on the same jobs. ``stats``
    is one of `STATISTICS`: when, if ever, the tables are analyzed (`Driver.analyze`).

    Processing stops after ``cap`` seconds (partial result) if not done by then.

    Raises:
        ValueError: ``stats`` is not one of `STATISTICS`.
    """
    if stats not in STATISTICS:
        raise ValueError(f"stats must be one of {STATISTICS}, got {stats!r}")
    jobs = [(NOOP, 0.0)] * n
    references = driver.bulk_references(jobs)
    if stats == "empty":
        driver.analyze()
    start = time.perf_counter()
    driver.enqueue_bulk(jobs)
    bulk_seconds = time.perf_counter() - start
    clock.check("bulk enqueueing")
    if stats == "analyzed":
        driver.analyze()
    fleet = driver.fleet()
    fleet.start()
    try:
        drain = wait_processed(driver, fleet, n, n, clock, cap=cap)
    finally:
        fleet.stop()
    return {
        "jobs": n,
        "stats": stats,
        "bulk_seconds": bulk_seconds,
        "bulk_jobs_per_s": n / bulk_seconds,
        **references,
        **drain.as_result(),
        **fleet.memory(),
    }


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an ascending sequence."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


def figure_latency(driver: Driver, clock: Clock, rate: float, seconds: float) -> dict[str, Any]:
    """Enqueue at ``rate`` jobs/s for ``seconds`` s; enqueue -> task start, in ms."""
    fleet = driver.fleet()
    fleet.start()
    try:
        warm = 2 * max(1, len(fleet.commands))
        for _ in range(warm):
            driver.enqueue_one(WARMUP, time.time())
        while progress_count(driver.record_dir) < warm:
            fleet.check_alive()
            clock.check("waiting for the workers to start")
            time.sleep(0.01)
        time.sleep(0.5)  # let the workers settle back into their idle wait
        count = max(1, int(rate * seconds))
        start = time.perf_counter()
        for i in range(count):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            driver.enqueue_one(LATENCY, time.time())
        produce_seconds = time.perf_counter() - start
        while True:
            records = [r for r in read_records(driver.record_dir) if r.kind == LATENCY]
            if len(records) >= count:
                break
            fleet.check_alive()
            clock.check(f"waiting for latency probes ({len(records)} of {count})")
            time.sleep(0.02)
    finally:
        fleet.stop()
    latencies = sorted((r.started_at - r.enqueued_at) * 1000.0 for r in records)
    return {
        "jobs": count,
        "achieved_rate": count / produce_seconds if produce_seconds > 0 else float("nan"),
        "p50_ms": _percentile(latencies, 50),
        "p95_ms": _percentile(latencies, 95),
        "p99_ms": _percentile(latencies, 99),
        "max_ms": latencies[-1],
        **fleet.memory(),
    }


def figure_fairness(
    driver: Driver, clock: Clock, backlog: int, n_b: int, cap: float | None = None
) -> dict[str, Any]:
    """Tenant A's backlog is being worked off; then B enqueues ``n_b`` jobs.

    ``seconds`` runs from just before B's first enqueue call to the end of B's last
    task. ``a_left`` is how many of A's jobs were still undone at that moment. If B
    is not done ``cap`` seconds after its enqueue, the result is partial and
    ``seconds`` (the time waited) is a lower bound.
    """
    driver.fill(backlog, TENANT_A)
    clock.check("filling tenant A's backlog")
    driver.analyze()
    fleet = driver.fleet()
    fleet.start()
    try:
        while progress_count(driver.record_dir) < 1:
            fleet.check_alive()
            clock.check("waiting for the workers to start")
            time.sleep(0.005)
        t0 = time.time()
        cap_end = time.monotonic() + (cap if cap is not None else float("inf"))
        for _ in range(n_b):
            driver.enqueue_one(TENANT_B, t0, TENANT_B_NAME)
        partial = False
        while True:
            done = progress_count(driver.record_dir)
            records = [r for r in read_records(driver.record_dir) if r.kind == TENANT_B]
            if len(records) >= n_b:
                break
            fleet.check_alive()
            if time.monotonic() > cap_end:
                partial = True
                break
            clock.check(f"waiting for tenant B ({len(records)} of {n_b} done)")
            time.sleep(0.01)
    finally:
        fleet.stop()
    finished = time.time() if partial else max(r.ended_at for r in records)
    return {
        "backlog": backlog,
        "b_jobs": n_b,
        "b_done": len(records),
        "seconds": finished - t0,
        "a_left": max(0, backlog - (done - len(records))),
        "partial": partial,
        **fleet.memory(),
    }


def figure_deep(driver: Driver, clock: Clock, depth: int, n: int, cap: float | None = None) -> dict[str, Any]:
    """With ``depth`` due jobs queued, time the processing of the first ``n`` (cut at ``cap`` s)."""
    start = time.perf_counter()
    driver.fill(depth)
    fill_seconds = time.perf_counter() - start
    clock.check("filling the deep queue")
    driver.analyze()
    fleet = driver.fleet()
    fleet.start()
    try:
        drain = wait_processed(driver, fleet, n, depth, clock, cap=cap)
    finally:
        fleet.stop()
    return {
        "depth": depth,
        "jobs": n,
        "fill_seconds": fill_seconds,
        **drain.as_result(),
        **fleet.memory(),
    }


FIGURES: dict[str, Callable[..., dict[str, Any]]] = {
    "enqueue_one": figure_enqueue_one,
    "throughput": figure_throughput,
    "latency": figure_latency,
    "fairness": figure_fairness,
    "deep": figure_deep,
}
