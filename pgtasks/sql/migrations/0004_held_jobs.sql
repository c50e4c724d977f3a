-- A running job may be held without having started: a worker claims jobs ahead of its
-- free slots (prefetch), and started_at is written when the body starts (NULL until then:
-- the job is "claimed"). Running still requires a worker. The new check is weaker than
-- the old one, so every existing row satisfies it.
ALTER TABLE pgtasks.jobs
    DROP CONSTRAINT jobs_running_has_worker,
    ADD CONSTRAINT jobs_running_has_worker CHECK (status <> 'running' OR worker_id IS NOT NULL);
