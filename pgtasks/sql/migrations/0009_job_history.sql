-- Job history: finished jobs leave the hot table. The workers' history service
-- (pgtasks.maintenance.History) moves jobs that finished more than Settings.history_after
-- seconds ago from pgtasks.jobs to pgtasks.job_history, in batches, one worker at a time;
-- so the claim's indexes, the table the claim and the reaper scan, and the bloat that
-- autovacuum has to clean stay the size of the live work, not of the whole history.
--
-- A plain table, not one partitioned by finish time: every reader looks a job up by id
-- (a partitioned table's primary key must hold the partition key, so an id lookup would
-- probe one index per partition), and the retention policy deletes by task, queue and
-- status, not whole time ranges, so dropping partitions would not replace its deletes.
-- The move is one statement (DELETE ... RETURNING into INSERT): a job is in exactly one
-- of the two tables in every snapshot.
--
-- The same columns as pgtasks.jobs, in the same order (LIKE), so a move is
-- INSERT INTO job_history SELECT * FROM (DELETE FROM jobs ... RETURNING *).
-- RULE: a later migration that adds, drops or changes a column of pgtasks.jobs does the
-- same to pgtasks.job_history in the same order (tests/test_job_history.py compares the
-- two tables' columns from the catalog).
--
-- Only finished jobs. Never moved (see the move query, job_history_move_batch): blocked,
-- queued and running jobs; a prerequisite with an unresolved edge (none exists once the
-- trigger of 0007 ran, but the mover checks); a schedule run the scheduler has not
-- followed up yet. A dependent enqueued later with a moved prerequisite finds it here
-- (job_block below, job_lock_prerequisites), with its outcome and result.
--
-- A tenant column: the row-level security mode covers it (pgtasks.tenant_tables()).

CREATE TABLE pgtasks.job_history (
    LIKE pgtasks.jobs INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    PRIMARY KEY (id),
    CONSTRAINT job_history_finished CHECK (
        status IN ('succeeded', 'failed', 'cancelled', 'partial_failure'))
);

-- Retention and purge read the history in finish order.
CREATE INDEX job_history_finished_idx ON pgtasks.job_history (finished_at);

-- A schedule's runs, newest first (schedules history; one run per fire time).
CREATE INDEX job_history_schedule_idx ON pgtasks.job_history (schedule_name, id DESC)
    WHERE schedule_name IS NOT NULL;

-- A tenant's jobs, newest first (jobs list and the dashboard of a tenant handle).
CREATE INDEX job_history_tenant_idx ON pgtasks.job_history (tenant, id DESC);

-- Move a failed, cancelled or partially failed job of p_tenant (NULL: any tenant's) back
-- from the history to pgtasks.jobs, as it is, for a requeue in the same transaction;
-- returns its id, or NULL when the history has no such job. SECURITY DEFINER: a role
-- acting only through tenant handles (row-level security mode) may requeue its jobs but
-- has no DELETE on the history; with a tenant set for the transaction (pgtasks.tenant)
-- only that tenant's job moves, whatever p_tenant says.
CREATE FUNCTION pgtasks.job_history_restore(p_id bigint, p_tenant text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    scope text := nullif(current_setting('pgtasks.tenant', true), '');
    moved bigint;
BEGIN
    WITH back AS (
        DELETE FROM pgtasks.job_history h
        WHERE h.id = p_id AND h.status IN ('failed', 'cancelled', 'partial_failure')
          AND (p_tenant IS NULL OR h.tenant = p_tenant)
          AND (scope IS NULL OR h.tenant = scope)
        RETURNING h.*
    )
    INSERT INTO pgtasks.jobs SELECT * FROM back RETURNING id INTO moved;
    RETURN moved;
END
$$;

-- As 0007's job_block, and a prerequisite already moved to the history counts as the
-- finished job it is (its outcome and result, read from there). The caller locked the
-- prerequisites still in pgtasks.jobs (job_lock_prerequisites); a row in the history
-- never changes, so it needs no lock.
CREATE OR REPLACE FUNCTION pgtasks.job_block(
    p_id bigint, p_prerequisites bigint[], p_run_on text, p_on_failure text, p_pass_results text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    p record;
    s text;
BEGIN
    INSERT INTO pgtasks.job_dependencies (job_id, prerequisite_id, position, tenant, run_on,
                                          on_failure, pass_results)
    SELECT p_id, u.id, (u.n - 1)::integer, j.tenant, p_run_on, p_on_failure, p_pass_results
    FROM unnest(p_prerequisites) WITH ORDINALITY AS u(id, n)
    CROSS JOIN (SELECT tenant FROM pgtasks.jobs WHERE id = p_id) j;
    UPDATE pgtasks.jobs
    SET status = 'blocked', prerequisites_pending = cardinality(p_prerequisites),
        trigger = 'dependency', parent_id = p_prerequisites[1]
    WHERE id = p_id AND status = 'queued';
    FOR p IN
        UPDATE pgtasks.jobs j SET has_dependents = true
        WHERE j.id = ANY (p_prerequisites)
        RETURNING j.id, j.status, j.result, j.queue, j.run_at
    LOOP
        IF p.status IN ('succeeded', 'failed', 'cancelled', 'partial_failure') THEN
            PERFORM pgtasks.job_prerequisite_done(p.id, p.status, p.result);
        ELSIF p.status = 'queued' AND p.run_at <= now() THEN
            -- A claim meanwhile skipped the row this transaction locks (SKIP LOCKED), and
            -- its worker may have gone to sleep: wake one on commit to claim it by id.
            PERFORM pg_notify('pgtasks_jobs', p.queue || ':' || p.id);
        END IF;
    END LOOP;
    FOR p IN
        SELECT h.id, h.status, h.result FROM pgtasks.job_history h
        WHERE h.id = ANY (p_prerequisites)
          AND NOT EXISTS (SELECT 1 FROM pgtasks.jobs j WHERE j.id = h.id)
        ORDER BY h.id
    LOOP
        PERFORM pgtasks.job_prerequisite_done(p.id, p.status, p.result);
    END LOOP;
    SELECT status INTO s FROM pgtasks.jobs WHERE id = p_id;
    RETURN s;
END
$$;
