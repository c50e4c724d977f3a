-- How many live workers serve a queue, for explain (job_explain's "no worker serves its
-- queue"): a count only, through a function that runs with its owner's rights (SECURITY
-- DEFINER), so that a tenant-facing role of the row-level security mode, which may not
-- read pgtasks.workers (the fleet's hosts, process ids and queues), can still be told.
-- A worker counts while it is not stopping and its lease has not expired at "at".

CREATE FUNCTION pgtasks.live_workers(queue text, at timestamptz) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT count(*) FROM pgtasks.workers w
    WHERE $1 = ANY (w.queues) AND NOT w.stopping AND w.lease_expires_at >= $2
$$;
