-- Every SQL statement pgtasks runs, one named block each.
-- A block starts with "-- name: entity_verb" and a "-- " line saying what it is for.
-- Parameters are psycopg named placeholders. Time-sensitive statements take an
-- optional %(now)s and fall back to the database clock, so tests can pin time.
-- Every state-changing UPDATE names the status it expects in its WHERE clause.

-- ======================================================================
-- Migrations
-- ======================================================================

-- name: migration_lock
-- Serialise concurrent migrators (transaction-scoped advisory lock; key = hashtext('pgtasks.migrate')).
SELECT pg_advisory_xact_lock(hashtext('pgtasks.migrate'));

-- name: migration_bootstrap_schema
-- Create the schema that holds every pgtasks object.
CREATE SCHEMA IF NOT EXISTS pgtasks;

-- name: migration_bootstrap_table
-- Create the table that records applied migrations.
CREATE TABLE IF NOT EXISTS pgtasks.migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_applied
-- Versions already applied, oldest first.
SELECT version, name, applied_at FROM pgtasks.migrations ORDER BY version;

-- name: migration_record
-- Record one applied migration.
INSERT INTO pgtasks.migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: migration_schema_exists
-- Whether the pgtasks migrations table exists yet (read-only check).
SELECT to_regclass('pgtasks.migrations') IS NOT NULL AS present;

-- ======================================================================
-- Jobs: enqueue
-- ======================================================================

-- name: job_insert
-- Enqueue one job; returns nothing when its unique key is already held. Wakes workers on commit.
WITH ins AS (
    INSERT INTO pgtasks.jobs (
        task_name, queue, tenant, args, kwargs, headers, priority, max_attempts, run_at,
        lock_key, unique_key, trigger, schedule_name, scheduled_for, parent_id,
        correlation_id, retry_on_worker_lost)
    VALUES (
        %(task_name)s, %(queue)s, %(tenant)s, %(args)s::jsonb, %(kwargs)s::jsonb,
        %(headers)s::jsonb, %(priority)s, %(max_attempts)s,
        coalesce(%(eta)s::timestamptz,
                 now() + make_interval(secs => coalesce(%(countdown)s::float8, 0))),
        %(lock_key)s, %(unique_key)s, %(trigger)s, %(schedule_name)s,
        %(scheduled_for)s::timestamptz, %(parent_id)s::bigint, %(correlation_id)s,
        %(retry_on_worker_lost)s)
    ON CONFLICT (unique_key) WHERE status IN ('queued', 'running') AND unique_key IS NOT NULL
    DO NOTHING
    RETURNING id, queue
)
SELECT ins.id, pg_notify('pgtasks_jobs', ins.queue) IS NOT NULL AS notified FROM ins;

-- name: job_insert_many
-- Enqueue many jobs in one statement (arrays of equal length); rows whose unique key is held are skipped.
INSERT INTO pgtasks.jobs (
    task_name, queue, tenant, args, kwargs, headers, priority, max_attempts, run_at,
    lock_key, unique_key, trigger, retry_on_worker_lost)
SELECT v.task_name, v.queue, v.tenant, v.args, v.kwargs, v.headers, v.priority,
       v.max_attempts, coalesce(v.eta, now() + make_interval(secs => coalesce(v.countdown, 0))),
       v.lock_key, v.unique_key, 'api', v.retry_on_worker_lost
FROM unnest(
    %(task_names)s::text[], %(queues)s::text[], %(tenants)s::text[], %(args)s::jsonb[],
    %(kwargs)s::jsonb[], %(headers)s::jsonb[], %(priorities)s::smallint[],
    %(max_attempts)s::integer[], %(etas)s::timestamptz[], %(countdowns)s::float8[],
    %(lock_keys)s::text[], %(unique_keys)s::text[], %(retry_on_worker_lost)s::boolean[]
) AS v(task_name, queue, tenant, args, kwargs, headers, priority, max_attempts, eta, countdown,
       lock_key, unique_key, retry_on_worker_lost)
ON CONFLICT (unique_key) WHERE status IN ('queued', 'running') AND unique_key IS NOT NULL
DO NOTHING
RETURNING id;

-- name: job_copy_in
-- Bulk enqueue through COPY (batches without unique or lock keys); ids come from job_ids_reserve.
COPY pgtasks.jobs (id, task_name, queue, tenant, args, kwargs, headers, priority, max_attempts,
                   lock_key, retry_on_worker_lost) FROM STDIN;

-- name: job_ids_reserve
-- Reserve n job ids from the identity sequence for a COPY batch.
SELECT nextval(pg_get_serial_sequence('pgtasks.jobs', 'id')) AS id
FROM generate_series(1, %(n)s::integer);

-- name: job_notify_queues
-- Wake workers of these queues on commit (one notification per queue).
SELECT pg_notify('pgtasks_jobs', q) IS NOT NULL AS notified FROM unnest(%(queues)s::text[]) AS q;

-- name: job_find_unique
-- The unfinished job that holds a unique key.
SELECT id FROM pgtasks.jobs
WHERE unique_key = %(unique_key)s AND status IN ('queued', 'running');

-- ======================================================================
-- Jobs: read
-- ======================================================================

-- name: job_get
-- One job by id, every column.
SELECT * FROM pgtasks.jobs WHERE id = %(id)s;

-- name: job_status
-- Status, result and error of one job (what AsyncResult polls).
SELECT id, status, result, error FROM pgtasks.jobs WHERE id = %(id)s;

-- name: job_list
-- Jobs filtered by optional status, queue, task, tenant; newest first, keyset-paginated by id.
SELECT * FROM pgtasks.jobs
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(task_name)s::text IS NULL OR task_name = %(task_name)s)
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
  AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: queue_stats
-- Job counts per queue and status (for `pgtasks queues` and metrics).
SELECT queue, status, count(*) AS jobs,
       min(run_at) FILTER (WHERE status = 'queued') AS oldest_run_at
FROM pgtasks.jobs
GROUP BY queue, status
ORDER BY queue, status;

-- ======================================================================
-- Jobs: claim and complete (the hot path)
-- ======================================================================

-- name: job_claim_batch
-- Claim up to %(limit)s due jobs for a worker: tenants served round-robin (fair) or by strict
-- priority; at most one job per lock key, none whose lock key is running elsewhere.
-- The per-tenant sub-selects lock with SKIP LOCKED inside LATERAL; the outer UPDATE joins on
-- the picked ids, so no LIMITed sub-select sits in a WHERE ... IN (the planner trap).
WITH RECURSIVE tenants AS (
    (SELECT j.queue, j.tenant, 1 AS n
     FROM pgtasks.jobs j
     WHERE j.status = 'queued' AND j.queue = ANY(%(queues)s::text[])
       AND (j.queue, j.tenant) > (%(after_queue)s::text, %(after_tenant)s::text)
     ORDER BY j.queue, j.tenant
     LIMIT 1)
    UNION ALL
    SELECT nxt.queue, nxt.tenant, t.n + 1
    FROM tenants t
    CROSS JOIN LATERAL (
        SELECT j.queue, j.tenant
        FROM pgtasks.jobs j
        WHERE j.status = 'queued' AND j.queue = ANY(%(queues)s::text[])
          AND (j.queue, j.tenant) > (t.queue, t.tenant)
        ORDER BY j.queue, j.tenant
        LIMIT 1
    ) nxt
    WHERE t.n < %(max_tenants)s
),
candidates AS (
    SELECT c.*
    FROM tenants t
    CROSS JOIN LATERAL (
        SELECT j.id, j.queue, j.tenant, j.priority, j.run_at, j.lock_key
        FROM pgtasks.jobs j
        WHERE j.status = 'queued' AND j.queue = t.queue AND j.tenant = t.tenant
          AND j.run_at <= coalesce(%(now)s::timestamptz, now())
          AND (j.lock_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM pgtasks.jobs r
                WHERE r.lock_key = j.lock_key AND r.status = 'running'))
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) c
),
ranked AS (
    SELECT c.id, c.priority, c.run_at, c.lock_key,
           row_number() OVER (PARTITION BY c.queue, c.tenant
                              ORDER BY c.priority DESC, c.run_at, c.id) AS turn,
           row_number() OVER (PARTITION BY c.lock_key
                              ORDER BY c.priority DESC, c.run_at, c.id) AS lock_turn
    FROM candidates c
),
picked AS (
    SELECT r.id
    FROM ranked r
    WHERE r.lock_key IS NULL OR r.lock_turn = 1
    ORDER BY CASE WHEN %(fair)s::boolean THEN r.turn ELSE 0 END,
             r.priority DESC, r.run_at, r.id
    LIMIT %(limit)s
)
UPDATE pgtasks.jobs j
SET status = 'running', attempt = j.attempt + 1, worker_id = %(worker_id)s,
    started_at = coalesce(%(now)s::timestamptz, now()),
    heartbeat_at = coalesce(%(now)s::timestamptz, now())
FROM picked
WHERE j.id = picked.id AND j.status = 'queued'
RETURNING j.id, j.task_name, j.queue, j.tenant, j.args, j.kwargs, j.headers, j.priority,
          j.attempt, j.max_attempts, j.trigger, j.lock_key, j.unique_key, j.schedule_name,
          j.scheduled_for, j.parent_id, j.correlation_id, j.started_at, j.retry_on_worker_lost;

-- name: job_next_run_at
-- Earliest run-at of a queued job in these queues (lets an idle worker sleep until then).
SELECT min(run_at) AS run_at, coalesce(%(now)s::timestamptz, now()) AS now
FROM pgtasks.jobs
WHERE status = 'queued' AND queue = ANY(%(queues)s::text[]);

-- name: job_succeed_batch
-- Record the results of finished jobs, one statement per batch; wakes result waiters on commit.
WITH done AS (
    UPDATE pgtasks.jobs j
    SET status = 'succeeded', result = v.result,
        finished_at = coalesce(%(now)s::timestamptz, now()), cancel_requested = false
    FROM unnest(%(ids)s::bigint[], %(results)s::jsonb[]) AS v(id, result)
    WHERE j.id = v.id AND j.status = 'running' AND j.worker_id = %(worker_id)s
    RETURNING j.id
)
SELECT done.id FROM done
CROSS JOIN (SELECT pg_notify('pgtasks_done', '') IS NOT NULL AS notified) n;

-- name: job_finish
-- End a running job with a terminal non-success status (failed, cancelled, partial_failure),
-- appending the attempt (built from the row, timed by the database clock) to its history.
UPDATE pgtasks.jobs
SET status = %(status)s, finished_at = coalesce(%(now)s::timestamptz, now()),
    error = %(error)s::jsonb, result = %(result)s::jsonb, cancel_requested = false,
    attempts = attempts || jsonb_build_array(jsonb_build_object(
        'attempt', attempt, 'trigger', CASE WHEN attempt > 1 THEN 'retry' ELSE trigger END,
        'worker_id', worker_id, 'started_at', started_at,
        'finished_at', coalesce(%(now)s::timestamptz, now()), 'outcome', %(status)s::text,
        'error', %(error)s::jsonb))
WHERE id = %(id)s AND status = 'running' AND worker_id = %(worker_id)s
RETURNING id, finished_at, pg_notify('pgtasks_done', '') IS NOT NULL AS notified;

-- name: job_retry
-- Send a running job back to the queue for another attempt after %(delay)s seconds,
-- appending the failed attempt to its history.
UPDATE pgtasks.jobs
SET status = 'queued', worker_id = NULL, started_at = NULL, heartbeat_at = NULL,
    run_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s::float8),
    max_attempts = greatest(max_attempts, %(max_attempts)s::integer),
    error = %(error)s::jsonb, cancel_requested = false,
    attempts = attempts || jsonb_build_array(jsonb_build_object(
        'attempt', attempt, 'trigger', CASE WHEN attempt > 1 THEN 'retry' ELSE trigger END,
        'worker_id', worker_id, 'started_at', started_at,
        'finished_at', coalesce(%(now)s::timestamptz, now()), 'outcome', 'retry',
        'error', %(error)s::jsonb))
WHERE id = %(id)s AND status = 'running' AND worker_id = %(worker_id)s
RETURNING id, run_at, pg_notify('pgtasks_jobs', queue) IS NOT NULL AS notified;

-- name: job_defer
-- Put a claimed job back without using up an attempt, not before %(delay)s seconds
-- (a task this worker does not know, left for a worker that does).
UPDATE pgtasks.jobs
SET status = 'queued', attempt = attempt - 1, worker_id = NULL, started_at = NULL,
    heartbeat_at = NULL,
    run_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s::float8)
WHERE id = %(id)s AND status = 'running' AND worker_id = %(worker_id)s
RETURNING id;

-- name: job_release
-- Hand claimed-but-unstarted or interrupted jobs back to the queue at once (graceful shutdown).
UPDATE pgtasks.jobs
SET status = 'queued', attempt = attempt - 1, worker_id = NULL, started_at = NULL,
    heartbeat_at = NULL
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'running' AND worker_id = %(worker_id)s
RETURNING id, pg_notify('pgtasks_jobs', queue) IS NOT NULL AS notified;

-- name: job_report_progress
-- Merge progress counters into a running job the worker holds; doubles as the job heartbeat.
UPDATE pgtasks.jobs
SET progress = coalesce(progress, '{}'::jsonb) || %(progress)s::jsonb,
    heartbeat_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s AND status = 'running' AND worker_id = %(worker_id)s
RETURNING cancel_requested;

-- name: job_cancel
-- Cancel a job: a queued one ends at once, a running one is flagged (and its worker told).
WITH target AS (
    SELECT id, status AS old_status FROM pgtasks.jobs
    WHERE id = %(id)s AND status IN ('queued', 'running')
    FOR UPDATE
), upd AS (
    UPDATE pgtasks.jobs j
    SET status = CASE WHEN t.old_status = 'queued' THEN 'cancelled' ELSE j.status END,
        finished_at = CASE WHEN t.old_status = 'queued'
                           THEN coalesce(%(now)s::timestamptz, now()) ELSE j.finished_at END,
        error = CASE WHEN t.old_status = 'queued'
                     THEN %(error)s::jsonb ELSE j.error END,
        headers = CASE WHEN t.old_status = 'running'
                       THEN j.headers || jsonb_build_object('cancel_terminate', %(terminate)s::boolean)
                       ELSE j.headers END,
        cancel_requested = true
    FROM target t
    WHERE j.id = t.id AND j.status = t.old_status
    RETURNING j.id, j.status, t.old_status
)
SELECT upd.id, upd.status, upd.old_status,
       pg_notify('pgtasks_cancel', upd.id::text) IS NOT NULL AS notified,
       pg_notify('pgtasks_done', '') IS NOT NULL AS done_notified
FROM upd;

-- name: job_requeue
-- Put a finished (failed, cancelled, partial_failure) job back in the queue by hand.
UPDATE pgtasks.jobs
SET status = 'queued', finished_at = NULL, worker_id = NULL, started_at = NULL,
    heartbeat_at = NULL, run_at = coalesce(%(now)s::timestamptz, now()),
    cancel_requested = false, attempt = 0, result = NULL
WHERE id = %(id)s AND status IN ('failed', 'cancelled', 'partial_failure')
RETURNING id, pg_notify('pgtasks_jobs', queue) IS NOT NULL AS notified;

-- name: job_cancel_requested
-- Running jobs of a worker that someone asked to cancel (and whether to terminate them).
SELECT id, coalesce((headers ->> 'cancel_terminate')::boolean, false) AS terminate FROM pgtasks.jobs
WHERE worker_id = %(worker_id)s AND status = 'running' AND cancel_requested;

-- name: job_purge_finished
-- Delete finished jobs older than a cutoff (bounded batch); returns how many went.
WITH gone AS (
    DELETE FROM pgtasks.jobs
    WHERE id IN (
        SELECT id FROM pgtasks.jobs
        WHERE status IN ('succeeded', 'failed', 'cancelled', 'partial_failure')
          AND finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s::float8)
          AND (%(status)s::text IS NULL OR status = %(status)s)
        ORDER BY finished_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT count(*) AS deleted FROM gone;

-- ======================================================================
-- Workers: registration, heartbeat, reaping
-- ======================================================================

-- name: worker_register
-- Register a worker process (unique id per process start) with its first lease.
INSERT INTO pgtasks.workers (id, host, pid, queues, concurrency, pool, lease_timeout, lease_expires_at)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s::text[], %(concurrency)s, %(pool)s,
        make_interval(secs => %(lease_timeout)s::float8),
        coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease_timeout)s::float8))
RETURNING started_at;

-- name: worker_heartbeat
-- Extend a worker's lease; returns nothing when the worker row is gone (it was reaped).
UPDATE pgtasks.workers
SET last_seen_at = coalesce(%(now)s::timestamptz, now()),
    lease_expires_at = coalesce(%(now)s::timestamptz, now()) + lease_timeout,
    stopping = %(stopping)s
WHERE id = %(id)s
RETURNING lease_expires_at;

-- name: worker_unregister
-- Remove a worker that stopped cleanly (its jobs were finished or released first).
DELETE FROM pgtasks.workers WHERE id = %(id)s;

-- name: worker_list
-- Every registered worker with its running-job count.
SELECT w.*, (w.lease_expires_at < now()) AS expired,
       (SELECT count(*) FROM pgtasks.jobs j
        WHERE j.worker_id = w.id AND j.status = 'running') AS running
FROM pgtasks.workers w
ORDER BY w.host, w.started_at;

-- name: job_reap_lost
-- Recover running jobs whose worker's lease expired (or whose worker is gone) and whose own
-- heartbeat is older than the lease: retried now, or failed for non-idempotent tasks and
-- exhausted attempts. Error code WORKER_LOST, failure class transient.
WITH lost AS (
    SELECT j.id
    FROM pgtasks.jobs j
    LEFT JOIN pgtasks.workers w ON w.id = j.worker_id
    WHERE j.status = 'running'
      AND (w.id IS NULL OR w.lease_expires_at < coalesce(%(now)s::timestamptz, now()))
      AND j.heartbeat_at < coalesce(%(now)s::timestamptz, now())
                           - coalesce(w.lease_timeout, make_interval(secs => %(lease_timeout)s::float8))
    ORDER BY j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
), reaped AS (
    UPDATE pgtasks.jobs j
    SET status = CASE WHEN j.retry_on_worker_lost AND j.attempt < j.max_attempts
                      THEN 'queued' ELSE 'failed' END,
        finished_at = CASE WHEN j.retry_on_worker_lost AND j.attempt < j.max_attempts
                           THEN NULL ELSE coalesce(%(now)s::timestamptz, now()) END,
        run_at = coalesce(%(now)s::timestamptz, now()),
        worker_id = NULL, started_at = NULL, heartbeat_at = NULL,
        error = jsonb_build_object(
            'type', 'WorkerLost', 'code', 'WORKER_LOST', 'class', 'transient',
            'message', 'worker ' || coalesce(j.worker_id, '?') || ' stopped heartbeating',
            'worker_id', j.worker_id),
        attempts = j.attempts || jsonb_build_array(jsonb_build_object(
            'attempt', j.attempt, 'trigger', CASE WHEN j.attempt > 1 THEN 'retry' ELSE j.trigger END,
            'worker_id', j.worker_id, 'started_at', j.started_at,
            'finished_at', coalesce(%(now)s::timestamptz, now()), 'outcome', 'lost',
            'error', jsonb_build_object('type', 'WorkerLost', 'code', 'WORKER_LOST',
                                        'class', 'transient',
                                        'message', 'worker stopped heartbeating')))
    FROM lost
    WHERE j.id = lost.id AND j.status = 'running'
    RETURNING j.id, j.status, j.task_name, j.queue, j.schedule_name
)
SELECT reaped.*, pg_notify('pgtasks_jobs', reaped.queue) IS NOT NULL AS notified FROM reaped;

-- name: worker_prune_expired
-- Forget workers whose lease expired long ago and who hold no running job.
DELETE FROM pgtasks.workers w
WHERE w.lease_expires_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s::float8)
  AND NOT EXISTS (SELECT 1 FROM pgtasks.jobs j WHERE j.worker_id = w.id AND j.status = 'running')
RETURNING w.id;

-- ======================================================================
-- Clock
-- ======================================================================

-- name: listen_jobs
-- Subscribe to "jobs were enqueued" wake-ups (payload: queue name).
LISTEN pgtasks_jobs;

-- name: listen_cancel
-- Subscribe to cancellation requests (payload: job id).
LISTEN pgtasks_cancel;

-- name: listen_done
-- Subscribe to "jobs finished" wake-ups (result waiters re-check their job).
LISTEN pgtasks_done;

-- name: clock_now
-- The database clock (workers never use their own).
SELECT now() AS now;
