"""Tasks that handle secrets, for tests/test_secrets.py.

A worker process loads this module (``pgtasks -A tests.apps.secrets_app:app
worker``); the test process builds the same tasks with `make_app` to enqueue. The
tasks prove they received the real secret without storing it: they compare it with a
SHA-256 digest the test passes and write only the verdict (a note in the ledger of
``apps/worker_app.py``, or a boolean result).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import pgtasks
from pgtasks.context import TaskContext

from .worker_app import ledger_start

APP_SPEC = "tests.apps.secrets_app:app"

log = logging.getLogger("secrets_app")


def digest(text: str) -> str:
    """SHA-256 of ``text`` in hex: what the test passes instead of the secret."""
    return hashlib.sha256(text.encode()).hexdigest()


def make_app(dsn: str | None = None) -> pgtasks.App:
    """The app with the secret-handling tasks (``dsn`` None: from ``PGTASKS_DSN``)."""
    app = pgtasks.App("secrets-tests", dsn=dsn, load_entry_points=False)

    @app.task(name="s.leaky", bind=True, max_retries=0, redact=["card.number"])
    def leaky(
        self: TaskContext, user: str, password: str, api_token: str, *, card: dict[str, Any], expected: str
    ) -> None:
        received = digest(password + api_token + card["number"]) == expected
        ledger_start(self, "received" if received else "not received")
        # A task's own careless log line, formatted as pgtasks' handler sees it.
        log.warning("connecting as %s with password=%s", user, password)
        raise RuntimeError(
            f"cannot connect to postgresql://{user}:{password}@db.example/prod "
            f"(password {password} refused; api token {api_token}; card {card['number']})"
        )

    @app.task(name="s.by_ref", bind=True, max_retries=0)
    def by_ref(self: TaskContext, host: str, secret: str, expected: str) -> bool:
        if host == "refuse":
            raise ValueError(f"login with {secret} refused")
        return digest(secret) == expected

    @app.task(
        name="s.retry_once", bind=True, max_retries=1, autoretry_for=(ValueError,), default_retry_delay=0
    )
    def retry_once(self: TaskContext, db_password: str) -> int:
        if self.request.attempt == 1:
            raise ValueError(f"login refused for {db_password}")
        return self.request.attempt

    return app


app = make_app()
