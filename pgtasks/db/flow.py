"""Flow control's own table: tenant weights (`FlowStore`, migration 0008).

The claim reads the weights itself (``job_claim_batch``); this store sets and lists them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgtasks.db.database import Database

__all__ = ["FlowStore", "TenantWeight"]


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


class FlowStore:
    """Runs the ``tenant_weight_*`` queries on a `Database`."""

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
