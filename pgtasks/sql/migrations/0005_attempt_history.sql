-- Attempt history across manual requeues, and no stale error on a succeeded job.
--
-- attempt_base: attempts the job made before its last manual requeue. A requeue starts
-- a new round: "attempt" counts the round's attempts against max_attempts (a fresh
-- budget), and the history numbers attempts attempt_base + attempt, so numbers keep
-- increasing. A constant default: adding the column rewrites no row.
ALTER TABLE pgtasks.jobs
    ADD COLUMN attempt_base integer NOT NULL DEFAULT 0
        CONSTRAINT jobs_attempt_base_nonnegative CHECK (attempt_base >= 0);

-- A succeeded job has no error: before this version a success kept the error of the
-- failed attempt before it (that error stays in the history).
UPDATE pgtasks.jobs SET error = NULL WHERE status = 'succeeded' AND error IS NOT NULL;

-- Histories written before this version restarted at attempt 1 after each requeue, and
-- the requeue itself was not recorded. Within one round the numbers recorded increase,
-- so a number that does not marks a requeue: number the attempts across rounds, record
-- each requeue found (by and at unknown: null), and set attempt_base. The last round may
-- have recorded nothing yet (requeued, then queued, running or succeeded without a failed
-- attempt): its counter then cannot follow the last number recorded.
DO $$
DECLARE
    r record;
    e jsonb;
    n integer;
    prev integer;
    base integer;
    out_attempts jsonb;
BEGIN
    FOR r IN
        SELECT id, status, attempt, attempts FROM pgtasks.jobs
        WHERE jsonb_array_length(attempts) > 0
        FOR UPDATE
    LOOP
        prev := 0;
        base := 0;
        out_attempts := '[]'::jsonb;
        FOR e IN SELECT value FROM jsonb_array_elements(r.attempts) LOOP
            n := coalesce((e ->> 'attempt')::integer, 0);
            IF n <= prev THEN
                base := base + prev;
                out_attempts := out_attempts || jsonb_build_array(jsonb_build_object(
                    'event', 'requeue', 'by', NULL, 'at', NULL, 'after_attempt', base));
            END IF;
            IF base > 0 THEN
                e := jsonb_set(e, '{attempt}', to_jsonb(base + n));
                IF n = 1 THEN
                    e := jsonb_set(e, '{trigger}', '"manual"');
                END IF;
            END IF;
            out_attempts := out_attempts || jsonb_build_array(e);
            prev := n;
        END LOOP;
        IF (r.status IN ('running', 'succeeded') AND r.attempt <= prev)
           OR (r.status NOT IN ('running', 'succeeded') AND r.attempt < prev) THEN
            base := base + prev;
            out_attempts := out_attempts || jsonb_build_array(jsonb_build_object(
                'event', 'requeue', 'by', NULL, 'at', NULL, 'after_attempt', base));
        END IF;
        IF base > 0 THEN
            UPDATE pgtasks.jobs SET attempt_base = base, attempts = out_attempts WHERE id = r.id;
        END IF;
    END LOOP;
END
$$;
