-- Flow control in the claim: at most N running jobs per concurrency key across the fleet,
-- fleet-wide rate limits per rate key, and tenant weights for the fair claim
-- (docs/flow-control.md). Every new column is NULL or has a constant default, so adding
-- them rewrites nothing; ordinary jobs (no key, no rate, cost 1) pay nothing new.

ALTER TABLE pgtasks.jobs
    ADD COLUMN concurrency_key   text,
    ADD COLUMN concurrency_limit integer,
    ADD COLUMN rate_key          text,
    ADD COLUMN rate_limit        integer,
    ADD COLUMN rate_period       float8,
    ADD COLUMN cost              real NOT NULL DEFAULT 1,
    ADD CONSTRAINT jobs_concurrency_whole CHECK (
        (concurrency_key IS NULL) = (concurrency_limit IS NULL)
        AND (concurrency_limit IS NULL OR concurrency_limit >= 1)),
    ADD CONSTRAINT jobs_rate_whole CHECK (
        (rate_key IS NULL) = (rate_limit IS NULL) AND (rate_key IS NULL) = (rate_period IS NULL)
        AND (rate_limit IS NULL OR rate_limit >= 1) AND (rate_period IS NULL OR rate_period > 0)),
    ADD CONSTRAINT jobs_cost_positive CHECK (cost > 0);

-- "Its key at its limit (N running: ids)": the running jobs of a key (explain).
CREATE INDEX jobs_concurrency_running_idx ON pgtasks.jobs (concurrency_key, id)
    WHERE status = 'running' AND concurrency_key IS NOT NULL;

-- Whether queued jobs wait on their rate key's next start (the idle worker's next wake-up).
CREATE INDEX jobs_rate_queued_idx ON pgtasks.jobs (rate_key, queue)
    WHERE status = 'queued' AND rate_key IS NOT NULL;

-- One counter per concurrency key: the jobs of the key that claims took (running), less
-- those given back. Claims and ending jobs update a counter row only while holding its
-- key's advisory lock (see concurrency_release below), which they try and never wait
-- for, so neither ever waits on a counter, and no two claims take slots from one counter
-- at once.
-- granted: the slots the last claim took, read back by that claim (RETURNING cannot see
-- the old value on PostgreSQL 14).
CREATE TABLE pgtasks.concurrency_keys (
    key      text PRIMARY KEY,
    running  integer NOT NULL DEFAULT 0 CHECK (running >= 0),
    granted  integer NOT NULL DEFAULT 0
);

-- Slots given back by jobs that left running while a claim held their key's counter (one
-- row each, written by the trigger below, appended: a finishing job never waits on a
-- claim or on another finishing job). The claim that next holds the counter deletes them
-- and lowers the counter by as many.
CREATE TABLE pgtasks.concurrency_releases (
    id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key  text NOT NULL
);
CREATE INDEX concurrency_releases_key_idx ON pgtasks.concurrency_releases (key);

-- A job leaving running gives its slot back: straight to its key's counter when no claim
-- holds the key (the common case: one write, no row to fold in later), else as a release
-- row. Who may write a counter row is decided by a transaction-level advisory lock on the
-- key (class 1885828195, "pgtc"; the key's hashtext), only ever tried, never waited for:
-- so this never waits and never deadlocks with a claim or with another job's end, and no
-- row lock is written before the update. A key this transaction holds already (several
-- jobs of a key in one outcome batch) is its own. A hash shared by two keys only sends a
-- slot through a release row.
-- SECURITY DEFINER: a role acting only through tenant handles (row-level security mode)
-- has no right on these tables, yet may end a job it owns.
CREATE FUNCTION pgtasks.concurrency_release() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF pg_try_advisory_xact_lock(1885828195, hashtext(OLD.concurrency_key)) THEN
        UPDATE pgtasks.concurrency_keys k SET running = greatest(0, k.running - 1)
        WHERE k.key = OLD.concurrency_key;
        IF FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    INSERT INTO pgtasks.concurrency_releases (key) VALUES (OLD.concurrency_key);
    RETURN NULL;
END
$$;

-- Success, failure, retry, cancel, the reaper, release on shutdown, deferral: every way out
-- of running is an UPDATE of status (or a DELETE); the WHEN keeps other jobs free of it.
CREATE TRIGGER jobs_concurrency_release
    AFTER UPDATE OF status ON pgtasks.jobs
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status <> 'running' AND OLD.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION pgtasks.concurrency_release();

CREATE TRIGGER jobs_concurrency_release_deleted
    AFTER DELETE ON pgtasks.jobs
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND OLD.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION pgtasks.concurrency_release();

-- One row per rate key: a limit of lim starts per period seconds spaces the starts one
-- step (period / lim) apart on a grid that begins at the key's first claim (window_start):
-- start number i (from 0) may happen from window_start + i steps on, as Celery's rate
-- limits space them (a token bucket of one). taken: the starts given so far; next_at: when
-- the next may happen. A claim that comes late takes the steps it missed, at most lim (a
-- key idle for long gets at most lim starts at once, then one a step). Written only by
-- claims, under FOR UPDATE SKIP LOCKED, as the counters.
CREATE TABLE pgtasks.rate_windows (
    key           text PRIMARY KEY,
    lim           integer NOT NULL CHECK (lim >= 1),
    period        float8 NOT NULL CHECK (period > 0),
    window_start  timestamptz NOT NULL,
    taken         bigint NOT NULL DEFAULT 0 CHECK (taken >= 0),
    next_at       timestamptz NOT NULL,
    granted       integer NOT NULL DEFAULT 0
);

-- What explain reads of the counters and windows (job_explain), callable by a role that
-- acts only through tenant handles, which has no right on these tables: their rows name
-- keys of every tenant. SECURITY DEFINER, each answers for one key it is given.
-- The slots a concurrency key's jobs hold: its counter less the slots given back since.
CREATE FUNCTION pgtasks.concurrency_running(key text) RETURNS integer
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT greatest(0, coalesce((SELECT k.running FROM pgtasks.concurrency_keys k WHERE k.key = $1), 0)
                       - (SELECT count(*) FROM pgtasks.concurrency_releases r WHERE r.key = $1))::integer
$$;

-- When a rate key's next start may happen, if later than instant at (else NULL).
CREATE FUNCTION pgtasks.rate_window_end(key text, at timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT w.next_at FROM pgtasks.rate_windows w WHERE w.key = $1 AND w.next_at > $2
$$;

-- Tenant weights for the fair claim: a tenant with due jobs gets a share of claims
-- proportional to its weight, measured in job cost. queue '' applies to every queue a
-- row of its own does not cover; a tenant with no row weighs 1. A tenant column, so the
-- row-level security mode covers it (pgtasks.tenant_tables()).
CREATE TABLE pgtasks.tenant_weights (
    queue   text COLLATE "C" NOT NULL DEFAULT '',
    tenant  text COLLATE "C" NOT NULL,
    weight  float8 NOT NULL CHECK (weight > 0 AND weight <= 1000000),
    PRIMARY KEY (queue, tenant)
);

-- A role acting only through tenant handles may read its tenant's weight, not set it:
-- as 0006's grant, but SELECT only on the weights.
CREATE OR REPLACE FUNCTION pgtasks.rls_grant_tenant_role(role text) RETURNS SETOF regclass
LANGUAGE plpgsql AS $$
DECLARE
    grantee text := pgtasks.rls_roles(ARRAY[role]);
    s name;
    t regclass;
BEGIN
    FOR s IN
        SELECT DISTINCT n.nspname FROM pg_catalog.pg_namespace n
        WHERE n.nspname = 'pgtasks' OR n.nspname LIKE 'pgtasks\_%'
    LOOP
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO %s', s, grantee);
        EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA %I TO %s', s, grantee);
    END LOOP;
    FOR t IN SELECT * FROM pgtasks.tenant_tables() LOOP
        IF t = 'pgtasks.tenant_weights'::regclass THEN
            EXECUTE format('GRANT SELECT ON %s TO %s', t, grantee);
        ELSE
            EXECUTE format('GRANT SELECT, INSERT, UPDATE ON %s TO %s', t, grantee);
        END IF;
        RETURN NEXT t;
    END LOOP;
END
$$;
