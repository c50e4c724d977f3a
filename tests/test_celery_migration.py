"""The Celery migration guide, exercised: a Celery project and its pgtasks conversion
(`examples.celery_migration`) do the same work and give the same results.

The Celery side runs on a real Celery worker (a subprocess, solo pool) with this
machine's Redis as broker and result backend, on a queue of this test alone; the
pgtasks side on a real pgtasks worker over the test's database. The beat schedule
and the pgtasks schedules it became must fire at the same minutes.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from pgtasks.worker import Worker, WorkerConfig

REPO = Path(__file__).resolve().parents[1]
BROKER = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_APP = "examples.celery_migration.celery_version.celeryapp"
ZONE = ZoneInfo("Europe/Berlin")

pytestmark = pytest.mark.slow


def _fresh(name: str) -> ModuleType:
    """Import ``name`` anew (its module-level app reads the environment)."""
    sys.modules.pop(name, None)
    return importlib.import_module(name)


@pytest.fixture
def celery_queue() -> Iterator[str]:
    """A queue of this test alone, served by a Celery worker subprocess on Redis."""
    redis = pytest.importorskip("redis")
    try:
        redis.Redis.from_url(BROKER, socket_connect_timeout=2).ping()
    except redis.exceptions.ConnectionError as exc:
        pytest.skip(f"no Redis at {BROKER}: {exc}")
    queue = f"invoices_{uuid.uuid4().hex[:10]}"
    env = {**os.environ, "CELERY_BROKER_URL": BROKER, "CELERY_QUEUE": queue, "PYTHONPATH": str(REPO)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", CELERY_APP, "worker", "-P", "solo", "-Q", queue,
         "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "WARNING"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        yield queue
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)


def _celery_results(queue: str) -> dict[str, Any]:
    celeryapp = _fresh(CELERY_APP)
    celeryapp.app.conf.task_default_queue = queue
    tasks = _fresh("examples.celery_migration.celery_version.tasks")
    delayed = tasks.total.apply_async(([5, 7],), countdown=2)
    early = _ready_after(delayed, 0.5)
    return {
        "total": tasks.total.delay([1250, 399, 1]).get(timeout=60),
        "chain": tasks.invoice_total_with_tax([1000, 234], 19).get(timeout=60),
        "rate": tasks.fetch_rate.delay("USD", unavailable_for=2).get(timeout=60),
        "report": tasks.report.delay("daily").get(timeout=60),
        "countdown": (early, delayed.get(timeout=60)),
    }


def _ready_after(result: Any, seconds: float) -> bool:
    """Whether a job enqueued with a countdown had run ``seconds`` later."""
    time.sleep(seconds)
    return bool(result.ready())


def _pgtasks_results(dsn: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("PGTASKS_DSN", dsn)
    monkeypatch.setenv("PGTASKS_DISABLE_PLUGIN_AUTOLOAD", "1")
    tasks = _fresh("examples.celery_migration.pgtasks_version.tasks")
    app = tasks.app
    app.migrate()  # step 1 of the guide
    app.schedules.sync()
    worker = Worker(app, WorkerConfig(queues=(tasks.QUEUE,), concurrency=2, poll_interval=0.1))
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    try:
        delayed = tasks.total.apply_async(([5, 7],), countdown=2)
        early = _ready_after(delayed, 0.5)
        return {
            "total": tasks.total.delay([1250, 399, 1]).get(timeout=60),
            "chain": tasks.invoice_total_with_tax([1000, 234], 19).get(timeout=60),
            "rate": tasks.fetch_rate.delay("USD", unavailable_for=2).get(timeout=60),
            "report": app.schedules.trigger("nightly-report").get(timeout=60),
            "countdown": (early, delayed.get(timeout=60)),
        }
    finally:
        worker.request_stop("test")
        thread.join(60)
        app.close()


def test_both_versions_give_the_same_results(
    celery_queue: str, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    celery = _celery_results(celery_queue)
    moved = _pgtasks_results(dsn, monkeypatch)
    assert celery == {
        "total": 1650,
        "chain": 1468,  # 1234 + 19 % rounded half up
        "rate": {"currency": "USD", "rate": 108, "retries": 2},  # two failed attempts, then the rate
        "report": "report daily: 3 rates",
        "countdown": (False, 12),  # not run half a second in, then run
    }
    assert moved == celery


def _celery_fires(schedule: Any, start: datetime, end: datetime) -> set[datetime]:
    """The minutes in [start, end) at which a Celery ``crontab`` fires, in its zone."""
    fires = set()
    minute = start
    while minute < end:
        local = minute.astimezone(ZONE)
        weekday = (local.weekday() + 1) % 7  # Celery: 0 is Sunday
        if (
            local.minute in schedule.minute
            and local.hour in schedule.hour
            and weekday in schedule.day_of_week
            and local.day in schedule.day_of_month
            and local.month in schedule.month_of_year
        ):
            fires.add(minute)
        minute += timedelta(minutes=1)
    return fires


def test_the_beat_schedule_and_the_schedules_it_became_fire_at_the_same_minutes(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    celery_schedule = _fresh(CELERY_APP).app.conf.beat_schedule
    monkeypatch.setenv("PGTASKS_DSN", dsn)
    monkeypatch.setenv("PGTASKS_DISABLE_PLUGIN_AUTOLOAD", "1")
    app = _fresh("examples.celery_migration.pgtasks_version.tasks").app
    try:
        app.schedules.sync()
        start = datetime(2027, 1, 4, tzinfo=UTC)  # two weeks without a DST change
        end = start + timedelta(days=14)
        for name, entry in celery_schedule.items():
            schedule = app.schedules.get(name)
            assert schedule.task_name == entry["task"]
            assert tuple(schedule.args) == entry["args"]
            ours = {
                t
                for t in app.schedules.next_fire_times(name, 1000, after=start - timedelta(seconds=1))
                if t < end
            }
            expected = _celery_fires(entry["schedule"], start, end)
            assert expected, name
            assert ours == expected, name
    finally:
        app.close()
