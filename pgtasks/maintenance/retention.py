"""`Retention`: deletes finished jobs the retention policy no longer keeps.

A maintenance service (`pgtasks.maintenance.Service`) that every worker runs (unless
the policy is off). Only one worker deletes at a time: each batch takes the fleet's
retention lock (a transaction-level advisory lock, so it works behind PgBouncer's
transaction pooling), and a worker that finds it taken leaves the pass to the
holder until its next tick. Batches are bounded (``policy.batch`` rows, then
``policy.pause`` seconds), delete only finished jobs and skip locked rows, so
claims never wait for them.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import dataclass

from pgtasks.db import Now
from pgtasks.db.retention import RetentionCount, RetentionRules, RetentionStore
from pgtasks.maintenance.service import Service
from pgtasks.settings import RetentionPolicy

__all__ = ["Retention", "RetentionResult"]

log = logging.getLogger("pgtasks.maintenance")


@dataclass(frozen=True, slots=True)
class RetentionResult:
    """One retention pass (over the hot table, then the history of finished jobs).

    Attributes:
        deleted: jobs deleted, and of them per final status: succeeded, cancelled,
            failed, partial_failure.
        batches: statements run.
        yielded: the pass stopped because another worker held the retention lock.
    """

    deleted: int = 0
    succeeded: int = 0
    cancelled: int = 0
    failed: int = 0
    partial_failure: int = 0
    batches: int = 0
    yielded: bool = False


class Retention(Service):
    """Deletes, every ``policy.interval`` seconds, the finished jobs ``policy`` no
    longer keeps (see the module docstring).

    Args:
        store: the retention queries over the worker's (or app's) database.
        policy: what to keep, how often, how many per statement, the pause between.
        now: pinned time for every pass (tests); None: the database clock.
        tenant: only this tenant's jobs (None: every tenant's).
    """

    name = "retention"

    def __init__(
        self, store: RetentionStore, policy: RetentionPolicy, *, now: Now = None, tenant: str | None = None
    ) -> None:
        super().__init__(policy.interval)
        self.store = store
        self.policy = policy
        self.rules = RetentionRules.of(policy.rules())
        self.now = now
        self.tenant = tenant
        self.last: RetentionResult | None = None
        self.passed = threading.Event()  # set after each pass (tests wait on it)

    def run_once(self) -> RetentionResult:
        """One pass: batches until one comes back short, the lock is taken by another
        worker, or the service is stopped; returns the counts.

        Raises:
            DatabaseError: a statement failed (what earlier batches deleted stays
                deleted; the service tries again on its next tick).
        """
        if self.rules.min_keep is None:  # everything is kept forever
            return self._done(RetentionResult())
        totals = dict.fromkeys(("deleted", "succeeded", "cancelled", "failed", "partial_failure"), 0)
        batches = 0
        yielded = False
        for history in (False, True):  # the hot table, then the history (migration 0009)
            after: dt.datetime | None = None
            while True:
                batch = self.store.delete_batch(
                    rules=self.rules,
                    limit=self.policy.batch,
                    after=after,
                    tenant=self.tenant,
                    now=self.now,
                    history=history,
                )
                batches += 1
                if not batch.leader:
                    yielded = True
                    break
                for key in totals:
                    totals[key] += getattr(batch, key)
                if batch.deleted < self.policy.batch:
                    break
                after = batch.last_finished_at
                if self._stop.wait(self.policy.pause):
                    break
            if yielded or self._stop.is_set():
                break
        result = RetentionResult(**totals, batches=batches, yielded=yielded)
        if result.deleted:
            log.info(
                "retention: deleted %d finished job(s) (%d succeeded, %d cancelled, %d failed, "
                "%d partial_failure) in %d batch(es)",
                result.deleted,
                result.succeeded,
                result.cancelled,
                result.failed,
                result.partial_failure,
                batches,
            )
        return self._done(result)

    def preview(self) -> list[RetentionCount]:
        """What a pass would delete now, per queue, task and status; deletes nothing."""
        return self.store.count(rules=self.rules, tenant=self.tenant, now=self.now)

    def _done(self, result: RetentionResult) -> RetentionResult:
        self.last = result
        self.passed.set()
        return result
