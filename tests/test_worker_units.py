"""The worker's parts, in process, on a real PostgreSQL: backoff arithmetic, the
reaper and heartbeat with pinned time, batched completion, claim order and batch
size, and a `Worker` run in a thread and stopped with `request_stop`.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from apps.worker_app import ledger_rows, make_app, one, raise_flag, rows, setup_ledger, status
from helpers import eventually

import pgtasks
from pgtasks.completion import Completer, Completion, Outcome
from pgtasks.context import CLAIM_COLUMNS, Request
from pgtasks.db import Database, JobStore, ReapedJob, WorkerStore, text_array_literal
from pgtasks.db.workers import worker_database
from pgtasks.errors import Retry
from pgtasks.maintenance import Reaper, ReaperConfig
from pgtasks.states import JobStatus
from pgtasks.task import MAX_DELAY, UNLIMITED_ATTEMPTS, TaskOptions, backoff_delay
from pgtasks.worker import Worker, WorkerConfig
from pgtasks.worker.dbtime import DatabaseTime
from pgtasks.worker.heartbeat import Heartbeat
from pgtasks.worker.listener import Listener
from pgtasks.worker.outcome import decide
from pgtasks.worker.pool import HeldJob
from pgtasks.worker.processes import _Slot

SECOND = dt.timedelta(seconds=1)


def upper(hi: float) -> float:
    """Deterministic "jitter": always the upper bound."""
    return hi


# -- backoff ---------------------------------------------------------------------------------


def test_backoff_without_exponent_is_the_default_delay() -> None:
    opts = TaskOptions(name="t", default_retry_delay=7.5)
    assert [backoff_delay(opts, n, upper) for n in (0, 1, 50)] == [7.5, 7.5, 7.5]


def test_backoff_doubles_from_its_factor_and_stops_at_the_cap() -> None:
    opts = TaskOptions(name="t", retry_backoff=True, retry_backoff_max=60, retry_jitter=False)
    assert [backoff_delay(opts, n, upper) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    opts = TaskOptions(name="t", retry_backoff=2.5, retry_backoff_max=600, retry_jitter=False)
    assert [backoff_delay(opts, n, upper) for n in range(4)] == [2.5, 5, 10, 20]


def test_backoff_jitter_draws_below_the_exponential_delay() -> None:
    opts = TaskOptions(name="t", retry_backoff=True, retry_backoff_max=100)
    asked: list[float] = []

    def rand(hi: float) -> float:
        asked.append(hi)
        return hi / 4

    assert [backoff_delay(opts, n, rand) for n in range(3)] == [0.25, 0.5, 1.0]
    assert asked == [1.0, 2.0, 4.0]
    assert backoff_delay(opts, 3, lambda hi: 0.0) == 0.0
    # A jitter source that overshoots is clamped to the cap, never above.
    assert backoff_delay(opts, 20, lambda hi: hi * 10) == 100


@pytest.mark.parametrize("retries", [-5, 1022, 1023, 1024, 1025, 10**6, 10**18])
def test_backoff_never_overflows(retries: int) -> None:
    capped = TaskOptions(name="t", retry_backoff=True, retry_jitter=False)
    widest = TaskOptions(name="t", retry_backoff=True, retry_backoff_max=MAX_DELAY, retry_jitter=False)
    expected = 1.0 if retries < 0 else 600.0
    assert backoff_delay(capped, retries, upper) == expected
    delay = backoff_delay(widest, retries, upper)
    assert delay == (1.0 if retries < 0 else MAX_DELAY)
    # The resulting run-at is representable in Python (and in PostgreSQL, which goes further).
    assert dt.datetime(2000, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=delay) < dt.datetime(
        2100, 1, 1, tzinfo=dt.UTC
    )


def test_retry_with_huge_max_retries_is_clamped_to_the_column_range() -> None:
    opts = TaskOptions(name="t", max_retries=0)
    outcome = decide(
        Retry(countdown=5, max_retries=10**12), opts, Request(id=1, task_name="t", attempt=1, max_attempts=1)
    )
    assert (outcome.status, outcome.delay, outcome.max_attempts) == ("queued", 5.0, UNLIMITED_ATTEMPTS)


# -- reaper and heartbeat with pinned time -------------------------------------------------------


@pytest.fixture
def store(dsn: str) -> Iterator[Database]:
    """A store on the test database."""
    s = Database(dsn, max_size=4)
    yield s
    s.close()


def register(store: Database, worker_id: str, now: dt.datetime | None, lease: float = 30.0) -> None:
    """Register a worker row at ``now``."""
    WorkerStore(store).register(
        id=worker_id,
        host="test",
        pid=1,
        queues=["default"],
        concurrency=1,
        pool="threads",
        lease_timeout=lease,
        now=now,
    )


_ID = CLAIM_COLUMNS.index("id")


def claim(
    store: Database, worker_id: str, now: dt.datetime | None, limit: int = 100, *, fair: bool = True
) -> list[int]:
    """Claim due jobs for ``worker_id`` at ``now``; returns their ids in claim order."""
    rows = JobStore(store).claim_batch(
        queues=text_array_literal(["default"]),
        worker_id=worker_id,
        limit=limit,
        start_tenant="",
        max_tenants=100,
        fair=fair,
        now=now,
    )
    return [int(r[_ID]) for r in rows]


def succeed(
    store: Database, worker_id: str, ids: list[int], now: dt.datetime | None, conn: Any = None
) -> list[int]:
    """Record success of ``ids`` as ``worker_id`` would."""
    return JobStore(store).succeed_batch(
        worker_id=worker_id, ids=ids, results_json=['"ok"'] * len(ids), now=now, conn=conn
    )


def test_reaper_takes_only_running_jobs_of_expired_workers(
    app: pgtasks.App, store: Database, conn: psycopg.Connection[Any]
) -> None:
    again = app.task(name="again")(lambda: None)
    once = app.task(name="once", retry_on_worker_lost=False)(lambda: None)
    done_job = again.delay().id
    lost_job = again.delay().id
    lost_once = once.delay().id
    t0 = one(conn, "SELECT now()") + SECOND
    register(store, "dead", t0)
    assert sorted(claim(store, "dead", t0)) == sorted([done_job, lost_job, lost_once])
    # Their bodies started (a claimed job not started goes back with its attempt unused:
    # tests/test_honest_start.py).
    started = [done_job, lost_job, lost_once]
    assert JobStore(store).mark_started(worker_id="dead", ids=started, starts=[t0.timestamp()] * 3) == 3
    assert succeed(store, "dead", [done_job], t0 + SECOND) == [done_job]

    assert (
        Reaper(JobStore(store), WorkerStore(store), ReaperConfig(), now=t0 + 29 * SECOND).run_once().requeued
        == 0
    )
    assert status(conn, lost_job) == "running"  # the lease is alive

    result = Reaper(JobStore(store), WorkerStore(store), ReaperConfig(), now=t0 + 31 * SECOND).run_once()
    assert (result.requeued, result.failed) == (1, 1)
    assert status(conn, lost_job) == "queued"
    job = app.get_job(lost_job)
    assert (job.worker_id, job.attempt, job.run_at) == (None, 1, t0 + 31 * SECOND)
    assert [(a["attempt"], a["outcome"], a["worker_id"]) for a in job.attempts] == [(1, "lost", "dead")]
    failed = app.get_job(lost_once)
    assert failed.status == "failed" and failed.error is not None
    assert failed.error["code"] == "WORKER_LOST"

    # The job that finished just before is never touched.
    finished = app.get_job(done_job)
    assert (finished.status, finished.result, finished.attempts) == ("succeeded", "ok", [])
    assert finished.finished_at == t0 + SECOND
    # Nothing is reaped twice.
    assert (
        Reaper(JobStore(store), WorkerStore(store), ReaperConfig(), now=t0 + 99 * SECOND).run_once().requeued
        == 0
    )


def test_reaper_never_overwrites_a_job_finishing_at_the_same_moment(
    app: pgtasks.App, store: Database, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    task = app.task(name="t")(lambda *a, **k: None)
    racing = task.delay().id
    late = task.delay().id
    t0 = one(conn, "SELECT now()") + SECOND
    register(store, "w", t0)
    claim(store, "w", t0)
    later = t0 + 100 * SECOND
    # The worker's success write is in flight (row locked, not yet committed) as the reaper runs.
    with psycopg.connect(dsn) as writer:
        assert succeed(store, "w", [racing], t0 + SECOND, conn=writer) == [racing]
        result = Reaper(JobStore(store), WorkerStore(store), ReaperConfig(), now=later).run_once()
        assert (result.requeued, result.failed) == (1, 0)  # only the other job
        writer.commit()
    assert Reaper(JobStore(store), WorkerStore(store), ReaperConfig(), now=later).run_once().requeued == 0
    job = app.get_job(racing)
    assert (job.status, job.result, job.attempts) == ("succeeded", "ok", [])
    # The other way round: reaped first, then the stale worker's write changes nothing.
    assert status(conn, late) == "queued"
    assert succeed(store, "w", [late], later) == []
    assert status(conn, late) == "queued"


def test_a_long_job_on_a_live_worker_is_never_reaped(
    app: pgtasks.App, store: Database, conn: psycopg.Connection[Any]
) -> None:
    task = app.task(name="t")(lambda *a, **k: None)
    job = task.delay().id
    orphan = task.delay().id
    t0 = one(conn, "SELECT now()") + SECOND
    register(store, "alive", t0)
    claim(store, "alive", t0, limit=1)
    register(store, "gone", t0)
    claim(store, "gone", t0, limit=1)
    conn.execute("DELETE FROM pgtasks.workers WHERE id = 'gone'")
    # The worker heartbeats on; its job's own heartbeat stays at the claim.
    for minutes in range(1, 60):
        WorkerStore(store).heartbeat(id="alive", now=t0 + minutes * 60 * SECOND, stopping=False)
    result = Reaper(
        JobStore(store), WorkerStore(store), ReaperConfig(lease_timeout=30), now=t0 + 3550 * SECOND
    ).run_once()
    assert (result.requeued, result.failed) == (1, 0)
    assert (status(conn, job), status(conn, orphan)) == ("running", "queued")
    # Long-expired worker rows without jobs are forgotten.
    register(store, "ancient", t0 - 7200 * SECOND)
    assert (
        Reaper(JobStore(store), WorkerStore(store), ReaperConfig(), now=t0).run_once().workers_forgotten == 1
    )


def test_heartbeat_extends_the_lease_and_passes_on_cancel_requests(
    app: pgtasks.App, store: Database, conn: psycopg.Connection[Any]
) -> None:
    task = app.task(name="t")(lambda *a, **k: None)
    first, second = task.delay().id, task.delay().id
    register(store, "hb", None, lease=30)
    before = one(conn, "SELECT lease_expires_at FROM pgtasks.workers WHERE id = 'hb'")
    claim(store, "hb", None)
    cancels: list[tuple[int, bool]] = []
    lost: list[bool] = []
    beat = Heartbeat(
        WorkerStore(store),
        JobStore(store),
        "hb",
        10,
        lambda i, t: cancels.append((i, t)),
        lambda: lost.append(True),
        lambda: True,
    )
    result = beat.run_once()
    assert (result.extended, result.cancel_requested, cancels, lost) == (True, 0, [], [])
    after, stopping = rows(conn, "SELECT lease_expires_at, stopping FROM pgtasks.workers WHERE id = 'hb'")[0]
    assert after > before and stopping is True

    assert app.cancel(first) is True
    assert app.cancel(second, terminate=True) is True
    assert beat.run_once().cancel_requested == 2
    assert sorted(cancels) == sorted([(first, False), (second, True)])

    conn.execute("DELETE FROM pgtasks.workers WHERE id = 'hb'")
    assert beat.run_once().extended is False
    assert lost == [True]


# -- notifications and children ------------------------------------------------------------------


def test_listener_survives_a_failing_callback_and_calls_only_bad_payloads_malformed(
    store: Database, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    cancelled: list[int] = []
    enqueued: list[str] = []

    def on_cancel(job_id: int) -> None:
        if job_id == 1:  # what a slot raised when asked to kill a child it was closing
            raise ValueError("process object is closed")
        cancelled.append(job_id)

    listener = Listener(
        store, JobStore(store), on_jobs=enqueued.append, on_cancel=on_cancel, on_reconnect=lambda: None
    )
    listener.start()
    try:
        assert listener.connected.wait(10)
        for channel, payload in [
            ("pgtasks_cancel", "1"),
            ("pgtasks_cancel", "x"),
            ("pgtasks_cancel", "2"),
            ("pgtasks_jobs", "q"),
        ]:
            conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))
        eventually(lambda: cancelled == [2] and enqueued == ["q"], timeout=10, message="later notifications")
    finally:
        listener.stop()
    messages = [r.getMessage() for r in caplog.records]
    assert "handling the pgtasks_cancel notification '1' failed" in messages
    assert "ignored malformed cancel notification 'x'" in messages
    assert not [m for m in messages if "malformed" in m and "'1'" in m]


def test_a_slot_kills_its_child_only_for_the_job_it_runs() -> None:
    running = HeldJob(None, Request(id=1, task_name="t"))
    finished = HeldJob(None, Request(id=2, task_name="t"))
    slot = _Slot.__new__(_Slot)  # the kill/close protocol only; no pool, no worker
    slot.lock = threading.Lock()
    slot.killed_for = None
    slot.conn = None
    slot.current = running
    slot.process = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,), daemon=True)
    slot.process.start()
    child = slot.process
    try:
        # A cancel or hard limit that arrives after the slot moved on must not hit the
        # next job's child.
        assert slot.kill("cancel", finished) is False
        assert child.is_alive() and slot.killed_for is None
        assert slot.kill("cancel", running) is True
        assert slot.killed_for == "cancel"
        child.join(5)
        assert not child.is_alive()
        slot.close()
        assert slot.process is None
        # Closed meanwhile: nothing to kill, and no error from a closed process object.
        assert slot.kill("cancel", running) is False
    finally:
        if slot.process is not None:
            slot.process.kill()


# -- completion ---------------------------------------------------------------------------------


def test_completer_writes_in_batches_and_reports_only_durable_results(
    app: pgtasks.App, store: Database, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    task = app.task(name="t")(lambda *a, **k: None)
    ids = [task.delay().id for _ in range(8)]
    register(store, "c", None)
    claim(store, "c", None)
    conn.execute("UPDATE pgtasks.jobs SET worker_id = 'someone-else' WHERE id = %s", (ids[-1],))
    batches: list[tuple[list[int], set[int], list[str]]] = []
    all_reported = threading.Event()

    def on_written(done: list[Completion], lost: set[int]) -> None:
        # Seen from another connection at the moment of the report: already committed.
        with psycopg.connect(dsn) as other:
            seen = [
                r[0]
                for r in other.execute(
                    "SELECT status FROM pgtasks.jobs WHERE id = ANY(%s) ORDER BY id",
                    ([c.job_id for c in done],),
                )
            ]
        batches.append(([c.job_id for c in done], lost, seen))
        if sum(len(b[0]) + len(b[1]) for b in batches) == 8:
            all_reported.set()

    completer = Completer(JobStore(store), "c", batch=3, delay=0.5, on_written=on_written)
    completer.start()
    try:
        for job_id in ids:
            completer.add(Completion(job_id, "t", f"{job_id}", job_id, 0.0))
        assert all_reported.wait(10)
    finally:
        completer.stop()
    assert [len(b[0]) + len(b[1]) for b in batches] == [3, 3, 2]
    assert [i for b in batches for i in b[0]] == ids[:-1]
    assert batches[-1][1] == {ids[-1]}  # not held by this worker: not written
    assert all(s == "succeeded" for b in batches for s in b[2])
    assert completer.written == 7
    assert status(conn, ids[-1]) == "running"
    assert one(conn, "SELECT count(*) FROM pgtasks.jobs WHERE result = to_jsonb(id)") == 7


def test_completer_stop_writes_what_is_pending(
    app: pgtasks.App, store: Database, conn: psycopg.Connection[Any]
) -> None:
    task = app.task(name="t")(lambda *a, **k: None)
    ids = [task.delay().id for _ in range(2)]
    claim(store, "c", None)
    completer = Completer(JobStore(store), "c", batch=100, delay=60.0, on_written=lambda done, lost: None)
    completer.start()
    for job_id in ids:
        completer.add(Completion(job_id, "t", "1", 1, 0.0))
    completer.stop()
    assert [status(conn, i) for i in ids] == ["succeeded", "succeeded"]


def test_completer_writes_every_result_added_from_many_threads(
    app: pgtasks.App, store: Database, conn: psycopg.Connection[Any]
) -> None:
    """Pool threads add results concurrently (no lock): each is written exactly once, none waits."""
    task = app.task(name="t")(lambda *a, **k: None)
    ids = [r.id for r in task.delay_many(range(800))]
    assert sorted(claim(store, "c", None, limit=800)) == sorted(ids)
    written: list[int] = []
    completer = Completer(
        JobStore(store),
        "c",
        batch=50,
        delay=0.002,
        on_written=lambda done, lost: written.extend(c.job_id for c in done),
    )
    completer.start()
    chunks = [ids[i::4] for i in range(4)]

    def add_all(chunk: list[int]) -> None:
        for i in chunk:
            completer.add(Completion(i, "t", "null", None, 0.0))

    threads = [threading.Thread(target=add_all, args=(chunk,)) for chunk in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert eventually(lambda: completer.pending() == 0 and len(written) == 800, timeout=10)
    completer.stop()
    assert sorted(written) == sorted(ids)
    assert one(conn, "SELECT count(*) FROM pgtasks.jobs WHERE status = 'succeeded'") == 800


def test_starts_and_successes_written_at_once_wait_for_each_other_without_deadlock(
    app: pgtasks.App, store: Database, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """The heartbeat's start batch and the completer's success batch can cover the same
    held jobs (started and finished since the last beat). Handed their ids in opposite
    orders, both lock the rows in one order: neither fails nor retries on a deadlock."""
    task = app.task(name="t")(lambda *a, **k: None)
    completer = Completer(JobStore(store), "c", batch=1000, on_written=lambda done, lost: None)
    failures: list[BaseException] = []
    for _ in range(8):
        ids = sorted(r.id for r in task.delay_many(range(600)))
        assert sorted(claim(store, "c", None, limit=600)) == ids
        now = time.time()
        both = threading.Barrier(2)

        def starts(ids: list[int] = ids, now: float = now, both: threading.Barrier = both) -> None:
            both.wait()
            try:
                completer.record_starts([(i, now) for i in reversed(ids)])
            except BaseException as exc:  # a deadlock reaches the heartbeat as DatabaseError
                failures.append(exc)

        thread = threading.Thread(target=starts)
        thread.start()
        both.wait()
        completer._write_successes(
            [Completion(i, "t", "null", None, 0.0, None, now, now + 0.001) for i in ids]
        )
        thread.join()
    assert failures == []
    assert "recording results failed" not in caplog.text
    assert one(conn, "SELECT count(*) FROM pgtasks.jobs WHERE status = 'succeeded'") == 8 * 600


def test_every_other_outcome_goes_through_one_path_that_says_whether_it_applied(
    app: pgtasks.App, store: Database, conn: psycopg.Connection[Any]
) -> None:
    task = app.task(name="t")(lambda *a, **k: None)
    retried, failed, taken = (task.delay().id for _ in range(3))
    register(store, "c", None)
    claim(store, "c", None)
    conn.execute("UPDATE pgtasks.jobs SET worker_id = 'someone-else' WHERE id = %s", (taken,))
    seen: list[tuple[str, int]] = []

    class Recorder:
        @pgtasks.hookimpl
        def pgtasks_job_retrying(self, job_id: int) -> None:
            seen.append(("retrying", job_id))

        @pgtasks.hookimpl
        def pgtasks_job_failed(self, job_id: int, final_status: str) -> None:
            seen.append((final_status, job_id))

    app.plugin_manager.register(Recorder())
    completer = Completer(JobStore(store), "c", app.plugin_manager)
    error = {"type": "E", "code": "E", "class": "transient", "message": "m"}

    def request(job_id: int) -> Request:
        return Request(id=job_id, task_name="t", attempt=1, max_attempts=3)

    retry = Outcome(JobStatus.QUEUED, error, delay=60.0, max_attempts=3)
    fail = Outcome(JobStatus.FAILED, error, max_attempts=3)
    assert completer.set_state_if_running(request(retried), retry) is True
    assert completer.set_state_if_running(request(failed), fail) is True
    # Not held by this worker (reaped and taken by another, say): nothing written, no hook.
    assert completer.set_state_if_running(request(taken), fail) is False
    # Written once: the job no longer runs, so a second write changes nothing.
    assert completer.set_state_if_running(request(failed), fail) is False
    assert [status(conn, i) for i in (retried, failed, taken)] == ["queued", "failed", "running"]
    assert seen == [("retrying", retried), ("failed", failed)]


def test_the_reaper_writes_through_the_completer_it_is_given(
    app: pgtasks.App, store: Database, conn: psycopg.Connection[Any]
) -> None:
    task = app.task(name="t")(lambda *a, **k: None)
    lost = task.delay().id
    t0 = one(conn, "SELECT now()") + SECOND
    register(store, "dead", t0)
    claim(store, "dead", t0)
    reaps: list[int] = []

    class Counting(Completer):
        def reap_lost(self, **kwargs: Any) -> list[ReapedJob]:
            reaped = super().reap_lost(**kwargs)
            reaps.extend(r.job_id for r in reaped)
            return reaped

    completer = Counting(JobStore(store), "alive")
    reaper = Reaper(
        JobStore(store), WorkerStore(store), ReaperConfig(), now=t0 + 31 * SECOND, completer=completer
    )
    assert reaper.run_once().requeued == 1
    assert reaps == [lost]
    assert status(conn, lost) == "queued"


def test_completer_stops_at_once_when_idle(store: Database) -> None:
    completer = Completer(JobStore(store), "c", batch=10, delay=60.0, on_written=lambda done, lost: None)
    completer.start()
    completer.stop(timeout=5)
    assert not any(t.name == "pgtasks-completer" for t in threading.enumerate())


# -- claiming -------------------------------------------------------------------------------------


def test_claim_order_is_priority_then_run_at_then_id(
    app: pgtasks.App, store: Database, conn: psycopg.Connection[Any]
) -> None:
    task = app.task(name="t")(lambda *a, **k: None)
    base = one(conn, "SELECT now()")
    jobs = []
    for i, (priority, offset) in enumerate([(0, 5), (5, 9), (0, 1), (5, 9), (-3, 0), (0, 1), (5, 2)]):
        r = task.apply_async((i,), priority=priority, eta=base + offset * SECOND)
        jobs.append((-priority, base + offset * SECOND, r.id))
    later = base + 60 * SECOND
    order = [i for _ in jobs for i in claim(store, "w", later, limit=1)]
    assert order == [j[2] for j in sorted(jobs)]
    # Not due yet: not claimed.
    future = task.apply_async(countdown=3600).id
    assert claim(store, "w", later) == []
    assert status(conn, future) == "queued"


def test_a_claim_never_takes_more_than_asked(app: pgtasks.App, store: Database) -> None:
    task = app.task(name="t")(lambda *a, **k: None)
    task.delay_many(list(range(200)))
    task.delay_many([(i,) for i in range(50)], tenant="other")
    assert [len(claim(store, "w", None, limit=n)) for n in (1, 7, 33)] == [1, 7, 33]


def test_fair_claim_serves_tenants_round_robin(app: pgtasks.App, store: Database) -> None:
    task = app.task(name="t")(lambda *a, **k: None)
    big = {r.id for r in task.delay_many(list(range(500)), tenant="big")}
    small = {r.id for r in task.delay_many(list(range(2)), tenant="small")}
    tiny = {r.id for r in task.delay_many([0], tenant="tiny")}
    first = set(claim(store, "w", None, limit=6))
    assert small | tiny <= first
    # A tenant's share of the limit is 6 / 3 tenants: the big one gives 2, not the 3 left.
    assert len(first & big) == 2
    # Without fairness, strict order: the bulk tenant's older jobs first.
    rest = set(claim(store, "w", None, limit=5, fair=False))
    assert rest <= big


# -- a whole worker, in process ---------------------------------------------------------------------


@pytest.fixture
def tasks_app(dsn: str) -> Iterator[pgtasks.App]:
    """The worker-test tasks on the test database, with the ledger."""
    setup_ledger(dsn)
    application = make_app(dsn)
    yield application
    application.close()


def run_in_thread(worker: Worker) -> tuple[threading.Thread, list[int]]:
    """Start ``worker.run()`` in a thread; the list receives its exit code."""
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.run()), name="test-worker")
    thread.start()
    assert worker.started.wait(20)
    return thread, codes


def test_claims_are_sized_to_free_capacity(
    tasks_app: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    ids = [r.id for r in tasks_app.tasks["w.block"].delay_many([("go",)] * 10)]
    worker = Worker(tasks_app, WorkerConfig(concurrency=2, prefetch_multiplier=2, poll_interval=0.1))
    thread, codes = run_in_thread(worker)
    try:
        eventually(lambda: one(conn, "SELECT count(*) FROM public.ledger") == 2, message="two running")
        # Two slots, two jobs held ahead: four claimed, the rest left for other workers.
        running = one(
            conn,
            "SELECT count(*) FROM pgtasks.jobs WHERE status = 'running' AND worker_id = %s",
            (worker.id,),
        )
        assert running == 4
        assert one(conn, "SELECT count(*) FROM pgtasks.jobs WHERE status = 'queued'") == 6
        raise_flag(dsn, "go")
        eventually(lambda: all(status(conn, i) == "succeeded" for i in ids), message="all done")
    finally:
        worker.request_stop()
        thread.join(30)
    assert codes == [0]
    assert worker.stopped.is_set()
    assert one(conn, "SELECT count(*) FROM pgtasks.workers") == 0
    assert all(len(ledger_rows(conn, i)) == 1 for i in ids)


def test_a_claim_cut_at_a_tenants_share_is_followed_at_once(
    tasks_app: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """A short claim is not a drained queue when a tenant gave its whole share: the worker
    claims again as its buffer empties instead of sleeping until the poll (60 s here)."""
    record = tasks_app.tasks["w.record"]
    ids = [r.id for r in record.delay_many([(i, 0) for i in range(40)], tenant="big")]
    ids.append(record.apply_async((99, 0), tenant="small").id)
    worker = Worker(tasks_app, WorkerConfig(concurrency=2, prefetch_multiplier=8, poll_interval=60))
    thread, codes = run_in_thread(worker)
    try:
        # The first claim takes 8 of big's jobs (16 over 2 tenants) and small's one.
        eventually(lambda: all(status(conn, i) == "succeeded" for i in ids), message="all done")
    finally:
        worker.request_stop()
        thread.join(30)
    assert codes == [0]
    assert all(len(ledger_rows(conn, i)) == 1 for i in ids)


def test_request_stop_drains_with_heartbeats_and_hands_back(
    tasks_app: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    # The job outlives the lease (1.5 s): only heartbeats during the drain keep it from the reaper.
    running = tasks_app.tasks["w.record"].apply_async((1, 2.5), priority=5).id
    waiting = [r.id for r in tasks_app.tasks["w.record"].delay_many(list(range(3)))]
    worker = Worker(
        tasks_app,
        concurrency=1,
        prefetch_multiplier=4,
        poll_interval=0.1,
        lease_timeout=1.5,
        reap_interval=0.2,
    )
    thread, codes = run_in_thread(worker)
    eventually(lambda: ledger_rows(conn, running), message="long job started")
    worker.request_stop("test")
    lease = "SELECT lease_expires_at FROM pgtasks.workers WHERE stopping AND id = %s"
    first = eventually(lambda: rows(conn, lease, (worker.id,)), message="marked stopping")[0][0]
    eventually(lambda: rows(conn, lease, (worker.id,))[0][0] > first, message="lease extended while draining")
    thread.join(30)
    assert codes == [0]
    assert (status(conn, running), len(ledger_rows(conn, running))) == ("succeeded", 1)
    assert tasks_app.get_job(running).attempts == []  # never reaped
    assert [
        (status(conn, i), one(conn, "SELECT attempt FROM pgtasks.jobs WHERE id = %s", (i,))) for i in waiting
    ] == [("queued", 0)] * 3


def test_worker_connections_use_generic_plans_and_app_connections_do_not(app: pgtasks.App) -> None:
    """The claim is re-planned on every execution unless the worker's session asks for generic
    plans; those are kept from a statement's first run, so a plan made while the queue was
    empty must not scan the table later (tests/test_claim_plans.py): sequential scans are
    priced out of a worker's session, not of an application's."""
    worker = Worker(app, queues=("default",))
    try:
        with worker.database.connection() as c:
            row = c.execute("SHOW plan_cache_mode").fetchone()
            assert row is not None and row[0] == "force_generic_plan"
            jit = c.execute("SHOW jit").fetchone()
            assert jit is not None and jit[0] == "off"
            seqscan = c.execute("SHOW enable_seqscan").fetchone()
            assert seqscan is not None and seqscan[0] == "off"
        with app.store.connection() as c:
            row = c.execute("SHOW plan_cache_mode").fetchone()
            assert row is not None and row[0] == "auto"
            seqscan = c.execute("SHOW enable_seqscan").fetchone()
            assert seqscan is not None and seqscan[0] == "on"
    finally:
        worker.database.close()


def test_worker_connections_prepare_the_claim_at_its_first_use(dsn: str) -> None:
    """A worker's queries are prepared at their first execution on a connection (not
    the sixth, psycopg's default): an unprepared claim is parsed and planned each time.
    With prepared statements off (PgBouncer before 1.21), nothing is prepared; an app's
    connections keep psycopg's threshold."""
    cases = (
        (worker_database(dsn, max_size=1, prepare_threshold=5), 1),
        (worker_database(dsn, max_size=1, prepare_threshold=None), 0),
        (Database(dsn, max_size=1), 0),
    )
    for database, expected in cases:
        try:
            JobStore(database).claim_batch(
                queues=text_array_literal(["default"]), worker_id="w", limit=1, max_tenants=1, fair=True
            )
            with database.connection() as c:  # the pool's only connection: the one that claimed
                row = c.execute(
                    "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ("%Claim up to%",)
                ).fetchone()
            assert row is not None and row[0] == expected, (database, expected)
        finally:
            database.close()


def test_recorded_start_and_end_are_on_the_database_clock_whatever_the_host_clock(
    tasks_app: pgtasks.App, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host clock an hour fast (no NTP, a drifting VM) does not move the ``started_at``
    and ``finished_at`` the worker records: they are on the database clock."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600.0)
    ids = [r.id for r in tasks_app.tasks["w.pid"].delay_many([()] * 3)]
    worker = Worker(tasks_app, WorkerConfig(concurrency=1, poll_interval=0.1))
    thread, codes = run_in_thread(worker)
    try:
        eventually(lambda: all(status(conn, i) == "succeeded" for i in ids), message="all done")
    finally:
        worker.request_stop()
        thread.join(30)
    assert codes == [0]
    for job_id in ids:
        created, started, finished, now = rows(
            conn,
            "SELECT created_at, started_at, finished_at, clock_timestamp() FROM pgtasks.jobs WHERE id = %s",
            (job_id,),
        )[0]
        assert created <= started <= finished <= now, (job_id, created, started, finished, now)


def test_a_slow_round_trip_does_not_make_a_trusted_host_clock_jump() -> None:
    """On a busy host a heartbeat's answer may be read long after the database wrote
    its clock: that delay is no skew, and must not shift recorded instants."""
    clock = DatabaseTime()
    now = time.monotonic()
    on_time = dt.datetime.fromtimestamp(time.time(), tz=dt.UTC)
    clock.sync(on_time, now - 0.002, now)  # a precise reading: no skew
    assert clock.correction == 0.0
    # The database answered at once, but the thread read it 300 ms later.
    answered_early = dt.datetime.fromtimestamp(time.time() - 0.3, tz=dt.UTC)
    clock.sync(answered_early, now - 0.3, now)
    assert clock.correction == 0.0
    # The only reading so far, 200 ms long, answered as it was sent: 100 ms of apparent
    # skew, all of it within what the round trip cannot tell apart.
    clock = DatabaseTime()
    clock.sync(dt.datetime.fromtimestamp(time.time() - 0.2, tz=dt.UTC), now - 0.2, now)
    assert clock.correction == 0.0


def test_later_instants_map_to_later_times_whatever_threads_do_meanwhile() -> None:
    """Mapping one instant may be interrupted by a thread switch; the times of a job's
    end and of the next job's start on the same slot must keep their order anyway."""
    clock = DatabaseTime()
    stop = threading.Event()

    def busy() -> None:  # contends for the interpreter, as the pool's other threads do
        while not stop.is_set():
            sum(range(1000))

    others = [threading.Thread(target=busy, daemon=True) for _ in range(4)]
    for t in others:
        t.start()
    try:
        mapped = []
        for _ in range(20_000):
            end = clock.now()
            start = clock.at(time.monotonic())
            mapped.append((end, start))
    finally:
        stop.set()
        for t in others:
            t.join()
    assert all(start >= end for end, start in mapped)
    assert abs(clock.now() - time.time()) < 0.01  # a trusted host clock is used as it is


def test_a_host_clock_an_hour_off_is_corrected_by_a_precise_reading() -> None:
    clock = DatabaseTime()
    now = time.monotonic()
    clock.sync(dt.datetime.fromtimestamp(time.time() - 3600, tz=dt.UTC), now - 0.002, now)
    assert abs(clock.correction + 3600) < 0.01
    # A later imprecise reading (far slower than the best) leaves the correction alone.
    clock.sync(dt.datetime.fromtimestamp(time.time() - 3599.5, tz=dt.UTC), now - 0.5, now)
    assert abs(clock.correction + 3600) < 0.01
