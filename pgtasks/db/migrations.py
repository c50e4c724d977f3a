"""`MigrationStore`: the migration ledgers of pgtasks and of plugins, and applying a migration.

Each migration runs in its own transaction that first takes the migration advisory
lock (`lock`), so any number of processes may migrate at once: one applies, the
others wait and then find it recorded.
"""

from __future__ import annotations

from pgtasks.db.database import AnyConnection, Database
from pgtasks.sql import QUERIES

__all__ = ["MigrationStore"]


class MigrationStore:
    """Typed access to ``pgtasks.migrations`` and ``pgtasks.plugin_migrations``.

    Args:
        database: the `Database` that runs the statements.
    """

    def __init__(self, database: Database) -> None:
        self.database = database

    def lock(self, *, conn: AnyConnection) -> None:
        """Take the migration advisory lock until ``conn``'s transaction ends."""
        self.database.execute("migration_lock", conn=conn)

    def schema_exists(self, *, conn: AnyConnection | None = None) -> bool:
        """Whether pgtasks' migration ledger exists yet (a read-only check)."""
        row = self.database.fetch_one("migration_schema_exists", conn=conn)
        return bool(row and row["present"])

    def bootstrap(self, *, conn: AnyConnection) -> None:
        """Create the ``pgtasks`` schema and the migration ledger if missing.

        Only when the ledger is missing: PostgreSQL checks the right to create a schema
        before it looks whether it exists, so ``CREATE SCHEMA IF NOT EXISTS`` fails for
        a role that may not create one (a fleet role other than the tables' owner) even
        on a current database, where there is nothing to create. Run under the
        migration lock, so no other migrator creates it in between.
        """
        if self.schema_exists(conn=conn):
            return
        self.database.execute("migration_bootstrap_schema", conn=conn)
        self.database.execute("migration_bootstrap_table", conn=conn)

    def applied(self, *, conn: AnyConnection | None = None) -> set[int]:
        """Versions of pgtasks' own migrations already applied."""
        return {int(r["version"]) for r in self.database.fetch_all("migration_applied", conn=conn)}

    def record(self, *, version: int, name: str, conn: AnyConnection) -> None:
        """Record pgtasks' migration ``version`` as applied."""
        self.database.execute("migration_record", {"version": version, "name": name}, conn=conn)

    def plugin_applied(self, *, plugin: str, conn: AnyConnection | None = None) -> set[int]:
        """Versions of one plugin's migrations already applied."""
        rows = self.database.fetch_all("plugin_migration_applied", {"plugin": plugin}, conn=conn)
        return {int(r["version"]) for r in rows}

    def plugin_record(self, *, plugin: str, version: int, name: str, conn: AnyConnection) -> None:
        """Record a plugin's migration ``version`` as applied."""
        params = {"plugin": plugin, "version": version, "name": name}
        self.database.execute("plugin_migration_record", params, conn=conn)

    def apply_script(self, sql_text: str, *, conn: AnyConnection) -> None:
        """Run a migration file's statements (trusted text shipped in a package) in ``conn``."""
        self.database.execute_script(sql_text, conn=conn)

    @staticmethod
    def bootstrap_sql() -> list[str]:
        """The statements `bootstrap` runs, for a printed schema script."""
        return [QUERIES["migration_bootstrap_schema"], QUERIES["migration_bootstrap_table"]]
