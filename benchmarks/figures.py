"""The figures: which driver op measures each, with what sizes and deadline, and
which numbers of its result the report shows.

A *run* is one driver op in one repetition (e.g. ``throughput``); a *metric* is one
number taken from a run's result (e.g. bulk jobs/s from ``throughput``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.sizes import Sizes

# Deadlines (s): a base for start-up, the fill at no less than FILL_FLOOR jobs/s, then
# processing at no less than FLOOR_RATE jobs/s but never longer than Sizes.process_cap,
# after which the driver reports what it has as partial. The harness kills a driver
# 30 s after its deadline.
BASE_DEADLINE = 30.0
FILL_FLOOR = 1000.0
FLOOR_RATE = 100.0


def _processing(s: Sizes, jobs: int) -> float:
    return min(jobs / FLOOR_RATE, s.process_cap)


@dataclass(frozen=True, slots=True)
class Run:
    """One driver op per repetition: ``args`` and ``deadline`` (s) come from the sizes."""

    key: str
    op: str
    args: Callable[[Sizes], dict[str, Any]]
    deadline: Callable[[Sizes], float]
    table_size: bool = False  # measure the system's tables after the op


RUNS: tuple[Run, ...] = (
    Run(
        "enqueue_one",
        "enqueue_one",
        lambda s: {"n": s.enqueue_one},
        lambda s: BASE_DEADLINE + s.enqueue_one / FLOOR_RATE,
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
        "latency",
        "latency",
        lambda s: {"rate": s.latency_rate, "seconds": s.latency_seconds},
        lambda s: BASE_DEADLINE + 2 * s.latency_seconds,
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
    _metric("latency_p50", "Latency p50", "latency", "p50_ms", "ms",
            description="enqueue call -> task start at a steady rate"),
    _metric("latency_p95", "Latency p95", "latency", "p95_ms", "ms"),
    _metric("latency_p99", "Latency p99", "latency", "p99_ms", "ms"),
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
