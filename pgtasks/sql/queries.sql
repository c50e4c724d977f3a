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
-- Enqueue one plain job (due now, no keys, trigger api: the common case, kept minimal).
-- With %(notify)s it wakes workers of its queue on commit (an enqueue inside a caller's
-- transaction); without, the caller sends the wake-up after the commit (job_wake). The
-- payload "queue:id" names the job, so an idle worker can claim it by primary key
-- (job_claim_ids); see pgtasks.worker.hints.
INSERT INTO pgtasks.jobs (
    task_name, queue, tenant, args, kwargs, headers, priority, max_attempts, retry_on_worker_lost)
VALUES (
    %(task_name)s, %(queue)s, %(tenant)s, %(args)s::jsonb, %(kwargs)s::jsonb,
    %(headers)s::jsonb, %(priority)s, %(max_attempts)s, %(retry_on_worker_lost)s)
RETURNING id, CASE WHEN %(notify)s THEN pg_notify('pgtasks_jobs', queue || ':' || id) IS NOT NULL END
    AS notified;

-- name: job_insert_full
-- Enqueue one job with any of run-at, lock key, trigger and schedule fields, without a
-- unique key; wakes workers of its queue on commit with %(notify)s (see job_insert).
INSERT INTO pgtasks.jobs (
    task_name, queue, tenant, args, kwargs, headers, priority, max_attempts, run_at,
    lock_key, trigger, schedule_name, scheduled_for, parent_id, correlation_id,
    retry_on_worker_lost, concurrency_key, concurrency_limit, rate_key, rate_limit, rate_period, cost)
VALUES (
    %(task_name)s, %(queue)s, %(tenant)s, %(args)s::jsonb, %(kwargs)s::jsonb,
    %(headers)s::jsonb, %(priority)s, %(max_attempts)s,
    coalesce(%(eta)s::timestamptz, now() + make_interval(secs => coalesce(%(countdown)s::float8, 0))),
    %(lock_key)s, %(trigger)s, %(schedule_name)s, %(scheduled_for)s::timestamptz,
    %(parent_id)s::bigint, %(correlation_id)s, %(retry_on_worker_lost)s,
    %(concurrency_key)s::text, %(concurrency_limit)s::integer, %(rate_key)s::text,
    %(rate_limit)s::integer, %(rate_period)s::float8, %(cost)s::real)
RETURNING id, CASE WHEN %(notify)s THEN pg_notify('pgtasks_jobs', queue || ':' || id) IS NOT NULL END
    AS notified;

-- name: job_insert_unique
-- Enqueue one job with a unique key; returns nothing when an unfinished job holds the key.
-- Wakes workers of its queue on commit with %(notify)s (see job_insert).
INSERT INTO pgtasks.jobs (
    task_name, queue, tenant, args, kwargs, headers, priority, max_attempts, run_at,
    lock_key, unique_key, trigger, schedule_name, scheduled_for, parent_id,
    correlation_id, retry_on_worker_lost, concurrency_key, concurrency_limit, rate_key, rate_limit,
    rate_period, cost)
VALUES (
    %(task_name)s, %(queue)s, %(tenant)s, %(args)s::jsonb, %(kwargs)s::jsonb,
    %(headers)s::jsonb, %(priority)s, %(max_attempts)s,
    coalesce(%(eta)s::timestamptz, now() + make_interval(secs => coalesce(%(countdown)s::float8, 0))),
    %(lock_key)s, %(unique_key)s, %(trigger)s, %(schedule_name)s,
    %(scheduled_for)s::timestamptz, %(parent_id)s::bigint, %(correlation_id)s,
    %(retry_on_worker_lost)s, %(concurrency_key)s::text, %(concurrency_limit)s::integer,
    %(rate_key)s::text, %(rate_limit)s::integer, %(rate_period)s::float8, %(cost)s::real)
ON CONFLICT (unique_key) WHERE status IN ('queued', 'running') AND unique_key IS NOT NULL
DO NOTHING
RETURNING id, CASE WHEN %(notify)s THEN pg_notify('pgtasks_jobs', queue || ':' || id) IS NOT NULL END
    AS notified;

-- name: job_insert_many
-- Enqueue many jobs in one statement; rows whose unique key is held are skipped.
-- %(jobs)s: one JSON array with an array per job, in this order: task name, queue, tenant,
-- args, kwargs, headers (JSON values), priority, max attempts, eta (timestamp text or
-- null), countdown (seconds or null), lock key, unique key, retry on worker lost, and,
-- when the batch has flow control, concurrency key, concurrency limit, rate key, rate
-- limit, rate period (seconds) and cost (absent or null: none, cost 1). One document,
-- not an array per column: the client writes it in one call (orjson), where psycopg
-- escapes every element of a text[] and jsonb[] in Python, about 25 µs per job.
-- With %(notify)s it wakes the workers of each written job's queue on commit (one
-- notification per queue: PostgreSQL delivers identical ones of a transaction once), so
-- a batch written on its own is one statement and one commit.
INSERT INTO pgtasks.jobs (
    task_name, queue, tenant, args, kwargs, headers, priority, max_attempts, run_at,
    lock_key, unique_key, trigger, retry_on_worker_lost, concurrency_key, concurrency_limit,
    rate_key, rate_limit, rate_period, cost)
SELECT v.r->>0, v.r->>1, v.r->>2, v.r->3, v.r->4, v.r->5, (v.r->>6)::smallint,
       (v.r->>7)::integer,
       coalesce((v.r->>8)::timestamptz, now() + make_interval(secs => coalesce((v.r->>9)::float8, 0))),
       v.r->>10, v.r->>11, 'api', (v.r->>12)::boolean, v.r->>13, (v.r->>14)::integer,
       v.r->>15, (v.r->>16)::integer, (v.r->>17)::float8, coalesce((v.r->>18)::real, 1)
FROM jsonb_array_elements(%(jobs)s::jsonb) AS v(r)
ON CONFLICT (unique_key) WHERE status IN ('queued', 'running') AND unique_key IS NOT NULL
DO NOTHING
RETURNING id, CASE WHEN %(notify)s THEN pg_notify('pgtasks_jobs', queue) IS NOT NULL END AS notified;

-- name: job_copy_in
-- Bulk enqueue through COPY (batches without unique or lock keys); ids come from job_ids_reserve.
COPY pgtasks.jobs (id, task_name, queue, tenant, args, kwargs, headers, priority, max_attempts,
                   lock_key, retry_on_worker_lost) FROM STDIN;

-- name: job_ids_reserve
-- Reserve n job ids from the identity sequence for a COPY batch, as one array (one row
-- to read instead of n). NULL, reserving nothing, when row-level security applies to this
-- role on the jobs table (row-level security mode, migration 0006): PostgreSQL refuses
-- COPY FROM there ("COPY FROM not supported with row-level security"), so the batch
-- goes through the INSERT instead.
SELECT CASE WHEN row_security_active('pgtasks.jobs') THEN NULL ELSE array(
    SELECT nextval(pg_get_serial_sequence('pgtasks.jobs', 'id'))
    FROM generate_series(1, %(n)s::integer)
) END AS ids;

-- name: job_notify_queues
-- Wake workers of these queues on commit (one notification per queue).
SELECT pg_notify('pgtasks_jobs', q) IS NOT NULL AS notified FROM unnest(%(queues)s::text[]) AS q;

-- name: job_wake
-- Wake workers for jobs that already committed (pgtasks.db.wakeups): one notification
-- per payload ("queue:id" or a bare queue). Run alone on the sender's connection, so it
-- is a transaction of its own, and its commit does not wait for the WAL flush: the
-- notification lock that serialises notifying commits is held for microseconds, and
-- a wake-up lost in a server crash costs a poll interval, never a job.
SELECT set_config('synchronous_commit', 'off', true) AS synchronous_commit,
       (SELECT count(pg_notify('pgtasks_jobs', p)) FROM unnest(%(payloads)s::text[]) AS p) AS sent;

-- name: job_find_unique
-- The unfinished job that holds a unique key; with %(tenant)s, only if it is that
-- tenant's (a tenant handle never learns the id of another tenant's job).
SELECT id FROM pgtasks.jobs
WHERE unique_key = %(unique_key)s AND status IN ('blocked', 'queued', 'running')
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s);

-- ======================================================================
-- Jobs: dependencies (migration 0007)
-- ======================================================================

-- name: job_lock_prerequisites
-- The prerequisites of a job about to be enqueued, among %(ids)s (bigint[]), that exist and
-- are %(tenant)s's jobs, locked in id order until the enqueue commits: a prerequisite that
-- finishes meanwhile writes its status after the commit, so its trigger sees the new edges.
-- Changes nothing (an id missing here is refused before any write). A prerequisite moved
-- to the history (migration 0009) is finished for good: it is returned, not locked.
SELECT id, status FROM (
    SELECT id, status FROM pgtasks.jobs
    WHERE id = ANY (%(ids)s::bigint[]) AND tenant = %(tenant)s
    ORDER BY id
    FOR NO KEY UPDATE
) hot
UNION ALL
SELECT h.id, h.status FROM pgtasks.job_history h
WHERE h.id = ANY (%(ids)s::bigint[]) AND h.tenant = %(tenant)s
ORDER BY id;

-- name: job_block
-- Make the job just inserted (queued, in this transaction) wait for %(prerequisites)s
-- (bigint[], locked by job_lock_prerequisites), each edge with %(run_on)s ('success' or
-- 'failure'), %(on_failure)s ('cancel' or 'run') and %(pass_results)s ('none', 'each' or
-- 'list'); see pgtasks.job_block in migration 0007. Returns the job's status afterwards.
SELECT pgtasks.job_block(%(id)s, %(prerequisites)s::bigint[], %(run_on)s, %(on_failure)s,
                         %(pass_results)s) AS status;

-- name: job_prerequisites
-- The prerequisites a blocked job still has edges to, in their order: id, the outcome
-- recorded when it finished (NULL: not yet), and its status now (NULL: no such job any
-- more). %(tenant)s as job_get.
SELECT d.prerequisite_id AS id, d.position, d.run_on, d.outcome,
       coalesce(p.status, (SELECT h.status FROM pgtasks.job_history h WHERE h.id = d.prerequisite_id))
           AS status
FROM pgtasks.job_dependencies d
LEFT JOIN pgtasks.jobs p ON p.id = d.prerequisite_id
WHERE d.job_id = %(id)s AND (%(tenant)s::text IS NULL OR d.tenant = %(tenant)s)
ORDER BY d.position;

-- ======================================================================
-- Jobs: read
-- ======================================================================

-- name: job_get
-- One job by id, every column. %(tenant)s NULL: any tenant's (the operator's view);
-- else only that tenant's, so another tenant's id reads as no job at all, by the same
-- primary-key lookup (the tenant is a filter on the one row found, not a second query).
-- A finished job may have moved to the history (migration 0009): one statement reads both
-- tables in one snapshot, and a move is one transaction, so the job is found exactly once.
SELECT * FROM pgtasks.jobs WHERE id = %(id)s AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
UNION ALL
SELECT * FROM pgtasks.job_history WHERE id = %(id)s AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s);

-- name: job_status
-- Status, result and error of one job (what AsyncResult polls); %(tenant)s and the
-- history as job_get.
SELECT id, status, result, error FROM pgtasks.jobs WHERE id = %(id)s AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
UNION ALL
SELECT id, status, result, error FROM pgtasks.job_history WHERE id = %(id)s AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s);

-- name: job_explain
-- Why a job is where it is (pgtasks.jobadmin.explain): the job's state, and for a queued job
-- what holds it back: whether a running job holds its lock key (and which, unless the store
-- is scoped and that job is another tenant's: keys are shared), the live workers serving its
-- queue (lease not expired, not stopping, as queue_health counts them), and how many due
-- jobs of its queue come before it (higher priority, or the same priority and earlier in
-- run-at and id order), in all and of its own tenant (fair claims serve tenants in turn),
-- each counted up to %(ahead_limit)s. %(tenant)s as job_get.
WITH n AS (SELECT coalesce(%(now)s::timestamptz, now()) AS t),
j AS (
    SELECT id, status, queue, tenant, task_name, priority, run_at, lock_key, worker_id,
           started_at, finished_at, attempt, max_attempts, concurrency_key, concurrency_limit,
           rate_key, rate_limit
    FROM pgtasks.jobs
    WHERE id = %(id)s AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
    UNION ALL  -- a finished job moved to the history (migration 0009): nothing holds it back
    SELECT id, status, queue, tenant, task_name, priority, run_at, lock_key, worker_id,
           started_at, finished_at, attempt, max_attempts, concurrency_key, concurrency_limit,
           rate_key, rate_limit
    FROM pgtasks.job_history
    WHERE id = %(id)s AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
),
-- Flow control (migration 0008), for a queued job: the slots its concurrency key's jobs
-- hold (the counter the claim enforces) and the first running ids (of its own tenant only
-- when scoped); when its rate key's next start is later than now, that instant (both through
-- functions a tenant-facing role may call); its tenant's weight and running jobs in the
-- queue, the running jobs of the queue and the weights of the tenants that have some (with
-- its own), and whether another tenant has due jobs in the queue (claims share between them).
-- The tenants with queued jobs in its queue: a skip scan of jobs_claim_idx, at most 100.
queued_tenants AS (
    WITH RECURSIVE t AS (
        SELECT (SELECT q.tenant FROM pgtasks.jobs q
                WHERE q.status = 'queued' AND q.queue = j.queue
                ORDER BY q.tenant LIMIT 1) AS tenant, 1 AS n
        FROM j WHERE j.status = 'queued'
        UNION ALL
        SELECT (SELECT q.tenant FROM pgtasks.jobs q
                WHERE q.status = 'queued' AND q.queue = (SELECT j.queue FROM j) AND q.tenant > t.tenant
                ORDER BY q.tenant LIMIT 1), t.n + 1
        FROM t WHERE t.tenant IS NOT NULL AND t.n < 100
    )
    SELECT tenant FROM t WHERE tenant IS NOT NULL
    UNION
    SELECT j.tenant FROM j WHERE j.status = 'queued'
),
f AS (
    SELECT
        CASE WHEN j.status = 'queued' AND j.concurrency_key IS NOT NULL
             THEN pgtasks.concurrency_running(j.concurrency_key) ELSE 0 END AS key_running,
        ARRAY(SELECT r.id FROM pgtasks.jobs r
              WHERE j.status = 'queued' AND r.concurrency_key = j.concurrency_key AND r.status = 'running'
                AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s)
              ORDER BY r.id LIMIT 10) AS key_running_ids,
        CASE WHEN j.status = 'queued' AND j.rate_key IS NOT NULL
             THEN pgtasks.rate_window_end(j.rate_key, n.t) END AS rate_opens_at,
        coalesce((SELECT tw.weight FROM pgtasks.tenant_weights tw
                  WHERE tw.tenant = j.tenant AND tw.queue IN (j.queue, '')
                  ORDER BY tw.queue DESC LIMIT 1), 1)::float8 AS tenant_weight,
        r.tenant_running, r.queue_running, r.weights,
        EXISTS (SELECT 1 FROM pgtasks.jobs o
                WHERE j.status = 'queued' AND o.status = 'queued' AND o.queue = j.queue
                  AND o.tenant <> j.tenant AND o.run_at <= n.t) AS others_due
    FROM j CROSS JOIN n
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(c.running) FILTER (WHERE c.tenant = j.tenant), 0)::int AS tenant_running,
               coalesce(sum(c.running), 0)::int AS queue_running,
               coalesce(sum(coalesce((SELECT tw.weight FROM pgtasks.tenant_weights tw
                                      WHERE tw.tenant = c.tenant AND tw.queue IN (j.queue, '')
                                      ORDER BY tw.queue DESC LIMIT 1), 1)), 0)::float8 AS weights
        FROM (SELECT x.tenant, count(*) FILTER (WHERE x.running) AS running
              FROM (SELECT r.tenant, true AS running FROM pgtasks.jobs r
                    WHERE j.status = 'queued' AND r.status = 'running' AND r.queue = j.queue
                    UNION ALL SELECT q.tenant, false FROM queued_tenants q) x
              GROUP BY x.tenant) c
    ) r
)
SELECT j.*, n.t AS now, h.held AS lock_held, f.*,
       CASE WHEN %(tenant)s::text IS NULL OR h.tenant = %(tenant)s THEN h.id END AS lock_holder,
       pgtasks.live_workers(j.queue, n.t) AS live_workers,  -- migration 0010: tenant roles too
       (SELECT count(*) FROM (
            SELECT 1 FROM pgtasks.jobs a
            WHERE j.status = 'queued' AND a.status = 'queued' AND a.queue = j.queue AND a.run_at <= n.t
              AND a.id <> j.id
              AND (a.priority > j.priority
                   OR (a.priority = j.priority AND (a.run_at, a.id) < (j.run_at, j.id)))
            LIMIT %(ahead_limit)s) x) AS ahead,
       (SELECT count(*) FROM (
            SELECT 1 FROM pgtasks.jobs a
            WHERE j.status = 'queued' AND a.status = 'queued' AND a.queue = j.queue
              AND a.tenant = j.tenant AND a.run_at <= n.t AND a.id <> j.id
              AND (a.priority > j.priority
                   OR (a.priority = j.priority AND (a.run_at, a.id) < (j.run_at, j.id)))
            LIMIT %(ahead_limit)s) x) AS ahead_in_tenant
FROM j CROSS JOIN n CROSS JOIN f
LEFT JOIN LATERAL (
    SELECT r.id, r.tenant, true AS held FROM pgtasks.jobs r
    WHERE j.lock_key IS NOT NULL AND r.lock_key = j.lock_key AND r.status = 'running' AND r.id <> j.id
    LIMIT 1
) h ON true;

-- fragment: job_listed
-- The filters of job_list, on the hot table or the history; %(started)s (NULL: either)
-- whether the body started (started_at set): with status 'running', false lists the jobs
-- claimed ahead, true the ones running (the phases of `pgtasks.Job.phase`).
(%(status)s::text IS NULL OR status = %(status)s)
AND (%(started)s::boolean IS NULL OR (started_at IS NOT NULL) = %(started)s::boolean)
AND (%(queue)s::text IS NULL OR queue = %(queue)s)
AND (%(task_name)s::text IS NULL OR task_name = %(task_name)s)
AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s::timestamptz)
AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s)

-- name: job_list
-- Jobs filtered by optional status, start, queue, task, tenant and creation time in
-- [%(created_after)s, %(created_before)s) (each NULL: any); newest first, keyset-paginated by id.
-- The hot table and the history (migration 0009), one page of each merged in id order; the
-- history is not read at all for an unfinished status.
SELECT * FROM (
    (SELECT * FROM pgtasks.jobs
     WHERE
        -- include: job_listed
     ORDER BY id DESC
     LIMIT %(limit)s)
    UNION ALL
    (SELECT * FROM pgtasks.job_history
     WHERE (%(status)s::text IS NULL
            OR %(status)s::text IN ('succeeded', 'failed', 'cancelled', 'partial_failure'))
       AND
        -- include: job_listed
     ORDER BY id DESC
     LIMIT %(limit)s)
) j
ORDER BY id DESC
LIMIT %(limit)s;

-- name: queue_stats
-- Job counts per queue and status (for `pgtasks queues` and metrics); claimed: of the
-- running ones, those held but not started (started_at NULL; 0 for other statuses).
SELECT queue, status, count(*) AS jobs,
       count(*) FILTER (WHERE status = 'running' AND started_at IS NULL) AS claimed,
       min(run_at) FILTER (WHERE status = 'queued') AS oldest_run_at
FROM pgtasks.jobs
GROUP BY queue, status
ORDER BY queue, status;

-- name: queue_health
-- Per queue with queued jobs due now (pgtasks check): how many, the run-at of the oldest and
-- how long it has waited, and how many live workers serve the queue (lease not expired, not
-- stopping). %(queues)s: a text[] of queues to look at, or NULL for every queue.
SELECT d.queue, d.due, d.oldest_run_at,
       extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - d.oldest_run_at)::float8
           AS oldest_wait_seconds,
       (SELECT count(*) FROM pgtasks.workers w
        WHERE d.queue = ANY (w.queues) AND NOT w.stopping
          AND w.lease_expires_at >= coalesce(%(now)s::timestamptz, now())) AS live_workers
FROM (
    SELECT queue, count(*) AS due, min(run_at) AS oldest_run_at
    FROM pgtasks.jobs
    WHERE status = 'queued' AND run_at <= coalesce(%(now)s::timestamptz, now())
      AND (%(queues)s::text[] IS NULL OR queue = ANY (%(queues)s::text[]))
    GROUP BY queue
) d
ORDER BY d.queue;

-- name: job_stuck_past_lease
-- Running jobs held by a worker whose lease has expired or whose row is gone (pgtasks check;
-- the reaper recovers them), oldest id first, at most %(limit)s, each with the total count.
-- %(queues)s: a text[] of queues to look at, or NULL for every queue.
SELECT j.id, j.queue, j.task_name, j.tenant, j.worker_id, j.started_at, j.heartbeat_at,
       w.lease_expires_at, count(*) OVER () AS total
FROM pgtasks.jobs j
LEFT JOIN pgtasks.workers w ON w.id = j.worker_id
WHERE j.status = 'running'
  AND (w.id IS NULL OR w.lease_expires_at < coalesce(%(now)s::timestamptz, now()))
  AND (%(queues)s::text[] IS NULL OR j.queue = ANY (%(queues)s::text[]))
ORDER BY j.id
LIMIT %(limit)s;

-- ======================================================================
-- Jobs: claim and complete (the hot path)
-- ======================================================================

-- fragment: claim_admitted
-- The part of a claim that both claims share, after they picked their jobs (a CTE
-- picked: id, concurrency_key, concurrency_limit, rate_key, rate_limit, rate_period,
-- claim_order): rate windows and concurrency slots are taken, and admitted lists the
-- picked jobs that got both, in claim order.
rate_wanted AS (
    -- Rate keys among the picked jobs: how many want a start, the limit and period (the
    -- smallest the jobs name).
    SELECT p.rate_key AS key, count(*)::int AS n, min(p.rate_limit) AS lim,
           min(p.rate_period) AS period
    FROM picked p WHERE p.rate_key IS NOT NULL GROUP BY p.rate_key
),
clock AS (SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS t),
rate_seen AS (
    -- The wanted keys that have a window in this snapshot (one primary-key probe each).
    SELECT w.key FROM pgtasks.rate_windows w WHERE w.key = ANY(ARRAY(SELECT x.key FROM rate_wanted x))
),
rate_fresh AS (
    -- A key's first start, which opens its grid of steps (migration 0008): inserted in key
    -- order, so two claims adding keys never wait on each other in a circle; a row another
    -- claim added first is left to it. Only keys this snapshot does not see: ON CONFLICT
    -- would wait for a transaction writing or deleting the row (a claim, flow_state_prune).
    INSERT INTO pgtasks.rate_windows (key, lim, period, window_start, taken, next_at, granted)
    SELECT w.key, w.lim, w.period, k.t, 1, k.t + make_interval(secs => w.period / w.lim), 1
    FROM rate_wanted w CROSS JOIN clock k
    WHERE w.key <> ALL(ARRAY(SELECT s.key FROM rate_seen s))
    ORDER BY w.key
    ON CONFLICT (key) DO NOTHING
    RETURNING key, granted
),
rate_held AS (
    -- Existing rows, locked; one another claim holds is passed over, not waited for
    -- (its jobs wait for a later claim), so claims never queue behind one another.
    SELECT w.key, w.lim, w.period, w.window_start, w.taken FROM pgtasks.rate_windows w
    WHERE w.key = ANY(ARRAY(SELECT x.key FROM rate_wanted x))
    FOR UPDATE SKIP LOCKED
),
rate_next AS (
    -- The step the clock is in (c: starts 0..c may have happened by now); the starts given
    -- so far, raised to c + 1 - lim when the key fell behind (at most lim to catch up);
    -- what is free of them goes to the wanted jobs. The row values are the locked,
    -- newest version's (READ COMMITTED), so no two claims take the same start. A key
    -- whose limit or period changed starts a new grid now.
    SELECT h.key, o.origin, o.base + least(x.n, greatest(0, o.c + 1 - o.base)) AS taken,
           least(x.n, greatest(0, o.c + 1 - o.base))::int AS granted, x.lim, x.period
    FROM rate_held h
    JOIN rate_wanted x ON x.key = h.key
    CROSS JOIN clock k
    CROSS JOIN LATERAL (
        SELECT s.origin, s.c, greatest(s.taken, s.c + 1 - x.lim) AS base
        FROM (SELECT CASE WHEN h.lim = x.lim AND h.period = x.period THEN h.window_start ELSE k.t END
                         AS origin,
                     CASE WHEN h.lim = x.lim AND h.period = x.period THEN h.taken ELSE 0 END AS taken,
                     CASE WHEN h.lim = x.lim AND h.period = x.period
                          THEN floor(extract(epoch FROM k.t - h.window_start) * x.lim / x.period)::bigint
                          ELSE 0 END AS c) s
    ) o
),
rate_taken AS (
    UPDATE pgtasks.rate_windows w
    SET window_start = r.origin, taken = r.taken, granted = r.granted, lim = r.lim, period = r.period,
        next_at = r.origin + make_interval(secs => r.taken * r.period / r.lim)
    FROM rate_next r
    WHERE w.key = ANY(ARRAY(SELECT h.key FROM rate_held h)) AND r.key = w.key
    RETURNING w.key, w.granted
),
passed AS (
    -- The picked jobs that got a start of their rate key (the first of the key in claim order).
    -- Jobs without a key pass as they are; only the others are numbered within their key (a
    -- window sorts its whole input, and most claims hold no keyed job).
    SELECT p.id, p.concurrency_key, p.concurrency_limit, p.claim_order FROM picked p WHERE p.rate_key IS NULL
    UNION ALL
    SELECT p.id, p.concurrency_key, p.concurrency_limit, p.claim_order
    FROM (SELECT p.*, row_number() OVER (PARTITION BY p.rate_key ORDER BY p.claim_order) AS n
          FROM picked p WHERE p.rate_key IS NOT NULL) p
    WHERE p.n <= coalesce(
        (SELECT g.granted FROM rate_fresh g WHERE g.key = p.rate_key),
        (SELECT g.granted FROM rate_taken g WHERE g.key = p.rate_key), 0)
),
slots_wanted AS (
    SELECT p.concurrency_key AS key, count(*)::int AS n, min(p.concurrency_limit) AS lim
    FROM passed p WHERE p.concurrency_key IS NOT NULL GROUP BY p.concurrency_key
),
slots_seen AS (
    -- The wanted keys that have a counter in this snapshot (as rate_seen).
    SELECT k.key FROM pgtasks.concurrency_keys k WHERE k.key = ANY(ARRAY(SELECT w.key FROM slots_wanted w))
),
slots_fresh AS (
    -- A key's counter, made by its first claim (as rate_fresh: only keys not seen).
    INSERT INTO pgtasks.concurrency_keys (key, running, granted)
    SELECT w.key, least(w.n, w.lim), least(w.n, w.lim) FROM slots_wanted w
    WHERE w.key <> ALL(ARRAY(SELECT s.key FROM slots_seen s))
    ORDER BY w.key
    ON CONFLICT (key) DO NOTHING
    RETURNING key, granted
),
slots_held AS (
    -- Existing counters whose key this claim could take: the advisory lock of migration
    -- 0008 (class 1885828195), tried, never waited for; a key another claim or an ending
    -- job holds is passed over (its jobs wait for a later claim). No row lock is written:
    -- only the holder of a key updates its counter, so the update below never waits.
    SELECT k.key FROM pgtasks.concurrency_keys k
    WHERE k.key = ANY(ARRAY(SELECT w.key FROM slots_wanted w))
      AND pg_try_advisory_xact_lock(1885828195, hashtext(k.key))
),
slots_returned AS (
    -- The slots jobs gave back since (jobs_concurrency_release): the holder of a key folds
    -- them in. A release another claim folded meanwhile is gone (not returned here).
    DELETE FROM pgtasks.concurrency_releases r
    WHERE r.key = ANY(ARRAY(SELECT h.key FROM slots_held h))
    RETURNING r.key
),
slots_taken AS (
    -- running, less the slots given back, plus what the limit leaves for the wanted jobs.
    -- Under READ COMMITTED the update reads the row's newest version (that of the last
    -- holder of the key, committed before this claim got the lock), so concurrent claims
    -- cannot overshoot.
    UPDATE pgtasks.concurrency_keys k
    SET granted = least(x.n, greatest(0, x.lim - greatest(0, k.running - x.back))),
        running = greatest(0, k.running - x.back)
                  + least(x.n, greatest(0, x.lim - greatest(0, k.running - x.back)))
    FROM (SELECT w.key, w.n, w.lim,
                 (SELECT count(*) FROM slots_returned r WHERE r.key = w.key)::int AS back
          FROM slots_wanted w) x
    WHERE k.key = ANY(ARRAY(SELECT h.key FROM slots_held h)) AND x.key = k.key
    RETURNING k.key, k.granted
),
admitted AS (
    -- The jobs that got a slot of their concurrency key (the first of the key in claim order;
    -- jobs without a key as in passed).
    SELECT p.id, p.claim_order FROM passed p WHERE p.concurrency_key IS NULL
    UNION ALL
    SELECT p.id, p.claim_order
    FROM (SELECT p.*, row_number() OVER (PARTITION BY p.concurrency_key ORDER BY p.claim_order) AS n
          FROM passed p WHERE p.concurrency_key IS NOT NULL) p
    WHERE p.n <= coalesce(
        (SELECT g.granted FROM slots_fresh g WHERE g.key = p.concurrency_key),
        (SELECT g.granted FROM slots_taken g WHERE g.key = p.concurrency_key), 0)
),

-- name: job_claim_batch
-- Claim up to %(limit)s due jobs for a worker: tenants served round-robin (fair) or by strict
-- priority; at most one job per lock key, none whose lock key is running elsewhere.
-- Two claims in flight at once could each take a different job of one key: the second
-- would wait for the first and then fail on jobs_lock_running_idx (unique), losing its
-- whole batch:
-- so a job with a lock key is taken only with a transaction-level advisory lock on its
-- key (class 1885828211, "pgts"; the key's hashtext), which a concurrent claim skips, and
-- only if no job of the key is running as of the moment the lock is held
-- (pgtasks.lock_key_free, migration 0011). A hash shared by two keys only makes one wait
-- for the next claim.
-- A fair claim takes at most its share of the limit from each tenant (see share below); every
-- row carries that share (tenant_share), so the worker knows a tenant it got that many from
-- may have more.
-- Tenants are found by a skip scan of jobs_claim_idx per queue, starting at %(start_tenant)s
-- (inclusive) and looking at most at %(max_tenants)s tenants per queue. Inside a tenant, each
-- priority is its own range of the index, whose due jobs come first (run_at follows priority
-- in the key): the claim reads each range up to its first future job and probes for the next
-- priority, so jobs due later cost one probe per (tenant, priority), not one index entry each.
-- The per-tenant sub-selects lock with SKIP LOCKED inside LATERAL; the outer UPDATE joins on
-- the picked ids, so no LIMITed sub-select sits in a WHERE ... IN (the planner trap).
-- %(tasks)s (a text[], or NULL for every task): the task names this worker knows, with
-- --unknown-tasks defer; the per-(tenant, priority) scans pass over other tasks' jobs
-- without locking them, so a worker that knows such a job claims it at once. The tenant
-- and priority probes do not look at the task: each stays one probe.
WITH RECURSIVE tenants AS (
    SELECT f.queue, f.tenant, f.priority, f.run_at, f.id, 1 AS n,
           coalesce((SELECT tw.weight FROM pgtasks.tenant_weights tw
                     WHERE tw.tenant = f.tenant AND tw.queue IN (f.queue, '')
                     ORDER BY tw.queue DESC LIMIT 1), 1)::float8 AS weight,
           -ln(1.0 - random()) AS draw
    FROM unnest(%(queues)s::text[]) AS q(queue)
    CROSS JOIN LATERAL (
        SELECT j.queue, j.tenant, j.priority, j.run_at, j.id
        FROM pgtasks.jobs j
        WHERE j.status = 'queued' AND j.queue = q.queue AND j.tenant >= %(start_tenant)s::text
        ORDER BY j.tenant, j.priority DESC, j.run_at, j.id
        LIMIT 1
    ) f
    UNION ALL
    SELECT nxt.queue, nxt.tenant, nxt.priority, nxt.run_at, nxt.id, t.n + 1,
           coalesce((SELECT tw.weight FROM pgtasks.tenant_weights tw
                     WHERE tw.tenant = nxt.tenant AND tw.queue IN (nxt.queue, '')
                     ORDER BY tw.queue DESC LIMIT 1), 1)::float8,
           -ln(1.0 - random())
    FROM tenants t
    CROSS JOIN LATERAL (
        SELECT j.queue, j.tenant, j.priority, j.run_at, j.id
        FROM pgtasks.jobs j
        WHERE j.status = 'queued' AND j.queue = t.queue AND j.tenant > t.tenant
        ORDER BY j.tenant, j.priority DESC, j.run_at, j.id
        LIMIT 1
    ) nxt
    WHERE t.n < %(max_tenants)s
),
share AS (
    -- How many jobs one tenant's scan may lock. Fair: the limit over the tenants whose first
    -- job is due, rounded up, since the first turns of every tenant are picked before anyone's
    -- second; each tenant's scan locking up to the whole limit would lock 100 times what the
    -- claim keeps with 100 tenants. A tenant whose first job is due later while a lower
    -- priority has one due goes uncounted: that only makes the share larger. Strict
    -- priority: the whole limit.
    -- Weighted (pgtasks.tenant_weights), the heaviest tenant's part of the limit, rounded
    -- up, for every tenant (unweighted, each weighs 1: the same figure). lottery: some
    -- tenant's weight is not 1, so the claim order draws (see picked).
    SELECT CASE WHEN %(fair)s::boolean
                THEN least(%(limit)s::int, greatest(1, ceil(%(limit)s::int * d.max_weight / d.weights)))::int
                ELSE %(limit)s::int END AS share,
           d.lottery
    FROM (SELECT coalesce(max(t.weight) FILTER (WHERE t.run_at <= coalesce(%(now)s::timestamptz, now())), 1)
                     AS max_weight,
                 coalesce(sum(t.weight) FILTER (WHERE t.run_at <= coalesce(%(now)s::timestamptz, now())), 1)
                     AS weights,
                 coalesce(bool_or(t.weight <> 1), false) AS lottery
          FROM tenants t) d
),
candidates AS (
    -- Each tenant's due jobs in priority order, numbered (turn) as the ordered sub-select
    -- returns them: OVER () takes its input's order, where OVER (ORDER BY ...) would sort
    -- again (the planner does not carry the order through the row locks). The tenant's
    -- priorities come from the recursion highest first (its first is the one the tenants
    -- skip scan saw); each priority's due jobs in run-at order, stopping at the limit, so
    -- a lower priority is probed only if the higher ones did not fill it.
    -- Each range is read from the first queued job its probe found (run_at, id): the
    -- entries of finished jobs a drain leaves at the head of jobs_claim_idx (until VACUUM
    -- removes them) are walked once, by that probe, not a second time by the scan.
    SELECT c.*, t.weight, t.draw
    FROM tenants t
    CROSS JOIN LATERAL (
        SELECT l.*, row_number() OVER () AS turn, sum(l.cost) OVER (ROWS UNBOUNDED PRECEDING) AS spent
        FROM (
            WITH RECURSIVE priorities AS (
                SELECT t.priority, t.run_at, t.id
                UNION ALL
                SELECT nxt.priority, nxt.run_at, nxt.id
                FROM priorities p
                CROSS JOIN LATERAL (
                    SELECT j.priority, j.run_at, j.id
                    FROM pgtasks.jobs j
                    WHERE j.status = 'queued' AND j.queue = t.queue AND j.tenant = t.tenant
                      AND j.priority < p.priority
                    ORDER BY j.priority DESC, j.run_at, j.id
                    LIMIT 1
                ) nxt
            )
            SELECT d.*
            FROM priorities p
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, j.lock_key, j.concurrency_key,
                       j.concurrency_limit, j.rate_key, j.rate_limit, j.rate_period, j.cost
                FROM pgtasks.jobs j
                WHERE j.status = 'queued' AND j.queue = t.queue AND j.tenant = t.tenant
                  AND j.priority = p.priority
                  AND (j.run_at, j.id) >= (p.run_at, p.id)
                  AND j.run_at <= coalesce(%(now)s::timestamptz, now())
                  AND (%(tasks)s::text[] IS NULL OR j.task_name = ANY(%(tasks)s::text[]))
                  -- A job of a lock key only if no job of the key runs or is being
                  -- claimed, as of now rather than of this statement's snapshot
                  -- (migration 0011).
                  AND (j.lock_key IS NULL OR pgtasks.lock_key_free(j.lock_key))
                  -- Pass over the jobs of a concurrency key at its limit (no slot given
                  -- back since) and of a rate key whose next start is later, so their backlog
                  -- does not take the share of jobs behind it. One key lookup each, only
                  -- for jobs that have such a key.
                  AND (j.concurrency_key IS NULL OR NOT EXISTS (
                        SELECT 1 FROM pgtasks.concurrency_keys k
                        WHERE k.key = j.concurrency_key AND k.running >= j.concurrency_limit
                          AND NOT EXISTS (SELECT 1 FROM pgtasks.concurrency_releases x
                                          WHERE x.key = k.key)))
                  AND (j.rate_key IS NULL OR NOT EXISTS (
                        SELECT 1 FROM pgtasks.rate_windows w
                        WHERE w.key = j.rate_key
                          AND w.next_at > coalesce(%(now)s::timestamptz, clock_timestamp())))
                ORDER BY j.run_at, j.id
                LIMIT (SELECT s.share FROM share s)
                FOR UPDATE SKIP LOCKED
            ) d
            LIMIT (SELECT s.share FROM share s)
        ) l
    ) c
),
ordered AS (
    -- At most one job per lock key: the first of its key in priority order (checked only
    -- for jobs that have a key).
    -- fair_key: fair, the tenant's cost spent up to and with this job (its turn, when each
    -- job costs 1) over its weight, so first turns of every tenant come before second
    -- turns; weighted (or with a cost other than 1 among the candidates, else a cheap
    -- tenant's second turn would always come before a dear one's first), the job's own
    -- cost scaled by the tenant's draw (an exponential variate of mean 1), which makes
    -- the first job of the claim a tenant's with chance weight / cost over the sum of all
    -- (lottery scheduling, Waldspurger and Weihl, 1994): a claim of one job is as fair
    -- over time as a claim of many. Else 0 (priority order).
    SELECT c.id, c.priority, c.run_at, c.concurrency_key, c.concurrency_limit, c.rate_key,
           c.rate_limit, c.rate_period,
           CASE WHEN %(fair)s::boolean
                THEN (c.spent - c.cost
                      + c.cost * CASE WHEN s.lottery OR (SELECT bool_or(d.cost <> 1) FROM candidates d)
                                      THEN c.draw ELSE 1 END) / c.weight
                ELSE 0 END AS fair_key
    FROM candidates c CROSS JOIN share s
    WHERE c.lock_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM candidates d
        WHERE d.lock_key = c.lock_key
          AND (d.priority > c.priority
               OR (d.priority = c.priority AND (d.run_at, d.id) < (c.run_at, c.id))))
),
picked AS (
    -- Fair: in fair_key order; else priority order. Of a concurrency or rate key, no more
    -- jobs than its limit (the write below takes what its counter allows): only jobs with a
    -- key are ranked within it (each window sorts its whole input; most claims hold none).
    -- The ORDER BY repeats the window's, so one sort serves both.
    SELECT r.id, r.concurrency_key, r.concurrency_limit, r.rate_key, r.rate_limit, r.rate_period,
           row_number() OVER w AS claim_order
    FROM (SELECT o.id, o.priority, o.run_at, o.concurrency_key, o.concurrency_limit, o.rate_key,
                 o.rate_limit, o.rate_period, o.fair_key
          FROM ordered o WHERE o.concurrency_key IS NULL AND o.rate_key IS NULL
          UNION ALL
          SELECT k.id, k.priority, k.run_at, k.concurrency_key, k.concurrency_limit, k.rate_key,
                 k.rate_limit, k.rate_period, k.fair_key
          FROM (SELECT o.*,
                       row_number() OVER (PARTITION BY o.concurrency_key
                                          ORDER BY o.fair_key, o.priority DESC, o.run_at, o.id) AS key_rank,
                       row_number() OVER (PARTITION BY o.rate_key
                                          ORDER BY o.fair_key, o.priority DESC, o.run_at, o.id) AS rate_rank
                FROM ordered o WHERE o.concurrency_key IS NOT NULL OR o.rate_key IS NOT NULL) k
          WHERE (k.concurrency_key IS NULL OR k.key_rank <= k.concurrency_limit)
            AND (k.rate_key IS NULL OR k.rate_rank <= k.rate_limit)) r
    WINDOW w AS (ORDER BY r.fair_key, r.priority DESC, r.run_at, r.id)
    ORDER BY r.fair_key, r.priority DESC, r.run_at, r.id
    LIMIT %(limit)s
),
-- include: claim_admitted
claimed AS (
    -- The write's plan must not depend on the table's statistics, which a queue table
    -- rarely has fresh (never analyzed; analyzed while nearly empty, then a burst). So:
    -- - The picked ids come as one array, unnested with their claim order: a function
    --   scan the planner always estimates at 10 rows, whatever the statistics say, so it
    --   probes the primary key once per id (a join to the picked CTE, estimated from the
    --   statistics, let it hash-join a sequential scan of every queued job instead).
    -- - The expected status is a one-row sub-select, a value known only at run time: a
    --   constant would let the planner prove the partial indexes' "status = 'queued'"
    --   and, when the statistics say jobs_claim_idx is nearly empty, scan all of it for
    --   the ids (130 page reads per claimed job at 20,000 queued jobs, never analyzed).
    -- - The claim order comes back in RETURNING, so no join of the written rows to
    --   picked (with estimates of one row each, a nested loop: n x n rows).
    -- started_at stays NULL: a claimed job is held, not started (its body may wait in the
    -- worker's buffer); the worker records the start (job_start, job_mark_started, or
    -- with the outcome). heartbeat_at is the database clock when the row is claimed.
    UPDATE pgtasks.jobs j
    SET status = 'running', attempt = j.attempt + 1, worker_id = %(worker_id)s,
        started_at = NULL,
        heartbeat_at = coalesce(%(now)s::timestamptz, clock_timestamp())
    FROM unnest(ARRAY(SELECT a.id FROM admitted a ORDER BY a.claim_order))
         WITH ORDINALITY AS o(id, claim_order)
    WHERE j.id = o.id AND j.status = (SELECT 'queued'::text)
    RETURNING j.id, j.task_name, j.attempt, j.max_attempts, j.trigger, j.args, j.kwargs,
              j.queue, j.tenant, j.priority, j.headers, j.lock_key, j.unique_key,
              j.schedule_name, j.scheduled_for, j.parent_id, j.correlation_id, j.run_at, o.claim_order,
              j.concurrency_key
)
-- Rows come back in the order they should start (UPDATE ... RETURNING has none), in the
-- order of pgtasks.context.CLAIM_COLUMNS (the worker reads them by position), then the
-- job's run-at as Unix seconds (due: the worker's wait-time metric), tenant_share, and
-- keyed: whether the job holds a concurrency slot (its end frees one, a reason to claim).
SELECT c.id, c.task_name, c.attempt, c.max_attempts, c.trigger, c.args, c.kwargs, c.queue,
       c.tenant, c.priority, c.headers, c.lock_key, c.unique_key, c.schedule_name,
       c.scheduled_for, c.parent_id, c.correlation_id, extract(epoch FROM c.run_at)::float8 AS due,
       (SELECT s.share FROM share s) AS tenant_share, c.concurrency_key IS NOT NULL AS keyed
FROM claimed c
ORDER BY c.claim_order;

-- name: job_claim_ids
-- Claim the named jobs for an idle worker (their ids came with the enqueue notifications):
-- the rules of job_claim_batch (one of %(queues)s, due, lock key not running elsewhere, at
-- most one job per lock key, priority order, only %(tasks)s unless NULL), but each job
-- found by its primary key; concurrency and rate limits as job_claim_batch.
-- The expected status is a run-time value here too, so only the primary key can find the
-- ids, whatever the statistics say (see job_claim_batch's write).
WITH candidates AS (
    SELECT j.id, j.priority, j.run_at, j.lock_key, j.concurrency_key, j.concurrency_limit,
           j.rate_key, j.rate_limit, j.rate_period
    FROM pgtasks.jobs j
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = (SELECT 'queued'::text)
      AND j.queue = ANY(%(queues)s::text[])
      AND j.run_at <= coalesce(%(now)s::timestamptz, now())
      AND (%(tasks)s::text[] IS NULL OR j.task_name = ANY(%(tasks)s::text[]))
      AND (j.lock_key IS NULL OR pgtasks.lock_key_free(j.lock_key))  -- see job_claim_batch
      AND (j.concurrency_key IS NULL OR NOT EXISTS (  -- as job_claim_batch
            SELECT 1 FROM pgtasks.concurrency_keys k
            WHERE k.key = j.concurrency_key AND k.running >= j.concurrency_limit
              AND NOT EXISTS (SELECT 1 FROM pgtasks.concurrency_releases x WHERE x.key = k.key)))
      AND (j.rate_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM pgtasks.rate_windows w
            WHERE w.key = j.rate_key AND w.next_at > coalesce(%(now)s::timestamptz, clock_timestamp())))
    FOR UPDATE SKIP LOCKED
),
picked AS (
    -- Of a concurrency or rate key, no more jobs than its limit (as job_claim_batch).
    SELECT r.id, r.concurrency_key, r.concurrency_limit, r.rate_key, r.rate_limit, r.rate_period,
           row_number() OVER (ORDER BY r.priority DESC, r.run_at, r.id) AS claim_order
    FROM (SELECT c.*,
                 row_number() OVER (PARTITION BY c.concurrency_key
                                    ORDER BY c.priority DESC, c.run_at, c.id) AS key_rank,
                 row_number() OVER (PARTITION BY c.rate_key
                                    ORDER BY c.priority DESC, c.run_at, c.id) AS rate_rank
          FROM candidates c
          WHERE c.lock_key IS NULL OR NOT EXISTS (
              SELECT 1 FROM candidates d
              WHERE d.lock_key = c.lock_key
                AND (d.priority > c.priority
                     OR (d.priority = c.priority AND (d.run_at, d.id) < (c.run_at, c.id))))) r
    WHERE (r.concurrency_key IS NULL OR r.key_rank <= r.concurrency_limit)
      AND (r.rate_key IS NULL OR r.rate_rank <= r.rate_limit)
),
-- Rate windows and concurrency slots, taken as job_claim_batch takes them.
-- include: claim_admitted
claimed AS (
    -- Written as job_claim_batch writes, for the same reasons (see there; and for started_at).
    UPDATE pgtasks.jobs j
    SET status = 'running', attempt = j.attempt + 1, worker_id = %(worker_id)s,
        started_at = NULL,
        heartbeat_at = coalesce(%(now)s::timestamptz, clock_timestamp())
    FROM unnest(ARRAY(SELECT a.id FROM admitted a ORDER BY a.claim_order))
         WITH ORDINALITY AS o(id, claim_order)
    WHERE j.id = o.id AND j.status = (SELECT 'queued'::text)
    RETURNING j.id, j.task_name, j.attempt, j.max_attempts, j.trigger, j.args, j.kwargs,
              j.queue, j.tenant, j.priority, j.headers, j.lock_key, j.unique_key,
              j.schedule_name, j.scheduled_for, j.parent_id, j.correlation_id, j.run_at, o.claim_order,
              j.concurrency_key
)
-- In the order of pgtasks.context.CLAIM_COLUMNS (the worker reads them by position), then
-- due, tenant_share (none here) and keyed as job_claim_batch.
SELECT c.id, c.task_name, c.attempt, c.max_attempts, c.trigger, c.args, c.kwargs, c.queue,
       c.tenant, c.priority, c.headers, c.lock_key, c.unique_key, c.schedule_name,
       c.scheduled_for, c.parent_id, c.correlation_id, extract(epoch FROM c.run_at)::float8 AS due,
       NULL::integer AS tenant_share, c.concurrency_key IS NOT NULL AS keyed
FROM claimed c
ORDER BY c.claim_order;

-- name: job_next_run_at
-- Earliest run-at of a queued job in these queues (lets an idle worker sleep until then).
-- A skip scan of jobs_claim_idx: the first entry of each (queue, tenant, priority) group
-- holds the group's earliest run-at, and the next group's first entry is one probe away
-- (a lower priority of the same tenant, else the next tenant). So the cost follows the
-- number of groups, not of queued jobs: an idle worker above a million jobs due tomorrow
-- reads a few index pages, not the million entries. Past %(max_groups)s groups in a queue
-- (many tenants or priorities) it falls back to the aggregate over every queued entry.
-- Only jobs of %(tasks)s unless NULL (the claim's filter): an idle worker is not woken for
-- jobs it leaves to others; each probe then passes over their entries (a row read each).
-- opens_at: the earliest next start of a rate key that queued jobs of these queues wait
-- on (pgtasks.rate_windows: one row per rate key), or NULL; the worker wakes then.
WITH RECURSIVE groups AS (
    SELECT f.queue, f.tenant, f.priority, f.run_at, 1 AS n
    FROM unnest(%(queues)s::text[]) AS q(queue)
    CROSS JOIN LATERAL (
        SELECT j.queue, j.tenant, j.priority, j.run_at
        FROM pgtasks.jobs j
        WHERE j.status = 'queued' AND j.queue = q.queue
          AND (%(tasks)s::text[] IS NULL OR j.task_name = ANY(%(tasks)s::text[]))
        ORDER BY j.tenant, j.priority DESC, j.run_at
        LIMIT 1
    ) f
    UNION ALL
    SELECT nxt.queue, nxt.tenant, nxt.priority, nxt.run_at, g.n + 1
    FROM groups g
    CROSS JOIN LATERAL (
        (SELECT j.queue, j.tenant, j.priority, j.run_at
         FROM pgtasks.jobs j
         WHERE j.status = 'queued' AND j.queue = g.queue AND j.tenant = g.tenant
           AND j.priority < g.priority
           AND (%(tasks)s::text[] IS NULL OR j.task_name = ANY(%(tasks)s::text[]))
         ORDER BY j.priority DESC, j.run_at
         LIMIT 1)
        UNION ALL
        (SELECT j.queue, j.tenant, j.priority, j.run_at
         FROM pgtasks.jobs j
         WHERE j.status = 'queued' AND j.queue = g.queue AND j.tenant > g.tenant
           AND (%(tasks)s::text[] IS NULL OR j.task_name = ANY(%(tasks)s::text[]))
         ORDER BY j.tenant, j.priority DESC, j.run_at
         LIMIT 1)
        LIMIT 1
    ) nxt
    WHERE g.n < %(max_groups)s
)
-- The fallback is an uncorrelated sub-select: PostgreSQL runs it only if that branch is taken.
SELECT CASE WHEN max(g.n) >= %(max_groups)s
            THEN (SELECT min(j.run_at) FROM pgtasks.jobs j
                  WHERE j.status = 'queued' AND j.queue = ANY(%(queues)s::text[])
                    AND (%(tasks)s::text[] IS NULL OR j.task_name = ANY(%(tasks)s::text[])))
            ELSE min(g.run_at) END AS run_at,
       coalesce(%(now)s::timestamptz, now()) AS now,
       (SELECT min(w.next_at)
        FROM pgtasks.rate_windows w
        WHERE w.next_at > coalesce(%(now)s::timestamptz, now())
          AND EXISTS (SELECT 1 FROM pgtasks.jobs j
                      WHERE j.status = 'queued' AND j.rate_key = w.key
                        AND j.queue = ANY(%(queues)s::text[]))) AS opens_at
FROM groups g;

-- name: job_succeed_batch
-- Record the results of finished jobs, one statement per batch; wakes result waiters on commit.
-- %(ids)s is a bigint array, %(results)s a JSON array of the results in the same order,
-- %(spans)s a bigint array of the worker's instants, in microseconds after %(base)s (Unix
-- seconds): each job's start then its end (integers: cheaper to write and to read than
-- floats). So started_at is when the body started (a start written before, by job_start or
-- job_mark_started, stays) and finished_at when it ended, with no write of their own.
-- A succeeded job has no error: that of a failed attempt before it stays in its history.
-- %(attempts)s (integer[], NULL or one entry per job, NULL entries: any) names the attempt
-- each result is of, as job_finish fences it: a repeat of a write whose reply was lost
-- cannot complete a newer attempt of the job the same worker claimed since.
WITH v AS (
    SELECT i.id, i.attempt, r.result,
           to_timestamp(t.base + t.spans[2 * i.n - 1] / 1000000.0::float8) AS started_at,
           to_timestamp(t.base + t.spans[2 * i.n] / 1000000.0::float8) AS finished_at
    FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) WITH ORDINALITY AS i(id, attempt, n)
    JOIN jsonb_array_elements(%(results)s::jsonb) WITH ORDINALITY AS r(result, n) USING (n)
    CROSS JOIN (SELECT %(spans)s::bigint[] AS spans, %(base)s::float8 AS base) t
),
done AS (
    UPDATE pgtasks.jobs j
    SET status = 'succeeded', result = v.result, error = NULL,
        started_at = coalesce(j.started_at, v.started_at, %(now)s::timestamptz, now()),
        finished_at = coalesce(%(now)s::timestamptz, v.finished_at, now()), cancel_requested = false
    FROM v
    WHERE j.id = v.id AND j.status = 'running' AND j.worker_id = %(worker_id)s
      AND (v.attempt IS NULL OR j.attempt = v.attempt)
    RETURNING j.id
)
SELECT done.id FROM done
CROSS JOIN (SELECT pg_notify('pgtasks_done', '') IS NOT NULL AS notified) n;

-- name: job_finish
-- End a running job with a terminal non-success status (failed, cancelled, partial_failure),
-- appending the attempt (built from the row, timed by the database clock) to its history.
-- An attempt is numbered across manual requeues (attempt_base + attempt, see job_requeue);
-- its trigger is retry after the first attempt of a round, else manual when the history
-- holds anything (a first attempt after a requeue), else the job's.
-- %(started)s: when its body started (Unix seconds, the worker's clock), NULL if it never
-- did (cancelled before it started); a start already written stays.
-- The expected status is a run-time value, so the row is found by its primary key whatever
-- the statistics say (a constant let stale statistics pick a scan of jobs_running_worker_idx
-- over every job the worker holds).
UPDATE pgtasks.jobs
SET status = %(status)s, finished_at = coalesce(%(now)s::timestamptz, now()),
    started_at = coalesce(started_at, to_timestamp(%(started)s::float8)),
    error = %(error)s::jsonb, result = %(result)s::jsonb, cancel_requested = false,
    attempts = attempts || jsonb_build_array(jsonb_build_object(
        'attempt', attempt_base + attempt,
        'trigger', CASE WHEN attempt > 1 THEN 'retry' WHEN attempts <> '[]' THEN 'manual' ELSE trigger END,
        'worker_id', worker_id,
        'started_at', coalesce(started_at, to_timestamp(%(started)s::float8)),
        'finished_at', coalesce(%(now)s::timestamptz, now()), 'outcome', %(status)s::text,
        'error', %(error)s::jsonb))
WHERE id = %(id)s AND status = (SELECT 'running'::text) AND worker_id = %(worker_id)s
  -- Fenced by the attempt too (NULL: not): a write repeated after its reply was lost,
  -- when the first had committed and this worker has since claimed the job again,
  -- must not end the newer attempt.
  AND (%(attempt)s::integer IS NULL OR attempt = %(attempt)s::integer)
RETURNING id, finished_at, pg_notify('pgtasks_done', '') IS NOT NULL AS notified;

-- name: job_retry_batch
-- Send running jobs back to the queue for another attempt, one statement for many (the
-- completer writes them beside the successes, so a retry costs no commit of its own).
-- Per job, in the order of %(ids)s (bigint[]): %(delays)s seconds until it is due again,
-- %(max_attempts)s attempts now allowed (raised by retry(max_retries=)), its error record
-- (%(errors)s: one JSON array of the records, in the same order: a text[] of tracebacks
-- costs the client an escape of every character), %(starts)s when its body started (Unix
-- seconds, the worker's clock; NULL:
-- it never did; a start already written stays). The failed attempt is appended to the
-- history, numbered and triggered as in job_finish. Found by primary key whatever the
-- statistics say: the ids come from a function scan and the expected status is a run-time
-- value (see job_finish). Wakes each queue's workers on commit (PostgreSQL delivers
-- identical notifications of one transaction once).
UPDATE pgtasks.jobs j
SET status = 'queued', worker_id = NULL, started_at = NULL, heartbeat_at = NULL,
    run_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => v.delay),
    max_attempts = greatest(j.max_attempts, v.max_attempts),
    error = v.error, cancel_requested = false,
    attempts = j.attempts || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempt_base + j.attempt,
        'trigger', CASE WHEN j.attempt > 1 THEN 'retry' WHEN j.attempts <> '[]' THEN 'manual'
                        ELSE j.trigger END,
        'worker_id', j.worker_id,
        'started_at', coalesce(j.started_at, to_timestamp(v.started)),
        'finished_at', coalesce(%(now)s::timestamptz, now()), 'outcome', 'retry',
        'error', v.error))
FROM (SELECT i.id, i.delay, i.max_attempts, e.error, i.started, i.attempt
      FROM unnest(%(ids)s::bigint[], %(delays)s::float8[], %(max_attempts)s::integer[],
                  %(starts)s::float8[], %(attempts)s::integer[])
           WITH ORDINALITY AS i(id, delay, max_attempts, started, attempt, n)
      JOIN jsonb_array_elements(%(errors)s::jsonb) WITH ORDINALITY AS e(error, n) USING (n)) v
WHERE j.id = v.id AND j.status = (SELECT 'running'::text) AND j.worker_id = %(worker_id)s
  -- The attempt each retry is of (NULL: any), as job_finish fences it.
  AND (v.attempt IS NULL OR j.attempt = v.attempt)
RETURNING j.id, pg_notify('pgtasks_jobs', j.queue) IS NOT NULL AS notified;

-- name: job_claim_suspects
-- After a claim failed on something other than a race: the jobs it may have tried to take,
-- for the worker to test (pgtasks.worker.isolation). Per queue of %(queues)s, the first
-- %(max_tenants)s tenants from %(start_tenant)s, and of each the first %(limit)s due jobs in
-- claim order whose lock key is not running: what job_claim_batch picks with the same
-- parameters is among them (only jobs of %(tasks)s unless NULL, as the claim). Run only after
-- a failed claim, so it may read every queued entry.
WITH tenants AS (
    SELECT g.queue, g.tenant
    FROM (SELECT d.queue, d.tenant, row_number() OVER (PARTITION BY d.queue ORDER BY d.tenant) AS n
          FROM (SELECT DISTINCT j.queue, j.tenant
                FROM pgtasks.jobs j
                WHERE j.status = 'queued' AND j.queue = ANY(%(queues)s::text[])
                  AND j.tenant >= %(start_tenant)s::text) d) g
    WHERE g.n <= %(max_tenants)s
)
SELECT s.id, s.lock_key
FROM tenants t
CROSS JOIN LATERAL (
    SELECT j.id, j.lock_key, j.priority, j.run_at
    FROM pgtasks.jobs j
    WHERE j.status = 'queued' AND j.queue = t.queue AND j.tenant = t.tenant
      AND j.run_at <= coalesce(%(now)s::timestamptz, now())
      AND (%(tasks)s::text[] IS NULL OR j.task_name = ANY(%(tasks)s::text[]))
      AND (j.lock_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM pgtasks.jobs r
            WHERE r.lock_key = j.lock_key AND r.status = 'running'))
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(limit)s
) s
ORDER BY s.priority DESC, s.run_at, s.id;

-- name: job_claim_probe
-- The claim's write on the named queued jobs, for a dry run (the caller rolls it back):
-- fails as job_claim_batch would if one of them cannot be claimed. Jobs another
-- transaction holds are skipped, not waited for.
UPDATE pgtasks.jobs j
SET status = 'running', attempt = j.attempt + 1, worker_id = %(worker_id)s,
    started_at = clock_timestamp(), heartbeat_at = clock_timestamp()
WHERE j.id = ANY(ARRAY(
        SELECT q.id FROM pgtasks.jobs q
        WHERE q.id = ANY(%(ids)s::bigint[]) AND q.status = 'queued'
        FOR UPDATE SKIP LOCKED))
  AND j.status = 'queued'
RETURNING j.id;

-- name: job_fail_unclaimable
-- End a queued job no claim can take (a row written by SQL that the claim's write refuses,
-- such as a lock key too large for jobs_lock_running_idx) as failed, without using an
-- attempt. Its values stay as they are: a failed job enters none of the indexes of
-- unfinished or running jobs.
UPDATE pgtasks.jobs
SET status = 'failed', finished_at = coalesce(%(now)s::timestamptz, now()),
    error = %(error)s::jsonb, cancel_requested = false
WHERE id = %(id)s AND status = 'queued'
RETURNING id, task_name, pg_notify('pgtasks_done', '') IS NOT NULL AS notified;

-- name: job_start
-- Record that the body of a held job starts now (one job; a task that must not run twice
-- after a lost worker, retry_on_worker_lost=False: written before its body runs, so the
-- reaper knows it started). Returns nothing if the worker no longer holds the job.
UPDATE pgtasks.jobs
SET started_at = coalesce(%(now)s::timestamptz, to_timestamp(%(started)s::float8))
WHERE id = %(id)s AND status = (SELECT 'running'::text) AND worker_id = %(worker_id)s
RETURNING id;

-- name: job_mark_started
-- Record the starts of held jobs whose body runs (the worker's heartbeat, one statement for
-- all started since the last): %(ids)s a bigint array, %(starts)s the float8 array of their
-- start instants (Unix seconds) in the same order. A start already written stays.
UPDATE pgtasks.jobs j
SET started_at = to_timestamp(v.started)
FROM unnest(%(ids)s::bigint[], %(starts)s::float8[]) AS v(id, started)
WHERE j.id = v.id AND j.status = (SELECT 'running'::text) AND j.worker_id = %(worker_id)s
  AND j.started_at IS NULL
RETURNING j.id;

-- name: job_defer
-- Put a claimed job back without using up an attempt, not before %(delay)s seconds
-- (a task this worker does not know, left for a worker that does).
UPDATE pgtasks.jobs
SET status = 'queued', attempt = attempt - 1, worker_id = NULL, started_at = NULL,
    heartbeat_at = NULL,
    run_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s::float8)
WHERE id = %(id)s AND status = 'running' AND worker_id = %(worker_id)s
RETURNING id;

-- name: job_shift_run_at
-- Test clock (pgtasks.testing): bring queued jobs' run-at %(seconds)s seconds earlier, as if
-- the clock had moved on that far; every queued job, or only those of %(ids)s unless NULL.
UPDATE pgtasks.jobs
SET run_at = run_at - make_interval(secs => %(seconds)s::float8)
WHERE status = 'queued' AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
RETURNING id;

-- name: job_release
-- Hand claimed-but-unstarted jobs back to the queue at once, attempt not used (graceful shutdown).
UPDATE pgtasks.jobs
SET status = 'queued', attempt = attempt - 1, worker_id = NULL, started_at = NULL,
    heartbeat_at = NULL
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'running' AND worker_id = %(worker_id)s
RETURNING id, pg_notify('pgtasks_jobs', queue) IS NOT NULL AS notified;

-- name: job_release_unknown
-- After a claim whose reply was lost (its connection died in flight, in a failover or a
-- restart: it may have committed): hand back the jobs %(worker_id)s holds claimed and not
-- started that it does not know of (not in %(known)s), attempt not used. Under the
-- worker's live lease they would stay running until it stops. Rare: found through
-- jobs_running_worker_idx.
UPDATE pgtasks.jobs
SET status = 'queued', attempt = attempt - 1, worker_id = NULL, started_at = NULL,
    heartbeat_at = NULL
WHERE worker_id = %(worker_id)s AND status = 'running' AND started_at IS NULL
  AND id <> ALL(%(known)s::bigint[])
RETURNING id, pg_notify('pgtasks_jobs', queue) IS NOT NULL AS notified;

-- name: job_report_progress
-- Merge progress counters into a running job the worker holds; doubles as the job heartbeat.
-- Found by its primary key whatever the statistics say (see job_finish).
UPDATE pgtasks.jobs
SET progress = coalesce(progress, '{}'::jsonb) || %(progress)s::jsonb,
    heartbeat_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s AND status = (SELECT 'running'::text) AND worker_id = %(worker_id)s
RETURNING cancel_requested;

-- name: job_cancel
-- Cancel a job: a queued or blocked one ends at once (a blocked one's dependents are
-- cancelled in turn by the trigger of migration 0007), a running one is flagged (and its
-- worker told). %(tenant)s as job_get: another tenant's job is not touched.
WITH target AS (
    SELECT id, status AS old_status FROM pgtasks.jobs
    WHERE id = %(id)s AND status IN ('blocked', 'queued', 'running')
      AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
    FOR UPDATE
), upd AS (
    UPDATE pgtasks.jobs j
    SET status = CASE WHEN t.old_status <> 'running' THEN 'cancelled' ELSE j.status END,
        finished_at = CASE WHEN t.old_status <> 'running'
                           THEN coalesce(%(now)s::timestamptz, now()) ELSE j.finished_at END,
        error = CASE WHEN t.old_status <> 'running'
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
-- Put a finished (failed, cancelled, partial_failure) job back in the queue by hand, as
-- asked by %(by)s (an actor: "api", "cli:<os user>" or the caller's own text). It starts
-- a new round: the attempts made so far move into attempt_base and the round's counter
-- starts at 0, so max_attempts is a fresh budget while the history keeps numbering
-- (attempt_base + attempt). The requeue is appended to the history: when, by whom, from
-- which status, after which attempt. The error stays (the last attempt's) until an
-- attempt of the new round ends. Fails with a unique violation (23505) when an unfinished
-- job now holds the job's unique key: the store maps it to AlreadyQueued. %(tenant)s as
-- job_get: another tenant's job is not touched.
UPDATE pgtasks.jobs
SET status = 'queued', finished_at = NULL, worker_id = NULL, started_at = NULL,
    heartbeat_at = NULL, run_at = coalesce(%(now)s::timestamptz, now()),
    cancel_requested = false, attempt_base = attempt_base + attempt, attempt = 0, result = NULL,
    attempts = attempts || jsonb_build_array(jsonb_build_object(
        'event', 'requeue', 'by', %(by)s::text, 'at', coalesce(%(now)s::timestamptz, now()),
        'from_status', status, 'after_attempt', attempt_base + attempt))
WHERE id = %(id)s AND status IN ('failed', 'cancelled', 'partial_failure')
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
RETURNING id, pg_notify('pgtasks_jobs', queue) IS NOT NULL AS notified;

-- name: job_history_restore
-- Before a requeue, in its transaction: move job %(id)s back from the history to the hot
-- table if it is a failed, cancelled or partially failed job there (of %(tenant)s when not
-- NULL; see pgtasks.job_history_restore in migration 0009); id NULL when it is not.
SELECT pgtasks.job_history_restore(%(id)s, %(tenant)s::text) AS id;

-- name: job_cancel_requested
-- Running jobs of a worker that someone asked to cancel (and whether to terminate them).
SELECT id, coalesce((headers ->> 'cancel_terminate')::boolean, false) AS terminate FROM pgtasks.jobs
WHERE worker_id = %(worker_id)s AND status = 'running' AND cancel_requested;

-- fragment: job_purgeable
-- The jobs purge deletes: finished (of %(status)s, or any terminal status) more than
-- %(older_than)s seconds before %(now)s (default: the database clock). Shared by the
-- delete and its dry-run count, so both always mean the same jobs.
status IN ('succeeded', 'failed', 'cancelled', 'partial_failure')
AND finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s::float8)
AND (%(status)s::text IS NULL OR status = %(status)s)

-- name: job_purge_finished
-- Delete finished jobs older than a cutoff (bounded batch: up to %(limit)s of the hot table
-- and as many of the history, migration 0009); returns how many went. The batch is
-- claimed in a CTE (a sub-select in IN may run once per row and take more).
WITH doomed AS (
    SELECT id FROM pgtasks.jobs
    WHERE
        -- include: job_purgeable
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM pgtasks.jobs j USING doomed d WHERE j.id = d.id
    RETURNING 1
), doomed_history AS (
    SELECT id FROM pgtasks.job_history
    WHERE
        -- include: job_purgeable
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), gone_history AS (
    DELETE FROM pgtasks.job_history j USING doomed_history d WHERE j.id = d.id
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM gone_history) AS deleted;

-- name: job_purge_count
-- How many jobs job_purge_finished would delete now (purge --dry-run), in the hot table
-- and the history; changes nothing.
SELECT (SELECT count(*) FROM pgtasks.jobs
        WHERE
            -- include: job_purgeable
       )
       + (SELECT count(*) FROM pgtasks.job_history
          WHERE
              -- include: job_purgeable
         ) AS jobs;

-- ======================================================================
-- Retention: the policy's deletes of finished jobs (pgtasks.maintenance.Retention)
-- ======================================================================

-- fragment: retention_expired
-- A finished job (alias j) that the retention policy no longer keeps: it ended more than
-- the keep time of its most specific rule before %(now)s (default: the database clock).
-- The rules come as four parallel arrays (scope 'task', 'queue' or 'default'; name;
-- status; seconds, 'Infinity' for forever); a task's rule wins over its queue's, which
-- wins over the default. %(min_keep)s, the shortest keep time of all rules, bounds the
-- scan of jobs_finished_idx: a job younger than that is never looked at. %(tenant)s
-- (NULL: every tenant) limits it to one tenant's jobs. Shared by the delete and the
-- dry-run count, so both always mean the same jobs.
j.status IN ('succeeded', 'failed', 'cancelled', 'partial_failure')
AND j.finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(min_keep)s::float8)
AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)
AND extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - j.finished_at)::float8 > (
    SELECT r.keep
    FROM unnest(%(scopes)s::text[], %(names)s::text[], %(statuses)s::text[], %(keeps)s::float8[])
         AS r(scope, name, status, keep)
    WHERE r.status = j.status
      AND (r.scope = 'default'
           OR (r.scope = 'queue' AND r.name = j.queue)
           OR (r.scope = 'task' AND r.name = j.task_name))
    ORDER BY r.scope = 'task' DESC, r.scope = 'queue' DESC
    LIMIT 1)

-- name: retention_batch_settings
-- For the rest of this transaction (a retention_delete_batch): the batch is read in
-- finished_at order from jobs_finished_idx, never found by a bitmap scan and sorted, which
-- the planner picks when the statistics of the jobs table are stale and say few jobs are
-- old (a bitmap scan then reads every old job per batch: 180 ms for 1,000 of 100,000,
-- against 5 ms); and its commit does not wait for the WAL flush (a delete lost in a crash
-- is made again by the next pass).
SELECT set_config('enable_sort', 'off', true) AS enable_sort,
       set_config('enable_bitmapscan', 'off', true) AS enable_bitmapscan,
       set_config('synchronous_commit', 'off', true) AS synchronous_commit;

-- name: retention_delete_batch
-- Delete up to %(limit)s jobs the retention policy no longer keeps, oldest first, from
-- finish time %(after)s on (NULL: the oldest; a pass goes on from the last batch's
-- last_finished_at, so jobs kept longer are not read again by every batch). Only one
-- batch runs at a time across the fleet: without the transaction-level advisory lock
-- (single 64-bit key space; the migration lock has another key) it deletes nothing and
-- says leader = false. Terminal rows only, taken with SKIP LOCKED: a claim (queued rows)
-- never waits for it. The batch is picked in a CTE (see job_purge_finished). It runs in
-- the transaction retention_batch_settings set up.
WITH leader AS MATERIALIZED (
    SELECT pg_try_advisory_xact_lock(hashtext('pgtasks.retention')) AS held
), doomed AS (
    SELECT j.id, j.status, j.finished_at FROM pgtasks.jobs j
    WHERE (SELECT held FROM leader)
      AND j.finished_at >= coalesce(%(after)s::timestamptz, '-infinity')
      AND
        -- include: retention_expired
    ORDER BY j.finished_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
), gone AS (
    DELETE FROM pgtasks.jobs x USING doomed d WHERE x.id = d.id
    RETURNING d.status, d.finished_at
)
SELECT (SELECT held FROM leader) AS leader,
       count(*) AS deleted,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE status = 'partial_failure') AS partial_failure,
       max(finished_at) AS last_finished_at
FROM gone;

-- name: retention_delete_history_batch
-- retention_delete_batch over the history (migration 0009): the same lock, rules, order
-- and counts. A pass deletes from the hot table, then from the history.
WITH leader AS MATERIALIZED (
    SELECT pg_try_advisory_xact_lock(hashtext('pgtasks.retention')) AS held
), doomed AS (
    SELECT j.id, j.status, j.finished_at FROM pgtasks.job_history j
    WHERE (SELECT held FROM leader)
      AND j.finished_at >= coalesce(%(after)s::timestamptz, '-infinity')
      AND
        -- include: retention_expired
    ORDER BY j.finished_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
), gone AS (
    DELETE FROM pgtasks.job_history x USING doomed d WHERE x.id = d.id
    RETURNING d.status, d.finished_at
)
SELECT (SELECT held FROM leader) AS leader,
       count(*) AS deleted,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE status = 'partial_failure') AS partial_failure,
       max(finished_at) AS last_finished_at
FROM gone;

-- name: retention_count
-- What the retention policy would delete now, per queue, task and status (purge --policy
-- --dry-run), in the hot table and the history; changes nothing.
SELECT j.queue, j.task_name, j.status, count(*) AS jobs
FROM (SELECT queue, task_name, status, tenant, finished_at FROM pgtasks.jobs
      UNION ALL
      SELECT queue, task_name, status, tenant, finished_at FROM pgtasks.job_history) j
WHERE
    -- include: retention_expired
GROUP BY j.queue, j.task_name, j.status
ORDER BY j.queue, j.task_name, j.status;

-- ======================================================================
-- History: finished jobs moved out of the hot table (migration 0009,
-- pgtasks.maintenance.History)
-- ======================================================================

-- name: job_history_move_batch
-- Move up to %(limit)s jobs that finished more than %(after_seconds)s seconds before
-- %(now)s (default: the database clock), oldest first, from finish time %(since)s on
-- (NULL: the oldest), to the history, if no other batch runs in the fleet now (leader
-- false: another worker's does; nothing moved). One statement: each job is in one table
-- in every snapshot. Never moved: an unfinished job; a prerequisite with an edge not yet
-- resolved; a schedule run whose follow-up is not done. Rows taken with SKIP LOCKED (a
-- requeue or a dependent's enqueue holding one is not waited for; the next pass moves it).
-- Runs in the transaction retention_batch_settings set up (finish order from
-- jobs_finished_idx, no wait for the WAL flush: a move lost in a crash is made again).
WITH leader AS MATERIALIZED (
    SELECT pg_try_advisory_xact_lock(hashtext('pgtasks.history')) AS held
), doomed AS (
    SELECT j.id FROM pgtasks.jobs j
    WHERE (SELECT held FROM leader)
      AND j.status IN ('succeeded', 'failed', 'cancelled', 'partial_failure')
      AND j.finished_at >= coalesce(%(since)s::timestamptz, '-infinity')
      AND j.finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(after_seconds)s::float8)
      AND (j.schedule_name IS NULL OR j.followed_up_at IS NOT DISTINCT FROM j.finished_at)
      AND NOT (j.has_dependents AND EXISTS (
          SELECT 1 FROM pgtasks.job_dependencies d WHERE d.prerequisite_id = j.id AND d.outcome IS NULL))
    ORDER BY j.finished_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
), moved AS (
    DELETE FROM pgtasks.jobs x USING doomed d WHERE x.id = d.id
    RETURNING x.*
), kept AS (
    INSERT INTO pgtasks.job_history SELECT * FROM moved
    RETURNING finished_at
)
SELECT (SELECT held FROM leader) AS leader, count(*) AS moved, max(finished_at) AS last_finished_at
FROM kept;

-- name: job_history_sizes
-- Where finished jobs are (pgtasks check): finished jobs in the hot table (counted), and
-- the history's rows as the planner estimates them (a count of a long history would read
-- all of it), with both tables' sizes on disk in bytes, indexes included.
SELECT (SELECT count(*) FROM pgtasks.jobs
        WHERE status IN ('succeeded', 'failed', 'cancelled', 'partial_failure')) AS hot_finished,
       greatest((SELECT c.reltuples FROM pg_catalog.pg_class c
                 WHERE c.oid = 'pgtasks.job_history'::regclass), 0)::bigint AS history_estimate,
       pg_total_relation_size('pgtasks.jobs') AS hot_bytes,
       pg_total_relation_size('pgtasks.job_history') AS history_bytes;

-- ======================================================================
-- Workers: registration, heartbeat, reaping
-- ======================================================================

-- name: worker_register
-- Register a worker process (unique id per process start) with its first lease.
INSERT INTO pgtasks.workers (id, host, pid, queues, concurrency, pool, lease_timeout, lease_expires_at)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s::text[], %(concurrency)s, %(pool)s,
        make_interval(secs => %(lease_timeout)s::float8),
        coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease_timeout)s::float8))
RETURNING started_at, clock_timestamp() AS clock;

-- name: worker_heartbeat
-- Extend a worker's lease; returns nothing when the worker row is gone (it was reaped).
-- The database clock it returns keeps the worker's recorded instants on that clock.
UPDATE pgtasks.workers
SET last_seen_at = coalesce(%(now)s::timestamptz, now()),
    lease_expires_at = coalesce(%(now)s::timestamptz, now()) + lease_timeout,
    stopping = %(stopping)s
WHERE id = %(id)s
RETURNING lease_expires_at, clock_timestamp() AS clock;

-- name: worker_unregister
-- Remove a worker that stopped cleanly (its jobs were finished or released first).
DELETE FROM pgtasks.workers WHERE id = %(id)s;

-- name: worker_list
-- Every registered worker with the counts of jobs it runs (their body started) and holds
-- claimed but not started (prefetched).
SELECT w.*, (w.lease_expires_at < now()) AS expired, c.running, c.claimed
FROM pgtasks.workers w
CROSS JOIN LATERAL (
    SELECT count(j.started_at) AS running, count(*) - count(j.started_at) AS claimed
    FROM pgtasks.jobs j
    WHERE j.worker_id = w.id AND j.status = 'running') c
ORDER BY w.host, w.started_at;

-- name: job_reap_lost
-- Recover running jobs whose worker's lease expired (or whose worker is gone) and whose own
-- heartbeat is older than the lease. A job whose start was never recorded (started_at NULL:
-- claimed ahead and not started, or an ordinary task's start not yet written) goes back to
-- the queue with its attempt not used, whatever its idempotency, and no attempt recorded.
-- A started one is retried now, or failed for non-idempotent tasks and exhausted attempts.
-- Error code WORKER_LOST, failure class transient.
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
    SET status = CASE WHEN j.started_at IS NULL
                           OR (j.retry_on_worker_lost AND j.attempt < j.max_attempts)
                      THEN 'queued' ELSE 'failed' END,
        finished_at = CASE WHEN j.started_at IS NULL
                                OR (j.retry_on_worker_lost AND j.attempt < j.max_attempts)
                           THEN NULL ELSE coalesce(%(now)s::timestamptz, now()) END,
        run_at = coalesce(%(now)s::timestamptz, now()),
        attempt = CASE WHEN j.started_at IS NULL THEN j.attempt - 1 ELSE j.attempt END,
        worker_id = NULL, heartbeat_at = NULL,
        -- A failed job keeps when its last attempt started, as any finished job does.
        started_at = CASE WHEN j.started_at IS NULL
                               OR (j.retry_on_worker_lost AND j.attempt < j.max_attempts)
                          THEN NULL ELSE j.started_at END,
        error = CASE WHEN j.started_at IS NULL THEN j.error ELSE jsonb_build_object(
            'type', 'WorkerLost', 'code', 'WORKER_LOST', 'class', 'transient',
            'message', 'worker ' || coalesce(j.worker_id, '?') || ' stopped heartbeating',
            'worker_id', j.worker_id) END,
        attempts = CASE WHEN j.started_at IS NULL THEN j.attempts
                   ELSE j.attempts || jsonb_build_array(jsonb_build_object(
            'attempt', j.attempt_base + j.attempt,
            'trigger', CASE WHEN j.attempt > 1 THEN 'retry' WHEN j.attempts <> '[]' THEN 'manual'
                            ELSE j.trigger END,
            'worker_id', j.worker_id, 'started_at', j.started_at,
            'finished_at', coalesce(%(now)s::timestamptz, now()), 'outcome', 'lost',
            'error', jsonb_build_object('type', 'WorkerLost', 'code', 'WORKER_LOST',
                                        'class', 'transient',
                                        'message', 'worker stopped heartbeating'))) END
    -- By primary key, whatever the statistics say (see job_claim_batch's write): a join to
    -- lost, estimated from stale statistics, nested-looped the running jobs over it.
    FROM unnest(ARRAY(SELECT l.id FROM lost l)) AS lost(id)
    WHERE j.id = lost.id AND j.status = (SELECT 'running'::text)
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

-- name: session_setup
-- Session settings of pgtasks' own connections: JIT off (it costs more than the claim).
SET jit = off;

-- name: worker_session_setup
-- Session settings of a worker's connections: JIT off, and generic plans for its prepared
-- statements (claim, complete, heartbeat: key lookups whose best plan does not depend on
-- the values). Left on "auto", PostgreSQL kept re-planning the claim on every execution
-- (0.6 ms of planning against 0.3 ms of execution on an idle queue).
-- A generic plan is made once per connection, at a statement's first run, from the table's
-- size at that moment, and kept: a worker started on an empty queue planned its claim's
-- write as a sequential scan of pgtasks.jobs for each claimed id (the cheapest way to read
-- a table that looks empty), and later claimed 256 of 20,000 jobs in 700 ms instead of 4.
-- Every statement a worker runs finds its rows through an index, so sequential scans are
-- priced out (enable_seqscan, "20.7.1. Planner Method Configuration": a table with no
-- usable index is still scanned).
SET jit = off;
SET plan_cache_mode = force_generic_plan;
SET enable_seqscan = off;

-- name: session_reset
-- Undo what code outside pgtasks did to the session of a pooled connection it was lent
-- (TenantScope.connection): SET and SET ROLE, LISTEN, session advisory locks, temporary
-- tables. session_setup runs again after it. RESET ALL puts every setting back to the
-- connection's defaults, pgtasks.tenant included.
RESET SESSION AUTHORIZATION;
RESET ALL;
UNLISTEN *;
SELECT pg_advisory_unlock_all();
DISCARD TEMP;

-- name: clock_now
-- The database clock (workers never use their own).
SELECT now() AS now;

-- name: tenant_scope
-- Says whose transaction this is: the tenant whose rows the row-level security
-- policies let it see and write (migration 0006). Local to the transaction: the
-- setting is gone when it ends, so a pooled connection carries nothing to its next user.
SELECT set_config('pgtasks.tenant', %(tenant)s, true);

-- name: tenant_scope_enter
-- tenant_scope for one statement in a transaction that goes on after it (the caller's):
-- keeps the transaction's own tenant aside first, for tenant_scope_leave to put back.
WITH kept AS MATERIALIZED (
    SELECT set_config('pgtasks.caller_tenant', coalesce(current_setting('pgtasks.tenant', true), ''), true)
)
SELECT set_config('pgtasks.tenant', %(tenant)s, true) FROM kept;

-- name: tenant_scope_leave
-- Gives the transaction back its own tenant, the one tenant_scope_enter kept aside.
SELECT set_config('pgtasks.tenant', coalesce(current_setting('pgtasks.caller_tenant', true), ''), true);

-- name: tenant_scope_swap
-- tenant_scope for a block of statements in a transaction that goes on after it: returns
-- the transaction's own tenant ('' for none), which tenant_scope puts back after the block.
WITH kept AS MATERIALIZED (SELECT coalesce(current_setting('pgtasks.tenant', true), '') AS previous)
SELECT kept.previous, set_config('pgtasks.tenant', %(tenant)s, true) AS tenant FROM kept;

-- name: tenant_scope_reset
-- At the end of a tenant's transaction on a pooled connection: undo a session-level
-- SET pgtasks.tenant that the caller's own SQL made in it (NULL resets to the default),
-- so that the connection's next user does not inherit it.
SELECT set_config('pgtasks.tenant', NULL, false) AS tenant;

-- ======================================================================
-- Row-level security mode (pgtasks.isolation; functions of migration 0006)
-- ======================================================================

-- name: rls_enable
-- Enable the mode on every tenant table; the fleet roles see every row (default: the
-- role running this).
SELECT t::text AS table_name
FROM pgtasks.rls_enable(coalesce(%(fleet_roles)s::text[], ARRAY[current_user::text])) AS t;

-- name: rls_disable
-- Drop the policies and switch row-level security off on every tenant table.
SELECT t::text AS table_name FROM pgtasks.rls_disable() AS t;

-- name: rls_grant_tenant_role
-- Grant a tenant-facing role what tenant handles need (the policies choose the rows).
SELECT t::text AS table_name FROM pgtasks.rls_grant_tenant_role(%(role)s) AS t;

-- name: rls_tenant_role_missing
-- What a tenant-facing role lacks of what rls_grant_tenant_role gives (USAGE on the
-- schemas and sequences, SELECT, INSERT and UPDATE on the tenant tables, SELECT only on
-- pgtasks.tenant_weights): a GRANT by a
-- role that may not grant changes nothing and only warns, so the grant checks after it.
SELECT n.nspname::text AS object
FROM pg_catalog.pg_namespace n
WHERE (n.nspname = 'pgtasks' OR n.nspname LIKE 'pgtasks\_%%')
  AND NOT has_schema_privilege(%(role)s, n.oid, 'USAGE')
UNION ALL
SELECT c.oid::regclass::text
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE (n.nspname = 'pgtasks' OR n.nspname LIKE 'pgtasks\_%%')
  AND CASE WHEN c.relkind = 'S' THEN NOT has_sequence_privilege(%(role)s, c.oid, 'USAGE') ELSE false END
UNION ALL
SELECT t::text
FROM pgtasks.tenant_tables() AS t
WHERE NOT (has_table_privilege(%(role)s, t, 'SELECT')
           -- Tenant weights (migration 0008): read only; the operator sets them.
           AND (t = to_regclass('pgtasks.tenant_weights')
                OR (has_table_privilege(%(role)s, t, 'INSERT')
                    AND has_table_privilege(%(role)s, t, 'UPDATE'))))
ORDER BY 1;

-- name: rls_sees_every_row
-- Whether the current role sees every tenant's jobs: row-level security does not apply
-- to it (mode off, superuser, BYPASSRLS), or it has the rights of a role of the fleet
-- policy (pg_has_role USAGE: what a policy's TO checks). pgtasks check asks, so that a
-- role the mode hides every job from does not report "no due jobs".
SELECT NOT row_security_active('pgtasks.jobs'::regclass)
    OR EXISTS (
        SELECT 1
        FROM pg_catalog.pg_policy p, unnest(p.polroles) AS r
        WHERE p.polrelid = 'pgtasks.jobs'::regclass AND p.polname = 'pgtasks_fleet'
          AND (r = 0 OR pg_has_role(current_user, r, 'USAGE'))
    ) AS sees_every_row,
    current_user::text AS role;

-- name: rls_status
-- Each tenant table: whether the mode is on, and the roles of its fleet policy.
SELECT t::text AS table_name,
       c.relrowsecurity AS enabled,
       c.relforcerowsecurity AS forced,
       coalesce(
           (SELECT array_agg(r ORDER BY r) FROM pg_catalog.pg_policies p, unnest(p.roles) AS r
            WHERE p.schemaname = n.nspname AND p.tablename = c.relname AND p.policyname = 'pgtasks_fleet'),
           '{}'
       )::text[] AS fleet_roles,
       EXISTS (SELECT 1 FROM pg_catalog.pg_policies p
               WHERE p.schemaname = n.nspname AND p.tablename = c.relname
                 AND p.policyname = 'pgtasks_tenant') AS tenant_policy
FROM pgtasks.tenant_tables() AS t
JOIN pg_catalog.pg_class c ON c.oid = t
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace;

-- ======================================================================
-- Plugin migrations (pgtasks.plugins.migrate_plugins)
-- ======================================================================

-- name: plugin_migration_applied
-- Versions of one plugin's migrations already applied, oldest first.
SELECT version, name, applied_at FROM pgtasks.plugin_migrations
WHERE plugin = %(plugin)s ORDER BY version;

-- name: plugin_migration_record
-- Record one applied plugin migration.
INSERT INTO pgtasks.plugin_migrations (plugin, version, name) VALUES (%(plugin)s, %(version)s, %(name)s);

-- ======================================================================
-- Schedules and their runs (pgtasks.scheduler)
-- A run of a schedule is a job row with trigger, schedule_name, scheduled_for,
-- parent_id and correlation_id set. Fire times are computed in Python by
-- pgtasks.cron; the database decides which process creates each run.
-- ======================================================================

-- name: schedule_get
-- One schedule by name, with the status and trigger of its last run.
SELECT s.*, r.status AS last_run_status, r.trigger AS last_run_trigger
FROM pgtasks.schedules s
LEFT JOIN pgtasks.jobs r ON r.id = s.last_run_id
WHERE s.name = %(name)s;

-- name: schedule_list
-- Every schedule, by name, with the status and trigger of its last run.
SELECT s.*, r.status AS last_run_status, r.trigger AS last_run_trigger
FROM pgtasks.schedules s
LEFT JOIN pgtasks.jobs r ON r.id = s.last_run_id
ORDER BY s.name;

-- name: schedule_get_for_update
-- One schedule by name, locked for the rest of the transaction (definition changes).
SELECT * FROM pgtasks.schedules WHERE name = %(name)s FOR UPDATE;

-- name: schedule_dependency_edges
-- Every schedule's prerequisites, to refuse dependency cycles.
SELECT name, after FROM pgtasks.schedules WHERE cardinality(after) > 0;

-- name: schedule_insert
-- Create a schedule; returns nothing when the name is taken.
INSERT INTO pgtasks.schedules (
    name, task_name, cron, timezone, args, kwargs, queue, tenant, priority, lock_key, overlap,
    misfire, catch_up_limit, max_retries, retry_policy, retry_on_worker_lost, after, paused,
    paused_by, paused_at, source, next_fire_at, created_at, updated_at)
VALUES (
    %(name)s, %(task_name)s, %(cron)s, %(timezone)s, %(args)s::jsonb, %(kwargs)s::jsonb, %(queue)s,
    %(tenant)s, %(priority)s, %(lock_key)s, %(overlap)s, %(misfire)s, %(catch_up_limit)s,
    %(max_retries)s, %(retry_policy)s::jsonb, %(retry_on_worker_lost)s, %(after)s::text[],
    %(paused)s, %(paused_by)s,
    CASE WHEN %(paused)s THEN coalesce(%(now)s::timestamptz, now()) END,
    %(source)s, %(next_fire_at)s::timestamptz,
    coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (name) DO NOTHING
RETURNING name;

-- name: schedule_update_definition
-- Replace a schedule's definition (API change or start-up sync of a code-defined one). Pause
-- state and history are kept; a stale writer (next fire time moved meanwhile) changes nothing.
UPDATE pgtasks.schedules
SET task_name = %(task_name)s, cron = %(cron)s, timezone = %(timezone)s, args = %(args)s::jsonb,
    kwargs = %(kwargs)s::jsonb, queue = %(queue)s, tenant = %(tenant)s, priority = %(priority)s,
    lock_key = %(lock_key)s, overlap = %(overlap)s, misfire = %(misfire)s,
    catch_up_limit = %(catch_up_limit)s, max_retries = %(max_retries)s,
    retry_policy = %(retry_policy)s::jsonb, retry_on_worker_lost = %(retry_on_worker_lost)s,
    after = %(after)s::text[], source = %(source)s, next_fire_at = %(next_fire_at)s::timestamptz,
    invalid_reason = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE name = %(name)s AND next_fire_at IS NOT DISTINCT FROM %(expected_next_fire_at)s::timestamptz
RETURNING name;

-- name: schedule_pause
-- Pause a schedule (no new runs of any trigger); returns nothing when it was already paused.
UPDATE pgtasks.schedules
SET paused = true, paused_by = %(paused_by)s, paused_at = coalesce(%(now)s::timestamptz, now()),
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE name = %(name)s AND NOT paused
RETURNING name;

-- name: schedule_resume
-- Resume a paused schedule from its next fire time after now (ticks missed while paused are
-- not misfires); returns nothing when it was not paused.
UPDATE pgtasks.schedules
SET paused = false, paused_by = NULL, paused_at = NULL,
    next_fire_at = %(next_fire_at)s::timestamptz, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE name = %(name)s AND paused
RETURNING name;

-- name: schedule_delete
-- Delete a schedule (its runs stay in the jobs table as history).
DELETE FROM pgtasks.schedules WHERE name = %(name)s RETURNING name;

-- name: schedule_claim_due
-- Lock one schedule that is due (or has no next fire time yet) for this transaction; other
-- scheduler processes skip it and take another.
SELECT * FROM pgtasks.schedules
WHERE NOT paused AND invalid_reason IS NULL AND cron IS NOT NULL
  AND (next_fire_at IS NULL OR next_fire_at <= coalesce(%(now)s::timestamptz, now()))
  AND NOT (name = ANY(%(exclude)s::text[]))
ORDER BY next_fire_at NULLS FIRST, name
LIMIT 1
FOR UPDATE SKIP LOCKED;

-- name: schedule_advance
-- Move a schedule's next fire time on, compare-and-set: only if it still holds the value this
-- process read, so a stale scheduler changes nothing.
UPDATE pgtasks.schedules
SET next_fire_at = %(next_fire_at)s::timestamptz,
    last_fire_at = coalesce(%(fired_at)s::timestamptz, last_fire_at),
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE name = %(name)s AND NOT paused
  AND next_fire_at IS NOT DISTINCT FROM %(expected_next_fire_at)s::timestamptz
RETURNING name;

-- name: schedule_mark_invalid
-- Stop serving a schedule whose stored definition pgtasks refuses, saying why; only the
-- definition that was judged (same cron and time zone) is marked.
UPDATE pgtasks.schedules
SET invalid_reason = %(reason)s, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE name = %(name)s AND invalid_reason IS NULL
  AND cron IS NOT DISTINCT FROM %(cron)s AND timezone = %(timezone)s
RETURNING name;

-- name: schedule_run_insert
-- Create a run (trigger schedule, manual or dependency) from the schedule's row; returns
-- nothing when the database refuses it: the schedule's unique key is held by an active run
-- (overlap=skip) or this fire time already has its run. Records it as the last run.
WITH ins AS (
    INSERT INTO pgtasks.jobs (
        task_name, queue, tenant, args, kwargs, headers, priority, attempt, max_attempts, run_at,
        lock_key, unique_key, trigger, schedule_name, scheduled_for, parent_id, correlation_id,
        retry_on_worker_lost)
    SELECT s.task_name, s.queue, s.tenant, s.args, s.kwargs, %(headers)s::jsonb, s.priority, 0, 1,
           coalesce(%(now)s::timestamptz, now()), s.lock_key,
           CASE WHEN s.overlap = 'skip' THEN 'schedule:' || s.name END,
           %(trigger)s, s.name, %(scheduled_for)s::timestamptz, %(parent_id)s::bigint,
           coalesce(%(correlation_id)s::text, gen_random_uuid()::text), s.retry_on_worker_lost
    FROM pgtasks.schedules s
    WHERE s.name = %(name)s
    ON CONFLICT DO NOTHING
    RETURNING id, queue, correlation_id, created_at
), recorded AS (
    UPDATE pgtasks.schedules s
    SET last_run_id = ins.id, last_run_at = ins.created_at
    FROM ins
    WHERE s.name = %(name)s
    RETURNING s.name
)
SELECT ins.id, ins.correlation_id, pg_notify('pgtasks_jobs', ins.queue) IS NOT NULL AS notified
FROM ins;

-- name: schedule_run_retry_insert
-- Create the retry run of a failed run: same task, arguments and keys, attempt n+1, trigger
-- retry, linked to the failed run, due after %(delay)s seconds. Returns nothing when the
-- schedule's unique key is held by another active run. Records it as the last run.
WITH ins AS (
    INSERT INTO pgtasks.jobs (
        task_name, queue, tenant, args, kwargs, headers, priority, attempt, max_attempts, run_at,
        lock_key, unique_key, trigger, schedule_name, scheduled_for, parent_id, correlation_id,
        retry_on_worker_lost)
    SELECT f.task_name, f.queue, f.tenant, f.args, f.kwargs, f.headers, f.priority,
           greatest(f.attempt, 1), greatest(f.attempt, 1) + 1,
           coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s::float8),
           f.lock_key, f.unique_key, 'retry', f.schedule_name, f.scheduled_for, f.id,
           f.correlation_id, f.retry_on_worker_lost
    FROM pgtasks.jobs f
    WHERE f.id = %(parent_id)s AND f.status = 'failed'
    ON CONFLICT DO NOTHING
    RETURNING id, queue, schedule_name, attempt + 1 AS attempt, run_at, created_at
), recorded AS (
    UPDATE pgtasks.schedules s
    SET last_run_id = ins.id, last_run_at = ins.created_at
    FROM ins
    WHERE s.name = ins.schedule_name
    RETURNING s.name
)
SELECT ins.id, ins.attempt, ins.run_at, pg_notify('pgtasks_jobs', ins.queue) IS NOT NULL AS notified
FROM ins;

-- name: schedule_fire_run
-- The run made for one fire time of a schedule, if any (in the hot table or the history).
SELECT id FROM pgtasks.jobs
WHERE schedule_name = %(name)s AND scheduled_for = %(scheduled_for)s::timestamptz
  AND trigger = 'schedule'
UNION ALL
SELECT id FROM pgtasks.job_history
WHERE schedule_name = %(name)s AND scheduled_for = %(scheduled_for)s::timestamptz
  AND trigger = 'schedule';

-- name: schedule_history
-- A schedule's runs, newest first, one page (offset pagination for the CLI's --page), from
-- the hot table and the history (migration 0009).
SELECT * FROM (
    (SELECT * FROM pgtasks.jobs
     WHERE schedule_name = %(name)s AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s)
     ORDER BY id DESC
     LIMIT %(limit)s::bigint + %(offset)s::bigint)
    UNION ALL
    (SELECT * FROM pgtasks.job_history
     WHERE schedule_name = %(name)s AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s)
     ORDER BY id DESC
     LIMIT %(limit)s::bigint + %(offset)s::bigint)
) r
ORDER BY id DESC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: schedule_runs_to_follow_up
-- Finished runs whose follow-up (last outcome, retry run, dependency triggers) is not done.
SELECT id FROM pgtasks.jobs
WHERE schedule_name IS NOT NULL
  AND status IN ('succeeded', 'failed', 'cancelled', 'partial_failure')
  AND followed_up_at IS DISTINCT FROM finished_at
ORDER BY finished_at, id
LIMIT %(limit)s;

-- name: schedule_run_lock_finished
-- Lock one finished run that still needs its follow-up; other schedulers skip it.
SELECT * FROM pgtasks.jobs
WHERE id = %(id)s AND schedule_name IS NOT NULL
  AND status IN ('succeeded', 'failed', 'cancelled', 'partial_failure')
  AND followed_up_at IS DISTINCT FROM finished_at
FOR UPDATE SKIP LOCKED;

-- name: schedule_run_mark_followed_up
-- Record that a finished run was followed up (for exactly the finish that was seen).
UPDATE pgtasks.jobs
SET followed_up_at = finished_at
WHERE id = %(id)s AND status = %(status)s AND finished_at = %(finished_at)s::timestamptz
RETURNING id;

-- name: schedule_record_outcome
-- Record a finished run as the schedule's last outcome unless a later-finished run already is.
UPDATE pgtasks.schedules
SET last_outcome = %(outcome)s, last_outcome_run_id = %(run_id)s,
    last_outcome_at = %(finished_at)s::timestamptz
WHERE name = %(name)s
  AND (last_outcome_at IS NULL OR last_outcome_at <= %(finished_at)s::timestamptz)
RETURNING name;

-- name: schedule_dependents
-- Active schedules that name this one as a prerequisite.
SELECT name FROM pgtasks.schedules
WHERE after @> ARRAY[%(name)s]::text[] AND NOT paused AND invalid_reason IS NULL
ORDER BY name;

-- ======================================================================
-- Overview: what the dashboard reads (read-only; a replica can serve them)
-- ======================================================================

-- name: overview_queue_depth
-- Jobs per queue and status, of one tenant (%(tenant)s) or of all (NULL). claimed: of the
-- running ones, those held but not started; oldest_wait_seconds: how long the oldest queued
-- job that is due has waited since its run-at (NULL when none is due).
SELECT queue, status, count(*) AS jobs,
       count(*) FILTER (WHERE status = 'running' AND started_at IS NULL) AS claimed,
       extract(epoch FROM coalesce(%(now)s::timestamptz, now())
               - min(run_at) FILTER (WHERE status = 'queued'
                                     AND run_at <= coalesce(%(now)s::timestamptz, now())))::float8
           AS oldest_wait_seconds
FROM pgtasks.jobs
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
GROUP BY queue, status
ORDER BY queue, status;

-- name: overview_throughput
-- Jobs that finished in the last %(window)s seconds, per queue, bucket of %(bucket)s seconds
-- (0: the oldest) and final status, of one tenant or of all (%(tenant)s NULL).
SELECT queue,
       least(floor(extract(epoch FROM finished_at - (coalesce(%(now)s::timestamptz, now())
                                                     - make_interval(secs => %(window)s::float8)))
                   / %(bucket)s::float8)::int,
             ceil(%(window)s::float8 / %(bucket)s::float8)::int - 1) AS bucket,
       status, count(*) AS jobs
FROM pgtasks.jobs
WHERE status IN ('succeeded', 'failed', 'cancelled', 'partial_failure')
  AND finished_at > coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(window)s::float8)
  AND finished_at <= coalesce(%(now)s::timestamptz, now())
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3;

-- name: overview_tenants
-- Backlog per tenant (queued, of which due now, and running jobs) and its share of the
-- backlog of all tenants shown; one tenant's (%(tenant)s) or every tenant's (NULL).
SELECT tenant,
       count(*) FILTER (WHERE status = 'queued') AS queued,
       count(*) FILTER (WHERE status = 'queued'
                        AND run_at <= coalesce(%(now)s::timestamptz, now())) AS due,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) AS backlog,
       (count(*)::float8 / sum(count(*)) OVER ())::float8 AS share
FROM pgtasks.jobs
WHERE status IN ('queued', 'running')
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
GROUP BY tenant
ORDER BY count(*) DESC, tenant;

-- name: overview_workers
-- Every registered worker, as worker_list, with the counts of running and claimed jobs
-- taken among one tenant's jobs only (%(tenant)s; NULL: all tenants').
SELECT w.*, (w.lease_expires_at < coalesce(%(now)s::timestamptz, now())) AS expired,
       c.running, c.claimed
FROM pgtasks.workers w
CROSS JOIN LATERAL (
    SELECT count(j.started_at) AS running, count(*) - count(j.started_at) AS claimed
    FROM pgtasks.jobs j
    WHERE j.worker_id = w.id AND j.status = 'running'
      AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s)) c
ORDER BY w.host, w.started_at;

-- ======================================================================
-- Flow control: tenant weights (migration 0008, docs/flow-control.md)
-- ======================================================================

-- name: tenant_weight_set
-- Set a tenant's weight for the fair claim in %(queue)s ('' for every queue without a row
-- of its own); claims read it at once.
INSERT INTO pgtasks.tenant_weights (queue, tenant, weight)
VALUES (%(queue)s, %(tenant)s, %(weight)s::float8)
ON CONFLICT (queue, tenant) DO UPDATE SET weight = EXCLUDED.weight
RETURNING queue, tenant, weight;

-- name: tenant_weight_delete
-- Drop a tenant's weight in %(queue)s (the tenant weighs 1 there again, or its '' row's weight).
DELETE FROM pgtasks.tenant_weights WHERE queue = %(queue)s AND tenant = %(tenant)s
RETURNING queue, tenant, weight;

-- name: tenant_weight_list
-- Every weight set, by queue then tenant; with %(tenant)s only that tenant's.
SELECT queue, tenant, weight FROM pgtasks.tenant_weights
WHERE %(tenant)s::text IS NULL OR tenant = %(tenant)s
ORDER BY queue, tenant;

-- name: flow_state_prune
-- Delete flow-control state no claim needs any more (pgtasks.maintenance.FlowPrune): at most
-- %(key_limit)s concurrency counters (with the release rows they are owed) and %(limit)s rate
-- windows; returns how many of each. Never waits: rows FOR UPDATE SKIP LOCKED, key locks tried.
-- Counters of idle keys: no slot held (running no more than the key's release rows, as
-- pgtasks.concurrency_running counts), no running job of the key, the key's advisory lock
-- of migration 0008 (class 1885828195, its hashtext) got (tried, as claims and
-- jobs_concurrency_release try it; held to our commit), and the row still the version this
-- snapshot read. The counter and its release rows go together (a release row left behind
-- would lower the key's next counter). Why no claim or ending job races the delete:
-- - Claims and ending jobs write a counter, and claims fold release rows, only while
--   holding the key's lock, to their commit: one holding it now fails our try (the key is
--   kept); one coming after our try fails its own, so its claim takes no slot of the key
--   this time (its jobs wait for the next claim) and no job of the key is running to end.
-- - One that held the lock and committed between our snapshot and our try wrote a newer
--   version of the row (it may have folded the release rows we counted and taken a slot).
--   The row lock reads the newest version (READ COMMITTED's EvalPlanQual), but the checks
--   above read this snapshot; so the versions are compared (xmin, the transaction that
--   wrote it) and a row written since is kept. One unchanged since was written by no holder
--   of the lock, so the release rows this snapshot sees are all of the key's.
-- - A claim whose snapshot still sees the counter inserts none (claim_admitted inserts only
--   keys it does not see, so it never waits on this delete) and takes no slot of it (the
--   lock, or after our commit no row to update); one that does not see it inserts it
--   afresh, with running = the slots it takes: no job of the key runs, so that is the count.
-- The lock is tried only for rows that passed the other checks (cand, materialized and
-- limited first); each held lock takes a slot of the server's shared lock table until
-- the commit, hence the limit of its own.
-- Rate windows: next_at more than greatest(1 hour, period) before %(now)s (NULL: the
-- database clock). The key has recharged fully (a claim would give it its whole limit at
-- once); a claim then starts it afresh as a new key (one start, then one a step), which
-- never allows more starts than the kept row would. Claims lock windows FOR UPDATE SKIP
-- LOCKED and insert only keys they do not see, so they pass over a row being deleted.
-- Passes of several workers at once take disjoint rows (a row or key another pass holds is
-- skipped, one it deleted is gone): harmless.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS t),
cand AS MATERIALIZED (
    SELECT k.key, k.xmin AS seen FROM pgtasks.concurrency_keys k
    WHERE k.running <= (SELECT count(*) FROM pgtasks.concurrency_releases r WHERE r.key = k.key)
      AND NOT EXISTS (SELECT 1 FROM pgtasks.jobs j
                      WHERE j.concurrency_key = k.key AND j.status = 'running')
    LIMIT %(key_limit)s
),
idle_keys AS (
    SELECT k.key FROM pgtasks.concurrency_keys k
    JOIN (SELECT c.key, c.seen FROM cand c
          WHERE pg_try_advisory_xact_lock(1885828195, hashtext(c.key))) c ON c.key = k.key
    WHERE k.xmin = c.seen
    FOR UPDATE OF k SKIP LOCKED
),
keys_gone AS (
    DELETE FROM pgtasks.concurrency_keys k
    WHERE k.key = ANY(ARRAY(SELECT i.key FROM idle_keys i))
    RETURNING k.key
),
releases_gone AS (
    DELETE FROM pgtasks.concurrency_releases r
    WHERE r.key = ANY(ARRAY(SELECT g.key FROM keys_gone g))
    RETURNING r.key
),
old_windows AS (
    SELECT w.key FROM pgtasks.rate_windows w
    WHERE w.next_at < (SELECT c.t FROM clock c) - make_interval(secs => greatest(3600, w.period))
    LIMIT %(limit)s
    FOR UPDATE OF w SKIP LOCKED
),
windows_gone AS (
    DELETE FROM pgtasks.rate_windows w
    WHERE w.key = ANY(ARRAY(SELECT o.key FROM old_windows o))
      AND w.next_at < (SELECT c.t FROM clock c) - make_interval(secs => greatest(3600, w.period))
    RETURNING w.key
)
-- key_candidates: the idle counters found (as many as key_limit: there may be more).
SELECT (SELECT count(*) FROM cand)::int AS key_candidates,
       (SELECT count(*) FROM keys_gone)::int AS concurrency_keys,
       (SELECT count(*) FROM releases_gone)::int AS concurrency_releases,
       (SELECT count(*) FROM windows_gone)::int AS rate_windows;
