"""Batched writing of successful results: one statement for many jobs.

A finished job's result waits at most ``delay`` seconds (or until ``batch``
results are pending) and is then written with the others in one UPDATE. A job is
reported succeeded only by that committed write; until then it stays ``running``
and is recovered by the reaper if the worker dies, so no guarantee is weakened.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pgtasks.db import Database, bigint_array_literal
from pgtasks.errors import DatabaseError

__all__ = ["Completer", "Completion", "succeed_batch_params"]

log = logging.getLogger("pgtasks.worker")


@dataclass(slots=True)
class Completion:
    """A successful attempt waiting to be written (one per job: not frozen, see `Success`)."""

    job_id: int
    task_name: str
    result_json: str
    result: Any
    runtime: float
    lock_key: str | None = None  # written, the job frees this key for its next job


def succeed_batch_params(
    worker_id: str, ids: list[int], results_json: list[str], now: Any = None
) -> dict[str, Any]:
    """Parameters of ``job_succeed_batch``: job ids and their stored results, in order.

    The ids go as one array literal and the results (each a JSON text from
    `pgtasks.serialization.dumps`) as one JSON array: psycopg adapts a Python list
    element by element in Python, a string in one step.
    """
    return {
        "ids": bigint_array_literal(ids),
        "results": "[" + ",".join(results_json) + "]",
        "worker_id": worker_id,
        "now": now,
    }


class Completer:
    """Collects successful results and writes them in batches from one thread.

    Args:
        store: the worker's store.
        worker_id: only jobs this worker still holds are completed.
        batch: most results per statement.
        delay: seconds a result may wait for company.
        on_written: called after commit with the completions written and the ids
            that were no longer held (reaped or cancelled meanwhile).
    """

    def __init__(
        self,
        store: Database,
        worker_id: str,
        *,
        batch: int,
        delay: float,
        on_written: Callable[[list[Completion], set[int]], None],
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.batch = batch
        self.delay = delay
        self.on_written = on_written
        # Pool threads append to a deque (atomic, no lock to contend for) and set an
        # event when the writer may be asleep; the writer drains up to a batch.
        self._pending: collections.deque[Completion] = collections.deque()
        self._ready = threading.Event()  # something may be pending
        self._full = threading.Event()  # a batch is full
        self._stop = False
        self._thread: threading.Thread | None = None
        self.written = 0

    def start(self) -> None:
        """Start the writer thread."""
        self._thread = threading.Thread(target=self._run, name="pgtasks-completer", daemon=True)
        self._thread.start()

    def add(self, completion: Completion) -> None:
        """Queue a result for the next batch."""
        self._pending.append(completion)
        if not self._ready.is_set():
            self._ready.set()
        if len(self._pending) >= self.batch and not self._full.is_set():
            self._full.set()

    def pending(self) -> int:
        """Results not yet written."""
        return len(self._pending)

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is pending, then stop."""
        self._stop = True
        self._ready.set()
        self._full.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _take(self) -> list[Completion] | None:
        """The next batch to write; None once stopped with nothing pending."""
        pending = self._pending
        while True:
            self._ready.wait()
            if not pending:
                if self._stop:
                    return None
                self._clear_ready_if_empty()
                continue
            if len(pending) < self.batch and not self._stop:
                self._full.wait(self.delay)  # let results from other threads join
            self._full.clear()
            taken = [pending.popleft() for _ in range(min(len(pending), self.batch))]
            self._clear_ready_if_empty()
            return taken

    def _clear_ready_if_empty(self) -> None:
        if not self._pending:
            self._ready.clear()
            if self._pending or self._stop:  # added or stopped meanwhile: its set() was lost
                self._ready.set()

    def _run(self) -> None:
        while (items := self._take()) is not None:
            self._write(items)

    def _write(self, items: list[Completion]) -> None:
        delay = 0.05
        while True:
            try:
                rows = self.store.fetch_tuples(
                    "job_succeed_batch",
                    succeed_batch_params(
                        self.worker_id, [c.job_id for c in items], [c.result_json for c in items]
                    ),
                )
                break
            except DatabaseError as exc:
                if not exc.transient:
                    log.error(
                        "cannot record %d results (%s); their jobs will be recovered by lease",
                        len(items),
                        exc,
                    )
                    return
                log.warning("recording results failed (%s); retrying in %.2fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        done = {r[0] for r in rows}  # job_succeed_batch returns the ids it completed
        lost = {c.job_id for c in items} - done
        self.written += len(done)
        if lost:
            log.warning("jobs %s were no longer held by this worker; results dropped", sorted(lost))
        self.on_written([c for c in items if c.job_id in done], lost)
