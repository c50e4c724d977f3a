"""`IsolationStore`: switching row-level security mode on and off, and reading its state.

The policies themselves are created by functions of migration 0006
(``pgtasks.rls_enable`` and its siblings); this store runs them by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pgtasks.db.database import Database
from pgtasks.errors import DatabaseError

__all__ = ["IsolationStore", "TableIsolation"]


@dataclass(frozen=True, slots=True)
class TableIsolation:
    """Row-level security state of one tenant table.

    Attributes:
        table: the table's qualified name (``pgtasks.jobs``).
        enabled: row-level security is on (and forced on the owner, see ``forced``).
        forced: the policies bind the table's owner too.
        tenant_policy: the policy that keys rows on ``pgtasks.tenant`` exists.
        fleet_roles: roles of the policy that lets workers see every row.
    """

    table: str
    enabled: bool
    forced: bool
    tenant_policy: bool
    fleet_roles: tuple[str, ...]


class IsolationStore:
    """Runs the row-level security statements (named queries ``rls_*``).

    Args:
        database: the `Database` that runs the statements.

    Each method raises `pgtasks.errors.DatabaseError` when PostgreSQL refuses (a
    role that does not exist, a table the current role does not own, migration 0006
    not applied).
    """

    def __init__(self, database: Database) -> None:
        self.database = database

    def enable(self, fleet_roles: Sequence[str] | None) -> list[str]:
        """Enable the mode on every tenant table, in one transaction; returns their names.

        Args:
            fleet_roles: roles that see every row; None for the current role.
        """
        params = {"fleet_roles": list(fleet_roles) if fleet_roles is not None else None}
        with self.database.transaction() as tx:
            return [r["table_name"] for r in self.database.fetch_all("rls_enable", params, conn=tx)]

    def disable(self) -> list[str]:
        """Drop the policies and disable the mode on every tenant table; returns their names."""
        with self.database.transaction() as tx:
            return [r["table_name"] for r in self.database.fetch_all("rls_disable", conn=tx)]

    def grant_tenant_role(self, role: str) -> list[str]:
        """Grant ``role`` what tenant handles need on every tenant table; returns their names.

        Raises:
            DatabaseError: (SQLSTATE ``42501``) the role still lacks some of it, naming
                what: the current role may not grant it (PostgreSQL then only warns,
                "no privileges were granted"). Nothing is changed.
        """
        with self.database.transaction() as tx:
            rows = self.database.fetch_all("rls_grant_tenant_role", {"role": role}, conn=tx)
            missing = [
                r["object"]
                for r in self.database.fetch_all("rls_tenant_role_missing", {"role": role}, conn=tx)
            ]
            if missing:
                raise DatabaseError(
                    f"the current role may not grant {role!r} what tenant handles need on "
                    f"{', '.join(missing)}: run `pgtasks rls grant` as the tables' owner",
                    sqlstate="42501",
                )
            return [r["table_name"] for r in rows]

    def sees_every_row(self) -> tuple[bool, str]:
        """Whether the current role sees every tenant's jobs (the mode does not apply to
        it, or it is in the fleet), and the role's name."""
        row = self.database.fetch_one("rls_sees_every_row")
        assert row is not None
        return bool(row["sees_every_row"]), str(row["role"])

    def status(self) -> list[TableIsolation]:
        """The state of each tenant table, in schema and name order."""
        return [
            TableIsolation(
                table=r["table_name"],
                enabled=bool(r["enabled"]),
                forced=bool(r["forced"]),
                tenant_policy=bool(r["tenant_policy"]),
                fleet_roles=tuple(r["fleet_roles"]),
            )
            for r in self.database.fetch_all("rls_status")
        ]
