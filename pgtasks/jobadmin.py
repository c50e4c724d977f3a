"""Looking up and acting on existing jobs: what `pgtasks.App` and `pgtasks.TenantScope` share.

Each function checks its arguments (`pgtasks.validation`) and runs on the job store
it is given: the app's, which sees every tenant, or a tenant handle's
(`pgtasks.db.JobStore.scoped`), whose statements carry the tenant, so another
tenant's job is one the store cannot find.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

from pgtasks.errors import ConfigurationError, JobNotFound
from pgtasks.records import Explanation, Reason, ReasonCode
from pgtasks.states import CLAIMED, ErrorCode, FailureClass, JobStatus
from pgtasks.validation import MAX_PAGE_SIZE, check_bool, check_choice, check_int, check_job_id, check_text

if TYPE_CHECKING:
    from pgtasks.db import JobSituation, JobStore, Prerequisite
    from pgtasks.records import Job

__all__ = ["AHEAD_LIMIT", "REQUEUE_BY_MAX_CHARS", "cancel_job", "explain", "get_job", "list_jobs", "requeue"]

#: `explain` counts the due jobs ahead of a job up to this many ("more than ...").
AHEAD_LIMIT: Final = 10_000

#: Longest actor text a requeue records as who asked (``by=``), in characters.
REQUEUE_BY_MAX_CHARS: Final = 200

# The error record of a job cancelled before it started.
_CANCELLED_ERROR: Final = {
    "type": "Cancelled",
    "code": ErrorCode.CANCELLED.value,
    "class": FailureClass.PERMANENT.value,
    "message": "cancelled before it started",
}


def _is_actor(by: object) -> bool:
    """Whether ``by`` can be recorded as who requeued a job: text of 1 to
    `REQUEUE_BY_MAX_CHARS` characters that jsonb can store (no NUL, valid UTF-8)."""
    if not isinstance(by, str) or not 1 <= len(by) <= REQUEUE_BY_MAX_CHARS or "\x00" in by:
        return False
    try:
        by.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def get_job(jobs: JobStore, job_id: int) -> Job:
    """The job with this id.

    Raises:
        ConfigurationError: ``job_id`` is not an int in the bigint range.
        JobNotFound: the store has no such job.
    """
    return jobs.get(id=check_job_id("job_id", job_id))


def cancel_job(
    jobs: JobStore, job_id: int, *, terminate: bool = False
) -> Literal["cancelled", "requested", "finished"]:
    """Cancel a job and say what happened: ``"cancelled"`` (it was queued or blocked;
    a blocked job's dependents are cancelled in turn),
    ``"requested"`` (it runs; its worker is asked to stop, killing it with
    ``terminate`` in the processes pool) or ``"finished"`` (nothing changed).

    Raises:
        ConfigurationError: a bad ``job_id`` or ``terminate``.
        JobNotFound: the store has no such job.
    """
    job_id = check_job_id("job_id", job_id)
    was = jobs.cancel(id=job_id, error=_CANCELLED_ERROR, terminate=check_bool("terminate", terminate))
    if was in (JobStatus.QUEUED, JobStatus.BLOCKED):
        return "cancelled"
    if was is not None:
        return "requested"
    jobs.get(id=job_id)  # raises JobNotFound
    return "finished"


def requeue(jobs: JobStore, job_id: int, *, by: str = "api") -> bool:
    """Put a failed, cancelled or partially failed job back in the queue, recording
    ``by`` as who asked; False if the job is queued, running or succeeded.

    Raises:
        ConfigurationError: a bad ``job_id``, or ``by`` is not a string of 1 to
            `REQUEUE_BY_MAX_CHARS` characters without NUL (nothing is written).
        AlreadyQueued: another unfinished job now holds the job's unique key.
        JobNotFound: the store has no such job.
    """
    job_id = check_job_id("job_id", job_id)
    if not _is_actor(by):
        raise ConfigurationError(
            f"by must be a string of 1 to {REQUEUE_BY_MAX_CHARS} characters without NUL, got {by!r:.80}"
        )
    if jobs.requeue(id=job_id, by=by):
        return True
    jobs.get(id=job_id)  # raises JobNotFound
    return False


def list_jobs(
    jobs: JobStore,
    *,
    status: str | None = None,
    phase: str | None = None,
    queue: str | None = None,
    task_name: str | None = None,
    tenant: str | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> list[Job]:
    """Jobs newest first, filtered (None: any); page with ``before_id``.

    ``phase`` filters by `pgtasks.Job.phase`, what ``pgtasks jobs list`` shows:
    ``claimed`` lists the ``running`` jobs whose body has not started, ``running`` those
    whose body started, any other status the jobs of that status.

    Raises:
        ConfigurationError: a filter or bound of the wrong type or out of range, or both
            ``status`` and ``phase``; the message names the parameter and the limit.
    """
    started: bool | None = None
    if status is not None:
        check_choice("status", status, [s.value for s in JobStatus])
    if phase is not None:
        if status is not None:
            raise ConfigurationError("give status or phase, not both")
        check_choice("phase", phase, [*(s.value for s in JobStatus), CLAIMED])
        status = JobStatus.RUNNING.value if phase == CLAIMED else phase
        if status == JobStatus.RUNNING:
            started = phase != CLAIMED
    if queue is not None:
        check_text("queue", queue)
    if task_name is not None:
        check_text("task_name", task_name)
    if tenant is not None:
        check_text("tenant", tenant, empty=True)
    if before_id is not None:
        check_job_id("before_id", before_id)
    check_int("limit", limit, 1, MAX_PAGE_SIZE)
    return jobs.list(
        status=status, started=started, queue=queue, task_name=task_name, tenant=tenant,
        before_id=before_id, limit=limit,
    )  # fmt: skip


def explain(jobs: JobStore, job_id: int) -> Explanation:
    """Why the job is where it is, from the database, at its clock: for a queued job
    what holds it back (not due yet, its lock key held by a running job, no live
    worker for its queue, due jobs ahead of it), for a blocked one the prerequisites
    it waits for, else where it is (claimed ahead, running, finished).

    Raises:
        ConfigurationError: ``job_id`` is not an int in the bigint range.
        JobNotFound: the store has no such job.
    """
    found = jobs.situation(id=check_job_id("job_id", job_id), ahead_limit=AHEAD_LIMIT)
    if found is None:
        raise JobNotFound(job_id)
    if found.status == JobStatus.BLOCKED:
        reasons = [_blocked_reason(jobs.prerequisites(id=found.id))]
    else:
        reasons = _reasons(found)
    return Explanation(found.id, found.status, found.now, tuple(reasons))


def _agreeing(count: int, one: str, many: str) -> str:
    """``one`` (singular noun and verb) for a count of 1, else ``many``."""
    return one if count == 1 else many


def _blocked_reason(prerequisites: list[Prerequisite]) -> Reason:
    """The one reason of a blocked job: the prerequisites it still waits for."""
    waiting = [p for p in prerequisites if p.outcome is None]
    ids = [p.id for p in waiting]
    finished = {str(p.id): p.outcome for p in prerequisites if p.outcome is not None}
    if waiting:
        shown = ", ".join(f"{p.id} ({p.status or 'gone'})" for p in waiting)
        what = _agreeing(len(waiting), "prerequisite", "prerequisites")
        when = _agreeing(len(waiting), "it has", "they have")
        message = f"waiting for {what} {shown}; it is queued when {when} finished"
    else:  # the last one finished between the two reads
        message = "every prerequisite has just finished; it is queued or about to be"
    return Reason(ReasonCode.WAITING_FOR_PREREQUISITES, message, {"waiting_for": ids, "finished": finished})


def _reasons(j: JobSituation) -> list[Reason]:
    """The reasons of `explain`, most decisive first."""
    if j.status != JobStatus.QUEUED:
        return [_state_reason(j)]
    reasons: list[Reason] = []
    if j.run_at > j.now:
        wait = (j.run_at - j.now).total_seconds()
        why = "a retry's backoff" if j.attempt > 0 else "its countdown or eta"
        reasons.append(
            Reason(
                ReasonCode.NOT_DUE,
                f"not due until {j.run_at.isoformat()} (in {wait:,.1f} s: {why})",
                {"run_at": j.run_at.isoformat(), "seconds": wait},
            )
        )
    if j.lock_held:
        holder = "another tenant's running job" if j.lock_holder is None else f"running job {j.lock_holder}"
        reasons.append(
            Reason(
                ReasonCode.LOCK_HELD,
                f"its lock key is held by {holder}; jobs of one key run one at a time",
                {"lock_holder": j.lock_holder},
            )
        )
    reasons.extend(_flow_reasons(j))
    if j.live_workers == 0:
        reasons.append(
            Reason(
                ReasonCode.NO_WORKER,
                f"no live worker serves queue {j.queue!r} (start one with -Q {j.queue})",
                {"queue": j.queue},
            )
        )
    if j.ahead:
        more = "more than " if j.ahead >= AHEAD_LIMIT else ""
        jobs, come = ("job", "comes") if j.ahead == 1 and not more else ("jobs", "come")
        reasons.append(
            Reason(
                ReasonCode.BEHIND,
                f"{more}{j.ahead:,} due {jobs} of queue {j.queue!r} {come} before it by priority and age"
                f" ({j.ahead_in_tenant:,} of its own tenant; claims serve tenants in turn)",
                {"ahead": j.ahead, "ahead_in_tenant": j.ahead_in_tenant, "at_least": bool(more)},
            )
        )
    if not reasons:
        ready = f"due, and nothing holds it back: the next claim on {j.queue!r} takes it"
        reasons.append(Reason(ReasonCode.READY, ready, {"queue": j.queue}))
    return reasons


def _flow_reasons(j: JobSituation) -> list[Reason]:
    """What flow control holds back of a queued job: its concurrency key at its limit,
    its rate window full, its tenant over its weighted share (docs/flow-control.md)."""
    reasons: list[Reason] = []
    if (
        j.concurrency_key is not None
        and j.concurrency_limit is not None
        and j.key_running >= j.concurrency_limit
    ):
        shown = ", ".join(str(i) for i in j.key_running_ids) or "another tenant's jobs"
        more = ", ..." if j.key_running > len(j.key_running_ids) and j.key_running_ids else ""
        reasons.append(
            Reason(
                ReasonCode.CONCURRENCY_LIMIT,
                f"its key {j.concurrency_key!r} at its limit ({j.key_running} running: {shown}{more});"
                f" at most {j.concurrency_limit}"
                f" {_agreeing(j.concurrency_limit, 'job of the key runs', 'jobs of the key run')} at once",
                {
                    "concurrency_key": j.concurrency_key,
                    "limit": j.concurrency_limit,
                    "running": j.key_running,
                    "running_ids": list(j.key_running_ids),
                },
            )
        )
    if j.rate_opens_at is not None:
        wait = max(0.0, (j.rate_opens_at - j.now).total_seconds())
        reasons.append(
            Reason(
                ReasonCode.RATE_LIMITED,
                f"rate-limited until {j.rate_opens_at.isoformat()} (in {wait:,.1f} s): rate key"
                f" {j.rate_key!r} spaces its starts, {j.rate_limit} per period, and has none free before",
                {"rate_key": j.rate_key, "until": j.rate_opens_at.isoformat(), "seconds": wait},
            )
        )
    share = j.queue_running * j.tenant_weight / j.weights if j.weights > 0 else 0.0
    if j.others_due and j.tenant_running > 0 and j.tenant_running > share:
        reasons.append(
            Reason(
                ReasonCode.OVER_SHARE,
                f"its tenant {j.tenant!r} over its share: {j.tenant_running} of the {j.queue_running}"
                f" running {_agreeing(j.queue_running, 'job', 'jobs')} of queue {j.queue!r}"
                f" (weight {j.tenant_weight:g}, a share of {share:.1f});"
                " claims serve other tenants with due jobs first",
                {
                    "tenant": j.tenant,
                    "running": j.tenant_running,
                    "queue_running": j.queue_running,
                    "weight": j.tenant_weight,
                    "share": share,
                },
            )
        )
    return reasons


def _state_reason(j: JobSituation) -> Reason:
    """The one reason of a job that is not queued."""
    if j.status == JobStatus.RUNNING and j.started_at is None:
        return Reason(
            ReasonCode.CLAIMED,
            f"claimed ahead by worker {j.worker_id}; it starts when one of the worker's slots is free",
            {"worker_id": j.worker_id},
        )
    if j.status == JobStatus.RUNNING:
        assert j.started_at is not None
        return Reason(
            ReasonCode.RUNNING,
            f"running on worker {j.worker_id} since {j.started_at.isoformat()} (attempt {j.attempt})",
            {"worker_id": j.worker_id, "started_at": j.started_at.isoformat(), "attempt": j.attempt},
        )
    # The code says "finished" already (``pgtasks jobs explain`` prints "finished: <message>").
    ended = j.finished_at.isoformat() if j.finished_at is not None else None
    message = f"{j.status} at {ended}" if ended is not None else f"{j.status}, at an unrecorded time"
    return Reason(ReasonCode.FINISHED, message, {"finished_at": ended})
