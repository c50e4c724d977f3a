"""The small, immutable values the index hands back."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Capabilities", "IndexEntry", "MatchKind", "SearchHit", "UpsertResult"]

#: How a hit was found: the full-text index, pg_trgm similarity, or plain substring.
MatchKind = Literal["fulltext", "trigram", "substring"]


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One search result.

    Attributes:
        tenant, kind, key: the entry's identity (``kind`` is ``"document"``,
            ``"mail"`` or an application's own kind).
        title: the entry's title (may be empty).
        snippet: a short excerpt around the match; matched words are wrapped in the
            highlight markers asked for (default ``«`` and ``»``).
        rank: relevance within its ``match`` group, higher is better: ``ts_rank_cd``
            normalised to 0..1 for full-text hits, ``word_similarity`` (0..1) for
            trigram hits, 0 for substring hits. Full-text hits come first.
        match: how it was found (`MatchKind`).
        metadata: the JSON object stored with the entry.
        indexed_at: when the entry was last written (database clock, aware UTC).
    """

    tenant: str
    kind: str
    key: str
    title: str
    snippet: str
    rank: float
    match: MatchKind
    metadata: Mapping[str, Any] = field(default_factory=dict)
    indexed_at: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """An indexed document or mail as stored.

    Attributes:
        tenant, kind, key: identity.
        title, body: the text that was indexed.
        language: the text-search configuration it was tokenised with.
        metadata: the JSON object stored with it.
        indexed_at: when it was last written.
    """

    tenant: str
    kind: str
    key: str
    title: str
    body: str
    language: str
    metadata: Mapping[str, Any]
    indexed_at: dt.datetime


@dataclass(frozen=True, slots=True)
class UpsertResult:
    """What `pgtasks_index.upsert` did: ``created`` False means an entry was replaced.

    ``lexemes`` is the number of distinct words in the entry's tsvector.
    """

    tenant: str
    kind: str
    key: str
    created: bool
    lexemes: int
    language: str


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What the database offers the index.

    Attributes:
        migrated: the plugin's tables exist.
        trigram: pg_trgm's operators are usable (fuzzy and CJK fallback matching).
        trigram_index: the trigram GIN index exists (fallback matching is fast).
    """

    migrated: bool
    trigram: bool
    trigram_index: bool
