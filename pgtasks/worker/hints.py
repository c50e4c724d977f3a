"""Which jobs an enqueue notification names, and whether the worker may claim just those.

Enqueueing one job notifies ``pgtasks_jobs`` with the payload ``queue:id``; bulk
enqueues, retries, hand-backs and the reaper notify with the bare queue name. A
worker that holds no job and has only named jobs to look at claims them by primary
key (``job_claim_ids``) instead of running the full fair claim: on an idle worker the
full claim would find the same jobs, at several times the cost, and the latency of a
job enqueued into an idle fleet is mostly that claim.

Anything else (a bare queue name, more names than one claim takes, jobs still held,
the poll timer, a reconnect) leaves the decision to the full claim, which never
misses a due job: a name is only a shortcut.

The payload does not carry the task: a worker with ``--unknown-tasks defer`` is
woken for any job of its queues, and its claim by id, like its full claim, takes
only the tasks it knows (``job_claim_ids``' task list). A named job of another task
costs it one primary-key read, leaves the job untouched, and the worker then
sleeps as after any claim that found nothing.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

__all__ = ["WakeHints"]


class WakeHints:
    """Job ids named by notifications since the claim loop last looked.

    Args:
        queues: the worker's queues; notifications of other queues are ignored.
        max_ids: most ids one claim by id takes (ids beyond it mean a full claim).

    `note` runs on the listener thread and `take` on the claim loop; the deque's
    appends and pops are atomic, and the "full claim wanted" flag is guarded by a
    lock, so a bare notification is never lost between the two.
    """

    def __init__(self, queues: Iterable[str], max_ids: int) -> None:
        if max_ids < 1:
            raise ValueError(f"max_ids must be at least 1, got {max_ids}")
        self._queues = frozenset(queues)
        self._max_ids = max_ids
        self._ids: deque[int] = deque()
        self._full = True  # the first claim of a worker is a full one
        self._lock = threading.Lock()

    def note(self, payload: str) -> bool:
        """Record one ``pgtasks_jobs`` payload; True when it concerns these queues.

        ``queue`` asks for a full claim; ``queue:id`` (a queue name may itself hold
        ``:``; the id is the part after the last one, decimal digits) names a job. A
        payload equal to one of the queues is always a bare queue name.
        """
        if payload in self._queues:
            with self._lock:
                self._full = True
            return True
        queue, _, job_id = payload.rpartition(":")
        if queue in self._queues and job_id.isdigit():
            self._ids.append(int(job_id))
            return True
        return False

    def want_full(self) -> None:
        """Make the next `take` answer None (a full claim): poll timer, reconnect, start."""
        with self._lock:
            self._full = True

    def take(self, holding: bool, *, full: bool = False) -> list[int] | None:
        """The ids to claim by primary key, or None when a full claim is needed.

        Args:
            holding: whether the worker holds any job (claimed and not finished).
                A busy worker claims in batches, by the full claim.
            full: the caller wants a full claim anyway (its poll deadline passed).

        Empties what was noted either way.
        """
        # Only the claim loop takes, so the deque cannot empty between the check and
        # the pop; the listener may append meanwhile (taken next time).
        ids: list[int] = []
        while self._ids:
            ids.append(self._ids.popleft())
        with self._lock:
            wanted, self._full = self._full, False
        if full or wanted or holding or not ids or len(ids) > self._max_ids:
            return None
        return ids
