-- Named queries of the pgtasks_index plugin (same format as pgtasks/sql/queries.sql:
-- one "-- name:" block per statement, then a line saying what it is for).
-- Loaded with pgtasks.plugin_api.package_queries and run only by pgtasks_index/store.py

-- ======================================================================
-- Capabilities
-- ======================================================================

-- name: index_capabilities
-- Whether pg_trgm's operators and our trigram index are usable on this database
-- (run without parameters, so the % below is literal).
SELECT to_regoperator('<%(text,text)') IS NOT NULL AS trigram,
       to_regclass('pgtasks_index.entries_trgm_idx') IS NOT NULL AS trigram_index,
       to_regclass('pgtasks_index.entries') IS NOT NULL AS migrated;

-- name: index_language_exists
-- Whether a text-search configuration of this name (optionally schema-qualified) exists.
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_ts_config c
    JOIN pg_catalog.pg_namespace n ON n.oid = c.cfgnamespace
    WHERE c.cfgname = %(name)s
      AND (%(schema)s::text IS NULL OR n.nspname = %(schema)s::text)
) AS present;

-- ======================================================================
-- Entries: write
-- ======================================================================

-- name: entry_upsert
-- Insert or replace one entry (the tsvector is a generated column); returns whether it was new.
INSERT INTO pgtasks_index.entries AS e (tenant, kind, key, title, body, language, metadata)
VALUES (%(tenant)s, %(kind)s, %(key)s, %(title)s, %(body)s, %(language)s::regconfig, %(metadata)s::jsonb)
ON CONFLICT (tenant, kind, key) DO UPDATE
SET title = excluded.title,
    body = excluded.body,
    language = excluded.language,
    metadata = excluded.metadata,
    indexed_at = now()
RETURNING (xmax = 0) AS created, e.indexed_at, length(e.tsv) AS lexemes;

-- name: entry_delete
-- Remove one entry; idempotent (no row is not an error).
DELETE FROM pgtasks_index.entries
WHERE tenant = %(tenant)s AND kind = %(kind)s AND key = %(key)s
RETURNING key;

-- name: entry_delete_tenant
-- Remove every entry of a tenant (e.g. when the tenant is closed); returns the count.
WITH gone AS (DELETE FROM pgtasks_index.entries WHERE tenant = %(tenant)s RETURNING 1)
SELECT count(*) AS deleted FROM gone;

-- ======================================================================
-- Entries: read
-- ======================================================================

-- name: entry_get
-- One entry with its text, or nothing.
SELECT tenant, kind, key, title, body, language::text AS language, metadata, indexed_at
FROM pgtasks_index.entries
WHERE tenant = %(tenant)s AND kind = %(kind)s AND key = %(key)s;

-- name: entry_find_keys
-- Keys of a tenant's entries of one kind whose metadata contains the given JSON object.
SELECT key FROM pgtasks_index.entries
WHERE tenant = %(tenant)s AND kind = %(kind)s AND metadata @> %(metadata)s::jsonb
ORDER BY key
LIMIT %(limit)s;

-- name: entry_count
-- Number of entries per kind for a tenant.
SELECT kind, count(*) AS entries FROM pgtasks_index.entries
WHERE tenant = %(tenant)s GROUP BY kind ORDER BY kind;

-- ======================================================================
-- Search
-- ======================================================================

-- name: entry_search_fulltext
-- Full-text hits of one tenant, best first: the query in the given language OR'ed with
-- the same query in the 'simple' configuration; snippets only for the rows returned.
WITH q AS (
    SELECT websearch_to_tsquery(%(language)s::regconfig, %(query)s)
           || websearch_to_tsquery('simple'::regconfig, %(query)s) AS tsq
), hits AS (
    SELECT e.tenant, e.kind, e.key, e.title, e.body, e.metadata, e.indexed_at,
           ts_rank_cd(e.tsv, q.tsq, 32) AS rank
    FROM pgtasks_index.entries e, q
    WHERE e.tenant = %(tenant)s
      AND (%(kinds)s::text[] IS NULL OR e.kind = ANY (%(kinds)s::text[]))
      AND e.tsv @@ q.tsq
    ORDER BY rank DESC, e.indexed_at DESC, e.key
    LIMIT %(limit)s
)
SELECT h.tenant, h.kind, h.key, h.title, h.metadata, h.indexed_at, h.rank::float8 AS rank,
       ts_headline(%(language)s::regconfig, left(h.body, 500000), q.tsq, %(headline_options)s) AS snippet
FROM hits h, q
ORDER BY h.rank DESC, h.indexed_at DESC, h.key;

-- name: entry_search_substring
-- Fallback without pg_trgm: entries whose title or body contains the query text
-- (case-insensitive), other than those already found; a window of text around the match.
SELECT e.tenant, e.kind, e.key, e.title, e.metadata, e.indexed_at, 0.0::float8 AS rank,
       'substring' AS match,
       substr(e.body, greatest(strpos(lower(e.body), lower(%(needle)s)) - 80, 1), 240) AS snippet
FROM pgtasks_index.entries e
WHERE e.tenant = %(tenant)s
  AND (%(kinds)s::text[] IS NULL OR e.kind = ANY (%(kinds)s::text[]))
  AND (e.title || ' ' || e.body) ILIKE %(pattern)s
  AND (e.kind, e.key) NOT IN (SELECT * FROM unnest(%(exclude_kinds)s::text[], %(exclude_keys)s::text[]))
ORDER BY e.indexed_at DESC, e.key
LIMIT %(limit)s;

-- name: entry_search_trigram
-- Fallback with pg_trgm: substring matches, then, when fuzzy is true, similar words
-- (word_similarity at or above pg_trgm.word_similarity_threshold, 0.6 by default),
-- other than those already found.
SELECT e.tenant, e.kind, e.key, e.title, e.metadata, e.indexed_at,
       word_similarity(%(needle)s, e.title || ' ' || e.body)::float8 AS rank,
       CASE WHEN (e.title || ' ' || e.body) ILIKE %(pattern)s THEN 'substring' ELSE 'trigram' END AS match,
       substr(e.body, greatest(strpos(lower(e.body), lower(%(needle)s)) - 80, 1), 240) AS snippet
FROM pgtasks_index.entries e
WHERE e.tenant = %(tenant)s
  AND (%(kinds)s::text[] IS NULL OR e.kind = ANY (%(kinds)s::text[]))
  AND ((e.title || ' ' || e.body) ILIKE %(pattern)s
       OR (%(fuzzy)s::boolean AND %(needle)s <%% (e.title || ' ' || e.body)))
  AND (e.kind, e.key) NOT IN (SELECT * FROM unnest(%(exclude_kinds)s::text[], %(exclude_keys)s::text[]))
ORDER BY (e.title || ' ' || e.body) ILIKE %(pattern)s DESC, rank DESC, e.indexed_at DESC, e.key
LIMIT %(limit)s;
