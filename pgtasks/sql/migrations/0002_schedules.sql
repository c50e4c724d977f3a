-- Schedules, and what the scheduler needs on the jobs table to run them.
-- A run of a schedule IS a job row (trigger, schedule_name, scheduled_for, parent_id,
-- correlation_id, attempt, progress, error, worker_id are jobs columns already).
-- Applied inside one transaction under the migration advisory lock.

CREATE TABLE pgtasks.schedules (
    name            text        PRIMARY KEY,
    task_name       text        NOT NULL CHECK (task_name <> ''),
    -- NULL: the schedule runs only when triggered (by hand or by a prerequisite).
    cron            text,
    timezone        text        NOT NULL DEFAULT 'UTC',
    args            jsonb       NOT NULL DEFAULT '[]',
    kwargs          jsonb       NOT NULL DEFAULT '{}',
    queue           text        NOT NULL DEFAULT 'default' CHECK (queue <> ''),
    tenant          text        NOT NULL DEFAULT '',
    priority        smallint    NOT NULL DEFAULT 0,
    -- Lock key copied to every run (at most one running job per key, fleet-wide).
    lock_key        text,
    overlap         text        NOT NULL DEFAULT 'skip',
    misfire         text        NOT NULL DEFAULT 'skip',
    catch_up_limit  integer     NOT NULL DEFAULT 10,
    -- Retry runs after a transient failure: how many (NULL: no limit) and the backoff
    -- settings of pgtasks.task.backoff_delay ({"backoff", "backoff_max", "delay", "jitter"}).
    max_retries     integer,
    retry_policy    jsonb       NOT NULL DEFAULT '{}',
    retry_on_worker_lost boolean NOT NULL DEFAULT true,
    -- Prerequisites: a succeeded run of any of these schedules triggers a run of this one.
    after           text[]      NOT NULL DEFAULT '{}',
    paused          boolean     NOT NULL DEFAULT false,
    paused_by       text,
    paused_at       timestamptz,
    source          text        NOT NULL DEFAULT 'api',
    next_fire_at    timestamptz,
    last_fire_at    timestamptz,
    last_run_id     bigint,
    last_run_at     timestamptz,
    last_outcome    text,
    last_outcome_run_id bigint,
    last_outcome_at timestamptz,
    -- Set by the scheduler when a row cannot be served (e.g. a cron expression written
    -- straight into the table that pgtasks refuses); cleared by a change through the API.
    invalid_reason  text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_name_nonempty CHECK (name <> ''),
    CONSTRAINT schedules_overlap_known CHECK (overlap IN ('skip', 'queue', 'allow')),
    CONSTRAINT schedules_misfire_known CHECK (misfire IN ('skip', 'catch_up')),
    CONSTRAINT schedules_catch_up_limit_range CHECK (catch_up_limit BETWEEN 1 AND 1000),
    CONSTRAINT schedules_max_retries_nonneg CHECK (max_retries IS NULL OR max_retries >= 0),
    CONSTRAINT schedules_source_known CHECK (source IN ('code', 'api')),
    CONSTRAINT schedules_retry_policy_object CHECK (jsonb_typeof(retry_policy) = 'object'),
    CONSTRAINT schedules_args_array CHECK (jsonb_typeof(args) = 'array'),
    CONSTRAINT schedules_kwargs_object CHECK (jsonb_typeof(kwargs) = 'object'),
    -- Only a cron expression gives fire times.
    CONSTRAINT schedules_fire_needs_cron CHECK (cron IS NOT NULL OR next_fire_at IS NULL),
    CONSTRAINT schedules_paused_by CHECK (paused OR (paused_by IS NULL AND paused_at IS NULL))
);

-- The scheduler's tick: schedules that are due.
CREATE INDEX schedules_due_idx ON pgtasks.schedules (next_fire_at)
    WHERE NOT paused AND invalid_reason IS NULL;

-- Dependency triggers: schedules that name a given prerequisite.
CREATE INDEX schedules_after_idx ON pgtasks.schedules USING gin (after);

-- Exactly one run per schedule and fire time, whatever the scheduler processes do:
-- the database refuses a second cron-made run for the same instant.
CREATE UNIQUE INDEX jobs_schedule_fire_idx ON pgtasks.jobs (schedule_name, scheduled_for)
    WHERE trigger = 'schedule';

-- Follow-up of finished runs (last outcome, retry runs, dependency triggers) is driven
-- from the database so that it survives crashes: a finished run whose followed_up_at
-- differs from its finished_at still needs it. Only schedule runs enter this index, and
-- nothing on the claim/complete path reads or writes the column.
ALTER TABLE pgtasks.jobs ADD COLUMN followed_up_at timestamptz;

CREATE INDEX jobs_schedule_followup_idx ON pgtasks.jobs (finished_at, id)
    WHERE schedule_name IS NOT NULL
      AND status IN ('succeeded', 'failed', 'cancelled', 'partial_failure')
      AND followed_up_at IS DISTINCT FROM finished_at;
