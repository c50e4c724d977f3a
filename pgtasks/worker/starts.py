"""The start recorder: writes, in batches, when the bodies of held jobs started.

A claimed job is held (`pgtasks.states`: status ``running``, ``started_at`` NULL) until
its body starts. The start of a task that must not run twice after a lost worker
(``retry_on_worker_lost=False``) is written before its body runs (`Worker._begin`);
every other start costs no write of its own: a job that ends within a tick has its
start written with its outcome, and one still running at a tick is written with every
other such job, in one statement. So views and the reaper know a running body within
a tick (``interval``), and a claim or a success batch has no write added.

A maintenance service of the shared shape (`pgtasks.maintenance.Service`).
"""

from __future__ import annotations

from collections.abc import Callable

from pgtasks.maintenance import Service

__all__ = ["START_RECORD_EVERY", "StartRecorder"]

START_RECORD_EVERY = 0.2  # seconds between the recorder's ticks


class StartRecorder(Service):
    """Calls ``record`` every ``interval`` seconds (it writes the starts not yet written,
    if any, and returns how many).

    Args:
        record: the worker's `Worker._write_starts`.
        interval: seconds between ticks.
    """

    name = "start-recorder"

    def __init__(self, record: Callable[[], int], interval: float = START_RECORD_EVERY) -> None:
        super().__init__(interval)
        self.record = record

    def run_once(self) -> int:
        """Write the starts of held jobs whose body runs and whose start is not yet written."""
        return self.record()
