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
masked value either). The hot path pays a dictionary look-up and a counter
increment per event; the gauges are read only when scraped.

Metric names follow Prometheus' naming guide (``<namespace>_<name>_<unit>``,
``_total`` for counters): https://prometheus.io/docs/practices/naming/
"""

from __future__ import annotations

import threading
from collections.abc import Callable
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
        self._started = Counter(
            "pgtasks_worker_jobs_started", "Jobs whose body this worker started.", labels, registry=registry
        )
        self._finished = Counter(
            "pgtasks_worker_jobs_finished",
            "Attempts this worker finished, by outcome (succeeded, retried, failed, cancelled, "
            "partial_failure).",
            (*labels, "outcome"),
            registry=registry,
        )
        self._retries = Counter(
            "pgtasks_worker_job_retries", "Failed attempts this worker sent back to the queue.", labels,
            registry=registry,
        )  # fmt: skip
        self._run = Histogram(
            "pgtasks_worker_job_run_seconds", "Seconds a job's body ran (any outcome).", labels,
            buckets=DURATION_BUCKETS, registry=registry,
        )  # fmt: skip
        self._wait = Histogram(
            "pgtasks_worker_job_wait_seconds", "Seconds from a job's due time (run-at) to its body's start.",
            labels, buckets=DURATION_BUCKETS, registry=registry,
        )  # fmt: skip
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
        labels = self._job_labels(task, queue, tenant)
        self._child(self._started, *labels).inc()
        if wait is not None:
            self._child(self._wait, *labels).observe(max(0.0, wait))

    def job_finished(self, task: str, queue: str, tenant: str, outcome: str, runtime: float | None) -> None:
        """An attempt ended with ``outcome`` (one of `OUTCOMES`) after ``runtime``
        seconds of its body (None: it never started)."""
        labels = self._job_labels(task, queue, tenant)
        self._child(self._finished, *labels, outcome).inc()
        if outcome == "retried":
            self._child(self._retries, *labels).inc()
        if runtime is not None:
            self._child(self._run, *labels).observe(runtime)

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
