"""The fuzz suite's harness: hypothesis profiles, one database and one real worker per module.

Profiles (``PGTASKS_FUZZ_PROFILE``): ``ci`` (default) runs a few examples per test,
well under a minute for the whole suite, without a hypothesis database; ``long``
runs at least 10,000 cases in all and keeps failing examples under ``.hypothesis/``
(git-ignored) to replay them first next time. See docs/fuzzing.md.

Each module gets its own database (cloned from the session's migrated template) and
one `pgtasks.worker.Worker` running in a thread for the whole module, fed one batch
of jobs per example: starting a worker per example would make 10,000 cases take
hours. The worker's task, ``fuzz.echo``, writes what it received into `Harness.received`
(keyed by job id) and returns its args, so a test compares the values a job was given with
the values its task saw, in this process, with `same` (type-exact).
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import scratch_database
from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from psycopg import sql

import pgtasks
from pgtasks.context import TaskContext
from pgtasks.errors import DatabaseError, PgtasksError
from pgtasks.worker import Worker, WorkerConfig

REPO = Path(__file__).resolve().parents[2]
PROFILE = os.environ.get("PGTASKS_FUZZ_PROFILE", "ci")
QUEUE = "fuzz"  # the only queue the module's worker serves

_common = {
    "deadline": None,  # examples talk to PostgreSQL and wait for a worker: time varies
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    "print_blob": True,
}
# ci: no example database and no shrinking, so a failure costs seconds, not minutes of the
# test run; the long profile shrinks it to a minimal example.
settings.register_profile(
    "ci",
    database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    **_common,  # type: ignore[arg-type]
)
settings.register_profile(
    "long",
    database=DirectoryBasedExampleDatabase(str(REPO / ".hypothesis" / "fuzz")),
    **_common,  # type: ignore[arg-type]
)
if PROFILE not in ("ci", "long"):
    raise pytest.UsageError(f"PGTASKS_FUZZ_PROFILE must be ci or long, got {PROFILE!r}")

#: Cases run per test so far, by test name (printed at the end of the session).
CASES: dict[str, int] = {}


def fuzz_settings(*, ci: int, long: int) -> settings:
    """Settings of a fuzz test: ``ci`` examples in the ci profile, ``long`` in the long one."""
    return settings(settings.get_profile(PROFILE), max_examples=ci if PROFILE == "ci" else long)


def count_cases(test: str, n: int = 1) -> None:
    """Add ``n`` cases (calls, rows or command lines tried) to ``test``'s count."""
    CASES[test] = CASES.get(test, 0) + n


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long profile runs for minutes per test: lift the suite's 300 s timeout for it."""
    if PROFILE == "long":
        for item in items:
            if "tests/fuzz/" in str(item.path).replace(os.sep, "/"):
                item.add_marker(pytest.mark.timeout(7200))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print how many cases each fuzz test ran, and the total."""
    if CASES:
        terminalreporter.section(f"fuzz cases (profile {PROFILE})")
        for name, n in sorted(CASES.items()):
            terminalreporter.write_line(f"{name}: {n}")
        # "name (detail)" entries count a subset of "name" (e.g. the refused calls).
        terminalreporter.write_line(f"total: {sum(n for name, n in CASES.items() if '(' not in name)}")


# -- exact comparison --------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Whether ``b`` is ``a`` read back exactly: equal, of the same types all the way down.

    Stricter than ``==``: ``1 == 1.0 == True`` and ``(1,) != [1]`` matter, a ``-0.0``
    keeps its sign, a datetime keeps its time zone (a `zoneinfo.ZoneInfo` by key, a
    `datetime.timezone` by offset and name) and ``fold``, a Decimal its exponent
    (``Decimal("1.10")``). NaN equals NaN (its sign and payload are not kept: Python
    does not tell them apart in ``repr``, which is how pgtasks stores it).
    """
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, decimal.Decimal):
        return str(a) == str(b)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, set | frozenset):
        if len(a) != len(b):
            return False
        rest = list(b)
        for x in a:
            match = next((i for i, y in enumerate(rest) if same(x, y)), None)
            if match is None:
                return False
            rest.pop(match)
        return True
    if isinstance(a, dt.datetime | dt.time):
        return (
            a == b
            and a.replace(tzinfo=None) == b.replace(tzinfo=None)
            and a.fold == b.fold
            and _same_zone(a.tzinfo, b.tzinfo)
        )
    return bool(a == b)


def _same_zone(a: dt.tzinfo | None, b: dt.tzinfo | None) -> bool:
    if a is None or b is None:
        return a is b
    if type(a) is not type(b):
        return False
    if isinstance(a, dt.timezone):
        return a.utcoffset(None) == b.utcoffset(None) and a.tzname(None) == b.tzname(None)
    return a is b or str(a) == str(b)


# -- one database and one worker per module ------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_dsn(admin_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for this module (cloned from the session's template)."""
    with scratch_database(admin_dsn, template=template_db, prefix="pgtasks_fz") as url:
        yield url


class Harness:
    """A module's app, its running worker and a side connection for checks.

    Attributes:
        app: the app (tasks ``fuzz.echo`` and ``fuzz.add`` on queue ``fuzz``).
        worker: the worker, running in ``thread``.
        conn: an autocommit connection for counts and rewrites by SQL.
        received: ``job id -> (args, kwargs, headers)`` as ``fuzz.echo``/``fuzz.add`` saw them.
    """

    def __init__(
        self,
        app: pgtasks.App,
        worker: Worker,
        thread: threading.Thread,
        conn: psycopg.Connection[Any],
        received: dict[int, tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]],
    ) -> None:
        self.app = app
        self.worker = worker
        self.thread = thread
        self.conn = conn
        self.received = received
        self.sentinel_n = 0

    def __repr__(self) -> str:  # shown in every failing example: keep it short
        return f"<Harness {self.worker!r} alive={self.thread.is_alive()}>"

    def count(self, table: str = "jobs") -> int:
        """Rows in ``pgtasks.<table>``."""
        row = self.conn.execute(
            sql.SQL("SELECT count(*) FROM pgtasks.{}").format(sql.Identifier(table))
        ).fetchone()
        assert row is not None
        return int(row[0])

    def sentinel(self) -> int:
        """Enqueue a good job (``fuzz.echo("sentinel", n)``); returns its id."""
        self.sentinel_n += 1
        return self.app.tasks["fuzz.echo"].delay("sentinel", self.sentinel_n).id

    def refused(self, exc: PgtasksError, before: int, table: str = "jobs") -> None:
        """A refusal at the call site: typed (not PostgreSQL refusing what the API let
        through, a `DatabaseError`), and nothing written."""
        assert not isinstance(exc, DatabaseError), f"PostgreSQL refused what the API accepted: {exc!r}"
        assert self.count(table) == before, f"{exc!r} was raised but rows were written"

    def run_and_check(
        self,
        expected: Mapping[int, tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]],
        good: Sequence[int] = (),
        *,
        timeout: float = 60.0,
    ) -> None:
        """Let the worker run the accepted jobs ``expected`` (``id -> (args, kwargs,
        headers)``) and the good jobs ``good`` (plus a closing sentinel), then check:
        every one succeeded with attempt 1, its task received exactly what it was
        given, and the worker is alive.

        Jobs may sit in another queue or run later (the caller checked their queue,
        run-at and keys): they are moved to the worker's queue, due now.
        """
        ids = [*expected, *good, self.sentinel()]
        self.conn.execute(
            "UPDATE pgtasks.jobs SET queue = %s, run_at = now() WHERE id = ANY(%s) AND status = 'queued'",
            (QUEUE, ids),
        )
        deadline = time.monotonic() + timeout
        while True:
            row = self.conn.execute(
                "SELECT count(*) FROM pgtasks.jobs WHERE id = ANY(%s) AND status IN ('queued', 'running')",
                (ids,),
            ).fetchone()
            assert row is not None
            if row[0] == 0:
                break
            assert self.thread.is_alive(), "the worker died"
            assert time.monotonic() < deadline, f"jobs {ids} not finished within {timeout}s"
            time.sleep(0.005)
        outcomes = self.conn.execute(
            "SELECT id, status, attempt, error FROM pgtasks.jobs WHERE id = ANY(%s) ORDER BY id", (ids,)
        ).fetchall()
        assert [(i, s, a) for i, s, a, _ in outcomes] == [(i, "succeeded", 1) for i in sorted(ids)], outcomes
        for job_id, (args, kwargs, headers) in expected.items():
            got = self.received.pop(job_id)
            assert same(args, got[0]), f"job {job_id}: args {args!r} came to the task as {got[0]!r}"
            assert same(kwargs, got[1]), f"job {job_id}: kwargs {kwargs!r} came to the task as {got[1]!r}"
            assert same(headers, got[2]), f"job {job_id}: headers {headers!r} came as {got[2]!r}"
            result = self.app.AsyncResult(job_id).get(timeout=10)
            assert same(list(args), result), f"job {job_id}: result {result!r}"
        for job_id in [*good, ids[-1]]:
            self.received.pop(job_id, None)
        assert self.thread.is_alive(), "the worker died"


def make_fuzz_app(dsn: str, received: dict[int, Any]) -> pgtasks.App:
    """The fuzz app: ``fuzz.echo`` takes anything; ``fuzz.add(x, y=0)`` has a fixed signature."""
    app = pgtasks.App("fuzz", dsn=dsn, load_entry_points=False)

    @app.task(name="fuzz.echo", queue=QUEUE, bind=True, max_retries=0)
    def echo(ctx: TaskContext, /, *args: Any, **kwargs: Any) -> list[Any]:
        assert ctx.request.id is not None
        received[ctx.request.id] = (args, kwargs, dict(ctx.request.headers))
        return list(args)  # no deeper than the args: they may sit at the nesting limit

    @app.task(name="fuzz.add", queue=QUEUE, bind=True, max_retries=0)
    def add(ctx: TaskContext, x: Any, y: Any = 0) -> list[Any]:
        assert ctx.request.id is not None
        received[ctx.request.id] = ((x, y), {}, dict(ctx.request.headers))
        return [x, y]

    return app


@pytest.fixture
def no_leaks() -> Iterator[None]:
    """Per test, nothing: the module's worker keeps its threads across tests on purpose;
    `harness` checks at the end of the module that none is left behind."""
    yield


def _threads() -> set[int | None]:
    return {t.ident for t in threading.enumerate() if t.is_alive()}


@pytest.fixture(scope="module")
def harness(fuzz_dsn: str) -> Iterator[Harness]:
    """The module's app and its worker (threads pool, 4 slots), running until the module ends.

    Fails the module if the worker did not exit cleanly or left threads behind.
    """
    threads_before = _threads()
    received: dict[int, Any] = {}
    app = make_fuzz_app(fuzz_dsn, received)
    worker = Worker(
        app,
        WorkerConfig(queues=(QUEUE,), concurrency=4, poll_interval=0.05, completion_delay=0.0005),
    )
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.run()), name="fuzz-worker", daemon=True)
    thread.start()
    assert worker.started.wait(30)
    with psycopg.connect(fuzz_dsn, autocommit=True) as conn:
        yield Harness(app=app, worker=worker, thread=thread, conn=conn, received=received)
    worker.request_stop("fuzz module done")
    thread.join(60)
    app.close()
    assert codes == [0]
    deadline = time.monotonic() + 5.0
    while (left := _threads() - threads_before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"threads left behind: {[t.name for t in threading.enumerate() if t.ident in left]}"
