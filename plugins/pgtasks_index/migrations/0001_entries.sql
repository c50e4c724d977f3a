-- pgtasks_index 0001: the full-text index, one row per indexed document or mail.
--
-- tsv holds two tokenisations of the same text: one with the entry's language
-- (stemmed: "documents" -> "document"; weights A for the title, B for the body) and
-- one with the 'simple' configuration (lower-cased, unstemmed; weight D), so a search
-- matches words the stemmer would mangle, such as names, words of another language,
-- and Cyrillic or Greek words. Scripts without spaces (Chinese, Japanese) are not
-- split into words by PostgreSQL's parser; for them, and for typos, search falls back
-- to trigram similarity (pg_trgm) or, where pg_trgm is unavailable, to substring
-- matching. Text past 500,000 characters is stored but not tokenised (tsvector's
-- 1 MB size limit).
CREATE SCHEMA IF NOT EXISTS pgtasks_index;

CREATE TABLE pgtasks_index.entries (
    tenant text NOT NULL,
    kind text NOT NULL CHECK (kind ~ '^[a-z][a-z0-9_]*$'),
    key text NOT NULL CHECK (key <> ''),
    title text NOT NULL DEFAULT '',
    body text NOT NULL DEFAULT '',
    language regconfig NOT NULL,
    metadata jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(metadata) = 'object'),
    tsv tsvector GENERATED ALWAYS AS (
        setweight(to_tsvector(language, title), 'A')
        || setweight(to_tsvector(language, left(body, 500000)), 'B')
        || setweight(to_tsvector('simple'::regconfig, title || ' ' || left(body, 500000)), 'D')
    ) STORED,
    indexed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, kind, key)
);

CREATE INDEX entries_tsv_idx ON pgtasks_index.entries USING gin (tsv);

-- pg_trgm is optional: a managed server may not offer it, or the role may lack the
-- right to create it. Then search still works, without fuzzy matching and with
-- substring matching that scans the tenant's rows.
DO $$
BEGIN
    CREATE EXTENSION IF NOT EXISTS pg_trgm;
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'pgtasks_index: pg_trgm is not available (%); search falls back to substring matching', SQLERRM;
END
$$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_opclass WHERE opcname = 'gin_trgm_ops' AND pg_opclass_is_visible(oid)) THEN
        EXECUTE 'CREATE INDEX entries_trgm_idx ON pgtasks_index.entries '
                'USING gin ((title || '' '' || body) gin_trgm_ops)';
    END IF;
END
$$;
