"""`FlowPrune`: deletes flow-control state no claim needs any more.

A maintenance service (`pgtasks.maintenance.Service`) that every worker runs. Claims
leave one row per concurrency key in pgtasks.concurrency_keys and one per rate key in
pgtasks.rate_windows (migration 0008), and nothing else deletes them: with keys per
user or per host, both tables would grow for ever. A pass deletes, in bounded batches
(``flow_state_prune``):

- the counters of idle keys: no slot held (the counter, less the release rows no claim
  has folded in yet, is 0), no running job of the key, and the key's advisory lock (the
  one claims and ending jobs take) free at that instant; the counter goes with its
  release rows, and the next claim of the key makes it afresh, as for a new key;
- the rate windows whose next start is more than max(1 hour, their period) ago: the key
  has recharged fully, and a claim starts it afresh as a new key, which never allows
  more starts than the old row would.

The statement never waits: rows are taken ``FOR UPDATE SKIP LOCKED`` and the key locks
are only tried, so a claim never waits for a pass, nor a pass for a claim. Passes of
several workers at once are harmless, so no worker leads: they take disjoint rows (a
row one pass holds the other skips, a row it deleted is gone), and a pass over tables
kept small by pruning costs one scan of each until a batch comes back short.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from pgtasks.db import Now
from pgtasks.db.flow import FlowStore
from pgtasks.maintenance.service import Service, check_pass_config

__all__ = ["FlowPrune", "FlowPruneConfig", "FlowPruneResult"]

log = logging.getLogger("pgtasks.maintenance")


@dataclass(frozen=True, slots=True)
class FlowPruneConfig:
    """How the flow-control state is pruned.

    Attributes:
        interval: seconds between passes of a worker (> 0; default 300).
        batch: rate windows per statement (1..100000; default 10000).
        key_batch: concurrency counters per statement (1..5000; default 1000). Each
            holds its key's advisory lock until the statement commits, and advisory
            locks share the server's lock table (max_locks_per_transaction x
            max_connections entries, 6,400 by default, for every session together:
            PostgreSQL's "Advisory Locks"), so a batch of 10,000 would fill it.
        pause: seconds between the batches of a pass (>= 0; default 0.05).

    Raises:
        ConfigurationError: a value out of range.
    """

    interval: float = 300.0
    batch: int = 10_000
    key_batch: int = 1000
    pause: float = 0.05

    def __post_init__(self) -> None:
        check_pass_config(
            "flow prune",
            interval=self.interval,
            batches=(("batch", self.batch, 100_000), ("key_batch", self.key_batch, 5000)),
            at_least=(("pause", self.pause, 0),),
        )


@dataclass(frozen=True, slots=True)
class FlowPruneResult:
    """One pass.

    Attributes:
        concurrency_keys: idle counters deleted.
        concurrency_releases: release rows deleted with them.
        rate_windows: recharged rate windows deleted.
        batches: statements run.
    """

    concurrency_keys: int = 0
    concurrency_releases: int = 0
    rate_windows: int = 0
    batches: int = 0


class FlowPrune(Service):
    """Deletes, every ``config.interval`` seconds, the concurrency counters and rate
    windows no claim needs any more (see the module docstring).

    Args:
        store: the flow-control queries over the worker's (or app's) database.
        config: how often, how many per statement, the pause between statements.
        now: pinned time for every pass (tests); None: the database clock.
    """

    name = "flow-prune"

    def __init__(self, store: FlowStore, config: FlowPruneConfig | None = None, *, now: Now = None) -> None:
        config = FlowPruneConfig() if config is None else config
        super().__init__(config.interval)
        self.store = store
        self.config = config
        self.now = now
        self.last: FlowPruneResult | None = None
        self.passed = threading.Event()  # set after each pass (tests wait on it)

    def run_once(self) -> FlowPruneResult:
        """One pass: batches until one finds fewer idle counters than ``key_batch`` (or
        deletes none of them: all held elsewhere) and deletes fewer windows than
        ``batch``, or the service is stopped; returns the counts.

        Raises:
            DatabaseError: a statement failed (what earlier batches deleted stays
                deleted; the service tries again on its next tick).
        """
        keys = releases = windows = batches = 0
        while True:
            batch = self.store.prune(key_limit=self.config.key_batch, limit=self.config.batch, now=self.now)
            batches += 1
            keys += batch.concurrency_keys
            releases += batch.concurrency_releases
            windows += batch.rate_windows
            # More idle counters may follow a full batch that deleted some; one whose keys
            # were all held elsewhere would find the same ones again.
            more_keys = batch.key_candidates >= self.config.key_batch and batch.concurrency_keys > 0
            if not more_keys and batch.rate_windows < self.config.batch:
                break
            if self._stop.wait(self.config.pause):
                break
        result = FlowPruneResult(
            concurrency_keys=keys, concurrency_releases=releases, rate_windows=windows, batches=batches
        )
        if keys or windows:
            log.info(
                "flow prune: deleted %d idle concurrency key(s) (with %d release row(s)) and %d"
                " recharged rate window(s) in %d batch(es)",
                keys,
                releases,
                windows,
                batches,
            )
        self.last = result
        self.passed.set()
        return result
