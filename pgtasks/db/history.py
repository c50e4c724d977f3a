"""`HistoryStore`: moves of finished jobs from the hot table to the history
(migration 0009), one method per named query.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from pgtasks.db.database import Database, Now

__all__ = ["HistoryBatch", "HistorySizes", "HistoryStore"]


@dataclass(frozen=True, slots=True)
class HistoryBatch:
    """One ``job_history_move_batch``.

    Attributes:
        leader: this statement held the fleet's history lock (False: another worker's
            batch ran; nothing moved).
        moved: jobs moved from pgtasks.jobs to pgtasks.job_history.
        last_finished_at: the latest finish time among them (None: none moved); the
            next batch of the pass starts there.
    """

    leader: bool
    moved: int
    last_finished_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class HistorySizes:
    """Where finished jobs are (``job_history_sizes``).

    Attributes:
        hot_finished: finished jobs still in pgtasks.jobs (counted).
        history_estimate: rows of pgtasks.job_history as the planner estimates them
            (0 before its first ANALYZE).
        hot_bytes, history_bytes: each table's size on disk, indexes included.
    """

    hot_finished: int
    history_estimate: int
    hot_bytes: int
    history_bytes: int


class HistoryStore:
    """The history queries over a `Database`.

    Args:
        database: where to run them.
    """

    def __init__(self, database: Database) -> None:
        self.database = database

    def move_batch(
        self, *, after_seconds: float, limit: int, since: dt.datetime | None, now: Now = None
    ) -> HistoryBatch:
        """Move up to ``limit`` jobs that finished more than ``after_seconds`` seconds
        before ``now`` (None: the database clock), oldest first, from finish time
        ``since`` on (None: from the oldest), if no other batch runs in the fleet now.
        Unfinished jobs, prerequisites with unresolved edges and schedule runs not
        followed up yet never move. One transaction: ``retention_batch_settings``
        (plan in finish order, no wait for the WAL flush), then
        ``job_history_move_batch``.

        Raises:
            DatabaseError: the statement failed (nothing moved).
        """
        params = {"after_seconds": after_seconds, "limit": limit, "since": since, "now": now}
        with self.database.transaction() as conn:
            self.database.fetch_one("retention_batch_settings", conn=conn)
            row = self.database.fetch_one("job_history_move_batch", params, conn=conn)
        assert row is not None  # an aggregate without GROUP BY returns one row
        return HistoryBatch(
            leader=bool(row["leader"]), moved=int(row["moved"]), last_finished_at=row["last_finished_at"]
        )

    def sizes(self) -> HistorySizes:
        """Finished jobs in the hot table and the history, and both tables' sizes."""
        row = self.database.fetch_one("job_history_sizes")
        assert row is not None
        return HistorySizes(
            hot_finished=int(row["hot_finished"]),
            history_estimate=int(row["history_estimate"]),
            hot_bytes=int(row["hot_bytes"]),
            history_bytes=int(row["history_bytes"]),
        )
