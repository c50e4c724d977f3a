"""`IndexStore`: the index's data module, one method per named query of ``sql/queries.sql``.

The plugin's SQL lives in ``sql/queries.sql`` next to this module (the format of
pgtasks' own file); this module alone names those queries. They run through a
`pgtasks.plugin_api.NamedQueries` on the app's pooled connections (or the
caller's, so a write joins the caller's transaction): the plugin opens no pool of
its own. Methods take keyword-only parameters and return the records of
`pgtasks_index.records` or plain values; `pgtasks_index.api` checks arguments
and calls them.

A statement whose parameters name a tenant (every read and write of entries) runs
in a transaction of that tenant (`pgtasks.plugin_api.tenant_context`), so that in
pgtasks' row-level security mode a tenant's database role reaches its own entries;
the ``tenant = ...`` condition of each statement still decides which rows it sees.

Every method raises `ConfigurationError` when the plugin's tables do not exist
(its migrations were not applied) and `DatabaseError` for any other database
failure.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Final

from pgtasks.errors import ConfigurationError, DatabaseError
from pgtasks.plugin_api import (
    AnyConnection,
    Database,
    NamedQueries,
    Row,
    StoreProvider,
    package_queries,
    tenant_context,
)

from .records import Capabilities, IndexEntry, MatchKind, SearchHit, UpsertResult

__all__ = ["QUERIES", "IndexStore", "index_store"]

log = logging.getLogger("pgtasks_index")

QUERIES: Final = package_queries("pgtasks_index")

_UNDEFINED_TABLE: Final = "42P01"
_NOT_MIGRATED: Final = (
    "the index tables do not exist yet: run app.migrate() (or `pgtasks migrate`) "
    "with the pgtasks_index plugin loaded"
)


class IndexStore:
    """Typed access to ``pgtasks_index.entries`` over the app's `Database`.

    Args:
        database: the app's database (``app.stores.database``).

    Attributes:
        default_language: the language `pgtasks_index.configure` set, or None.
    """

    def __init__(self, database: Database) -> None:
        self._queries = NamedQueries(database, QUERIES)
        self._lock = threading.Lock()
        self._capabilities: Capabilities | None = None
        self._languages: set[str] = set()
        self.default_language: str | None = None

    def _fetch(
        self, name: str, params: dict[str, Any] | None = None, conn: AnyConnection | None = None
    ) -> list[Row]:
        tenant = (params or {}).get("tenant")
        scope = tenant_context(tenant) if isinstance(tenant, str) and tenant else contextlib.nullcontext()
        try:
            with scope:
                return self._queries.fetch_all(name, params, conn=conn)
        except DatabaseError as exc:
            if exc.sqlstate == _UNDEFINED_TABLE:
                raise ConfigurationError(_NOT_MIGRATED) from exc
            raise

    # -- capabilities ----------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        """What the database offers (cached once the tables exist); logs missing pg_trgm once."""
        if self._capabilities is not None:
            return self._capabilities
        row = self._fetch("index_capabilities")[0]
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
        rows = self._fetch("index_language_exists", {"name": name, "schema": schema or None})
        if not rows or not rows[0]["present"]:
            raise ConfigurationError(
                f"unknown text-search language {language!r}; see SELECT cfgname FROM pg_ts_config "
                "(e.g. english, german, french, simple)"
            )
        with self._lock:
            self._languages.add(language)
        return language

    # -- entries: write --------------------------------------------------------------

    def upsert(
        self,
        *,
        tenant: str,
        kind: str,
        key: str,
        title: str,
        body: str,
        language: str,
        metadata: str,
        conn: AnyConnection | None = None,
    ) -> UpsertResult:
        """Insert or replace one entry; ``metadata`` is a JSON object's text, ``language``
        a checked text-search configuration."""
        params = {
            "tenant": tenant, "kind": kind, "key": key, "title": title, "body": body,
            "language": language, "metadata": metadata,
        }  # fmt: skip
        row = self._fetch("entry_upsert", params, conn)[0]
        return UpsertResult(tenant, kind, key, bool(row["created"]), int(row["lexemes"]), language)

    def delete(self, *, tenant: str, kind: str, key: str, conn: AnyConnection | None = None) -> bool:
        """Remove one entry; True if it existed."""
        return bool(self._fetch("entry_delete", {"tenant": tenant, "kind": kind, "key": key}, conn))

    def delete_tenant(self, *, tenant: str, conn: AnyConnection | None = None) -> int:
        """Remove every entry of ``tenant``; returns how many."""
        rows = self._fetch("entry_delete_tenant", {"tenant": tenant}, conn)
        return int(rows[0]["deleted"]) if rows else 0

    # -- entries: read ---------------------------------------------------------------

    def get(self, *, tenant: str, kind: str, key: str) -> IndexEntry | None:
        """The stored entry, or None."""
        rows = self._fetch("entry_get", {"tenant": tenant, "kind": kind, "key": key})
        if not rows:
            return None
        row = rows[0]
        return IndexEntry(
            tenant=row["tenant"],
            kind=row["kind"],
            key=row["key"],
            title=row["title"],
            body=row["body"],
            language=row["language"],
            metadata=row["metadata"],
            indexed_at=row["indexed_at"],
        )

    def find_keys(self, *, tenant: str, kind: str, metadata: str, limit: int) -> list[str]:
        """Keys of entries whose metadata contains ``metadata`` (a JSON object's text), by key."""
        params = {"tenant": tenant, "kind": kind, "metadata": metadata, "limit": limit}
        return [r["key"] for r in self._fetch("entry_find_keys", params)]

    def count(self, *, tenant: str) -> dict[str, int]:
        """Entries of ``tenant`` per kind."""
        return {r["kind"]: int(r["entries"]) for r in self._fetch("entry_count", {"tenant": tenant})}

    # -- search ----------------------------------------------------------------------

    def search_fulltext(
        self,
        *,
        query: str,
        tenant: str,
        language: str,
        kinds: Sequence[str] | None,
        limit: int,
        headline_options: str,
    ) -> list[SearchHit]:
        """Full-text hits, best first; ``snippet`` is ``ts_headline``'s text as PostgreSQL gives it.

        Args:
            query: web-search syntax. language: a checked configuration.
            kinds: only these kinds, or None for all. limit: most hits.
            headline_options: ``ts_headline``'s options (fragments, highlight markers).
        """
        params = {
            "query": query, "tenant": tenant, "language": language,
            "kinds": list(kinds) if kinds is not None else None, "limit": limit,
            "headline_options": headline_options,
        }  # fmt: skip
        return [_hit(r, "fulltext") for r in self._fetch("entry_search_fulltext", params)]

    def search_substring(
        self,
        *,
        tenant: str,
        kinds: Sequence[str] | None,
        needle: str,
        pattern: str,
        exclude: Sequence[tuple[str, str]],
        limit: int,
    ) -> list[SearchHit]:
        """Fallback without pg_trgm: entries containing ``needle`` (``pattern`` is its ILIKE
        pattern, wildcards escaped), other than the ``(kind, key)`` pairs in ``exclude``;
        ``snippet`` is the text around the match."""
        params = _fallback(
            tenant=tenant, kinds=kinds, needle=needle, pattern=pattern, exclude=exclude, limit=limit
        )
        return [_hit(r, r["match"]) for r in self._fetch("entry_search_substring", params)]

    def search_trigram(
        self,
        *,
        tenant: str,
        kinds: Sequence[str] | None,
        needle: str,
        pattern: str,
        exclude: Sequence[tuple[str, str]],
        fuzzy: bool,
        limit: int,
    ) -> list[SearchHit]:
        """Fallback with pg_trgm: as `search_substring`, then, when ``fuzzy``, entries with a
        word similar to ``needle`` (``match`` says which)."""
        params = _fallback(
            tenant=tenant, kinds=kinds, needle=needle, pattern=pattern, exclude=exclude, limit=limit
        )
        params["fuzzy"] = fuzzy
        return [_hit(r, r["match"]) for r in self._fetch("entry_search_trigram", params)]


def _fallback(
    *,
    tenant: str,
    kinds: Sequence[str] | None,
    needle: str,
    pattern: str,
    exclude: Sequence[tuple[str, str]],
    limit: int,
) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "kinds": list(kinds) if kinds is not None else None,
        "needle": needle,
        "pattern": pattern,
        "exclude_kinds": [kind for kind, _ in exclude],
        "exclude_keys": [key for _, key in exclude],
        "limit": limit,
    }


def _hit(row: Row, match: MatchKind) -> SearchHit:
    return SearchHit(
        tenant=row["tenant"],
        kind=row["kind"],
        key=row["key"],
        title=row["title"],
        snippet=row["snippet"] or "",
        rank=float(row["rank"]),
        match=match,
        metadata=row["metadata"],
        indexed_at=row["indexed_at"],
    )


_STORES: weakref.WeakKeyDictionary[StoreProvider, IndexStore] = weakref.WeakKeyDictionary()
_STORES_LOCK = threading.Lock()


def index_store(app: StoreProvider) -> IndexStore:
    """The `IndexStore` of ``app`` (one per app, created on first use, over ``app.stores.database``)."""
    store = _STORES.get(app)
    if store is None:
        with _STORES_LOCK:
            store = _STORES.get(app)
            if store is None:
                store = _STORES[app] = IndexStore(app.stores.database)
    return store
