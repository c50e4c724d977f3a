"""Numbered schema migrations shipped in the package, applied under an advisory lock.

Files live in ``pgtasks/migrations/NNNN_name.sql``. Each is applied in its own
transaction that first takes a transaction-level advisory lock, so any number of
processes may call `migrate` at once: one applies, the others wait and then find
nothing left to do. Applied versions are recorded in ``pgtasks.migrations``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

from pgtasks.errors import ConfigurationError
from pgtasks.store import AnyConnection, Store

if TYPE_CHECKING:
    from pgtasks.plugins import PluginMigrations

__all__ = ["Migration", "migrate", "migration_sql", "migrations", "pending"]

log = logging.getLogger("pgtasks.migrate")

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One migration file: its number, name and SQL text."""

    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """Every migration shipped in the package, in version order.

    Raises:
        ConfigurationError: two files share a version number.
    """
    found: dict[int, Migration] = {}
    for entry in resources.files("pgtasks").joinpath("migrations").iterdir():
        match = _FILE.match(entry.name)
        if not match:
            continue
        version = int(match.group(1))
        if version in found:
            raise ConfigurationError(f"two migrations with version {version}")
        found[version] = Migration(version, match.group(2), entry.read_text(encoding="utf-8"))
    return [found[v] for v in sorted(found)]


def _applied(store: Store) -> set[int]:
    present = store.fetch_one("migration_schema_exists")
    if not present or not present["present"]:
        return set()
    return {int(r["version"]) for r in store.fetch_all("migration_applied")}


def pending(store: Store) -> list[Migration]:
    """Migrations not yet applied to the store's database."""
    done = _applied(store)
    return [m for m in migrations() if m.version not in done]


def apply_each(
    store: Store,
    candidates: Iterable[Migration],
    *,
    applied: Callable[[AnyConnection], set[int]],
    record: Callable[[AnyConnection, Migration], None],
    label: str = "",
) -> list[Migration]:
    """Apply migrations one transaction each, under the migration advisory lock.

    Used for pgtasks' own migrations and for plugins' (`pgtasks.plugins.migrate_plugins`).

    Args:
        store: where to apply them.
        candidates: migrations in version order.
        applied: versions already applied, read inside the locked transaction.
        record: writes the ledger row of a migration just applied.
        label: prefix of the log line (a plugin key and ``:``), empty for pgtasks.

    Returns:
        The migrations this call applied.
    """
    done: list[Migration] = []
    for migration in candidates:
        with store.transaction() as conn:
            store.execute("migration_lock", conn=conn)
            if migration.version in applied(conn):
                continue
            store.execute_script(migration.sql, conn=conn)
            record(conn, migration)
        done.append(migration)
        log.info("applied migration %s%04d_%s", label, migration.version, migration.name)
    return done


def migrate(store: Store) -> list[Migration]:
    """Apply every pending migration; safe to call from many processes at once.

    Returns:
        The migrations this call applied (empty when the schema was current).

    Raises:
        DatabaseError: a migration failed; its transaction was rolled back.
    """

    def applied(conn: AnyConnection) -> set[int]:
        store.execute("migration_bootstrap_schema", conn=conn)
        store.execute("migration_bootstrap_table", conn=conn)
        return {int(r["version"]) for r in store.fetch_all("migration_applied", conn=conn)}

    def record(conn: AnyConnection, migration: Migration) -> None:
        store.execute("migration_record", {"version": migration.version, "name": migration.name}, conn=conn)

    return apply_each(store, migrations(), applied=applied, record=record)


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
    from pgtasks.queries import QUERIES

    parts = [
        "BEGIN;",
        QUERIES["migration_bootstrap_schema"] + ";",
        QUERIES["migration_bootstrap_table"] + ";",
    ]
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
