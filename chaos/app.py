"""The tasks the chaos run's worker processes execute, and the side ledger they write.

Worker processes load this module with ``pgtasks -A chaos.app:app worker`` (the DSN
comes from ``PGTASKS_DSN``); the harness builds the same tasks with `make_app` to
enqueue jobs, so both sides agree on the names.

Every execution of a task body writes one row of ``public.chaos_ledger`` when it
starts and stamps it when it ends (database clock), on a connection of its own and
outside the job's transaction: that record is at-least-once, and it is what proves,
independently of pgtasks' bookkeeping, which executions happened and when. The task
``chaos.effect`` also writes one row of ``public.chaos_effects`` inside
`TaskContext.transaction`, the effect that must exist exactly once per succeeded job.

Ledger writes survive the faults they witness: a write on a connection that was
terminated or whose server restarted is retried on a fresh connection for up to
`LEDGER_PATIENCE` seconds, and each row carries a token of its own (``ON CONFLICT DO
NOTHING``), so a retry after a lost commit acknowledgement does not write it twice.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

import pgtasks
from pgtasks.context import TaskContext
from pgtasks.errors import DatabaseError, Reject
from pgtasks.settings import Settings

APP_SPEC = "chaos.app:app"

#: Retries a job of the stream gets (max attempts = MAX_RETRIES + 1).
MAX_RETRIES = 6
#: Seconds before a retried attempt is due again.
RETRY_DELAY = 0.2
#: Seconds a ledger write keeps trying through a database outage.
LEDGER_PATIENCE = 90.0

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS public.chaos_ledger (
    token         text PRIMARY KEY,
    job_id        bigint NOT NULL,
    attempt       integer NOT NULL,
    task          text NOT NULL,
    worker_pid    integer NOT NULL,
    worker_id     text,
    started_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at   timestamptz,
    outcome       text
);
CREATE INDEX IF NOT EXISTS chaos_ledger_job_idx ON public.chaos_ledger (job_id);
CREATE TABLE IF NOT EXISTS public.chaos_effects (
    job_id      bigint NOT NULL,
    attempt     integer NOT NULL,
    worker_pid  integer NOT NULL,
    token       text NOT NULL,
    written_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

T = TypeVar("T")


class TransientFault(Exception):
    """The planned transient failure of an attempt (retried by the task's policy)."""


#: What a task's attempt may fail with and still be retried: the planned fault, and a
#: database error met by the task's own statements during an outage.
RETRIED = (TransientFault, DatabaseError, psycopg.OperationalError, psycopg.InterfaceError)

_local = threading.local()


def _ledger_write(dsn: str, write: Callable[[psycopg.Connection[Any]], T]) -> T:
    """Run ``write`` on this thread's ledger connection, reconnecting through outages."""
    deadline = time.monotonic() + LEDGER_PATIENCE
    while True:
        conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
        try:
            if conn is None or conn.closed:
                # No server-side prepared statements: through a transaction pooler the
                # next statement may run on another server connection.
                conn = psycopg.connect(dsn, autocommit=True, connect_timeout=5, prepare_threshold=None)
                _local.conn = conn
            return write(conn)
        except (psycopg.OperationalError, psycopg.InterfaceError):
            if conn is not None:
                conn.close()
            _local.conn = None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def ledger_start(ctx: TaskContext) -> str:
    """Record that this execution of the job's body starts; returns its ledger token."""
    token = uuid.uuid4().hex
    params = (
        token,
        ctx.request.id,
        ctx.request.attempt,
        ctx.request.task_name,
        os.getpid(),
        ctx.request.worker_id,
    )
    _ledger_write(
        ctx.app.stores.database.dsn,
        lambda c: c.execute(
            "INSERT INTO public.chaos_ledger (token, job_id, attempt, task, worker_pid, worker_id)"
            " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (token) DO NOTHING",
            params,
        ),
    )
    return token


def ledger_finish(ctx: TaskContext, token: str, outcome: str) -> None:
    """Record that the execution of ledger row ``token`` ended with ``outcome``."""
    _ledger_write(
        ctx.app.stores.database.dsn,
        lambda c: c.execute(
            "UPDATE public.chaos_ledger SET finished_at = clock_timestamp(), outcome = %s"
            " WHERE token = %s AND finished_at IS NULL",
            (outcome, token),
        ),
    )


def _body(ctx: TaskContext, token: str, duration: float, fail_attempts: int, permanent: bool) -> None:
    """The shared body: work for ``duration`` seconds, then fail as planned or return."""
    time.sleep(duration)
    if permanent:
        ledger_finish(ctx, token, "permanent")
        raise Reject("planned permanent failure", code="CHAOS_PERMANENT")
    if ctx.request.attempt <= fail_attempts:
        ledger_finish(ctx, token, "transient")
        raise TransientFault(f"planned transient failure of attempt {ctx.request.attempt}")


def _result(ctx: TaskContext, token: str) -> dict[str, Any]:
    return {"token": token, "attempt": ctx.request.attempt, "worker_id": ctx.request.worker_id}


def _run(ctx: TaskContext, body: Callable[[str], None]) -> dict[str, Any]:
    """Ledger around ``body(token)``: the end is stamped however the body leaves."""
    token = ledger_start(ctx)
    try:
        body(token)
    except BaseException as exc:
        ledger_finish(ctx, token, f"raised {type(exc).__name__}")
        raise
    ledger_finish(ctx, token, "ok")
    return _result(ctx, token)


def make_app(dsn: str | None = None, **settings: Any) -> pgtasks.App:
    """The chaos app with its four tasks (``dsn`` None: from ``PGTASKS_DSN``; ``settings``:
    other `pgtasks.Settings` fields, e.g. ``prepare_threshold=None, listen=False``
    through a transaction pooler; the rest from the environment).

    Tasks (keyword arguments: ``seq`` the stream's job number, ``duration`` seconds of
    work, ``fail_attempts`` attempts that fail transiently, ``permanent`` whether the
    job fails permanently):

    - ``chaos.work``: at-least-once work, ledger only.
    - ``chaos.once``: the same, non-idempotent (``retry_on_worker_lost=False``).
    - ``chaos.effect``: writes its effect row in ``self.transaction()``.
    - ``chaos.tick``: the cron schedule's task (ledger only).
    """
    app = pgtasks.App("chaos", settings=Settings.from_env(dsn, **settings), load_entry_points=False)
    policy: dict[str, Any] = {
        "bind": True,
        "max_retries": MAX_RETRIES,
        "autoretry_for": RETRIED,
        "default_retry_delay": RETRY_DELAY,
    }

    def work(
        self: TaskContext, seq: int, duration: float, fail_attempts: int = 0, permanent: bool = False
    ) -> dict[str, Any]:
        return _run(self, lambda token: _body(self, token, duration, fail_attempts, permanent))

    app.task(name="chaos.work", **policy)(work)
    app.task(name="chaos.once", retry_on_worker_lost=False, **policy)(work)

    @app.task(name="chaos.effect", **policy)
    def effect(
        self: TaskContext, seq: int, duration: float, fail_attempts: int = 0, permanent: bool = False
    ) -> dict[str, Any]:
        def body(token: str) -> None:
            with self.transaction() as conn:
                conn.execute(
                    "INSERT INTO public.chaos_effects (job_id, attempt, worker_pid, token)"
                    " VALUES (%s, %s, %s, %s)",
                    (self.request.id, self.request.attempt, os.getpid(), token),
                )
            _body(self, token, duration, fail_attempts, permanent)

        return _run(self, body)

    @app.task(name="chaos.tick", bind=True, max_retries=2, default_retry_delay=RETRY_DELAY)
    def tick(self: TaskContext) -> dict[str, Any]:
        return _run(self, lambda token: None)

    return app


app = make_app()
