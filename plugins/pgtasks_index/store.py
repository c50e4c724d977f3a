"""The index's named queries, run through a `pgtasks.db.Database` on the app's connections.

The plugin's SQL lives in ``sql/queries.sql`` next to this module (the format of
``pgtasks/sql/queries.sql``). It is run by a `Database` that is always handed one of
the app's pooled connections (or the caller's), so the plugin opens no pool of its
own and its statements can join the caller's transaction.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any, Final

from pgtasks.app import App
from pgtasks.errors import ConfigurationError, DatabaseError
from pgtasks.sql import parse_queries
from pgtasks.db import AnyConnection, Row, Database

from .records import Capabilities

__all__ = ["QUERIES", "IndexStore", "index_store"]

log = logging.getLogger("pgtasks_index")

QUERIES: Final = parse_queries(
    resources.files("pgtasks_index").joinpath("sql/queries.sql").read_text(encoding="utf-8"),
    source="pgtasks_index/sql/queries.sql",
)

_UNDEFINED_TABLE: Final = "42P01"
_NOT_MIGRATED: Final = (
    "the index tables do not exist yet: run app.migrate() (or `pgtasks migrate`) "
    "with the pgtasks_index plugin loaded"
)


class IndexStore:
    """Runs ``pgtasks_index`` queries for one app.

    Args:
        app: the app whose connections (and transactions) are used.
    """

    def __init__(self, app: App) -> None:
        self.app = app
        # This Database never opens a pool: every call below hands it a connection.
        self._runner = Database(app.store.dsn, queries=QUERIES)
        self._lock = threading.Lock()
        self._capabilities: Capabilities | None = None
        self._languages: set[str] = set()
        #: Language used when a call names none (`pgtasks_index.configure`); None: the default.
        self.default_language: str | None = None

    @contextmanager
    def transaction(self, conn: AnyConnection | None = None) -> Iterator[AnyConnection]:
        """A transaction on one of the app's connections (a savepoint in the caller's ``conn``)."""
        with self.app.store.transaction(conn) as tx:
            yield tx

    def fetch_all(
        self, name: str, params: dict[str, Any] | None = None, *, conn: AnyConnection | None = None
    ) -> list[Row]:
        """Run a named query; a missing table becomes a `ConfigurationError` saying to migrate.

        Raises:
            ConfigurationError: the plugin's migrations were not applied.
            DatabaseError: any other database failure.
        """
        try:
            with self.app.store.connection(conn) as c:
                return self._runner.fetch_all(name, params, conn=c)
        except DatabaseError as exc:
            if exc.sqlstate == _UNDEFINED_TABLE:
                raise ConfigurationError(_NOT_MIGRATED) from exc
            raise

    def fetch_one(
        self, name: str, params: dict[str, Any] | None = None, *, conn: AnyConnection | None = None
    ) -> Row | None:
        """`fetch_all`, first row or None."""
        rows = self.fetch_all(name, params, conn=conn)
        return rows[0] if rows else None

    def capabilities(self) -> Capabilities:
        """What the database offers (cached once the tables exist); logs missing pg_trgm once."""
        if self._capabilities is not None:
            return self._capabilities
        row = self.fetch_one("index_capabilities")
        assert row is not None
        caps = Capabilities(
            migrated=bool(row["migrated"]),
            trigram=bool(row["trigram"]),
            trigram_index=bool(row["trigram_index"]),
        )
        if caps.migrated:
            with self._lock:
                if self._capabilities is None:
                    self._capabilities = caps
                    if not caps.trigram:
                        log.warning(
                            "pgtasks_index: pg_trgm is not available on this database; search falls back "
                            "to substring matching (no fuzzy matching). Install the extension "
                            "(CREATE EXTENSION pg_trgm) to enable it."
                        )
                    elif not caps.trigram_index:
                        log.warning(
                            "pgtasks_index: pg_trgm is usable but the trigram index is missing (the "
                            "extension was added after migration); fallback matching scans each tenant. "
                            "Create it with: CREATE INDEX entries_trgm_idx ON pgtasks_index.entries "
                            "USING gin ((title || ' ' || body) gin_trgm_ops)"
                        )
        return caps

    def check_language(self, language: str) -> str:
        """Return ``language`` if it names a text-search configuration (cached).

        Raises:
            ConfigurationError: no such configuration (lists how to see them).
        """
        if language in self._languages:
            return language
        if not isinstance(language, str) or not language or "\x00" in language:
            raise ConfigurationError(f"language must be a text-search configuration name, got {language!r}")
        schema, _, name = language.rpartition(".")
        row = self.fetch_one("index_language_exists", {"name": name, "schema": schema or None})
        if not row or not row["present"]:
            raise ConfigurationError(
                f"unknown text-search language {language!r}; see SELECT cfgname FROM pg_ts_config "
                "(e.g. english, german, french, simple)"
            )
        with self._lock:
            self._languages.add(language)
        return language


_STORES: weakref.WeakKeyDictionary[App, IndexStore] = weakref.WeakKeyDictionary()
_STORES_LOCK = threading.Lock()


def index_store(app: App) -> IndexStore:
    """The `IndexStore` of ``app`` (one per app, created on first use)."""
    store = _STORES.get(app)
    if store is None:
        with _STORES_LOCK:
            store = _STORES.get(app)
            if store is None:
                store = _STORES[app] = IndexStore(app)
    return store
