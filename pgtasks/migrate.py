"""Numbered schema migrations shipped in the package, applied under an advisory lock.

Files live in ``pgtasks/sql/migrations/NNNN_name.sql``. Each is applied in its own
transaction that first takes a transaction-level advisory lock, so any number of
processes may call `migrate` at once: one applies, the others wait and then find
nothing left to do. Applied versions are recorded in ``pgtasks.migrations``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from pgtasks.db import AnyConnection, MigrationStore, Stores
from pgtasks.sql import Migration, read_migrations

if TYPE_CHECKING:
    from pgtasks.plugins import PluginMigrations

__all__ = ["Migration", "migrate", "migration_sql", "migrations", "pending"]

log = logging.getLogger("pgtasks.migrate")


def migrations() -> list[Migration]:
    """Every migration shipped in the package, in version order.

    Raises:
        ConfigurationError: two files share a version number.
    """
    return read_migrations("pgtasks.sql", "migrations")


def pending(stores: Stores) -> list[Migration]:
    """Migrations not yet applied to the stores' database."""
    ledger = stores.migrations
    done = ledger.applied() if ledger.schema_exists() else set()
    return [m for m in migrations() if m.version not in done]


def apply_each(
    stores: Stores,
    candidates: Iterable[Migration],
    *,
    applied: Callable[[AnyConnection], set[int]],
    record: Callable[[AnyConnection, Migration], None],
    label: str = "",
) -> list[Migration]:
    """Apply migrations one transaction each, under the migration advisory lock.

    Used for pgtasks' own migrations and for plugins' (`pgtasks.plugins.migrate_plugins`).

    Args:
        stores: where to apply them.
        candidates: migrations in version order.
        applied: versions already applied, read inside the locked transaction.
        record: writes the ledger row of a migration just applied.
        label: prefix of the log line (a plugin key and ``:``), empty for pgtasks.

    Returns:
        The migrations this call applied.
    """
    ledger: MigrationStore = stores.migrations
    done: list[Migration] = []
    for migration in candidates:
        with stores.database.transaction() as conn:
            ledger.lock(conn=conn)
            if migration.version in applied(conn):
                continue
            ledger.apply_script(migration.sql, conn=conn)
            record(conn, migration)
        done.append(migration)
        log.info("applied migration %s%04d_%s", label, migration.version, migration.name)
    return done


def migrate(stores: Stores) -> list[Migration]:
    """Apply every pending migration; safe to call from many processes at once.

    Returns:
        The migrations this call applied (empty when the schema was current).

    Raises:
        DatabaseError: a migration failed; its transaction was rolled back.
    """

    ledger = stores.migrations

    def applied(conn: AnyConnection) -> set[int]:
        ledger.bootstrap(conn=conn)
        return ledger.applied(conn=conn)

    def record(conn: AnyConnection, migration: Migration) -> None:
        ledger.record(version=migration.version, name=migration.name, conn=conn)

    return apply_each(stores, migrations(), applied=applied, record=record)


def migration_sql(plugin_sets: Sequence[PluginMigrations] = ()) -> str:
    """The whole schema as one SQL script, for DBAs who apply DDL themselves.

    The script is what `migrate` (and, for ``plugin_sets``, the plugins' migrations
    that ``App.migrate`` applies next) would run on an empty database, wrapped in
    one transaction, recording each version.

    Args:
        plugin_sets: the loaded plugins' migration sets
            (`pgtasks.plugins.plugin_migration_sets`); their keys and file names
            are validated identifiers, so they are safe to write as literals.
    """
    parts = ["BEGIN;", *(statement + ";" for statement in MigrationStore.bootstrap_sql())]
    for m in migrations():
        parts.append(f"-- {m.version:04d}_{m.name}\n{m.sql.strip()}")
        parts.append(
            f"INSERT INTO pgtasks.migrations (version, name) VALUES ({m.version}, '{m.name}') "
            "ON CONFLICT (version) DO NOTHING;"
        )
    for mset in plugin_sets:
        for m in mset.migrations():
            parts.append(f"-- {mset.plugin}:{m.version:04d}_{m.name}\n{m.sql.strip()}")
            parts.append(
                "INSERT INTO pgtasks.plugin_migrations (plugin, version, name) "
                f"VALUES ('{mset.plugin}', {m.version}, '{m.name}');"
            )
    parts.append("COMMIT;")
    return "\n\n".join(parts) + "\n"
