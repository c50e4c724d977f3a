"""The project's tasks, as a Celery project writes them."""

from __future__ import annotations

from celery import chain

from examples.celery_migration.celery_version.celeryapp import app
from examples.celery_migration.rates import RateUnavailable, lookup_rate, render_report


@app.task(name="invoices.total")
def total(amounts: list[int]) -> int:
    """The sum of an invoice's line amounts, in cents."""
    return sum(amounts)


@app.task(name="invoices.with_tax")
def with_tax(net: int, rate_percent: int) -> int:
    """The gross amount, in cents, rounded half up."""
    return net + (net * rate_percent + 50) // 100


@app.task(
    name="invoices.fetch_rate",
    bind=True,
    autoretry_for=(RateUnavailable,),
    max_retries=3,
    retry_backoff=False,
    default_retry_delay=0,
)
def fetch_rate(self, currency: str, unavailable_for: int = 0) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """An exchange rate from a flaky source: it fails ``unavailable_for`` times first."""
    return {"currency": currency, "rate": lookup_rate(currency, self.request.retries, unavailable_for),
            "retries": self.request.retries}  # fmt: skip


@app.task(name="invoices.report")
def report(period: str) -> str:
    """The report of a period."""
    return render_report(period)


def invoice_total_with_tax(amounts: list[int], rate_percent: int):  # type: ignore[no-untyped-def]
    """The chain total -> with_tax, started; its result is the gross amount."""
    return chain(total.s(amounts), with_tax.s(rate_percent)).apply_async()
