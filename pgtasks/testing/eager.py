"""`eager`: ``delay`` / ``apply_async`` run the job at once, in this process.

Celery's ``task_always_eager`` calls the function instead of sending a message,
so a test never sees what the broker would have refused. Here the enqueue is
unchanged: options are validated, arguments are encoded by the enqueue path's
own serialisation (`pgtasks.serialization`: an argument that cannot round-trip
exactly raises `SerializationError` at the call, as in production), and the job is
written to the database. Then, before ``delay`` returns, `run_until_idle` runs
what is due through the real worker code: the new job, and what it makes due (jobs
its task enqueues, retries without delay). So the `AsyncResult` that ``delay``
returns is already finished, and its status, result, error and history are the
rows production would have written.

Not run at once: a job enqueued in the caller's transaction (``connection=``: no
other connection sees it before the commit; call `run_until_idle` after it), and
a job not yet due (``countdown`` / ``eta``, a retry's backoff: move the test clock
on, `pgtasks.testing.TestClock`). A task's failure never raises out of ``delay``;
``AsyncResult.get()`` raises it (`pgtasks.errors.TaskFailed`), as it would after
a worker ran the job.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from pgtasks.hookspecs import hookimpl
from pgtasks.testing.runner import is_running, run_until_idle

if TYPE_CHECKING:
    from pgtasks.app import App

__all__ = ["eager"]

log = logging.getLogger("pgtasks.testing")


class _EagerPlugin:
    """Runs due jobs right after each enqueue that committed (``pgtasks_after_enqueue``)."""

    def __init__(self, app: App, timeout: float) -> None:
        self.app = app
        self.timeout = timeout

    @hookimpl
    def pgtasks_after_enqueue(self, job_ids: list[int], in_transaction: bool) -> None:
        # Inside a run (a task enqueueing, a scheduler tick) the run's next round takes it.
        if in_transaction or is_running(self.app):
            return
        run_until_idle(self.app, timeout=self.timeout)


@contextmanager
def eager(app: App, *, timeout: float = 30.0) -> Iterator[App]:
    """Within the block, jobs of ``app`` run as soon as they are enqueued (see the
    module docstring for what runs, and what does not).

    Args:
        app: the application.
        timeout: seconds each enqueue may spend running jobs (as `run_until_idle`).

    Yields:
        ``app``.
    """
    plugin = _EagerPlugin(app, timeout)
    app.plugin_manager.register(plugin, name=f"pgtasks.testing.eager.{id(plugin)}")
    try:
        yield app
    finally:
        app.plugin_manager.unregister(plugin)
