"""The Celery application: broker, result backend, settings and the beat schedule.

Run a worker with ``celery -A examples.celery_migration.celery_version.celeryapp worker``
and beat with ``celery -A ... beat``. The broker and result backend are Redis
(``CELERY_BROKER_URL``, default ``redis://127.0.0.1:6379/0``).
"""

from __future__ import annotations

import os

from celery import Celery
from celery.schedules import crontab

BROKER = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")

app = Celery(
    "invoices", broker=BROKER, backend=BROKER, include=["examples.celery_migration.celery_version.tasks"]
)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    timezone="Europe/Berlin",
    task_acks_late=True,
    task_default_queue=os.environ.get("CELERY_QUEUE", "invoices"),
    beat_schedule={
        "nightly-report": {
            "task": "invoices.report",
            "schedule": crontab(hour=2, minute=30),
            "args": ("daily",),
        },
        "quarter-hourly-rates": {
            "task": "invoices.fetch_rate",
            "schedule": crontab(minute="*/15", hour="8-18", day_of_week="mon-fri"),
            "args": ("EUR",),
        },
    },
)
