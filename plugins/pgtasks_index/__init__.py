"""Built-in full-text index plugin: documents and mails searchable in PostgreSQL itself.

Loaded through the ``pgtasks`` entry point ``pgtasks_index`` (module
`pgtasks_index.plugin`). Its tables live in schema ``pgtasks_index``, created by its
own migrations (``migrations/``), which `pgtasks.App.migrate` applies; its SQL is
in ``sql/queries.sql``.

- `upsert` / `remove` / `get_entry` / `find_keys`: write, delete, read and look up
  entries of a tenant;
- `search`: ranked hits with snippets (also `pgtasks.App.search` and
  ``pgtasks search QUERY --tenant T``);
- the ``pgtasks.index`` task (`INDEX_TASK`) for indexing through a job;
- `configure`: the app's default text-search language;
- `capabilities`: whether pg_trgm (fuzzy and CJK matching) is usable.
"""

from __future__ import annotations

from .api import (
    DEFAULT_LANGUAGE,
    capabilities,
    configure,
    count_entries,
    default_language,
    find_keys,
    get_entry,
    remove,
    remove_tenant,
    search,
    upsert,
)
from .records import Capabilities, IndexEntry, SearchHit, UpsertResult
from .tasks import INDEX_QUEUE, INDEX_TASK

__all__ = [
    "DEFAULT_LANGUAGE",
    "INDEX_QUEUE",
    "INDEX_TASK",
    "Capabilities",
    "IndexEntry",
    "SearchHit",
    "UpsertResult",
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
