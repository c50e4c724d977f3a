"""How a figure times the working-off of a pre-filled queue: first to last completion.

`wait_processed` watches the tasks' progress files (`benchmarks.systems.records`) and,
once they say all jobs ran, waits for the system's own bookkeeping to agree
(`Driver.finished`, else `Driver.pending`); `Drain` is what it measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from benchmarks.systems.base import Driver
from benchmarks.systems.clock import BenchmarkError, Clock
from benchmarks.systems.fleet import WorkerFleet
from benchmarks.systems.records import progress_count


@dataclass(slots=True)
class Drain:
    """How a pre-filled queue was worked off: `wait_processed`'s result."""

    first_at: float  # perf_counter seconds of the first sample that saw a completion
    count_at_first: int
    last_at: float  # perf_counter seconds when the last counted job was done and confirmed
    done: int  # jobs done at last_at: the target, or fewer when the deadline cut in
    partial: bool

    def rate(self) -> float:
        """Jobs/s between the first and the last sample (NaN when nothing was timed)."""
        elapsed = self.last_at - self.first_at
        jobs = self.done - self.count_at_first
        return jobs / elapsed if elapsed > 0 and jobs > 0 else float("nan")

    def as_result(self) -> dict[str, Any]:
        return {
            "process_seconds": self.last_at - self.first_at,
            "process_jobs_per_s": self.rate(),
            "jobs_done": self.done,
            "partial": self.partial,
        }


def wait_processed(
    driver: Driver,
    fleet: WorkerFleet,
    target: int,
    total: int,
    clock: Clock,
    *,
    cap: float | None = None,
    poll: float = 0.005,
) -> Drain:
    """Wait until ``target`` jobs of ``total`` queued are done; time first to last.

    When ``cap`` seconds (from this call) or the figure's deadline pass after some
    jobs were done, the result is *partial*: the rate over the jobs done so far, so a
    slow system still gets a number (flagged) while a stalled one (nothing done)
    raises :class:`BenchmarkError`.
    """
    cap_end = time.monotonic() + (cap if cap is not None else float("inf"))
    first_at: float | None = None
    count_at_first = 0
    while True:
        count = progress_count(driver.record_dir)
        now = time.perf_counter()
        if count > 0 and first_at is None:
            first_at, count_at_first = now, count
        if count >= target:
            break
        fleet.check_alive()
        progressed = first_at is not None and count > count_at_first
        if progressed and time.monotonic() > cap_end:
            assert first_at is not None
            return Drain(first_at, count_at_first, now, count, partial=True)
        try:
            clock.check(f"processing ({count} of {target} done)")
        except BenchmarkError:
            if first_at is None or not progressed:
                raise
            return Drain(first_at, count_at_first, now, count, partial=True)
        time.sleep(poll)
    # The task has run; wait for the system's own bookkeeping to agree.
    while True:
        last_at = time.perf_counter()
        finished = driver.finished()
        if finished is not None:
            if finished >= target:
                break
            pending: int | None = total - finished
        else:
            pending = driver.pending()
            if pending is None or pending <= total - target:
                break
        clock.check(f"waiting for the system to record completions ({pending} pending)")
        time.sleep(0.02)
    assert first_at is not None
    return Drain(first_at, count_at_first, last_at, target, partial=False)
