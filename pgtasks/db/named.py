"""`NamedQueries`: a plugin's own named-query file, run on the connections of an app's `Database`.

A plugin that owns tables ships its statements in a file of the format of
``pgtasks/sql/queries.sql`` and runs them through one `NamedQueries`, from its one
data module (``pgtasks_index/store.py`` is the example). The statements run on the
app's pooled connections, or on the caller's connection so that they join its
transaction; the plugin opens no pool of its own. Reached by plugins through
`pgtasks.plugin_api`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from pgtasks.db.database import AnyConnection, Database, Row

__all__ = ["NamedQueries"]


class NamedQueries:
    """Runs the statements of one named-query mapping on ``database``'s connections.

    Args:
        database: the app's `Database` (``app.stores.database``): its pool,
            transactions and connection set-up (jsonb decoding) are used.
        queries: name → statement, as `pgtasks.plugin_api.load_queries` or
            `pgtasks.plugin_api.package_queries` returns it.

    Every method raises `pgtasks.errors.DatabaseError` when PostgreSQL refuses a
    statement or the connection breaks, and `KeyError` for a name the mapping
    does not hold (a programming error).
    """

    def __init__(self, database: Database, queries: Mapping[str, str]) -> None:
        self.database = database
        # Runs the plugin's statements; it never opens a pool: every call hands it a
        # connection of ``database`` (or the caller's).
        self._runner = Database(database.dsn, queries=queries)

    @property
    def queries(self) -> Mapping[str, str]:
        """The read-only name → statement mapping."""
        return self._runner.queries

    @contextmanager
    def connection(self, conn: AnyConnection | None = None) -> Iterator[AnyConnection]:
        """``conn`` if given, else one of the app's pooled connections (autocommit)."""
        with self.database.connection(conn) as c:
            yield c

    @contextmanager
    def transaction(self, conn: AnyConnection | None = None) -> Iterator[AnyConnection]:
        """A transaction on one of the app's connections, or a savepoint in the caller's
        (`Database.transaction`: the caller's transaction is never committed here)."""
        with self.database.transaction(conn) as tx:
            yield tx

    def fetch_all(
        self, name: str, params: Mapping[str, Any] | None = None, *, conn: AnyConnection | None = None
    ) -> list[Row]:
        """Run the named statement with ``params`` (``%(key)s`` placeholders); every row as a dict."""
        with self.database.connection(conn) as c:
            return self._runner.fetch_all(name, params, conn=c)

    def fetch_one(
        self, name: str, params: Mapping[str, Any] | None = None, *, conn: AnyConnection | None = None
    ) -> Row | None:
        """`fetch_all`'s first row, or None."""
        rows = self.fetch_all(name, params, conn=conn)
        return rows[0] if rows else None

    def execute(
        self, name: str, params: Mapping[str, Any] | None = None, *, conn: AnyConnection | None = None
    ) -> int:
        """Run the named statement for its effect; returns the affected row count."""
        with self.database.connection(conn) as c:
            return self._runner.execute(name, params, conn=c)
