"""Job statuses and the transitions between them, written down once.

Code, tests and docs use `TRANSITIONS`; the database enforces the set of statuses
with a CHECK constraint, and every state-changing statement in
``pgtasks/sql/queries.sql`` names the status it expects in its WHERE clause, so a
stale writer changes nothing (a reaper never overwrites a job that just finished).

::

    blocked ──last prerequisite done──▶ queued
      ├──a prerequisite failed / cancel──▶ cancelled
    queued ──claim──▶ running ──success──▶ succeeded
      ▲  │               │ ├──failure, no retries left / Reject──▶ failed
      │  │               │ ├──task reports partial outcome──▶ partial_failure
      │  │               │ └──cancel honoured──▶ cancelled
      │  ├──cancel──▶ cancelled
      │  └──no claim can take the row (UNCLAIMABLE)──▶ failed
      └──retry / worker lost / released on shutdown── running
    failed, cancelled, partial_failure ──requeue by hand──▶ queued

A ``blocked`` job waits for its prerequisites (``depends_on``, a chain, a chord; see
docs/workflows.md): no worker claims it. The transaction that finishes its last
prerequisite makes it ``queued`` (or ``cancelled`` with ``DEPENDENCY_FAILED`` when a
prerequisite ended without success), in the database (migration 0007).

A ``running`` job is in one of two phases (`CLAIMED`, not a status of its own: the
transitions and their guards are the same). A worker claims jobs ahead of its free
slots (prefetch); such a job is *claimed*: ``running``, held by the worker, but with
``started_at`` NULL, its body not started. Its body starts when a slot takes it; from
then, with ``started_at`` set, it is *running* in the views (`pgtasks.Job.phase`, the
CLI, the metrics), so no more jobs show running on a worker than its concurrency. The
start of a task with ``retry_on_worker_lost=False`` is written before its body runs;
any other's goes with its outcome, or within a fraction of a second in a batch
(`pgtasks.worker.starts`). A claimed job whose worker is lost goes back to the queue
with its attempt not used, whatever the task; only a started one is a lost attempt
(retried, or failed ``WORKER_LOST`` for a non-idempotent task).
"""

from __future__ import annotations

import enum
from types import MappingProxyType
from typing import Final

__all__ = [
    "CLAIMED",
    "TERMINAL",
    "TRANSITIONS",
    "UNFINISHED",
    "ErrorCode",
    "FailureClass",
    "JobStatus",
    "Trigger",
    "can_transition",
]

# The phase of a ``running`` job a worker holds but has not started (``started_at`` NULL).
CLAIMED: Final = "claimed"


class JobStatus(enum.StrEnum):
    """Where a job is in its life."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PARTIAL_FAILURE = "partial_failure"
    BLOCKED = "blocked"  # waits for its prerequisites (depends_on); never claimed


class Trigger(enum.StrEnum):
    """What created a job or one of its attempts."""

    API = "api"
    SCHEDULE = "schedule"
    MANUAL = "manual"
    RETRY = "retry"
    DEPENDENCY = "dependency"


class FailureClass(enum.StrEnum):
    """Whether a failed attempt may succeed if tried again (``class`` of an error record).

    ``transient`` failures are retried while attempts remain; ``permanent`` ones
    fail the job (see `pgtasks.worker.outcome` for which exception is which).
    """

    TRANSIENT = "transient"
    PERMANENT = "permanent"


class ErrorCode(enum.StrEnum):
    """The ``code`` pgtasks itself writes in an error record.

    A task's own exception is recorded with its ``code`` attribute, else its class
    name in upper case; `Reject` and `PartialFailure` carry a code of their own
    (by default ``REJECTED`` and ``PARTIAL_FAILURE``).
    """

    CANCELLED = "CANCELLED"  # cancelled before or while it ran
    UNKNOWN_TASK = "UNKNOWN_TASK"  # no worker that claimed it knows the task
    WORKER_LOST = "WORKER_LOST"  # its worker (or worker process) died; written by job_reap_lost too
    TIME_LIMIT = "TIME_LIMIT"  # the hard or soft time limit ended it
    RETRY = "RETRY"  # the task asked for a retry without an exception
    MAX_RETRIES_EXCEEDED = "MAX_RETRIES_EXCEEDED"  # it asked for a retry past the attempts allowed
    REJECTED = "REJECTED"  # the task raised Reject
    PARTIAL_FAILURE = "PARTIAL_FAILURE"  # the task reported a partial outcome
    RESULT_NOT_SERIALIZABLE = "RESULT_NOT_SERIALIZABLE"  # its return value cannot be stored
    OUTCOME_NOT_RECORDED = "OUTCOME_NOT_RECORDED"  # PostgreSQL refused the outcome itself
    UNCLAIMABLE = "UNCLAIMABLE"  # the claim's write refuses the row (e.g. a lock key too large to index)
    UNDECODABLE = "UNDECODABLE"  # its stored args, kwargs, headers or scheduled_for cannot be read
    SECRET_UNAVAILABLE = "SECRET_UNAVAILABLE"  # a secret reference it was given is not set on the worker
    DEPENDENCY_FAILED = "DEPENDENCY_FAILED"  # a prerequisite ended failed, partial_failure or cancelled
    DEPENDENCY_NOT_FAILED = "DEPENDENCY_NOT_FAILED"  # a link_error callback, its job not failed


TERMINAL: Final = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.PARTIAL_FAILURE}
)

#: Statuses of a job that has not finished (a unique key is held through them).
UNFINISHED: Final = frozenset({JobStatus.BLOCKED, JobStatus.QUEUED, JobStatus.RUNNING})

TRANSITIONS: Final = MappingProxyType(
    {
        # queued: its last prerequisite finished; cancelled: one failed, or by hand
        JobStatus.BLOCKED: frozenset({JobStatus.QUEUED, JobStatus.CANCELLED}),
        # failed: a row the claim's write refuses (ErrorCode.UNCLAIMABLE), never run
        JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.CANCELLED, JobStatus.FAILED}),
        JobStatus.RUNNING: frozenset(
            {
                JobStatus.SUCCEEDED,
                JobStatus.FAILED,
                JobStatus.PARTIAL_FAILURE,
                JobStatus.CANCELLED,
                JobStatus.QUEUED,  # retry, lost worker, released at shutdown
            }
        ),
        JobStatus.SUCCEEDED: frozenset[JobStatus](),
        JobStatus.FAILED: frozenset({JobStatus.QUEUED}),  # manual requeue
        JobStatus.CANCELLED: frozenset({JobStatus.QUEUED}),
        JobStatus.PARTIAL_FAILURE: frozenset({JobStatus.QUEUED}),
    }
)


def can_transition(old: JobStatus | str, new: JobStatus | str) -> bool:
    """Whether a job may go from ``old`` to ``new`` (see the module diagram)."""
    return JobStatus(new) in TRANSITIONS[JobStatus(old)]
