"""A worker's own Prometheus metrics, served on ``/metrics`` (``pgtasks worker --metrics-port``).

What the worker itself sees, which the database does not keep: jobs it started
and finished (by task, queue and outcome), their run and wait times, the
retries it wrote, the jobs its reaper recovered, how long its claims took, the
jobs it holds claimed ahead, and its listener's reconnects. Fleet-wide numbers
read from the database (queue depth per status, workers alive) stay with
``pgtasks metrics`` (plugin ``pgtasks_metrics``).

Each worker has a registry of its own (`prometheus_client.CollectorRegistry`,
not the process-wide default), so several workers in one process, and tests,
do not share counters. Label values are bounded by the code: task and queue
names; the tenant only when asked (``--metrics-tenants``: one series per tenant
the worker serves); never a job id, an argument or an error message (so no
masked value either).

The per-job numbers (jobs started and finished, retries, run and wait times) are
on the hot path: each thread adds them to plain numbers of its own (`_JobTally`;
no lock; 1.4 microseconds per job measured), which a scrape sums up. With
prometheus_client's own counters and histograms they cost about 6 microseconds
per job (a lock per value, a Python loop over the buckets), a tenth of a no-op
job's whole cost in the worker. Events per claim, per reaper run or per
reconnection use prometheus_client's metrics; the gauges are read only when
scraped.

Metric names follow Prometheus' naming guide (``<namespace>_<name>_<unit>``,
``_total`` for counters): https://prometheus.io/docs/practices/naming/
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pgtasks.errors import ConfigurationError

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry

__all__ = ["DURATION_BUCKETS", "OUTCOMES", "WorkerMetrics"]

#: Upper bounds (seconds) of the run-time and wait-time histograms: from 5 ms to an hour.
DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip
#: Upper bounds (seconds) of the claim-duration histogram.
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Values of the ``outcome`` label of ``pgtasks_worker_jobs_finished_total``.
OUTCOMES = ("succeeded", "retried", "failed", "cancelled", "partial_failure")


# Fields of a `_JobTally` record (one list per label set), then the buckets of the wait
# and run histograms (one more than DURATION_BUCKETS: +Inf), then one count per outcome.
_STARTED, _RETRIES, _WAIT_COUNT, _WAIT_SUM, _RUN_COUNT, _RUN_SUM = range(6)
_WAIT_BUCKETS = 6
_RUN_BUCKETS = _WAIT_BUCKETS + len(DURATION_BUCKETS) + 1
_OUTCOME_AT = {o: _RUN_BUCKETS + len(DURATION_BUCKETS) + 1 + i for i, o in enumerate(OUTCOMES)}
_RECORD = _RUN_BUCKETS + len(DURATION_BUCKETS) + 1 + len(OUTCOMES)
_BOUNDS = [*DURATION_BUCKETS]


class _JobTally:
    """The per-job metrics, counted by each thread in numbers of its own and summed
    when scraped (a `prometheus_client` collector).

    A thread's first event registers its store (under a lock, once); after that it
    only changes its own lists, so threads never wait for each other. A scrape reads
    every store (CPython copies a list or a dict's items without letting another
    thread run in between) and adds them up: a count may be a job behind, never
    wrong.

    Args:
        labels: the label names of a record's key (``task``, ``queue`` [, ``tenant``]).
    """

    def __init__(self, labels: tuple[str, ...]) -> None:
        self.labels = labels
        self._local = threading.local()
        self._stores: list[dict[tuple[str, ...], list[float]]] = []
        self._lock = threading.Lock()

    def record(self, key: tuple[str, ...]) -> list[float]:
        """This thread's record of ``key`` (made on first use)."""
        store: dict[tuple[str, ...], list[float]] | None = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = {}
            with self._lock:
                self._stores.append(store)
        record = store.get(key)
        if record is None:
            record = store[key] = [0.0] * _RECORD
        return record

    def _totals(self) -> dict[tuple[str, ...], list[float]]:
        with self._lock:
            stores = list(self._stores)
        totals: dict[tuple[str, ...], list[float]] = {}
        for store in stores:
            for key, record in list(store.items()):
                values = record[:]
                total = totals.get(key)
                if total is None:
                    totals[key] = values
                else:
                    totals[key] = [a + b for a, b in zip(total, values, strict=True)]
        return totals

    def collect(self) -> Iterator[Any]:
        """The per-job metric families, summed over the threads."""
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        labels = list(self.labels)
        started = CounterMetricFamily(
            "pgtasks_worker_jobs_started", "Jobs whose body this worker started.", labels=labels
        )
        finished = CounterMetricFamily(
            "pgtasks_worker_jobs_finished",
            "Attempts this worker finished, by outcome (succeeded, retried, failed, cancelled, "
            "partial_failure).",
            labels=[*labels, "outcome"],
        )
        retries = CounterMetricFamily(
            "pgtasks_worker_job_retries", "Failed attempts this worker sent back to the queue.", labels=labels
        )
        run = HistogramMetricFamily(
            "pgtasks_worker_job_run_seconds", "Seconds a job's body ran (any outcome).", labels=labels
        )
        wait = HistogramMetricFamily(
            "pgtasks_worker_job_wait_seconds",
            "Seconds from a job's due time (run-at) to its body's start.",
            labels=labels,
        )
        for key, r in sorted(self._totals().items()):
            values = list(key)
            started.add_metric(values, r[_STARTED])
            retries.add_metric(values, r[_RETRIES])
            for outcome, at in _OUTCOME_AT.items():
                if r[at]:
                    finished.add_metric([*values, outcome], r[at])
            run.add_metric(values, _buckets(r, _RUN_BUCKETS), r[_RUN_SUM])
            wait.add_metric(values, _buckets(r, _WAIT_BUCKETS), r[_WAIT_SUM])
        yield from (started, finished, retries, run, wait)


def _buckets(record: list[float], first: int) -> list[tuple[str, float]]:
    """A histogram's cumulative buckets as `HistogramMetricFamily` takes them."""
    buckets: list[tuple[str, float]] = []
    count = 0.0
    for i, bound in enumerate(DURATION_BUCKETS):
        count += record[first + i]
        buckets.append((repr(float(bound)), count))
    buckets.append(("+Inf", count + record[first + len(DURATION_BUCKETS)]))
    return buckets


class WorkerMetrics:
    """The metrics of one worker, in a registry of its own.

    Args:
        worker_id: the worker's id (``pgtasks_worker_info``).
        pool: ``threads`` or ``processes`` (``pgtasks_worker_info``).
        tenants: add a ``tenant`` label to the per-job metrics.
        held: returns the worker's held jobs as ``(started,)`` flags, read at
            scrape time for the prefetch and running gauges.

    Attributes:
        registry: the `prometheus_client.CollectorRegistry` they live in.
    """

    def __init__(self, *, worker_id: str, pool: str, tenants: bool, held: Callable[[], list[bool]]) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

        self.registry: CollectorRegistry = CollectorRegistry()
        self.tenants = tenants
        labels = ("task", "queue", "tenant") if tenants else ("task", "queue")
        registry = self.registry
        Info("pgtasks_worker", "The worker serving these metrics.", registry=registry).info(
            {"worker_id": worker_id, "pool": pool}
        )
        self._jobs = _JobTally(labels)
        registry.register(self._jobs)
        self._reaped = Counter(
            "pgtasks_worker_reaped_jobs",
            "Jobs of lost workers this worker's reaper recovered, by what became of them (requeued, failed).",
            ("outcome",),
            registry=registry,
        )
        self._claim = Histogram(
            "pgtasks_worker_claim_duration_seconds",
            "Seconds a claim statement took (batch: the fair claim; named: jobs named by notifications).",
            ("kind",),
            buckets=CLAIM_BUCKETS,
            registry=registry,
        )
        self._claimed = Counter("pgtasks_worker_claimed_jobs", "Jobs this worker claimed.", registry=registry)
        self._reconnects = Counter(
            "pgtasks_worker_listener_reconnects",
            "Times the LISTEN connection was lost and made again.",
            registry=registry,
        )
        prefetched = Gauge(
            "pgtasks_worker_prefetched_jobs",
            "Jobs this worker holds claimed ahead, not started (its prefetch depth).",
            registry=registry,
        )
        prefetched.set_function(lambda: sum(1 for started in held() if not started))
        running = Gauge(
            "pgtasks_worker_running_jobs", "Jobs whose body this worker runs now.", registry=registry
        )
        running.set_function(lambda: sum(1 for started in held() if started))
        # Children by label values, looked up without prometheus_client's per-call lock.
        self._children: dict[tuple[Any, ...], Any] = {}
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        for kind in ("batch", "named"):  # both series exist from the start, at 0
            self._child(self._claim, kind)
        for outcome in ("requeued", "failed"):
            self._child(self._reaped, outcome)

    def _child(self, metric: Any, *values: str) -> Any:
        key = (id(metric), *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def _job_labels(self, task: str, queue: str, tenant: str) -> tuple[str, ...]:
        return (task, queue, tenant) if self.tenants else (task, queue)

    # -- events (called by the worker) -------------------------------------------------

    def job_started(self, task: str, queue: str, tenant: str, wait: float | None) -> None:
        """A job's body started, ``wait`` seconds after it was due (None: unknown)."""
        r = self._jobs.record(self._job_labels(task, queue, tenant))
        r[_STARTED] += 1
        if wait is not None:
            wait = max(0.0, wait)
            r[_WAIT_COUNT] += 1
            r[_WAIT_SUM] += wait
            r[_WAIT_BUCKETS + bisect_left(_BOUNDS, wait)] += 1

    def job_finished(self, task: str, queue: str, tenant: str, outcome: str, runtime: float | None) -> None:
        """An attempt ended with ``outcome`` (one of `OUTCOMES`) after ``runtime``
        seconds of its body (None: it never started)."""
        r = self._jobs.record(self._job_labels(task, queue, tenant))
        r[_OUTCOME_AT[outcome]] += 1
        if outcome == "retried":
            r[_RETRIES] += 1
        if runtime is not None:
            r[_RUN_COUNT] += 1
            r[_RUN_SUM] += runtime
            r[_RUN_BUCKETS + bisect_left(_BOUNDS, runtime)] += 1

    def claimed(self, kind: str, seconds: float, jobs: int) -> None:
        """A claim (``batch`` or ``named``) took ``seconds`` and returned ``jobs``."""
        self._child(self._claim, kind).observe(seconds)
        if jobs:
            self._claimed.inc(jobs)

    def reaped(self, requeued: int, failed: int) -> None:
        """The reaper recovered jobs: ``requeued`` back to the queue, ``failed``."""
        if requeued:
            self._child(self._reaped, "requeued").inc(requeued)
        if failed:
            self._child(self._reaped, "failed").inc(failed)

    def listener_reconnected(self) -> None:
        """The LISTEN connection was made again after it was lost."""
        self._reconnects.inc()

    # -- the endpoint --------------------------------------------------------------------

    def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread (`stop` ends it).

        Raises:
            ConfigurationError: the address cannot be bound (in use, not this host's).
        """
        from prometheus_client import start_http_server

        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
            ) from None

    @property
    def port(self) -> int | None:
        """The port served on (None: not serving)."""
        return None if self._server is None else int(self._server.server_address[1])

    def stop(self) -> None:
        """Stop serving (nothing when not serving)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
