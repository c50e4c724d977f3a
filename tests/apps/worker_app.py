"""Tasks the worker tests run, and the harness that starts real worker processes.

Worker processes load this module with ``pgtasks -A tests.apps.worker_app:app worker``
(the DSN comes from ``PGTASKS_DSN``). The test process builds the same tasks on its
own database with `make_app` to enqueue jobs: task names are fixed, so both sides
agree.

Tasks write to a side ledger the test creates (`LEDGER_DDL`): one row per attempt
they start, with the database clock at start and end. Counting there proves what
ran independently of pgtasks' own bookkeeping.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

import pgtasks
from pgtasks.context import TaskContext
from pgtasks.errors import Reject, SoftTimeLimitExceeded
from pgtasks.task import MAX_DELAY

REPO = Path(__file__).resolve().parents[2]
APP_SPEC = "tests.apps.worker_app:app"

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS public.ledger (
    id          bigserial PRIMARY KEY,
    job_id      bigint NOT NULL,
    attempt     integer NOT NULL,
    worker_pid  integer NOT NULL,
    worker_id   text,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz,
    note        text
);
CREATE INDEX IF NOT EXISTS ledger_job_idx ON public.ledger (job_id);
CREATE TABLE IF NOT EXISTS public.flags (name text PRIMARY KEY);
CREATE TABLE IF NOT EXISTS public.tx_docs (
    job_id  bigint NOT NULL,
    attempt integer NOT NULL,
    note    text NOT NULL
);
"""

_local = threading.local()


def _conn(dsn: str) -> psycopg.Connection[Any]:
    """A connection of this thread to ``dsn`` (kept for the thread's next tasks)."""
    conns: dict[str, psycopg.Connection[Any]] = _local.__dict__.setdefault("conns", {})
    conn = conns.get(dsn)
    if conn is None or conn.closed:
        conn = psycopg.connect(dsn, autocommit=True)
        conns[dsn] = conn
    return conn


def ledger_start(ctx: TaskContext, note: str | None = None) -> int:
    """Record that this attempt started; returns the ledger row id."""
    row = (
        _conn(ctx.app.stores.database.dsn)
        .execute(
            "INSERT INTO public.ledger (job_id, attempt, worker_pid, worker_id, note)"
            " VALUES (%s, %s, %s, %s, %s) RETURNING id",
            (ctx.request.id, ctx.request.attempt, os.getpid(), ctx.request.worker_id, note),
        )
        .fetchone()
    )
    assert row is not None
    return int(row[0])


def ledger_finish(ctx: TaskContext, entry: int, note: str | None = None) -> None:
    """Record that the attempt of ledger row ``entry`` finished."""
    _conn(ctx.app.stores.database.dsn).execute(
        "UPDATE public.ledger SET finished_at = clock_timestamp(), note = coalesce(%s, note) WHERE id = %s",
        (note, entry),
    )


def flag_set(ctx: TaskContext, name: str) -> bool:
    """Whether the test raised flag ``name``."""
    row = (
        _conn(ctx.app.stores.database.dsn)
        .execute("SELECT 1 FROM public.flags WHERE name = %s", (name,))
        .fetchone()
    )
    return row is not None


def _ledger_has(ctx: TaskContext) -> bool:
    """Whether the job has a ledger entry already (an earlier run of its body)."""
    query = "SELECT 1 FROM public.ledger WHERE job_id = %s"
    return _conn(ctx.app.stores.database.dsn).execute(query, (ctx.request.id,)).fetchone() is not None


def make_app(dsn: str | None = None) -> pgtasks.App:
    """The test app with every task below (``dsn`` None: from ``PGTASKS_DSN``)."""
    app = pgtasks.App("worker-tests", dsn=dsn, load_entry_points=False)

    @app.task(name="w.record", bind=True, max_retries=0)
    def record(self: TaskContext, n: int = 0, delay: float = 0.0) -> int:
        entry = ledger_start(self)
        if delay:
            time.sleep(delay)
        ledger_finish(self, entry)
        return n

    def _block(self: TaskContext, flag: str) -> str:
        entry = ledger_start(self)
        while not flag_set(self, flag):
            time.sleep(0.05)
        ledger_finish(self, entry)
        return flag

    app.task(name="w.block", bind=True, max_retries=3)(_block)
    app.task(name="w.block_once", bind=True, max_retries=3, retry_on_worker_lost=False)(_block)

    @app.task(name="w.tx_write", bind=True, max_retries=2, autoretry_for=(ValueError,), default_retry_delay=0)
    def tx_write(self: TaskContext, note: str, fail_attempts: int = 0, hold_flag: str | None = None) -> str:
        """Write a row of ``public.tx_docs`` with transactional completion. Attempts up to
        ``fail_attempts`` raise after the block; with ``hold_flag`` the first run of the
        body (whatever its attempt number: a start the worker had not recorded when it
        died does not count as an attempt), after its block, notes itself in the
        ledger and waits for the flag."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO public.tx_docs (job_id, attempt, note) VALUES (%s, %s, %s)",
                (self.request.id, self.request.attempt, note),
            )
        if hold_flag is not None and not _ledger_has(self):
            ledger_start(self, "written, not committed")
            while not flag_set(self, hold_flag):
                time.sleep(0.05)
        if self.request.attempt <= fail_attempts:
            raise ValueError(f"attempt {self.request.attempt} fails after its block")
        return note.upper()

    @app.task(name="w.tx_write_late", bind=True, max_retries=2, default_retry_delay=0)
    def tx_write_late(self: TaskContext, note: str, hold_flag: str) -> str:
        """Note the attempt in the ledger, wait for the flag ``{hold_flag}-{attempt}``,
        then write a row of ``public.tx_docs`` with transactional completion."""
        ledger_start(self, "waiting")
        while not flag_set(self, f"{hold_flag}-{self.request.attempt}"):
            time.sleep(0.05)
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO public.tx_docs (job_id, attempt, note) VALUES (%s, %s, %s)",
                (self.request.id, self.request.attempt, note),
            )
        return note.upper()

    @app.task(name="w.fail", bind=True, autoretry_for=(ValueError,), default_retry_delay=0)
    def fail(self: TaskContext) -> None:
        ledger_start(self)
        raise ValueError(f"attempt {self.request.attempt} fails")

    @app.task(name="w.crash", bind=True, max_retries=5, default_retry_delay=0)
    def crash(self: TaskContext) -> None:
        ledger_start(self)
        raise RuntimeError("not covered by autoretry_for")

    @app.task(name="w.reject", bind=True, max_retries=5, autoretry_for=(Exception,), default_retry_delay=0)
    def reject(self: TaskContext) -> None:
        ledger_start(self)
        raise Reject("input cannot be processed", code="BAD_INPUT")

    @app.task(name="w.nul_error", bind=True, max_retries=0)
    def nul_error(self: TaskContext) -> None:
        ledger_start(self)
        raise ValueError("bad\x00byte and a lone \ud800 surrogate")

    @app.task(name="w.partial_unstorable", bind=True, max_retries=0)
    def partial_unstorable(self: TaskContext) -> None:
        ledger_start(self)
        self.partial_failure("half done", result={"raw": "\x00"})

    @app.task(name="w.retry_later", bind=True, max_retries=2)
    def retry_later(self: TaskContext, countdown: float) -> int:
        ledger_start(self)
        if self.request.attempt == 1:
            self.retry(exc=OSError("try later"), countdown=countdown)
        return self.request.attempt

    @app.task(
        name="w.backoff",
        bind=True,
        autoretry_for=(ValueError,),
        max_retries=4,
        retry_backoff=0.3,
        retry_backoff_max=1.2,
        retry_jitter=False,
    )
    def backoff(self: TaskContext) -> None:
        ledger_start(self)
        raise ValueError("again")

    @app.task(
        name="w.huge",
        bind=True,
        autoretry_for=(ValueError,),
        max_retries=None,
        retry_backoff=True,
        retry_backoff_max=MAX_DELAY,
        retry_jitter=False,
    )
    def huge(self: TaskContext) -> None:
        ledger_start(self)
        raise ValueError("forever")

    @app.task(name="w.retry_unbounded", bind=True, max_retries=0)
    def retry_unbounded(self: TaskContext) -> None:
        ledger_start(self)
        self.retry(countdown=MAX_DELAY, max_retries=10**12)

    @app.task(name="w.soft", bind=True, soft_time_limit=0.5, max_retries=0)
    def soft(self: TaskContext) -> str:
        entry = ledger_start(self)
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                time.sleep(0.02)
        except SoftTimeLimitExceeded:
            ledger_finish(self, entry, "soft")
            return "soft limit seen"
        ledger_finish(self, entry, "no soft limit")
        return "no soft limit"

    @app.task(name="w.hard", bind=True, time_limit=1.0, max_retries=0)
    def hard(self: TaskContext) -> None:
        ledger_start(self)
        time.sleep(60)

    @app.task(name="w.hard_loop", bind=True, time_limit=1.0, max_retries=0)
    def hard_loop(self: TaskContext) -> str:
        entry = ledger_start(self)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.02)
        ledger_finish(self, entry, "not stopped")
        return "not stopped"

    @app.task(name="w.until_cancelled", bind=True, max_retries=0)
    def until_cancelled(self: TaskContext) -> str:
        entry = ledger_start(self)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.is_cancelled():
                ledger_finish(self, entry, "saw cancel")
                return "stopped early"
            time.sleep(0.02)
        ledger_finish(self, entry, "ran out")
        return "ran to the end"

    @app.task(name="w.stuck", bind=True, max_retries=0)
    def stuck(self: TaskContext) -> None:
        ledger_start(self)
        time.sleep(60)

    def _die_first(self: TaskContext) -> int:
        ledger_start(self)
        if self.request.attempt == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # a child killed mid-job (OOM killer, segfault)
        return self.request.attempt

    app.task(name="w.die_first", bind=True, max_retries=1)(_die_first)
    app.task(name="w.die_first_once", bind=True, max_retries=1, retry_on_worker_lost=False)(_die_first)

    @app.task(name="w.aio", bind=True, max_retries=0)
    async def aio(self: TaskContext, n: int) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        return {"double": n * 2, "loop": type(loop).__name__}

    @app.task(name="w.pid", max_retries=0)
    def pid() -> int:
        return os.getpid()

    # Flow control (tests/test_flow_control.py): the ledger's note is the job's key.
    @app.task(name="w.keyed", bind=True, max_retries=0, concurrency_key="key", concurrency_limit=3)
    def keyed(self: TaskContext, key: str, delay: float = 0.0) -> str:
        entry = ledger_start(self, key)
        if delay:
            time.sleep(delay)
        ledger_finish(self, entry)
        return key

    @app.task(name="w.rated", bind=True, max_retries=0, rate_limit="5/s")
    def rated(self: TaskContext, n: int = 0) -> int:
        ledger_finish(self, ledger_start(self))
        return n

    return app


app = make_app()


# -- the test side: real worker processes -------------------------------------------------


def setup_ledger(dsn: str) -> None:
    """Create the ledger and flags tables in the test database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LEDGER_DDL)


def raise_flag(dsn: str, name: str) -> None:
    """Let tasks blocked on ``name`` go on."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO public.flags VALUES (%s) ON CONFLICT DO NOTHING", (name,))


class WorkerProcess:
    """A ``pgtasks -A tests.apps.worker_app:app worker ...`` subprocess.

    Args:
        dsn: the test database (passed as ``PGTASKS_DSN``).
        args: worker flags, e.g. ``["-c", "4", "--lease-timeout", "3"]``.
        log_path: file receiving the worker's stderr (its log).
        app_spec: the ``-A`` app (default: this module's `app`).
    """

    def __init__(self, dsn: str, args: Sequence[str], log_path: Path, app_spec: str = APP_SPEC) -> None:
        self.log_path = log_path
        env = {
            **os.environ,
            "PGTASKS_DSN": dsn,
            "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pgtasks", "-A", app_spec, "-l", "INFO", "worker", *args],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self.proc.pid

    def log(self) -> str:
        """Everything the worker logged so far."""
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        """Send a signal (SIGTERM, SIGKILL, ...)."""
        self.proc.send_signal(signum)

    def wait(self, timeout: float) -> int:
        """Wait for exit; returns the exit code."""
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """Kill the process and any children it left (processes pool), then reap it."""
        import psutil

        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        for child in children:
            try:
                child.kill()
                child.wait(10)
            except psutil.NoSuchProcess:
                pass
        self._log.close()


@contextmanager
def workers(dsn: str, log_dir: Path, *arg_lists: Sequence[str]) -> Iterator[list[WorkerProcess]]:
    """Start one worker process per argument list; kill them all on exit."""
    started: list[WorkerProcess] = []
    try:
        for args in arg_lists:
            fd, path = tempfile.mkstemp(dir=log_dir, prefix="worker-", suffix=".log")
            os.close(fd)
            started.append(WorkerProcess(dsn, args, Path(path)))
        yield started
    finally:
        for w in started:
            w.kill()


# -- the test side: reading the database ----------------------------------------------------


def rows(conn: psycopg.Connection[Any], query: str, params: Any = None) -> list[tuple[Any, ...]]:
    """All rows of a query."""
    return conn.execute(query, params).fetchall()


def one(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    """The single value of a one-row, one-column query."""
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def db_now(conn: psycopg.Connection[Any]) -> dt.datetime:
    """The database clock (the clock every lease and ledger entry uses)."""
    return one(conn, "SELECT clock_timestamp()")  # type: ignore[no-any-return]


def worker_id_of(conn: psycopg.Connection[Any], pid: int, timeout: float = 20.0) -> str:
    """The registered id of the worker process ``pid``, once it has registered."""
    deadline = time.monotonic() + timeout
    while True:
        found = rows(conn, "SELECT id FROM pgtasks.workers WHERE pid = %s", (pid,))
        if found:
            return str(found[0][0])
        if time.monotonic() > deadline:
            raise AssertionError(f"worker {pid} did not register within {timeout}s")
        time.sleep(0.02)


def ledger_rows(conn: psycopg.Connection[Any], job_id: int) -> list[tuple[Any, ...]]:
    """Ledger rows of a job: (attempt, worker_pid, started_at, finished_at, note), in order."""
    return rows(
        conn,
        "SELECT attempt, worker_pid, started_at, finished_at, note FROM public.ledger"
        " WHERE job_id = %s ORDER BY id",
        (job_id,),
    )


def status(conn: psycopg.Connection[Any], job_id: int) -> str:
    """A job's status."""
    return one(conn, "SELECT status FROM pgtasks.jobs WHERE id = %s", (job_id,))  # type: ignore[no-any-return]
