"""`Explanation`: why a job is where it is, in reasons a person can act on."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["Explanation", "Reason", "ReasonCode"]


class ReasonCode(StrEnum):
    """What a `Reason` says, as a stable code (for scripts, ``--json``)."""

    #: The job has finished (succeeded, failed, cancelled, partial_failure).
    FINISHED = "finished"
    #: A worker holds it and its body runs.
    RUNNING = "running"
    #: A worker claimed it ahead (prefetch) and will start it when a slot is free.
    CLAIMED = "claimed"
    #: It waits for prerequisite jobs (``depends_on``, a chain, a chord) to finish.
    WAITING_FOR_PREREQUISITES = "waiting_for_prerequisites"
    #: Its run-at is in the future (countdown, eta, a retry's backoff).
    NOT_DUE = "not_due"
    #: Another job with the same lock key is running; they run one at a time.
    LOCK_HELD = "lock_held"
    #: Its concurrency key is at its limit: as many jobs of the key run already.
    CONCURRENCY_LIMIT = "concurrency_limit"
    #: Its rate key's window is full; it starts when the window ends.
    RATE_LIMITED = "rate_limited"
    #: Its tenant runs more than its weighted share while other tenants have due jobs.
    OVER_SHARE = "over_share"
    #: No live worker serves its queue.
    NO_WORKER = "no_worker"
    #: Due jobs of its queue come before it (priority, then age).
    BEHIND = "behind"
    #: Nothing holds it back: the next claim of a worker of its queue takes it.
    READY = "ready"


@dataclass(frozen=True, slots=True)
class Reason:
    """One thing that decides when the job runs.

    Attributes:
        code: what it is (`ReasonCode`).
        message: the same for people, with the values that matter.
        details: those values (ids, times, counts) for scripts.
    """

    code: ReasonCode
    message: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a job is where it is (``AsyncResult.explain()``, ``pgtasks jobs explain``).

    Attributes:
        job_id: the job. status: its status (`pgtasks.JobStatus` value).
        at: the database clock the reasons were judged at.
        reasons: what holds it back, most decisive first; a queued job with nothing
            holding it back has one reason, ``ready``.
    """

    job_id: int
    status: str
    at: Any
    reasons: tuple[Reason, ...]

    @property
    def codes(self) -> list[str]:
        """The reasons' codes, in order."""
        return [r.code.value for r in self.reasons]

    def __str__(self) -> str:
        return "; ".join(r.message for r in self.reasons)
