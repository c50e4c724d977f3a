-- Job dependencies: a job that waits until other jobs (its prerequisites) have finished.
--
-- Such a job is written with status 'blocked' (never claimed: the claim reads only
-- 'queued' rows through jobs_claim_idx, so the claim path pays nothing for this) and
-- one row per prerequisite in pgtasks.job_dependencies, the edges. Its counter
-- prerequisites_pending says how many edges are not resolved yet.
--
-- A prerequisite has has_dependents set. When its status becomes terminal, the row
-- trigger jobs_dependents_notify (its WHEN clause is false for every job without
-- dependents: ordinary completions pay nothing) calls pgtasks.job_prerequisite_done in
-- the completing transaction, whatever wrote the status (a batch of successes, a failure,
-- the reaper, a cancel): it resolves the edges, and each dependent whose counter reaches 0
-- becomes 'queued' (with the prerequisites' results prepended to its arguments when it
-- asked for them) and wakes a worker of its queue on commit; a dependent whose
-- prerequisite ended without the outcome it needs is cancelled (DEPENDENCY_FAILED), which
-- cascades to its own dependents through the same trigger.
--
-- The race with a concurrent completion: the enqueue locks the prerequisites' rows and
-- sets has_dependents in its transaction (pgtasks.job_block). A prerequisite that
-- finished before is seen terminal and resolved at once; one that finishes after waits
-- for the enqueue's commit, then its UPDATE re-reads the row (has_dependents now true),
-- the trigger fires and sees the edges. A dependent's counter is decremented by an UPDATE
-- of its row, which READ COMMITTED re-evaluates on the newest version: two prerequisites
-- finishing at once decrement it one after the other.

ALTER TABLE pgtasks.jobs
    ADD COLUMN has_dependents boolean NOT NULL DEFAULT false,
    ADD COLUMN prerequisites_pending integer NOT NULL DEFAULT 0
        CONSTRAINT jobs_prerequisites_pending_nonnegative CHECK (prerequisites_pending >= 0),
    DROP CONSTRAINT jobs_status_known,
    ADD CONSTRAINT jobs_status_known CHECK (
        status IN ('blocked', 'queued', 'running', 'succeeded', 'failed', 'cancelled', 'partial_failure')),
    DROP CONSTRAINT jobs_finished_iff_terminal,
    ADD CONSTRAINT jobs_finished_iff_terminal CHECK (
        (status IN ('blocked', 'queued', 'running')) = (finished_at IS NULL));

-- A unique key is held while its job is unfinished, blocked included.
DROP INDEX pgtasks.jobs_unique_key_idx;
CREATE UNIQUE INDEX jobs_unique_key_idx ON pgtasks.jobs (unique_key)
    WHERE status IN ('blocked', 'queued', 'running') AND unique_key IS NOT NULL;

-- One row per (dependent, prerequisite) while the dependent waits. An edge is resolved
-- (outcome, and the prerequisite's result or id for the dependent's arguments) when its
-- prerequisite finishes; a dependent's edges are deleted when it leaves 'blocked', so the
-- table holds only the edges of waiting jobs. No foreign key: deleting finished jobs
-- (retention, purge) pays no check per row, and an edge whose dependent is gone is
-- deleted when its prerequisite finishes.
CREATE TABLE pgtasks.job_dependencies (
    job_id          bigint  NOT NULL,
    prerequisite_id bigint  NOT NULL,
    -- 0-based place of the prerequisite in the dependent's list (results keep this order).
    position        integer NOT NULL CHECK (position >= 0),
    -- The dependent's tenant: the prerequisites are the same tenant's jobs, and the
    -- row-level security mode covers this table as every table with a tenant column.
    tenant          text COLLATE "C" NOT NULL,
    -- success: the dependent needs the prerequisite to succeed; failure: to fail
    -- (failed or partial_failure), as a link_error callback.
    run_on          text    NOT NULL DEFAULT 'success' CHECK (run_on IN ('success', 'failure')),
    -- cancel: an unmet prerequisite cancels the dependent; run: it runs once every
    -- prerequisite has finished, however they ended.
    on_failure      text    NOT NULL DEFAULT 'cancel' CHECK (on_failure IN ('cancel', 'run')),
    -- What the dependent gets prepended to its args when it is unblocked: none; each
    -- prerequisite's result in position order (a chain's partial signature; the
    -- prerequisite's id for a failure edge); or one list of them (a chord's callback).
    pass_results    text    NOT NULL DEFAULT 'none' CHECK (pass_results IN ('none', 'each', 'list')),
    outcome         text    CHECK (outcome IN ('succeeded', 'failed', 'cancelled', 'partial_failure')),
    result          jsonb,
    PRIMARY KEY (job_id, prerequisite_id)
);

CREATE INDEX job_dependencies_prerequisite_idx ON pgtasks.job_dependencies (prerequisite_id);

-- Delete the edges of dependent p_job_id, which no longer waits. With the owner's rights
-- (SECURITY DEFINER): the role that runs the completion may be a tenant-facing role of
-- the row-level security mode (migration 0006), which may not DELETE. The policies still
-- decide which rows it sees: a tenant's transaction only its own tenant's (the edges of
-- one dependent are all of its tenant). An edge left behind (a fleet role that is not
-- the owner and sees through no policy) is harmless: only the edges of blocked jobs are
-- read.
CREATE FUNCTION pgtasks.job_dependencies_forget(p_job_id bigint)
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    DELETE FROM pgtasks.job_dependencies WHERE job_id = p_job_id;
$$;

-- The edges of prerequisite p_id, which just ended with p_status (and p_result): resolve
-- them and move their dependents on. Runs in the transaction that wrote the status. The
-- dependents it cancels are followed in a loop here, not by the trigger of their own
-- UPDATE (whose WHEN clause is false inside a trigger): a chain of any length is
-- cancelled without one nested call per link (PostgreSQL's max_stack_depth).
CREATE FUNCTION pgtasks.job_prerequisite_done(p_id bigint, p_status text, p_result jsonb)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    todo bigint[] := ARRAY[p_id];
    i integer := 1;
    done_id bigint;
    done_status text := p_status;
    done_result jsonb := p_result;
    e record;
    met boolean;
    dep_id bigint;
    dep_status text;
    dep_queue text;
    dep_has_dependents boolean;
BEGIN
    WHILE i <= cardinality(todo) LOOP
        done_id := todo[i];
        IF i > 1 THEN
            done_status := 'cancelled';  -- a dependent cancelled below
            done_result := NULL;
        END IF;
        i := i + 1;
        -- Dependents in id order, each locked before its edge is touched: completions that
        -- share dependents take their locks in one order, and wait on the dependent's row,
        -- never on an edge another completion deletes.
        FOR e IN
            SELECT x.job_id, x.run_on, x.on_failure
            FROM pgtasks.job_dependencies x
            WHERE x.prerequisite_id = done_id AND x.outcome IS NULL
            ORDER BY x.job_id
        LOOP
            SELECT j.status INTO dep_status FROM pgtasks.jobs j WHERE j.id = e.job_id FOR NO KEY UPDATE;
            UPDATE pgtasks.job_dependencies x
            SET outcome = done_status,
                result = CASE WHEN x.run_on = 'failure' THEN to_jsonb(done_id) ELSE done_result END
            WHERE x.job_id = e.job_id AND x.prerequisite_id = done_id AND x.outcome IS NULL;
            IF NOT FOUND THEN
                CONTINUE;  -- deleted meanwhile: the dependent moved on
            END IF;
            IF dep_status IS DISTINCT FROM 'blocked' THEN
                -- Cancelled by hand, or purged: nothing waits any more.
                PERFORM pgtasks.job_dependencies_forget(e.job_id);
                CONTINUE;
            END IF;
            met := CASE WHEN e.run_on = 'success' THEN done_status = 'succeeded'
                        ELSE done_status IN ('failed', 'partial_failure') END;
            dep_id := NULL;
            dep_status := NULL;
            dep_has_dependents := false;
            IF NOT met AND e.on_failure = 'cancel' THEN
                UPDATE pgtasks.jobs j
                SET status = 'cancelled', finished_at = now(),
                    prerequisites_pending = greatest(j.prerequisites_pending - 1, 0),
                    error = jsonb_build_object(
                        'type', 'DependencyFailed',
                        'code', CASE WHEN e.run_on = 'success' THEN 'DEPENDENCY_FAILED'
                                     ELSE 'DEPENDENCY_NOT_FAILED' END,
                        'class', 'permanent',
                        'message', 'prerequisite job ' || done_id || ' ended ' || done_status
                            || CASE WHEN e.run_on = 'success' THEN ', not succeeded'
                                    ELSE '; this job was to run only if it failed (link_error)' END,
                        'prerequisite_id', done_id, 'prerequisite_status', done_status)
                WHERE j.id = e.job_id AND j.status = 'blocked'
                RETURNING j.id, j.status, j.has_dependents INTO dep_id, dep_status, dep_has_dependents;
                IF dep_has_dependents THEN
                    todo := todo || dep_id;
                END IF;
            ELSE
                UPDATE pgtasks.jobs j
                SET prerequisites_pending = j.prerequisites_pending - 1,
                    status = CASE WHEN j.prerequisites_pending = 1 THEN 'queued' ELSE 'blocked' END
                WHERE j.id = e.job_id AND j.status = 'blocked' AND j.prerequisites_pending > 0
                RETURNING j.id, j.status, j.queue INTO dep_id, dep_status, dep_queue;
                IF dep_status = 'queued' THEN
                    PERFORM pgtasks.job_unblocked(dep_id, dep_queue);
                END IF;
            END IF;
            IF dep_status IS DISTINCT FROM 'blocked' THEN
                -- The dependent moved on (or is gone, or no longer waits): its edges are done.
                PERFORM pgtasks.job_dependencies_forget(e.job_id);
            END IF;
        END LOOP;
    END LOOP;
END
$$;

-- A dependent that just became 'queued': prepend its prerequisites' results to its
-- arguments if it asked for them, and wake a worker of its queue when the transaction
-- commits (the payload "queue:id" lets an idle worker claim it by primary key).
CREATE FUNCTION pgtasks.job_unblocked(p_id bigint, p_queue text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    mode text;
    results jsonb;
BEGIN
    SELECT min(x.pass_results), coalesce(jsonb_agg(x.result ORDER BY x.position), '[]'::jsonb)
    INTO mode, results
    FROM pgtasks.job_dependencies x WHERE x.job_id = p_id;
    IF mode = 'each' THEN
        UPDATE pgtasks.jobs SET args = results || args WHERE id = p_id;
    ELSIF mode = 'list' THEN
        UPDATE pgtasks.jobs SET args = jsonb_build_array(results) || args WHERE id = p_id;
    END IF;
    PERFORM pg_notify('pgtasks_jobs', p_queue || ':' || p_id);
END
$$;

CREATE FUNCTION pgtasks.jobs_dependents_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgtasks.job_prerequisite_done(NEW.id, NEW.status, NEW.result);
    RETURN NULL;
END
$$;

-- Not inside another trigger (pg_trigger_depth): the cancels of job_prerequisite_done
-- follow their own dependents in its loop. A status written by a trigger of the
-- application's own tables would not move dependents on: write it with a statement.
CREATE TRIGGER jobs_dependents_notify
    AFTER UPDATE OF status ON pgtasks.jobs
    FOR EACH ROW
    WHEN (NEW.has_dependents AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('succeeded', 'failed', 'cancelled', 'partial_failure')
          AND pg_trigger_depth() = 0)
    EXECUTE FUNCTION pgtasks.jobs_dependents_trigger();

-- Make job p_id (just inserted by this transaction, 'queued') wait for p_prerequisites
-- (their rows already locked by the caller, each the same tenant's job), with one
-- run_on, on_failure and pass_results for all edges. Prerequisites already finished are
-- resolved at once; due queued ones are announced again on commit (the lock hid them
-- from claims until then). Returns the job's status afterwards: 'blocked', 'queued' (every
-- prerequisite had already succeeded) or 'cancelled' (one had already failed).
CREATE FUNCTION pgtasks.job_block(
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
    SELECT status INTO s FROM pgtasks.jobs WHERE id = p_id;
    RETURN s;
END
$$;
