"""Finding the rows a claim cannot take, so that one row never stops a queue.

A claim is one statement: if PostgreSQL refuses its write for one row (a job
written by SQL with a lock key too large for ``jobs_lock_running_idx``, an
attempt count already at its bound), every claim on that queue fails the same
way. After such a failure (a non-transient error other than the lock-key race,
SQLSTATE 23505) the worker tests the jobs the claim may have tried to take
(`pgtasks.db.JobStore.claim_suspects`, or the ids of a named claim) with dry runs
of the claim's write (`JobStore.claim_probe`, always rolled back), halving the set
that fails until single jobs remain. Those it fails ``UNCLAIMABLE`` through the
completer; the next claim goes on with the rest.

Cost: one dry run for the whole set, and about two per culprit and halving
(``2 * log2(n)`` for one culprit among ``n`` jobs); only paid after a failed claim.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from pgtasks.db.errors import first_line
from pgtasks.errors import DatabaseError

__all__ = ["LOCK_RACE", "distinct_keys", "find_unclaimable", "first_line"]

#: SQLSTATE of a lock-key race (unique_violation on ``jobs_lock_running_idx``): not a culprit.
LOCK_RACE = "23505"


def distinct_keys(suspects: Iterable[tuple[int, str | None]]) -> list[int]:
    """The ids of ``suspects`` ((id, lock key) pairs in claim order), keeping only the
    first job of each lock key, as a claim does: two jobs of one key in one dry run
    would collide with each other rather than show what is wrong with either."""
    seen: set[str] = set()
    ids = []
    for job_id, key in suspects:
        if key is not None:
            if key in seen:
                continue
            seen.add(key)
        ids.append(job_id)
    return ids


def find_unclaimable(
    probe: Callable[[Sequence[int]], None], ids: Sequence[int]
) -> list[tuple[int, DatabaseError]]:
    """The jobs among ``ids`` whose claim PostgreSQL refuses, by halving.

    Args:
        probe: a dry run of the claim's write on some ids (`JobStore.claim_probe`):
            returns when PostgreSQL accepts it, raises `DatabaseError` when not.
        ids: the suspects, at most one per lock key (`distinct_keys`).

    Returns:
        (job id, the error its dry run raised) per culprit, in the order of ``ids``.
        A single job refused with SQLSTATE 23505 is no culprit (its lock key was
        taken meanwhile) and is left out.

    Raises:
        DatabaseError: a transient error (a lost connection): the search stops, the
            claim loop tries again later.
    """
    found: list[tuple[int, DatabaseError]] = []
    pending: list[Sequence[int]] = [ids] if ids else []
    while pending:
        chunk = pending.pop()
        try:
            probe(chunk)
        except DatabaseError as exc:
            if exc.transient:
                raise
            if len(chunk) == 1:
                if exc.sqlstate != LOCK_RACE:
                    found.append((chunk[0], exc))
                continue
            half = len(chunk) // 2
            pending.append(chunk[half:])
            pending.append(chunk[:half])  # popped first: culprits come out in order
    return found
