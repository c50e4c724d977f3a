"""`RetentionStore`: the retention policy's deletes of finished jobs, one method per named query.

Both queries take the policy's rules through the ``retention_expired`` fragment, so
what the dry-run counts is what the delete deletes (docs/operations.md, "Retention").
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pgtasks.db.database import Database, Now

__all__ = ["RetentionBatch", "RetentionCount", "RetentionRules", "RetentionStore"]


@dataclass(frozen=True, slots=True)
class RetentionRules:
    """A retention policy as the retention queries take it.

    Attributes:
        scopes, names, statuses, keeps: parallel arrays, one entry per rule: scope
            ``task``, ``queue`` or ``default``; the task or queue name (``""`` for
            the default); the final status; seconds kept (``math.inf``: forever).
        min_keep: the shortest finite keep time (seconds), or None when every rule
            keeps forever (then nothing can be deleted).
    """

    scopes: tuple[str, ...]
    names: tuple[str, ...]
    statuses: tuple[str, ...]
    keeps: tuple[float, ...]
    min_keep: float | None

    @classmethod
    def of(cls, rules: Sequence[tuple[str, str, str, float | None]]) -> RetentionRules:
        """From ``(scope, name, status, seconds or None for forever)`` tuples
        (`pgtasks.settings.RetentionPolicy.rules`)."""
        keeps = tuple(math.inf if keep is None else float(keep) for _, _, _, keep in rules)
        finite = [k for k in keeps if math.isfinite(k)]
        return cls(
            scopes=tuple(r[0] for r in rules),
            names=tuple(r[1] for r in rules),
            statuses=tuple(r[2] for r in rules),
            keeps=keeps,
            min_keep=min(finite) if finite else None,
        )

    def params(self) -> dict[str, Any]:
        """The fragment's parameters (``min_keep`` must not be None)."""
        return {
            "scopes": list(self.scopes),
            "names": list(self.names),
            "statuses": list(self.statuses),
            "keeps": list(self.keeps),
            "min_keep": self.min_keep,
        }


@dataclass(frozen=True, slots=True)
class RetentionBatch:
    """One ``retention_delete_batch``.

    Attributes:
        leader: this statement held the fleet's retention lock (False: another
            worker's batch ran; nothing was deleted).
        deleted: jobs deleted, and of them per final status: succeeded, cancelled,
            failed, partial_failure.
        last_finished_at: the latest finish time among them (None: none deleted);
            the next batch of the pass starts there.
    """

    leader: bool
    deleted: int
    succeeded: int
    cancelled: int
    failed: int
    partial_failure: int
    last_finished_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class RetentionCount:
    """Jobs of one queue, task and final status the policy would delete now."""

    queue: str
    task_name: str
    status: str
    jobs: int


class RetentionStore:
    """The retention queries over a `Database`.

    Args:
        database: where to run them.
    """

    def __init__(self, database: Database) -> None:
        self.database = database

    def delete_batch(
        self,
        *,
        rules: RetentionRules,
        limit: int,
        after: dt.datetime | None,
        tenant: str | None = None,
        now: Now = None,
        history: bool = False,
    ) -> RetentionBatch:
        """Delete up to ``limit`` jobs the policy no longer keeps, oldest first, that
        finished at ``after`` or later (None: from the oldest), if no other batch runs
        in the fleet now. ``rules.min_keep`` must not be None. One transaction of two
        statements: ``retention_batch_settings`` (the plan, and no wait for the WAL
        flush), then ``retention_delete_batch`` (``history``: from the hot table
        pgtasks.jobs) or ``retention_delete_history_batch`` (from pgtasks.job_history,
        where finished jobs move after ``Settings.history_after``).

        Raises:
            DatabaseError: the statement failed (nothing deleted).
        """
        params = {**rules.params(), "limit": limit, "after": after, "tenant": tenant, "now": now}
        query = "retention_delete_history_batch" if history else "retention_delete_batch"
        with self.database.transaction() as conn:
            self.database.fetch_one("retention_batch_settings", conn=conn)
            row = self.database.fetch_one(query, params, conn=conn)
        assert row is not None  # an aggregate without GROUP BY returns one row
        return RetentionBatch(
            leader=bool(row["leader"]),
            deleted=int(row["deleted"]),
            succeeded=int(row["succeeded"]),
            cancelled=int(row["cancelled"]),
            failed=int(row["failed"]),
            partial_failure=int(row["partial_failure"]),
            last_finished_at=row["last_finished_at"],
        )

    def count(
        self, *, rules: RetentionRules, tenant: str | None = None, now: Now = None
    ) -> list[RetentionCount]:
        """What `delete_batch` would delete now (from both tables), per queue, task and
        status, without deleting anything (an empty list when every rule keeps forever)."""
        if rules.min_keep is None:
            return []
        params = {**rules.params(), "tenant": tenant, "now": now}
        rows = self.database.fetch_all("retention_count", params)
        return [RetentionCount(r["queue"], r["task_name"], r["status"], int(r["jobs"])) for r in rows]
