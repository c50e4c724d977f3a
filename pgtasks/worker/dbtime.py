"""`DatabaseTime`: instants a worker records, kept on the database clock.

A worker records when a job's body started and ended without a round trip of its
own (the instants go with the success batch or the start recorder's statement), so
it reads them from its host. pgtasks trusts only the database clock (DESIGN:
"Workers use the database clock, never their own"), and host clocks disagree (no
NTP, a drifting VM). Registration and every heartbeat return the database's
``clock_timestamp()``; from it and the round trip the worker learns how far its host
clock is off. A reading places the database clock only to within half its round
trip (the answer was read somewhere between sending and receiving), so the host
clock is used as it is unless the skew exceeds `TRUSTED_SKEW` plus that half: a host
kept by NTP is never "corrected" by the noise of a slow round trip on a busy
machine, which would move recorded instants back and forth between readings and
make a job seem to start before its predecessor on the same slot ended. Readings
whose round trip is more than twice the best seen (and above `TRUSTED_SKEW`) are
ignored; beyond the bound, every recorded instant is corrected by the skew
measured, to within half the round trip of the reading.
"""

from __future__ import annotations

import time
from datetime import datetime

__all__ = ["REBASE_STEP", "TRUSTED_SKEW", "DatabaseTime"]

TRUSTED_SKEW = 0.05  # seconds the host clock may be off the database clock and still be used as is
REBASE_STEP = 0.001  # seconds the wall clock must step before instants follow it


class DatabaseTime:
    """Maps this process's `time.monotonic()` instants to POSIX seconds on the database clock.

    Attributes:
        correction: seconds added to the host clock's reading (0 while it is trusted).
    """

    def __init__(self) -> None:
        self.correction = 0.0
        self._best_round_trip = float("inf")
        self._base = _wall_minus_monotonic()

    def _rebase(self) -> None:
        """Follow a step of the host's wall clock (a manual change, an NTP step).

        Instants are mapped with one fixed offset between `time.monotonic()` and
        `time.time()`, so two instants keep their order: reading the two clocks
        afresh for each mapping let a thread switch between the two reads shift an
        instant back by the switch's length, and a job's recorded start could then
        precede its predecessor's end on the same slot. A new reading replaces the
        offset only when it moved by more than `REBASE_STEP` (a real step, not the
        noise of the two reads).
        """
        base = _wall_minus_monotonic()
        if abs(base - self._base) > REBASE_STEP:
            self._base = base

    def sync(self, database_clock: datetime, sent: float, received: float) -> None:
        """Measure the host clock against one statement's answer.

        Args:
            database_clock: the database's ``clock_timestamp()`` in the answer (aware).
            sent, received: `time.monotonic()` just before sending it and just after the answer.
        """
        self._rebase()
        round_trip = max(received - sent, 0.0)
        self._best_round_trip = min(self._best_round_trip, round_trip)
        if round_trip > max(TRUSTED_SKEW, 2 * self._best_round_trip):
            return  # a reading this imprecise would only add noise
        host_at_midpoint = (sent + received) / 2 + self._base
        skew = database_clock.timestamp() - host_at_midpoint
        self.correction = skew if abs(skew) > TRUSTED_SKEW + round_trip / 2 else 0.0

    def at(self, monotonic: float) -> float:
        """A `time.monotonic()` instant of this process as POSIX seconds on the database
        clock; later instants map to later times (between two corrections)."""
        return monotonic + self._base + self.correction

    def now(self) -> float:
        """Now, as POSIX seconds on the database clock."""
        return self.at(time.monotonic())


def _wall_minus_monotonic() -> float:
    """`time.time()` minus `time.monotonic()`, read so that a thread switch between the
    two reads does not shrink it: the largest of a few paired reads (a switch after the
    wall clock's read makes the difference smaller, never larger)."""
    return max(time.time() - time.monotonic() for _ in range(3))
