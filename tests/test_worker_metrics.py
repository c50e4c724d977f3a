"""A worker's own Prometheus metrics (``pgtasks worker --metrics-port``), scraped over HTTP
from a real worker process and checked against the database and the tasks' side ledger.
"""

from __future__ import annotations

import re
import threading
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps.worker_app import one, rows, status, worker_id_of, workers
from helpers import eventually
from prometheus_client.parser import text_string_to_metric_families

import pgtasks
from pgtasks.errors import ConfigurationError
from pgtasks.worker import Worker, WorkerConfig
from pgtasks.worker.metrics import WorkerMetrics

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> tuple[str, Samples]:
    """The text of /metrics, and its samples by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return text, samples


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


def served_port(log: str) -> int | None:
    found = re.search(r"serves metrics on http://127\.0\.0\.1:(\d+)/metrics", log)
    return int(found.group(1)) if found else None


FINAL = ("succeeded", "failed", "cancelled", "partial_failure")


@pytest.mark.slow
def test_a_worker_serves_metrics_that_match_the_database(
    wdsn: str, client: pgtasks.App, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    # Two jobs of a worker that died: the reaper requeues one (attempts left) and fails
    # the other (none left).
    lost = rows(
        conn,
        "INSERT INTO pgtasks.jobs"
        " (task_name, status, attempt, max_attempts, worker_id, started_at, heartbeat_at)"
        " VALUES ('w.record', 'running', 1, 3, 'gone:1:dddddd', now() - interval '1 hour',"
        "         now() - interval '1 hour'),"
        "        ('w.record', 'running', 1, 1, 'gone:1:dddddd', now() - interval '1 hour',"
        "         now() - interval '1 hour') RETURNING id",
    )
    jobs = [client.tasks["w.record"].delay(n=i) for i in range(5)]
    jobs += [client.tasks["w.record"].apply_async(kwargs={"n": 9}, tenant="acme") for _ in range(3)]
    jobs += [client.tasks["w.fail"].delay() for _ in range(2)]  # retried, then failed
    jobs += [client.tasks["w.crash"].apply_async(tenant="acme"), client.tasks["w.reject"].delay()]
    ids = [j.id for j in jobs] + [r[0] for r in lost]
    args = ["-c", "2", "--poll-interval", "0.1", "--metrics-port", "0", "--metrics-tenants"]
    with workers(wdsn, tmp_path, args) as (worker,):
        worker_id_of(conn, worker.pid)
        served = eventually(lambda: served_port(worker.log()), timeout=20, message="metrics served")
        assert served is not None
        port = served

        def all_final() -> bool:
            return all(status(conn, i) in FINAL for i in ids)

        eventually(all_final, timeout=60, message="every job finished")
        # The listener's connection dies; the worker makes it again and counts it.
        listeners = rows(
            conn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE '%LISTEN pgtasks_cancel%'"
            " AND pid <> pg_backend_pid()",
        )
        assert len(listeners) == 1

        def reconnected() -> Samples | None:
            samples = scrape(port)[1]
            return samples if total(samples, "pgtasks_worker_listener_reconnects_total") >= 1 else None

        eventually(reconnected, timeout=20, message="listener reconnected")
        text, samples = scrape(port)

    # What ran here, from the tasks' own ledger: one row per attempt started.
    attempts = one(conn, "SELECT count(*) FROM public.ledger WHERE worker_pid = %s", (worker.pid,))
    ran_jobs = one(
        conn, "SELECT count(DISTINCT job_id) FROM public.ledger WHERE worker_pid = %s", (worker.pid,)
    )
    acme = one(
        conn,
        "SELECT count(*) FROM public.ledger l JOIN pgtasks.jobs j ON j.id = l.job_id"
        " WHERE l.worker_pid = %s AND j.tenant = 'acme'",
        (worker.pid,),
    )
    assert attempts == 5 + 3 + 2 * 4 + 1 + 1 + 1  # w.fail runs 4 attempts; the requeued lost job 1
    assert ran_jobs == len(jobs) + 1

    def final(state: str) -> int:
        return int(
            one(
                conn,
                "SELECT count(*) FROM pgtasks.jobs WHERE status = %s"
                " AND id IN (SELECT job_id FROM public.ledger WHERE worker_pid = %s)",
                (state, worker.pid),
            )
        )

    assert total(samples, "pgtasks_worker_jobs_started_total") == attempts
    assert total(samples, "pgtasks_worker_jobs_started_total", tenant="acme") == acme
    assert total(samples, "pgtasks_worker_jobs_finished_total") == attempts
    assert (
        total(samples, "pgtasks_worker_jobs_finished_total", outcome="succeeded") == final("succeeded") == 9
    )
    assert total(samples, "pgtasks_worker_jobs_finished_total", outcome="failed") == final("failed") == 4
    assert total(samples, "pgtasks_worker_jobs_finished_total", outcome="retried") == attempts - ran_jobs
    assert total(samples, "pgtasks_worker_job_retries_total") == attempts - ran_jobs
    assert total(samples, "pgtasks_worker_jobs_finished_total", task="w.fail", outcome="retried") == 6
    assert total(samples, "pgtasks_worker_job_run_seconds_count") == attempts
    assert total(samples, "pgtasks_worker_job_wait_seconds_count") == attempts
    assert total(samples, "pgtasks_worker_claimed_jobs_total") == attempts
    assert total(samples, "pgtasks_worker_claim_duration_seconds_count") >= 1
    worker_lost = {
        r[0]: (r[1], r[2])
        for r in rows(
            conn,
            "SELECT id, status, attempt FROM pgtasks.jobs WHERE id = ANY(%s)",
            ([r[0] for r in lost],),
        )
    }
    assert sorted(worker_lost.values()) == [("failed", 1), ("succeeded", 2)]
    assert total(samples, "pgtasks_worker_reaped_jobs_total", outcome="requeued") == 1
    assert total(samples, "pgtasks_worker_reaped_jobs_total", outcome="failed") == 1
    assert total(samples, "pgtasks_worker_listener_reconnects_total") == len(listeners)
    assert total(samples, "pgtasks_worker_prefetched_jobs") == 0
    assert total(samples, "pgtasks_worker_running_jobs") == 0
    # Bounded labels: task and queue names, the tenant (asked for), the outcome; never a job
    # id nor an error's text.
    label_names = {name for (_, labels) in samples for name, _ in labels}
    assert label_names <= {"task", "queue", "tenant", "outcome", "kind", "le", "worker_id", "pool"}
    assert "attempt 1 fails" not in text and "not covered by autoretry_for" not in text
    for i in ids:
        assert f'"{i}"' not in text


def test_without_a_port_a_worker_counts_nothing(app: pgtasks.App) -> None:
    worker = Worker(app, queues=("default",))
    try:
        assert worker.metrics is None
    finally:
        worker.database.close()


def test_the_tenant_label_is_there_only_when_asked() -> None:
    for tenants, expected in ((False, ["queue", "task"]), (True, ["queue", "task", "tenant"])):
        metrics = WorkerMetrics(worker_id="h:1:abcdef", pool="threads", tenants=tenants, held=list)
        metrics.job_started("t.a", "default", "acme", 0.5)
        metrics.job_finished("t.a", "default", "acme", "succeeded", 0.1)
        families = {f.name: f for f in text_string_to_metric_families(_text(metrics))}
        (sample,) = families["pgtasks_worker_jobs_started"].samples
        assert sorted(sample.labels) == expected


def _text(metrics: WorkerMetrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


def test_two_workers_in_one_process_count_apart() -> None:
    a = WorkerMetrics(
        worker_id="h:1:aaaaaa", pool="threads", tenants=False, held=lambda: [True, False, False]
    )
    b = WorkerMetrics(worker_id="h:1:bbbbbb", pool="threads", tenants=False, held=list)
    a.job_started("t.a", "default", "", None)
    assert "pgtasks_worker_jobs_started_total" in _text(a)
    assert 'pgtasks_worker_jobs_started_total{queue="default",task="t.a"} 1.0' in _text(a)
    assert 'task="t.a"' not in _text(b)
    assert "pgtasks_worker_prefetched_jobs 2.0" in _text(a)
    assert "pgtasks_worker_running_jobs 1.0" in _text(a)


def test_a_port_in_use_is_a_configuration_error() -> None:
    first = WorkerMetrics(worker_id="h:1:aaaaaa", pool="threads", tenants=False, held=list)
    first.serve("127.0.0.1", 0)
    try:
        assert first.port is not None
        second = WorkerMetrics(worker_id="h:1:bbbbbb", pool="threads", tenants=False, held=list)
        with pytest.raises(ConfigurationError, match=f"cannot serve metrics on 127.0.0.1:{first.port}"):
            second.serve("127.0.0.1", first.port)
    finally:
        first.stop()


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"metrics_port": 70000}, "metrics_port"),
        ({"metrics_port": -1}, "metrics_port"),
        ({"metrics_port": "9100"}, "metrics_port"),
        ({"metrics_host": ""}, "metrics_host"),
        ({"metrics_tenants": "yes"}, "metrics_tenants"),
    ],
)
def test_bad_metrics_settings_are_configuration_errors(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        WorkerConfig(**kwargs)


def test_counts_from_many_threads_add_up() -> None:
    """Each thread counts in numbers of its own; a scrape sums them, buckets included."""
    metrics = WorkerMetrics(worker_id="h:1:cccccc", pool="threads", tenants=False, held=list)

    def work(n: int) -> None:
        for i in range(n):
            metrics.job_started("t.a", "default", "", 0.02 if i % 2 else 2.0)
            metrics.job_finished("t.a", "default", "", "retried" if i % 4 == 0 else "succeeded", 0.004)

    threads = [threading.Thread(target=work, args=(10_000,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    samples: Samples = {}
    for family in text_string_to_metric_families(_text(metrics)):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert total(samples, "pgtasks_worker_jobs_started_total") == 40_000
    assert total(samples, "pgtasks_worker_jobs_finished_total", outcome="retried") == 10_000
    assert total(samples, "pgtasks_worker_jobs_finished_total", outcome="succeeded") == 30_000
    assert total(samples, "pgtasks_worker_job_retries_total") == 10_000
    assert total(samples, "pgtasks_worker_job_wait_seconds_bucket", le="0.025") == 20_000
    assert total(samples, "pgtasks_worker_job_wait_seconds_bucket", le="1.0") == 20_000
    assert total(samples, "pgtasks_worker_job_wait_seconds_bucket", le="2.5") == 40_000
    assert total(samples, "pgtasks_worker_job_wait_seconds_count") == 40_000
    assert total(samples, "pgtasks_worker_job_run_seconds_bucket", le="0.005") == 40_000
    assert total(samples, "pgtasks_worker_job_run_seconds_sum") == pytest.approx(160.0)
