"""A Prometheus collector that reads queue and worker state from PostgreSQL on each scrape.

Metric names follow Prometheus' naming guide (``<namespace>_<name>_<unit>``,
``_total`` only for counters): https://prometheus.io/docs/practices/naming/
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pgtasks import App
from pgtasks.plugin_api import list_workers
from pgtasks.states import CLAIMED, JobStatus

__all__ = ["QueueCollector"]


class QueueCollector(Collector):
    """Yields, per scrape, from the queue statistics and the worker list:

    * ``pgtasks_jobs{queue, status}``: jobs per queue and status (gauge); ``running``
      counts jobs whose body started, ``claimed`` those a worker holds but has not
      started (status ``running`` in the table, `pgtasks.Job.phase`);
    * ``pgtasks_queue_oldest_job_age_seconds{queue}``: age of the oldest due queued job;
    * ``pgtasks_workers{state}``: registered workers that are alive, stopping or expired;
    * ``pgtasks_worker_running_jobs{worker}``: jobs whose body each worker runs;
    * ``pgtasks_worker_claimed_jobs{worker}``: jobs each worker holds, not started.

    Args:
        app: the app whose database is read (a replica DSN is fine: read-only).
    """

    def __init__(self, app: App) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        """Read the database and yield the metric families."""
        jobs = GaugeMetricFamily("pgtasks_jobs", "Jobs per queue and status.", labels=["queue", "status"])
        oldest = GaugeMetricFamily(
            "pgtasks_queue_oldest_job_age_seconds",
            "Seconds since the oldest queued job became due.",
            labels=["queue"],
        )
        seen: dict[str, set[str]] = {}
        now = dt.datetime.now(dt.UTC)
        for row in self.app.queue_stats():
            jobs.add_metric([row["queue"], row["status"]], float(row["jobs"] - row["claimed"]))
            seen.setdefault(row["queue"], set()).add(row["status"])
            if row["status"] == JobStatus.RUNNING:
                jobs.add_metric([row["queue"], CLAIMED], float(row["claimed"]))
            if row["status"] == JobStatus.QUEUED and row["oldest_run_at"] is not None:
                oldest.add_metric([row["queue"]], max(0.0, (now - row["oldest_run_at"]).total_seconds()))
        for queue, statuses in seen.items():  # absent statuses are 0, not missing series
            for status in JobStatus:
                if status not in statuses:
                    jobs.add_metric([queue, str(status)], 0.0)
            if JobStatus.RUNNING not in statuses:
                jobs.add_metric([queue, CLAIMED], 0.0)
        yield jobs
        yield oldest
        workers = GaugeMetricFamily("pgtasks_workers", "Registered workers by state.", labels=["state"])
        running = GaugeMetricFamily(
            "pgtasks_worker_running_jobs", "Jobs whose body each worker runs.", labels=["worker"]
        )
        claimed = GaugeMetricFamily(
            "pgtasks_worker_claimed_jobs", "Jobs each worker holds claimed, not started.", labels=["worker"]
        )
        counts = {"alive": 0, "stopping": 0, "expired": 0}
        for w in list_workers(self.app):
            counts[w.state] += 1
            running.add_metric([w.id], float(w.running))
            claimed.add_metric([w.id], float(w.claimed))
        for state, n in counts.items():
            workers.add_metric([state], float(n))
        yield workers
        yield running
        yield claimed
