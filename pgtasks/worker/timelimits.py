"""Time limits for the ``threads`` pool: a watchdog raising inside late tasks.

``soft_time_limit`` raises `SoftTimeLimitExceeded` inside the task (it may catch
it to clean up). ``time_limit`` cannot be enforced on a thread: the watchdog
raises `HardTimeLimitExceeded` in it, which arrives at the next Python bytecode,
so it is best-effort here. The ``processes`` pool enforces it by killing the child.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pgtasks.errors import SoftTimeLimitExceeded, TimeLimitExceeded
from pgtasks.maintenance import Service
from pgtasks.worker.pool import HeldJob, raise_in_thread

__all__ = ["HardTimeLimitExceeded", "TimeLimitResult", "TimeLimitWatchdog"]

log = logging.getLogger("pgtasks.worker")


class HardTimeLimitExceeded(TimeLimitExceeded):
    """Raised inside a thread-pool task at its hard ``time_limit`` (best effort)."""

    def __init__(self, job_id: int = 0, status: str = "running", error: dict[str, Any] | None = None) -> None:
        super().__init__(job_id, status, error or {"type": "TimeLimitExceeded", "message": "hard time limit"})


@dataclass(frozen=True, slots=True)
class TimeLimitResult:
    """One watchdog round: soft and hard limits signalled."""

    soft: int
    hard: int


class TimeLimitWatchdog(Service):
    """Checks running jobs every ``interval`` seconds against their task's limits.

    Args:
        jobs: returns the jobs held now.
        interval: seconds between checks (default 0.1).
        on_hard_limit: called for a job past its hard limit (the processes pool
            kills the child there; the threads pool raises in the thread).
        soft_in_thread: raise the soft limit in the job's thread (the threads pool).
            False for the processes pool, whose children raise it themselves: the
            thread there is the parent's slot driver, which must never see it.
    """

    name = "time-limits"

    def __init__(
        self,
        jobs: Callable[[], Iterable[HeldJob]],
        interval: float = 0.1,
        on_hard_limit: Callable[[HeldJob], None] | None = None,
        *,
        soft_in_thread: bool = True,
    ) -> None:
        super().__init__(interval)
        self.jobs = jobs
        self.on_hard_limit = on_hard_limit
        self.soft_in_thread = soft_in_thread

    def run_once(self) -> TimeLimitResult:
        """Signal every job past a limit once."""
        soft = hard = 0
        now = time.monotonic()
        for job in self.jobs():
            with job.lock:  # the pool thread marks a job finished under this lock
                fired = self._check(job, now)
            soft += fired[0]
            hard += fired[1]
        return TimeLimitResult(soft=soft, hard=hard)

    def _check(self, job: HeldJob, now: float) -> tuple[int, int]:
        """Signal one job (called with ``job.lock`` held); returns (soft, hard) signalled."""
        soft = hard = 0
        if job.task is None or job.started_at is None or job.thread_id is None or job.finished:
            return soft, hard
        elapsed = now - job.started_at
        opts = job.task.options
        if (
            self.soft_in_thread
            and opts.soft_time_limit is not None
            and elapsed > opts.soft_time_limit
            and not job.soft_limit_fired
        ):
            job.soft_limit_fired = True
            soft += 1
            log.warning("job %s passed its soft time limit (%.1fs)", job.id, opts.soft_time_limit)
            raise_in_thread(job.thread_id, SoftTimeLimitExceeded)
        if opts.time_limit is not None and elapsed > opts.time_limit and not job.hard_limit_fired:
            job.hard_limit_fired = True
            hard += 1
            log.warning("job %s passed its time limit (%.1fs)", job.id, opts.time_limit)
            if self.on_hard_limit is not None:
                self.on_hard_limit(job)
            else:
                raise_in_thread(job.thread_id, HardTimeLimitExceeded)
        return soft, hard
