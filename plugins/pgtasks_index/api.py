"""The index's Python API: write, remove, read and search entries of one tenant.

An entry is one document or mail, identified by ``(tenant, kind, key)``. Every
function takes the `pgtasks.App` whose database holds the index (typed as the
`pgtasks.plugin_api.StoreProvider` it implements, so a task's ``self.app`` does);
writes accept ``conn=`` to join the caller's transaction.

Search runs in up to two steps. First PostgreSQL full-text search: the query is
parsed with ``websearch_to_tsquery`` (words, ``"phrases"``, ``or``, ``-word``) in
the entry language *and* in the ``simple`` configuration, so both stemmed words
and exact words (names, other languages, Cyrillic or Greek) match, ranked with
``ts_rank_cd``. When that gives fewer hits than asked for, a fallback finds
entries containing the query text as a substring, which catches what the
full-text parser cannot split into words, such as Chinese or Japanese text. When
full-text search found nothing at all and pg_trgm is usable, the fallback also
takes entries with a similar word (``word_similarity``, for typos in names);
fuzzy hits are not used to pad good results.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from pgtasks.errors import ConfigurationError
from pgtasks.plugin_api import AnyConnection, StoreProvider
from pgtasks.serialization import dumps

from .records import Capabilities, IndexEntry, SearchHit, UpsertResult
from .store import index_store

__all__ = [
    "DEFAULT_LANGUAGE",
    "DEFAULT_LIMIT",
    "capabilities",
    "configure",
    "count_entries",
    "default_language",
    "find_keys",
    "get_entry",
    "remove",
    "remove_tenant",
    "search",
    "upsert",
]

#: Text-search configuration used when neither the call nor `configure` names one.
DEFAULT_LANGUAGE: Final = "english"
#: Hits returned when the caller does not say.
DEFAULT_LIMIT: Final = 10
#: Most hits one search may return.
MAX_LIMIT: Final = 1000

_KIND_RE: Final = re.compile(r"^[a-z][a-z0-9_]*$")
_WHITESPACE_RE: Final = re.compile(r"\s+")


def configure(app: StoreProvider, *, language: str) -> None:
    """Set ``app``'s default text-search language (e.g. ``"german"``, ``"simple"``).

    Checked against the database on first use (`ConfigurationError` if unknown).
    """
    if not isinstance(language, str) or not language.strip():
        raise ConfigurationError(f"language must be a non-empty string, got {language!r}")
    index_store(app).default_language = language


def default_language(app: StoreProvider) -> str:
    """The language used for ``app`` when a call names none."""
    return index_store(app).default_language or DEFAULT_LANGUAGE


def capabilities(app: StoreProvider) -> Capabilities:
    """Whether the tables exist and pg_trgm (fuzzy/CJK fallback) is usable."""
    return index_store(app).capabilities()


def _check_identity(tenant: object, kind: object, key: object) -> tuple[str, str, str]:
    if not isinstance(tenant, str) or "\x00" in tenant:
        raise ConfigurationError(f"tenant must be a string without NUL, got {tenant!r}")
    if not isinstance(kind, str) or not _KIND_RE.match(kind):
        raise ConfigurationError(f"kind must match [a-z][a-z0-9_]* (e.g. 'document', 'mail'), got {kind!r}")
    if not isinstance(key, str) or not key or "\x00" in key:
        raise ConfigurationError(f"key must be a non-empty string without NUL, got {key!r}")
    return tenant, kind, key


def upsert(
    app: StoreProvider,
    *,
    tenant: str,
    kind: str,
    key: str,
    text: str,
    title: str = "",
    language: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    conn: AnyConnection | None = None,
) -> UpsertResult:
    """Insert or replace one entry.

    Args:
        app: the app whose database holds the index.
        tenant: the owner; searches see only their tenant's entries.
        kind: ``"document"``, ``"mail"`` or another lower-case word.
        key: the entry's id within tenant and kind (a document id, a mail's key).
        text: the body to index. NUL characters are removed (PostgreSQL text cannot
            hold U+0000); text past 500,000 characters is kept but not searchable.
        title: shown in hits and weighted above the body.
        language: text-search configuration (default: `default_language`).
        metadata: a JSON object stored with the entry and returned with hits.
        conn: the caller's connection; the write joins its transaction.

    Raises:
        ConfigurationError: a bad argument, an unknown language, or the plugin's
            migrations were not applied.
        SerializationError: ``metadata`` is not JSON-serialisable.
        DatabaseError: PostgreSQL refused the write.
    """
    tenant, kind, key = _check_identity(tenant, kind, key)
    if not isinstance(text, str) or not isinstance(title, str):
        raise ConfigurationError("text and title must be strings")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ConfigurationError(f"metadata must be a dict, got {type(metadata).__name__}")
    store = index_store(app)
    lang = store.check_language(language or default_language(app))
    return store.upsert(
        tenant=tenant,
        kind=kind,
        key=key,
        title=title.replace("\x00", ""),
        body=text.replace("\x00", ""),
        language=lang,
        metadata=dumps(dict(metadata or {}), "metadata"),
        conn=conn,
    )


def remove(
    app: StoreProvider, *, tenant: str, kind: str, key: str, conn: AnyConnection | None = None
) -> bool:
    """Remove one entry; True if it existed. Removing what is not there is not an error.

    Raises:
        ConfigurationError: a bad argument or the tables do not exist.
    """
    tenant, kind, key = _check_identity(tenant, kind, key)
    return index_store(app).delete(tenant=tenant, kind=kind, key=key, conn=conn)


def remove_tenant(app: StoreProvider, tenant: str, *, conn: AnyConnection | None = None) -> int:
    """Remove every entry of ``tenant``; returns how many."""
    return index_store(app).delete_tenant(tenant=tenant, conn=conn)


def get_entry(app: StoreProvider, *, tenant: str, kind: str, key: str) -> IndexEntry | None:
    """The stored entry, or None."""
    tenant, kind, key = _check_identity(tenant, kind, key)
    return index_store(app).get(tenant=tenant, kind=kind, key=key)


def find_keys(
    app: StoreProvider, *, tenant: str, kind: str, metadata: Mapping[str, Any], limit: int = MAX_LIMIT
) -> list[str]:
    """Keys of ``tenant``'s entries of ``kind`` whose metadata contains ``metadata`` (JSON ``@>``).

    Example: ``find_keys(app, tenant="t", kind="mail", metadata={"message_id": "a@b"})``
    gives every mail with that Message-ID (several messages may share one).

    Raises:
        ConfigurationError: bad arguments or the tables do not exist.
        SerializationError: ``metadata`` is not JSON-serialisable.
    """
    if not isinstance(metadata, Mapping):
        raise ConfigurationError(f"metadata must be a dict, got {type(metadata).__name__}")
    _check_identity(tenant, kind, "-")
    return index_store(app).find_keys(
        tenant=tenant, kind=kind, metadata=dumps(dict(metadata), "metadata"), limit=limit
    )


def count_entries(app: StoreProvider, tenant: str) -> dict[str, int]:
    """Entries of ``tenant`` per kind, e.g. ``{"document": 12, "mail": 3}``."""
    return index_store(app).count(tenant=tenant)


def search(
    app: StoreProvider,
    query: str,
    *,
    tenant: str,
    limit: int = DEFAULT_LIMIT,
    language: str | None = None,
    kinds: Sequence[str] | None = None,
    highlight: tuple[str, str] = ("«", "»"),
) -> list[SearchHit]:
    """Search ``tenant``'s entries; full-text hits first, then fallback hits (see module docs).

    Args:
        app: the app whose database holds the index.
        query: the user's words (web-search syntax). Blank gives no hits.
        tenant: whose entries to search (only those are ever returned).
        limit: most hits, 1 to 1000.
        language: text-search configuration for stemming the query (default:
            `default_language`); entries in other languages are still found by
            their exact words.
        kinds: only entries of these kinds (default: all).
        highlight: strings put before and after matched words in snippets
            (without double quotes).

    Returns:
        `SearchHit` list, best first.

    Raises:
        ConfigurationError: bad arguments, unknown language, tables missing.
    """
    if not isinstance(query, str):
        raise ConfigurationError(f"query must be a string, got {type(query).__name__}")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise ConfigurationError(f"limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}")
    if not isinstance(tenant, str):
        raise ConfigurationError(f"tenant must be a string, got {tenant!r}")
    start, stop = highlight
    if any('"' in marker or "\x00" in marker for marker in highlight):
        raise ConfigurationError("highlight markers must not contain double quotes or NUL")
    query = query.replace("\x00", "").strip()
    if not query:
        return []
    kind_list = list(kinds) if kinds is not None else None
    store = index_store(app)
    lang = store.check_language(language or default_language(app))
    headline_options = (
        f'MaxFragments=2, MinWords=8, MaxWords=25, FragmentDelimiter=" … ", '
        f'StartSel="{start}", StopSel="{stop}"'
    )
    found = store.search_fulltext(
        query=query,
        tenant=tenant,
        language=lang,
        kinds=kind_list,
        limit=limit,
        headline_options=headline_options,
    )
    hits = [dataclasses.replace(h, snippet=_WHITESPACE_RE.sub(" ", h.snippet).strip()) for h in found]
    if len(hits) >= limit:
        return hits
    needle = _WHITESPACE_RE.sub(" ", query.strip('"')).strip()
    if not needle:
        return hits
    exclude = [(h.kind, h.key) for h in hits]
    pattern = "%" + _like_escape(needle) + "%"
    if store.capabilities().trigram:
        more = store.search_trigram(
            tenant=tenant,
            kinds=kind_list,
            needle=needle,
            pattern=pattern,
            exclude=exclude,
            fuzzy=not hits,
            limit=limit - len(hits),
        )
    else:
        more = store.search_substring(
            tenant=tenant,
            kinds=kind_list,
            needle=needle,
            pattern=pattern,
            exclude=exclude,
            limit=limit - len(hits),
        )
    marked = re.compile(re.escape(needle), re.IGNORECASE)
    for h in more:
        snippet = _WHITESPACE_RE.sub(" ", h.snippet).strip()
        hits.append(
            dataclasses.replace(h, snippet=marked.sub(lambda m: f"{start}{m.group(0)}{stop}", snippet))
        )
    return hits


def _like_escape(text: str) -> str:
    """Escape LIKE's wildcards (backslash is LIKE's default escape character)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
