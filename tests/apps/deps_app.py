"""Tasks the dependency and workflow tests run in real worker processes.

Worker processes load this module with ``pgtasks -A tests.apps.deps_app:app worker``
(the DSN from ``PGTASKS_DSN``); the test process builds the same tasks with `make_app`
to enqueue. Every task writes the side ledger of `apps.worker_app` (``note`` = the
step's name), with the database clock at its start and end, so the order in which
jobs ran is proven independently of pgtasks' bookkeeping.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pgtasks
from pgtasks.context import TaskContext
from pgtasks.errors import Reject

from .worker_app import WorkerProcess, ledger_finish, ledger_start

APP_SPEC = "tests.apps.deps_app:app"


def make_app(dsn: str | None = None) -> pgtasks.App:
    """The test app with the tasks below (``dsn`` None: from ``PGTASKS_DSN``)."""
    app = pgtasks.App("deps-tests", dsn=dsn, load_entry_points=False)

    @app.task(name="d.step", bind=True, max_retries=0)
    def step(self: TaskContext, name: str, delay: float = 0.0) -> str:
        entry = ledger_start(self, name)
        if delay:
            time.sleep(delay)
        ledger_finish(self, entry)
        return name

    @app.task(name="d.add", bind=True, max_retries=0)
    def add(self: TaskContext, x: int, y: int) -> int:
        entry = ledger_start(self, f"add {x} {y}")
        ledger_finish(self, entry)
        return x + y

    @app.task(name="d.square", bind=True, max_retries=0)
    def square(self: TaskContext, x: int, delay: float = 0.0) -> int:
        entry = ledger_start(self, f"square {x}")
        if delay:
            time.sleep(delay)
        ledger_finish(self, entry)
        return x * x

    @app.task(name="d.collect", bind=True, max_retries=0)
    def collect(self: TaskContext, results: list[Any], label: str = "collect") -> list[Any]:
        entry = ledger_start(self, label)
        ledger_finish(self, entry)
        return results

    @app.task(name="d.fail", bind=True, max_retries=0)
    def fail(self: TaskContext, name: str = "fail") -> None:
        ledger_start(self, name)
        raise Reject(f"{name} cannot go on", code="BAD_INPUT")

    @app.task(name="d.errback", bind=True, max_retries=0)
    def errback(self: TaskContext, failed_id: int, label: str = "errback") -> int:
        entry = ledger_start(self, f"{label} {failed_id}")
        ledger_finish(self, entry)
        return failed_id

    return app


@contextmanager
def dep_workers(dsn: str, log_dir: Path, *arg_lists: Sequence[str]) -> Iterator[list[WorkerProcess]]:
    """Start one worker process of this app per argument list; kill them all on exit."""
    started: list[WorkerProcess] = []
    try:
        for args in arg_lists:
            fd, path = tempfile.mkstemp(dir=log_dir, prefix="worker-", suffix=".log")
            os.close(fd)
            started.append(WorkerProcess(dsn, args, Path(path), app_spec=APP_SPEC))
        yield started
    finally:
        for w in started:
            w.kill()


app = make_app()
