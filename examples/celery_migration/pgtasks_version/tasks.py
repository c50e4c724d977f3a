"""The project's tasks moved to pgtasks, step by step as docs/migrating-from-celery.md
says ("A step-by-step move"); each step is marked below.

Step 1, the schema: ``pgtasks -A examples.celery_migration.pgtasks_version.tasks:app migrate``.
Run a worker with ``pgtasks -A examples.celery_migration.pgtasks_version.tasks:app worker
-Q invoices --beat`` (``--beat`` replaces ``celery beat``).
"""

from __future__ import annotations

import os

import pgtasks
from examples.celery_migration.rates import RateUnavailable, lookup_rate, render_report

QUEUE = os.environ.get("PGTASKS_QUEUE", "invoices")

# Step 2: ``Celery("invoices", broker=..., backend=...)`` becomes ``pgtasks.App``; the DSN
# comes from PGTASKS_DSN (or DATABASE_URL). Serializer settings go: arguments are stored
# exactly or refused. ``task_acks_late`` goes: a job stays running until its outcome is
# written. ``task_default_queue`` becomes each task's ``queue=``.
app = pgtasks.App("invoices")


# The task bodies stay as they were.
@app.task(name="invoices.total", queue=QUEUE)
def total(amounts: list[int]) -> int:
    """The sum of an invoice's line amounts, in cents."""
    return sum(amounts)


@app.task(name="invoices.with_tax", queue=QUEUE)
def with_tax(net: int, rate_percent: int) -> int:
    """The gross amount, in cents, rounded half up."""
    return net + (net * rate_percent + 50) // 100


@app.task(
    name="invoices.fetch_rate",
    queue=QUEUE,
    bind=True,
    autoretry_for=(RateUnavailable,),
    max_retries=3,
    retry_backoff=False,
    default_retry_delay=0,
)
def fetch_rate(self: pgtasks.TaskContext, currency: str, unavailable_for: int = 0) -> dict[str, object]:
    """An exchange rate from a flaky source: it fails ``unavailable_for`` times first."""
    return {"currency": currency, "rate": lookup_rate(currency, self.request.retries, unavailable_for),
            "retries": self.request.retries}  # fmt: skip


# Step 3: the ``beat_schedule`` entries become schedules. Celery's ``timezone`` setting
# is each schedule's ``timezone``; ``crontab(hour=2, minute=30)`` is "30 2 * * *".
@app.periodic_task(
    "30 2 * * *", name="nightly-report", task_name="invoices.report", timezone="Europe/Berlin",
    args=("daily",), queue=QUEUE,
)  # fmt: skip
def report(period: str) -> str:
    """The report of a period."""
    return render_report(period)


app.add_periodic_task(
    "*/15 8-18 * * mon-fri", fetch_rate, name="quarter-hourly-rates", timezone="Europe/Berlin", args=("EUR",)
)


# A chain keeps its name and its rule: with_tax gets total's result prepended
# (docs/workflows.md). The second job waits in the database until the first succeeded.
def invoice_total_with_tax(amounts: list[int], rate_percent: int) -> pgtasks.AsyncResult:
    """The chain total -> with_tax, started; its result is the gross amount."""
    return pgtasks.chain(total.s(amounts), with_tax.s(rate_percent)).apply_async()
