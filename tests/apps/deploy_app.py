"""The two releases of a rolling deploy: `new` has a task `old` does not know.

Worker processes load ``tests.apps.deploy_app:old`` or ``tests.apps.deploy_app:new``
(the DSN comes from ``PGTASKS_DSN``); the test enqueues with `make_new_app`. Both
have every task of `worker_app`; the new task writes the same side ledger.
"""

from __future__ import annotations

import pgtasks
from pgtasks.context import TaskContext

from .worker_app import ledger_finish, ledger_start, make_app

NEW_TASK = "w.new_in_this_release"
OLD_SPEC = "tests.apps.deploy_app:old"
NEW_SPEC = "tests.apps.deploy_app:new"


def make_new_app(dsn: str | None = None) -> pgtasks.App:
    """The new release: `worker_app`'s tasks and `NEW_TASK` (``dsn`` None: ``PGTASKS_DSN``)."""
    app = make_app(dsn)

    @app.task(name=NEW_TASK, bind=True, max_retries=0)
    def new_in_this_release(self: TaskContext, n: int) -> int:
        ledger_finish(self, ledger_start(self))
        return n

    return app


old = make_app()
new = make_new_app()
