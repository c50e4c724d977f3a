"""The metrics plugin reads real queue state from PostgreSQL."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import pgtasks
from pgtasks_metrics.collector import QueueCollector


def _samples(app: pgtasks.App) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(app))
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_queue_length_per_status(app: pgtasks.App) -> None:
    @app.task(name="m.noop", queue="ocr")
    def noop(i: int) -> int:
        return i

    noop.delay_many(range(7))
    other = noop.apply_async((1,), queue="mail")
    assert other.revoke()

    samples = _samples(app)
    assert samples[("pgtasks_jobs", (("queue", "ocr"), ("status", "queued")))] == 7
    assert samples[("pgtasks_jobs", (("queue", "ocr"), ("status", "failed")))] == 0
    assert samples[("pgtasks_jobs", (("queue", "mail"), ("status", "cancelled")))] == 1
    assert samples[("pgtasks_queue_oldest_job_age_seconds", (("queue", "ocr"),))] >= 0
    assert samples[("pgtasks_workers", (("state", "alive"),))] == 0
