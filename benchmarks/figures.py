"""The figures: which driver op measures each, with what sizes and deadline, and
which numbers of its result the report shows.

A *run* is one driver op in one repetition (e.g. ``throughput``); a *metric* is one
number taken from a run's result (e.g. bulk jobs/s from ``throughput``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from benchmarks.sizes import (
    BULK_CALL,
    MIXED_JOBS_PER_LOCK_KEY,
    MIXED_TENANTS,
    PRODUCER_THREADS,
    Sizes,
    mixed_lock_keys,
)

# Deadlines (s): a base for start-up, the fill at no less than FILL_FLOOR jobs/s, then
# processing at no less than FLOOR_RATE jobs/s but never longer than Sizes.process_cap,
# after which the driver reports what it has as partial. The harness kills a driver
# 30 s after its deadline.
BASE_DEADLINE = 30.0
FILL_FLOOR = 1000.0
FLOOR_RATE = 100.0


def _processing(s: Sizes, jobs: int) -> float:
    return min(jobs / FLOOR_RATE, s.process_cap)


class MissingInput(Exception):
    """A run's arguments depend on an earlier figure that produced no number."""


# What a run's ``derive`` reads: the results of the runs before it in the same system's
# repetition, by run key (only the runs that succeeded).
Earlier = Mapping[str, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Run:
    """One driver op per repetition: ``args`` and ``deadline`` (s) come from the sizes.

    ``derive``, when set, adds arguments taken from the results of earlier runs of the
    same system and repetition (`Earlier`); it raises `MissingInput` when a result it
    needs is missing, and the run is then n/a with that reason.
    """

    key: str
    op: str
    args: Callable[[Sizes], dict[str, Any]]
    deadline: Callable[[Sizes], float]
    table_size: bool = False  # measure the system's tables after the op
    derive: Callable[[Earlier], dict[str, Any]] | None = None


# The latency under load runs at this fraction of the system's processing throughput.
LOAD_FRACTION = 0.5


def load_rate(earlier: Earlier) -> dict[str, Any]:
    """``{"rate": LOAD_FRACTION x the processing figure's jobs/s}`` of this repetition.

    The processing figure (run ``throughput``: no ANALYZE after the fill) measured the
    system's maximum in the same repetition, shortly before. A partial figure (cut at
    the processing cap) still gives the rate it reached.

    Raises:
        MissingInput: that figure failed or produced no rate.
    """
    rate = earlier.get("throughput", {}).get("process_jobs_per_s")
    if not isinstance(rate, int | float) or not math.isfinite(rate) or rate <= 0:
        raise MissingInput("no processing throughput in this repetition to take half of")
    return {"rate": LOAD_FRACTION * float(rate)}


RUNS: tuple[Run, ...] = (
    Run(
        "enqueue_one",
        "enqueue_one",
        lambda s: {"n": s.enqueue_one},
        lambda s: BASE_DEADLINE + s.enqueue_one / FLOOR_RATE,
    ),
    Run(
        "producers",
        "producers",
        lambda s: {"threads": list(PRODUCER_THREADS), "jobs": s.producer_jobs},
        lambda s: BASE_DEADLINE + len(PRODUCER_THREADS) * s.producer_jobs / FLOOR_RATE,
    ),
    Run(
        "bulk_chunked",
        "bulk_chunked",
        lambda s: {"n": s.bulk, "chunk": BULK_CALL},
        lambda s: BASE_DEADLINE + s.bulk / FILL_FLOOR,
    ),
    # Processing with the planner statistics in each state (benchmarks.systems.ops.STATISTICS):
    # none after the fill (the figure users meet, and the bulk-enqueue and memory figures),
    # taken while the table was empty, and taken after the fill.
    Run(
        "throughput",
        "throughput",
        lambda s: {"n": s.bulk, "cap": s.process_cap, "stats": "none"},
        lambda s: BASE_DEADLINE + s.bulk / FILL_FLOOR + _processing(s, s.bulk),
    ),
    Run(
        "throughput_stats_empty",
        "throughput",
        lambda s: {"n": s.bulk, "cap": s.process_cap, "stats": "empty"},
        lambda s: BASE_DEADLINE + s.bulk / FILL_FLOOR + _processing(s, s.bulk),
    ),
    Run(
        "throughput_analyzed",
        "throughput",
        lambda s: {"n": s.bulk, "cap": s.process_cap, "stats": "analyzed"},
        lambda s: BASE_DEADLINE + s.bulk / FILL_FLOOR + _processing(s, s.bulk),
    ),
    Run(
        "mixed",
        "mixed",
        lambda s: {
            "n": s.mixed,
            "tenants": MIXED_TENANTS,
            "lock_keys": mixed_lock_keys(s.mixed),
            "cap": s.process_cap,
        },
        lambda s: BASE_DEADLINE + s.mixed / FILL_FLOOR + _processing(s, s.mixed),
    ),
    Run(
        "latency",
        "latency",
        lambda s: {"rate": s.latency_rate, "seconds": s.latency_seconds},
        lambda s: BASE_DEADLINE + 2 * s.latency_seconds,
    ),
    # After "throughput", whose rate it takes half of (load_rate).
    Run(
        "latency_load",
        "latency_load",
        lambda s: {"seconds": s.latency_seconds},
        lambda s: BASE_DEADLINE + 2 * s.latency_seconds + s.process_cap,
        derive=load_rate,
    ),
    Run(
        "fairness",
        "fairness",
        lambda s: {"backlog": s.fairness_backlog, "n_b": s.fairness_b, "cap": s.process_cap},
        lambda s: BASE_DEADLINE + s.fairness_backlog / FILL_FLOOR + _processing(s, s.fairness_backlog),
    ),
    Run(
        "deep_small",
        "deep",
        lambda s: {"depth": s.deep_small, "n": s.deep_jobs, "cap": s.process_cap},
        lambda s: BASE_DEADLINE + s.deep_small / FILL_FLOOR + _processing(s, s.deep_jobs),
        table_size=True,
    ),
    Run(
        "deep_large",
        "deep",
        lambda s: {"depth": s.deep_large, "n": s.deep_jobs, "cap": s.process_cap},
        lambda s: BASE_DEADLINE + s.deep_large / FILL_FLOOR + _processing(s, s.deep_jobs),
        table_size=True,
    ),
)


@dataclass(frozen=True, slots=True)
class Metric:
    """One reported number: ``run`` key, ``field`` of its result, unit, direction.

    ``scale`` converts the raw field to the shown unit (e.g. bytes -> MiB).
    """

    key: str
    title: str
    run: str
    field: str
    unit: str
    higher_is_better: bool
    scale: float = 1.0
    description: str = ""
    capped: bool = False  # the processing cap can cut this number short (partial)
    reference_for: str = ""  # a further raw-SQL reference for the metric of this key
    statistics_of: str = ""  # the metric of this key measured with other planner statistics
    # The metric whose raw median is this one's "vs raw" (default: this one's own).
    over_reference: str = ""
    # Further result fields whose medians per system are listed under the table: (field, label).
    details: tuple[tuple[str, str], ...] = ()


# What benchmarks.report.summarize makes of a run, per metric key and system: the median,
# min and max over the repetitions (None without a number) and how many produced one.
Summary = dict[str, dict[str, dict[str, float | int | None]]]

MIB = 1.0 / (1024 * 1024)


def _metric(key: str, title: str, run: str, field: str, unit: str, **options: Any) -> Metric:
    higher = unit == "jobs/s"
    return Metric(key, title, run, field, unit, higher_is_better=higher, **options)


METRICS: tuple[Metric, ...] = (
    _metric("enqueue_one", "Enqueue, one call per job", "enqueue_one", "jobs_per_s", "jobs/s",
            description="`delay` / `defer` / `enqueue` in a loop, one job and one commit per call"),
    _metric("enqueue_bulk", "Bulk enqueue", "throughput", "bulk_jobs_per_s", "jobs/s",
            description="the system's best bulk API"),
    _metric("enqueue_bulk_insert", "Bulk enqueue, raw multi-row INSERT reference", "throughput",
            "bulk_insert_jobs_per_s", "jobs/s", reference_for="enqueue_bulk",
            description="the raw-SQL reference's bulk enqueue as multi-row INSERT statements (1,000 "
            "rows each, one transaction) instead of COPY, timed on the same jobs just before its COPY"),
    _metric("enqueue_bulk_call", "Bulk enqueue in calls of 1,000", "bulk_chunked", "jobs_per_s", "jobs/s",
            description=f"{BULK_CALL:,} jobs per call of the system's bulk API, each call its own commit; "
            f"raw: one multi-row INSERT of {BULK_CALL:,} rows per statement, autocommit"),
    *(
        _metric(f"producers_{n}", f"Enqueue from {n} concurrent producer{'s' if n > 1 else ''}",
                "producers", f"jobs_per_s_{n}", "jobs/s",
                description="one-call enqueue (pgtasks: `delay()`), one job and one commit per call, from "
                f"{n} thread(s) at once, each on its own pooled connection; raw: its single-row INSERT"
                if n == PRODUCER_THREADS[0] else "")
        for n in PRODUCER_THREADS
    ),
    _metric("process", "Processing throughput", "throughput", "process_jobs_per_s", "jobs/s", capped=True,
            description="pre-filled queue of no-op jobs, first to last completion; no ANALYZE after the "
            "fill (a queue table freshly deployed, as users meet it)"),
    _metric("process_stats_empty", "Processing throughput, statistics taken while empty",
            "throughput_stats_empty", "process_jobs_per_s", "jobs/s", capped=True, statistics_of="process",
            description="the same, with ANALYZE run while the table was empty, before the fill (a queue "
            "analyzed by autovacuum while nearly empty, then a burst)"),
    _metric("process_analyzed", "Processing throughput, analyzed after the fill", "throughput_analyzed",
            "process_jobs_per_s", "jobs/s", capped=True, statistics_of="process",
            description="the same, with ANALYZE run after the fill (statistics that describe the backlog)"),
    _metric("process_mixed", "Processing mixed work", "mixed", "process_jobs_per_s", "jobs/s", capped=True,
            over_reference="process",
            description=f"a pre-filled queue of {MIXED_TENANTS} tenants' no-op jobs, one in ten failing its "
            f"first attempt and retried at once, one in ten holding a lock key (one key per "
            f"{MIXED_JOBS_PER_LOCK_KEY} locked jobs); "
            "first to last completion, no ANALYZE after the fill; the figure checks that every job ended "
            "succeeded and that exactly the failing ones were retried. The raw reference does the same "
            "work with the least SQL that does it correctly (no tenant turns); `vs raw` is over raw's "
            "plain processing (the figure above) of the same run, as the target is",
            details=(("fail_once_jobs", "jobs failing once"),
                     ("recorded_retried", "retried jobs (system's record)"),
                     ("failed_attempts", "failed attempts (tasks' tally)"),
                     ("lock_jobs", "lock-key jobs"), ("jobs_done", "jobs done"))),
    _metric("latency_p50", "Latency p50", "latency", "p50_ms", "ms",
            description="enqueue call -> task start at a steady rate"),
    _metric("latency_p95", "Latency p95", "latency", "p95_ms", "ms"),
    _metric("latency_p99", "Latency p99", "latency", "p99_ms", "ms"),
    _metric("latency_load_p50", "Latency p50 at half the maximum throughput", "latency_load", "p50_ms", "ms",
            description=f"enqueue call -> task start while the producer enqueues at {LOAD_FRACTION:g} x the "
            "system's processing throughput of the same repetition (the figure above, no ANALYZE), one bulk "
            "call per 10 ms (rate x 0.01 jobs each), every job a probe; n/a when that figure has no number",
            details=(("rate", "rate asked (jobs/s)"), ("achieved_rate", "rate reached (jobs/s)"),
                     ("batch", "jobs per call"))),
    _metric("latency_load_p99", "Latency p99 at half the maximum throughput", "latency_load", "p99_ms", "ms"),
    _metric("fairness", "Fairness: tenant B behind tenant A's backlog", "fairness", "seconds", "s",
            capped=True, description="from B's first enqueue to B's last job finished"),
    _metric("deep_small", "Deep queue: throughput, shallow table", "deep_small", "process_jobs_per_s",
            "jobs/s", capped=True),
    _metric("deep_large", "Deep queue: throughput, deep table", "deep_large", "process_jobs_per_s",
            "jobs/s", capped=True),
    _metric("size_small", "Table + index size after the shallow run", "deep_small", "table_bytes", "MiB",
            scale=MIB, capped=True),
    _metric("size_large", "Table + index size after the deep run", "deep_large", "table_bytes", "MiB",
            scale=MIB, capped=True),
    _metric("memory", "Worker memory, peak RSS", "throughput", "rss_peak_bytes", "MiB", scale=MIB,
            description="sum over worker processes and their children, sampled every 0.2 s"),
    _metric("memory_anon", "Worker memory, peak anonymous RSS", "throughput", "rss_anon_peak_bytes", "MiB",
            scale=MIB, description="the part of the same sum not mapped from files: what the workers "
            "allocated (heap, stacks), without the shared-library pages whose resident count depends on "
            "the page cache"),
    _metric("memory_equal_work", "Worker memory at equal work, peak RSS", "deep_small", "rss_peak_bytes",
            "MiB", scale=MIB, description="the peak RSS sum in the shallow deep-queue run, where every "
            "system works off the same 10,000 jobs; in the processing run a slow system reaches the time "
            "limit after a fraction of the jobs, and a worker's peak grows with the jobs it has worked off "
            "before it levels"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Target:
    """A target for pgtasks' figure ``metric``: at least ``at_least`` x the raw
    reference's median of ``over`` (a ratio), or at most ``at_most`` (in the metric's
    unit). The report says met or missed from the run's own medians."""

    title: str
    metric: str
    over: str = ""
    at_least: float | None = None
    at_most: float | None = None


# The claim-path targets (the report's "Claim-path targets" table).
TARGETS: tuple[Target, ...] = (
    Target("mixed work ≥ 0.6 x raw's plain processing", "process_mixed", over="process", at_least=0.6),
    Target("enqueue from 16 producers ≥ 0.8 x raw's", "producers_16", over="producers_16", at_least=0.8),
    Target("latency p99 at 50 jobs/s ≤ 10 ms", "latency_p99", at_most=10.0),
    Target("latency p99 at half the maximum throughput ≤ 10 ms", "latency_load_p99", at_most=10.0),
    Target("bulk in calls of 1,000 ≥ 1.0 x raw's multi-row INSERT", "enqueue_bulk_call",
           over="enqueue_bulk_call", at_least=1.0),
)  # fmt: skip
