"""Flow control's own tables (`FlowStore`, migration 0008): tenant weights, and the
pruning of concurrency counters and rate windows no claim needs any more.

The claim reads the weights and writes the counters and windows itself
(``job_claim_batch``); this store sets and lists weights and prunes the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgtasks.db.database import Database, Now

__all__ = ["FlowPruneBatch", "FlowStore", "TenantWeight"]


@dataclass(frozen=True, slots=True)
class TenantWeight:
    """A tenant's weight in the fair claim.

    Attributes:
        queue: the queue it applies to; ``""`` for every queue without a row of its own.
        tenant: the tenant. weight: its weight (> 0; a tenant without a row weighs 1).
    """

    queue: str
    tenant: str
    weight: float


@dataclass(frozen=True, slots=True)
class FlowPruneBatch:
    """One ``flow_state_prune``.

    Attributes:
        concurrency_keys: idle counters deleted from pgtasks.concurrency_keys.
        concurrency_releases: release rows deleted with them (slots given back that no
            claim had folded into the counter yet).
        rate_windows: recharged windows deleted from pgtasks.rate_windows.
        key_candidates: idle counters found, deleted or not (one whose key lock or row
            was held elsewhere is kept); as many as the limit: there may be more.
    """

    concurrency_keys: int
    concurrency_releases: int
    rate_windows: int
    key_candidates: int


class FlowStore:
    """Runs the ``tenant_weight_*`` queries and ``flow_state_prune`` on a `Database`."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def weight_set(self, *, queue: str, tenant: str, weight: float) -> TenantWeight:
        """Set (insert or replace) a tenant's weight; returns the row written."""
        row = self.database.fetch_one(
            "tenant_weight_set", {"queue": queue, "tenant": tenant, "weight": weight}
        )
        assert row is not None  # an upsert returns its row
        return TenantWeight(row["queue"], row["tenant"], float(row["weight"]))

    def weight_delete(self, *, queue: str, tenant: str) -> bool:
        """Drop a tenant's weight; returns whether there was one."""
        rows = self.database.fetch_all("tenant_weight_delete", {"queue": queue, "tenant": tenant})
        return bool(rows)

    def weight_list(self, *, tenant: str | None = None) -> list[TenantWeight]:
        """Every weight set (only ``tenant``'s unless None), by queue then tenant."""
        rows = self.database.fetch_all("tenant_weight_list", {"tenant": tenant})
        return [TenantWeight(r["queue"], r["tenant"], float(r["weight"])) for r in rows]

    def prune(self, *, key_limit: int, limit: int, now: Now = None) -> FlowPruneBatch:
        """Delete up to ``key_limit`` idle concurrency counters (no slot held once the
        release rows are counted, no running job, the key's advisory lock free; their
        release rows with them) and up to ``limit`` rate windows whose next start is
        more than max(1 hour, their period) before ``now`` (None: the database clock).
        One statement, its own transaction; it never waits for a lock (see
        ``flow_state_prune`` for why claims and ending jobs are safe).

        Raises:
            DatabaseError: the statement failed (nothing deleted).
        """
        row = self.database.fetch_one(
            "flow_state_prune", {"key_limit": key_limit, "limit": limit, "now": now}
        )
        assert row is not None  # aggregates without FROM return one row
        return FlowPruneBatch(
            concurrency_keys=int(row["concurrency_keys"]),
            concurrency_releases=int(row["concurrency_releases"]),
            rate_windows=int(row["rate_windows"]),
            key_candidates=int(row["key_candidates"]),
        )
