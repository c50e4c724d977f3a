"""`History`: moves finished jobs out of the hot table into pgtasks.job_history.

A maintenance service (`pgtasks.maintenance.Service`) that every worker runs unless
``Settings.history_after`` is None. A job that finished more than ``after`` seconds
ago moves, in one statement, from pgtasks.jobs to pgtasks.job_history (migration
0009), so the table the claim reads and its indexes stay the size of the live work
however long the history grows; every reader (`App.get_job`, `AsyncResult`, ``jobs
list``, ``explain``, ``schedules history``, the dashboard) reads both tables.

Only one worker moves at a time: each batch takes the fleet's history lock (a
transaction-level advisory lock, so it works behind PgBouncer's transaction pooling),
and a worker that finds it taken leaves the pass to the holder until its next tick.
Batches are bounded (``config.batch`` rows, then ``config.pause`` seconds), take only
finished rows and skip locked ones, so claims never wait for them.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import dataclass

from pgtasks.db import Now
from pgtasks.db.history import HistoryStore
from pgtasks.maintenance.service import Service, check_pass_config

__all__ = ["History", "HistoryConfig", "HistoryResult"]

log = logging.getLogger("pgtasks.maintenance")


@dataclass(frozen=True, slots=True)
class HistoryConfig:
    """How the history service moves finished jobs.

    Attributes:
        after: seconds after its finish a job moves to the history (>= 0).
        interval: seconds between passes of a worker (> 0; default 60).
        batch: jobs per statement (1..100000; default 5000).
        pause: seconds between the batches of a pass (>= 0; default 0.05).

    Raises:
        ConfigurationError: a value out of range.
    """

    after: float = 3600.0
    interval: float = 60.0
    batch: int = 5000
    pause: float = 0.05

    def __post_init__(self) -> None:
        check_pass_config(
            "history",
            interval=self.interval,
            batches=(("batch", self.batch, 100_000),),
            at_least=(("after", self.after, 0.0), ("pause", self.pause, 0.0)),
        )


@dataclass(frozen=True, slots=True)
class HistoryResult:
    """One history pass.

    Attributes:
        moved: jobs moved to the history.
        batches: statements run.
        yielded: the pass stopped because another worker held the history lock.
    """

    moved: int = 0
    batches: int = 0
    yielded: bool = False


class History(Service):
    """Moves, every ``config.interval`` seconds, the jobs that finished more than
    ``config.after`` seconds ago to the history (see the module docstring).

    Args:
        store: the history queries over the worker's (or app's) database.
        config: how long after finish, how often, how many per statement, the pause.
        now: pinned time for every pass (tests); None: the database clock.
    """

    name = "history"

    def __init__(self, store: HistoryStore, config: HistoryConfig, *, now: Now = None) -> None:
        super().__init__(config.interval)
        self.store = store
        self.config = config
        self.now = now
        self.last: HistoryResult | None = None
        self.passed = threading.Event()  # set after each pass (tests wait on it)

    def run_once(self) -> HistoryResult:
        """One pass: batches until one comes back short, the lock is taken by another
        worker, or the service is stopped; returns the counts.

        Raises:
            DatabaseError: a statement failed (what earlier batches moved stays moved;
                the service tries again on its next tick).
        """
        moved = batches = 0
        yielded = False
        since: dt.datetime | None = None
        while True:
            batch = self.store.move_batch(
                after_seconds=self.config.after, limit=self.config.batch, since=since, now=self.now
            )
            batches += 1
            if not batch.leader:
                yielded = True
                break
            moved += batch.moved
            if batch.moved < self.config.batch:
                break
            since = batch.last_finished_at
            if self._stop.wait(self.config.pause):
                break
        result = HistoryResult(moved=moved, batches=batches, yielded=yielded)
        if moved:
            log.info(
                "history: moved %d finished job(s) to pgtasks.job_history in %d batch(es)", moved, batches
            )
        self.last = result
        self.passed.set()
        return result
