"""Job statuses and the transitions between them, written down once.

Code, tests and docs use `TRANSITIONS`; the database enforces the set of statuses
with a CHECK constraint, and every state-changing statement in
``pgtasks/sql/queries.sql`` names the status it expects in its WHERE clause, so a
stale writer changes nothing (a reaper never overwrites a job that just finished).

::

    queued ──claim──▶ running ──success──▶ succeeded
      ▲  │               │ ├──failure, no retries left / Reject──▶ failed
      │  │               │ ├──task reports partial outcome──▶ partial_failure
      │  │               │ └──cancel honoured──▶ cancelled
      │  └──cancel──▶ cancelled
      └──retry / worker lost / released on shutdown── running
    failed, cancelled, partial_failure ──requeue by hand──▶ queued
"""

from __future__ import annotations

import enum
from types import MappingProxyType
from typing import Final

__all__ = ["TERMINAL", "TRANSITIONS", "JobStatus", "Trigger", "can_transition"]


class JobStatus(enum.StrEnum):
    """Where a job is in its life."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PARTIAL_FAILURE = "partial_failure"


class Trigger(enum.StrEnum):
    """What created a job or one of its attempts."""

    API = "api"
    SCHEDULE = "schedule"
    MANUAL = "manual"
    RETRY = "retry"
    DEPENDENCY = "dependency"


TERMINAL: Final = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.PARTIAL_FAILURE}
)

TRANSITIONS: Final = MappingProxyType(
    {
        JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.CANCELLED}),
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
