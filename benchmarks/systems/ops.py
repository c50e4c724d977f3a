"""The figures, one function per driver op, built from the primitives of `Driver`.

Each takes the driver, the op's `Clock` and the op's own sizes (``Params.args``, from
`benchmarks.figures.RUNS`), and returns the op's result fields. `FIGURES` maps op
names to them.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.systems.base import Driver, MixedJob
from benchmarks.systems.clock import BenchmarkError, Clock
from benchmarks.systems.drain import wait_processed
from benchmarks.systems.records import (
    FAIL_ONCE,
    LATENCY,
    NOOP,
    TENANT_A,
    TENANT_B,
    TENANT_B_NAME,
    WARMUP,
    failed_attempt_count,
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


def _warm_up(driver: Driver, clock: Clock, fleet: Any) -> int:
    """Run two no-op jobs per worker process, wait until they are done, then let the
    workers settle back into their idle wait (the latency figures time from there).
    Returns how many warm-up jobs ran (they count in the progress tally)."""
    warm = 2 * max(1, len(fleet.commands))
    for _ in range(warm):
        driver.enqueue_one(WARMUP, time.time())
    while progress_count(driver.record_dir) < warm:
        fleet.check_alive()
        clock.check("waiting for the workers to start")
        time.sleep(0.01)
    time.sleep(0.5)
    return warm


def figure_latency(driver: Driver, clock: Clock, rate: float, seconds: float) -> dict[str, Any]:
    """Enqueue at ``rate`` jobs/s for ``seconds`` s; enqueue -> task start, in ms."""
    fleet = driver.fleet()
    fleet.start()
    try:
        _warm_up(driver, clock, fleet)
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


# --------------------------------------------------------------------------- claim path


def mixed_jobs(
    n: int, tenants: int, lock_keys: int, seed: int = 0, *, retries: bool = True, locks: bool = True
) -> list[MixedJob]:
    """The mixed-work figure's ``n`` jobs: (kind, tenant, lock key or None).

    Tenants ``t000``.. in turn (job i in tenant i mod ``tenants``); one job in ten
    (``n // 10``) of kind ``FAIL_ONCE`` and another one in ten carrying a lock key,
    the keys ``lock-0``.. in turn over ``lock_keys``; which jobs, is shuffled with
    ``seed``, so both kinds spread over the tenants. Without ``retries`` (or
    ``locks``) those jobs are plain no-op jobs instead (`benchmarks.mixed` compares).

    Raises:
        ValueError: ``tenants`` or ``lock_keys`` below 1, or ``n`` below 10.
    """
    if tenants < 1 or lock_keys < 1 or n < 10:
        raise ValueError(f"need n >= 10, tenants >= 1, lock_keys >= 1; got {n}, {tenants}, {lock_keys}")
    roles = ["fail"] * (n // 10) + ["lock"] * (n // 10)
    roles += ["plain"] * (n - len(roles))
    random.Random(seed).shuffle(roles)
    jobs: list[MixedJob] = []
    locked = 0
    for i, role in enumerate(roles):
        tenant = f"t{i % tenants:03d}"
        if role == "lock" and locks:
            jobs.append((NOOP, tenant, f"lock-{locked % lock_keys}"))
            locked += 1
        else:
            jobs.append((FAIL_ONCE if role == "fail" and retries else NOOP, tenant, None))
    return jobs


def figure_mixed(
    driver: Driver,
    clock: Clock,
    n: int,
    *,
    tenants: int,
    lock_keys: int,
    cap: float | None = None,
    retries: bool = True,
    locks: bool = True,
) -> dict[str, Any]:
    """Process ``n`` jobs of mixed work (`mixed_jobs`): tenants, retries, lock keys.

    The jobs are enqueued (`Driver.enqueue_mixed`, not timed), with no ANALYZE after,
    then worked off and timed as the processing figure times it (first to last
    completion; a retried job completes once, at its successful attempt). Unless the
    cap cut it short, the system's own record must then say that every job ended
    succeeded and that exactly the ``FAIL_ONCE`` jobs took a second attempt, and the
    tasks' own tally of failed attempts must agree.

    Raises:
        BenchmarkError: the counts disagree (the work did not happen as specified).
        Unsupported: the system lacks tenants, lock keys or retries.
    """
    jobs = mixed_jobs(n, tenants, lock_keys, retries=retries, locks=locks)
    failing = sum(1 for kind, _, _ in jobs if kind == FAIL_ONCE)
    locked = sum(1 for _, _, lock in jobs if lock is not None)
    start = time.perf_counter()
    driver.enqueue_mixed(jobs)
    fill_seconds = time.perf_counter() - start
    clock.check("enqueueing the mixed work")
    fleet = driver.fleet()
    fleet.start()
    try:
        drain = wait_processed(driver, fleet, n, n, clock, cap=cap)
    finally:
        fleet.stop()
    outcome = driver.mixed_outcome()
    failed_attempts = failed_attempt_count(driver.record_dir)
    if not drain.partial:
        expected = {"succeeded": n, "other": 0, "retried": failing}
        if outcome != expected or failed_attempts != failing:
            raise BenchmarkError(
                f"mixed work did not happen as specified: the system recorded {outcome}, the tasks "
                f"{failed_attempts} failed attempts; expected {expected} and {failing} failed attempts"
            )
    return {
        "jobs": n,
        "tenants": tenants,
        "lock_keys": lock_keys,
        "lock_jobs": locked,
        "fail_once_jobs": failing,
        "failed_attempts": failed_attempts,
        **{f"recorded_{k}": v for k, v in outcome.items()},
        "fill_seconds": fill_seconds,
        **drain.as_result(),
        **fleet.memory(),
    }


WARMUP_CALLS = 6  # per producer thread before the clock starts: past psycopg's prepare threshold (5)


def run_threads(threads: int, jobs: int, call: Callable[[int], object]) -> float:
    """Run ``call(thread_index)`` ``jobs`` times split evenly over ``threads`` threads; jobs/s.

    Each thread first calls `WARMUP_CALLS` times untimed (connections open,
    statements prepared); the clock runs from releasing all threads together to the
    last one's end. The first exception of any thread is raised here.
    `benchmarks.producers` measures with it too.
    """
    per_thread = [jobs // threads + (1 if i < jobs % threads else 0) for i in range(threads)]
    ready = threading.Barrier(threads + 1)
    go = threading.Event()
    errors: list[BaseException] = []

    def produce(index: int) -> None:
        try:
            for _ in range(WARMUP_CALLS):
                call(index)
        except BaseException as exc:  # reported by the measuring thread
            errors.append(exc)
        ready.wait()
        go.wait()
        if errors:
            return
        try:
            for _ in range(per_thread[index]):
                call(index)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=produce, args=(i,), name=f"producer-{i}") for i in range(threads)]
    for worker in workers:
        worker.start()
    ready.wait()
    started = time.perf_counter()
    go.set()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return jobs / elapsed


def figure_producers(driver: Driver, clock: Clock, threads: Sequence[int], jobs: int) -> dict[str, Any]:
    """One-call enqueue of ``jobs`` jobs from each count of ``threads`` concurrent threads.

    Each count gets fresh `Driver.producers` (one pooled connection per thread) and
    `run_threads`; ``jobs_per_s_<count>`` is its rate. No worker runs.

    Raises:
        Unsupported: the system does not run this figure.
    """
    result: dict[str, Any] = {"jobs": jobs, "threads": list(threads)}
    for count in threads:
        producers = driver.producers(count)
        try:
            result[f"jobs_per_s_{count}"] = run_threads(count, jobs, producers.call)
        finally:
            producers.close()
        clock.check(f"enqueueing from {count} threads")
    return result


def figure_bulk_chunked(driver: Driver, clock: Clock, n: int, chunk: int) -> dict[str, Any]:
    """Enqueue ``n`` jobs in calls of ``chunk`` jobs (`Driver.enqueue_chunk`), each its own commit."""
    jobs = [(NOOP, 0.0)] * n
    start = time.perf_counter()
    for first in range(0, n, chunk):
        driver.enqueue_chunk(jobs[first : first + chunk])
        if first % (50 * chunk) == 0:
            clock.check(f"enqueueing in calls of {chunk} ({first} of {n})")
    seconds = time.perf_counter() - start
    return {"jobs": n, "chunk": chunk, "seconds": seconds, "jobs_per_s": n / seconds}


def figure_latency_load(
    driver: Driver, clock: Clock, rate: float, seconds: float, tick: float = 0.01
) -> dict[str, Any]:
    """Latency (enqueue call -> task start, ms) while the workers run at ``rate`` jobs/s.

    After the warm-up of `figure_latency`, the producer enqueues ``rate x tick`` jobs
    (at least one) with one `Driver.enqueue_bulk` call per tick for ``seconds`` s,
    paced on the clock so the mean rate is ``rate``; each job carries the
    ``time.time()`` taken just before its call. A producer slower than the pace
    does not sleep, and ``achieved_rate`` says what it reached. Every job is a
    latency probe; the percentiles cover them all.

    Raises:
        BenchmarkError: ``rate`` or ``seconds`` is not positive.
    """
    if not rate > 0 or not seconds > 0:
        raise BenchmarkError(f"rate and seconds must be positive, got {rate!r} and {seconds!r}")
    fleet = driver.fleet()
    fleet.start()
    try:
        warm = _warm_up(driver, clock, fleet)
        batch = max(1, round(rate * tick))
        period = batch / rate
        batches = max(1, int(rate * seconds / batch))
        start = last_call = time.perf_counter()
        for i in range(batches):
            delay = start + i * period - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            last_call = time.perf_counter()
            driver.enqueue_bulk([(LATENCY, time.time())] * batch)
            if i % 50 == 0:
                clock.check(f"enqueueing at {rate:,.0f} jobs/s")
        # On pace, the last call starts (batches - 1) periods in: the span is batches periods.
        produce_seconds = last_call - start + period
        count = batches * batch
        while progress_count(driver.record_dir) < warm + count:
            fleet.check_alive()
            clock.check(f"waiting for the jobs enqueued at {rate:,.0f} jobs/s")
            time.sleep(0.02)
    finally:
        fleet.stop()
    latencies = sorted(
        (r.started_at - r.enqueued_at) * 1000.0 for r in read_records(driver.record_dir) if r.kind == LATENCY
    )
    if len(latencies) < count:
        raise BenchmarkError(f"{len(latencies)} of {count} latency records written")
    return {
        "jobs": count,
        "rate": rate,
        "batch": batch,
        "achieved_rate": count / produce_seconds if produce_seconds > 0 else float("nan"),
        "p50_ms": _percentile(latencies, 50),
        "p95_ms": _percentile(latencies, 95),
        "p99_ms": _percentile(latencies, 99),
        "max_ms": latencies[-1],
        **fleet.memory(),
    }


FIGURES: dict[str, Callable[..., dict[str, Any]]] = {
    "enqueue_one": figure_enqueue_one,
    "throughput": figure_throughput,
    "latency": figure_latency,
    "fairness": figure_fairness,
    "deep": figure_deep,
    "mixed": figure_mixed,
    "producers": figure_producers,
    "bulk_chunked": figure_bulk_chunked,
    "latency_load": figure_latency_load,
}
