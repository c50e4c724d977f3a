"""What both versions of the project share: the task bodies' plain logic."""

from __future__ import annotations

RATES = {"EUR": 100, "USD": 108, "CHF": 94}


class RateUnavailable(Exception):
    """The rate source did not answer (transient: the task retries)."""


def lookup_rate(currency: str, retries: int, unavailable_for: int) -> int:
    """The rate of ``currency`` in hundredths, once ``retries`` reaches ``unavailable_for``.

    Raises:
        RateUnavailable: before that.
        KeyError: an unknown currency.
    """
    if retries < unavailable_for:
        raise RateUnavailable(f"{currency}: the rate source did not answer")
    return RATES[currency]


def render_report(period: str) -> str:
    """The (tiny) report of a period."""
    return f"report {period}: {len(RATES)} rates"
