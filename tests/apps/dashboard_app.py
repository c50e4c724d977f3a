"""Tasks the dashboard tests enqueue, and their worker processes load.

Worker processes load this module with ``pgtasks -A tests.apps.dashboard_app:app
worker`` (DSN from ``PGTASKS_DSN``); the test process builds the same tasks with
`make_app` on its own database, with fixed task names, so both sides agree.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pgtasks
from pgtasks.context import TaskContext

#: The schedule `make_app` defines: nightly at 02:00 in Berlin, its runs end as partial failures.
NIGHTLY = "nightly-backup"


def make_app(dsn: str | None = None) -> pgtasks.App:
    """An app with the dashboard tests' tasks (``dash.*``)."""
    app = pgtasks.App("dashboard-test", dsn=dsn, load_entry_points=False)

    @app.task(name="dash.echo", queue="default")
    def echo(value: Any, password: str | None = None) -> Any:
        return {"echo": value}

    @app.task(
        name="dash.fail", queue="mail", max_retries=1, default_retry_delay=0, autoretry_for=(ValueError,)
    )
    def fail(account: str, password: str) -> None:
        raise ValueError(f"login refused for {account} with {password}")

    @app.task(name="dash.sleep", queue="default")
    def sleep(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @app.task(name="dash.backup", queue="backup", bind=True)
    def backup(self: TaskContext, volume: str) -> None:
        self.report_progress(bytes_processed=4096, files_processed=3, files_failed=1)
        self.partial_failure(f"1 file of {volume} could not be read")

    app.schedules.add("0 2 * * *", backup, name=NIGHTLY, timezone="Europe/Berlin", args=("/srv",))
    return app


app = make_app(os.environ.get("PGTASKS_DSN"))
