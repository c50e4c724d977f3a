-- Whether a claim may take a job of lock key "key": the claim's try of the key's
-- transaction-level advisory lock (class 1885828211, "pgts"; a key another claim in
-- flight holds is passed over), then whether a job of the key is running, read after
-- the lock is held.
--
-- The check must see what committed after the claim's statement began. A claim's
-- snapshot is the statement's: a job of the key that another claim started and
-- committed meanwhile was still queued in it, and that claim's advisory lock was already
-- released. Read in that snapshot, the key looked free; the claim then took a second job
-- of the key and failed on jobs_lock_running_idx at its write, losing its whole batch,
-- or, when the running job's success was being written at that moment, waited for that
-- write while the write waited for a row the claim had locked: a deadlock, broken only
-- after deadlock_timeout. A VOLATILE function takes a new snapshot for each statement it
-- runs (READ COMMITTED), so this one sees every start committed before it got the lock;
-- a start still in flight holds the lock and fails the try.
--
-- The running job is found through jobs_lock_running_idx, one probe per locked
-- candidate, whatever the number of running jobs. SECURITY INVOKER: it sees what the
-- caller sees, as the claim's own reads do.
CREATE FUNCTION pgtasks.lock_key_free(key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT AS $$
BEGIN
    IF NOT pg_catalog.pg_try_advisory_xact_lock(1885828211, pg_catalog.hashtext(key)) THEN
        RETURN false;
    END IF;
    RETURN NOT EXISTS (
        SELECT 1 FROM pgtasks.jobs r WHERE r.lock_key = key AND r.status = 'running'
    );
END
$$;
