"""Where the scheduler's "now" comes from.

In production the database clock decides (`DatabaseClock`): every scheduler
process, on any host, agrees on what time it is, and no host clock is trusted.
Tests pin time by passing ``now=`` to ``run_once``, or, across several real
processes, use a `SimulatedClock` that every process derives from the same
anchor, so they race on the same fire times without waiting for real minutes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from pgtasks.errors import ConfigurationError

__all__ = ["Clock", "DatabaseClock", "SimulatedClock"]


class Clock(Protocol):
    """A source of the current time for scheduler ticks."""

    def now(self) -> datetime | None:
        """An aware datetime, or None to use the database clock."""


class DatabaseClock:
    """Use the database clock (``now()``) for every tick; the default."""

    def now(self) -> datetime | None:
        """Always None: the statements fall back to ``now()``."""
        return None


@dataclass(frozen=True, slots=True)
class SimulatedClock:
    """Time that runs ``speed`` times faster than the host clock, from a shared anchor.

    ``now = start + (time.time() - anchor) * speed``, never later than ``until``.
    Processes given the same four values agree on the time (up to host clock
    differences), which lets tests run many scheduler processes through minutes of
    schedule time in seconds.

    Args:
        start: simulated time at the anchor (aware).
        speed: simulated seconds per real second (> 0).
        anchor: POSIX time (seconds) at which the simulated clock reads ``start``.
        until: the clock stops here (aware), or None.

    Raises:
        ConfigurationError: a naive datetime or a non-positive speed.
    """

    start: datetime
    speed: float
    anchor: float
    until: datetime | None = None

    def __post_init__(self) -> None:
        for value in (self.start, self.until):
            if value is not None and (value.tzinfo is None or value.utcoffset() is None):
                raise ConfigurationError("simulated clock times must be timezone-aware")
        if not self.speed > 0:
            raise ConfigurationError(f"simulated clock speed must be > 0, got {self.speed!r}")

    @classmethod
    def parse(cls, text: str) -> SimulatedClock:
        """Parse ``START,SPEED,ANCHOR[,UNTIL]`` (ISO times with offsets, numbers).

        Raises:
            ConfigurationError: the text does not have that shape.
        """
        parts = [p.strip() for p in text.split(",")]
        if len(parts) not in (3, 4):
            raise ConfigurationError(f"simulated clock must be START,SPEED,ANCHOR[,UNTIL], got {text!r}")
        try:
            start = datetime.fromisoformat(parts[0])
            speed = float(parts[1])
            anchor = float(parts[2])
            until = datetime.fromisoformat(parts[3]) if len(parts) == 4 else None
        except ValueError as exc:
            raise ConfigurationError(f"bad simulated clock {text!r}: {exc}") from None
        return cls(start, speed, anchor, until)

    def now(self) -> datetime:
        """The simulated time (aware UTC)."""
        value = self.start + timedelta(seconds=(time.time() - self.anchor) * self.speed)
        if self.until is not None:
            value = min(value, self.until)
        return value.astimezone(UTC)
