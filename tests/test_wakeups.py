"""Enqueue wake-ups: sent after the commit, coalesced, and never lost by a script that exits.

An enqueue that commits on its own leaves its wake-up to the app's `WakeupSender`
(its INSERT does not notify, so producers' commits do not serialise on the
notification lock); one inside the caller's transaction still notifies on that
transaction's commit.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from helpers import eventually

import pgtasks
from pgtasks.db import WakeupSender
from pgtasks.db.wakeups import MAX_NAMED, MIN_INTERVAL
from pgtasks.enqueue import COPY_THRESHOLD
from pgtasks.worker import Worker


class Listener:
    """A connection LISTENing on the jobs channel; `received` holds the payloads."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.conn.execute("LISTEN pgtasks_jobs")
        self.received: list[str] = []

    def drain(self, seconds: float) -> list[str]:
        """Collect what arrives within ``seconds``; returns everything received so far."""
        for note in self.conn.notifies(timeout=seconds, stop_after=None):
            self.received.append(note.payload)
        return self.received

    def wait_for(self, payload: str, timeout: float = 5.0) -> float:
        """Seconds until ``payload`` arrived (fails after ``timeout``)."""
        started = time.monotonic()
        while payload not in self.received:
            left = timeout - (time.monotonic() - started)
            assert left > 0, f"{payload!r} not received in {timeout} s; got {self.received}"
            for note in self.conn.notifies(timeout=left, stop_after=1):
                self.received.append(note.payload)
        return time.monotonic() - started


@pytest.fixture
def listener(dsn: str) -> Iterator[Listener]:
    lst = Listener(dsn)
    try:
        yield lst
    finally:
        lst.conn.close()


def test_delay_wakes_workers_with_the_job_named(app: pgtasks.App, listener: Listener) -> None:
    @app.task(name="wake.one", queue="mail")
    def one() -> None: ...

    result = one.delay()
    listener.wait_for(f"mail:{result.id}")


@pytest.mark.parametrize("leads", [False, True], ids=["amid-others", "after-a-quiet-spell"])
def test_who_sends_a_pooled_enqueues_wake_up(
    app: pgtasks.App, listener: Listener, monkeypatch: pytest.MonkeyPatch, leads: bool
) -> None:
    """Amid other enqueues the INSERT does not notify and the sender does; the first
    after a quiet spell notifies in its own commit and leaves the sender alone."""

    @app.task(name="wake.quiet", queue="mail")
    def quiet() -> None: ...

    sent: list[list[str]] = []
    jobs = app.stores.jobs
    original = jobs.wake

    def recording(*, payloads: list[str], conn: psycopg.Connection[object]) -> None:
        sent.append(list(payloads))
        original(payloads=payloads, conn=conn)

    monkeypatch.setattr(jobs, "wake", recording)
    monkeypatch.setattr(app.stores.wakeups, "leads", lambda: leads)
    result = quiet.delay()
    listener.wait_for(f"mail:{result.id}")
    app.stores.wakeups.flush()
    assert sent == ([] if leads else [[f"mail:{result.id}"]])
    listener.drain(0.3)
    assert listener.received.count(f"mail:{result.id}") == 1  # not from both


def test_only_the_first_enqueue_after_a_quiet_spell_leads(app: pgtasks.App) -> None:
    sender = WakeupSender(app.stores.jobs)
    assert sender.leads()
    assert not sender.leads(), "an enqueue right after another must leave its wake-up to the sender"
    time.sleep(2 * MIN_INTERVAL)
    assert sender.leads()
    with sender._cond:
        sender._pending["q"] = [1]  # a wake-up waiting to be sent: not quiet
    time.sleep(2 * MIN_INTERVAL)
    assert not sender.leads()
    sender.close()


def test_enqueue_in_the_callers_transaction_wakes_on_its_commit(
    app: pgtasks.App, dsn: str, listener: Listener
) -> None:
    @app.task(name="wake.tx", queue="mail")
    def in_tx() -> None: ...

    with psycopg.connect(dsn) as conn:
        result = in_tx.apply_async(connection=conn)
        assert listener.drain(0.5) == [], "woken before the caller's commit"
        conn.commit()
    listener.wait_for(f"mail:{result.id}")


def test_bulk_enqueue_wakes_each_queue_once(app: pgtasks.App, listener: Listener) -> None:
    @app.task(name="wake.bulk", queue="bulk")
    def bulk(i: int) -> None: ...

    bulk.delay_many(range(COPY_THRESHOLD))  # COPY
    listener.wait_for("bulk")
    assert listener.drain(0.3).count("bulk") == 1


def test_a_small_bulk_enqueue_is_one_statement_that_wakes_its_queue_once(
    app: pgtasks.App, dsn: str, listener: Listener
) -> None:
    """Below the COPY threshold, a pooled ``delay_many`` is one INSERT whose commit
    carries the wake-up (one per queue, however many rows): the jobs and the
    notification come together."""

    @app.task(name="wake.small", queue="small")
    def small(i: int) -> None: ...

    results = small.delay_many(range(10))
    listener.wait_for("small")
    assert listener.drain(0.3).count("small") == 1
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pgtasks.jobs WHERE id = ANY(%s) AND status = 'queued'",
            ([r.id for r in results],),
        ).fetchone()
    assert row == (10,)


def test_wake_ups_gathered_during_a_send_leave_together(app: pgtasks.App, listener: Listener) -> None:
    sender = WakeupSender(app.stores.jobs)
    try:
        # Held condition: the sending thread cannot take what is pending until released,
        # as when a send is on its way.
        with sender._cond:
            for job_id in range(1, 4):
                sender.wake("a", job_id)
            for job_id in range(1, MAX_NAMED + 5):
                sender.wake("b", job_id)
            sender.wake("c")
            sender.wake("c", 7)  # a bare wake-up already covers the queue
        assert sender.flush(5)
        listener.drain(0.3)
        assert sorted(listener.received) == ["a:1", "a:2", "a:3", "b", "c"]
    finally:
        sender.close()


def test_a_steady_stream_of_wake_ups_costs_a_bounded_number_of_sends(
    app: pgtasks.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = app.stores.jobs
    sends: list[list[str]] = []
    original = jobs.wake

    def recording(*, payloads: list[str], conn: psycopg.Connection[object]) -> None:
        sends.append(list(payloads))
        original(payloads=payloads, conn=conn)

    monkeypatch.setattr(jobs, "wake", recording)
    sender = WakeupSender(jobs)
    try:
        started = time.monotonic()
        for job_id in range(1, 301):
            sender.wake("steady", job_id)
            time.sleep(0.0002)
        assert sender.flush(5)
        elapsed = time.monotonic() - started
        assert sends, "nothing was sent"
        assert len(sends) <= elapsed / MIN_INTERVAL + 2, f"{len(sends)} sends in {elapsed:.3f} s"
        # Every job is named, or covered by a bare wake-up of its queue in the same send.
        named = {p for payloads in sends for p in payloads}
        assert all(f"steady:{i}" in named for i in range(1, 301)) or "steady" in named
        assert sends[0] == ["steady:1"], "the first wake-up after a quiet spell must leave alone, at once"
        assert {"steady:300", "steady"} & set(sends[-1]), "the last job's wake-up was not sent last"
    finally:
        sender.close()


def test_the_sender_recovers_after_its_connection_is_cut(
    app: pgtasks.App, dsn: str, listener: Listener
) -> None:
    sender = WakeupSender(app.stores.jobs)
    try:
        sender.wake("q", 1)
        listener.wait_for("q:1")
        assert sender._conn is not None
        pid = sender._conn.info.backend_pid
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        # The first send after the cut fails and is dropped; a later one goes out.
        deadline = time.monotonic() + 10
        job_id = 2
        while f"q:{job_id - 1}" not in listener.received or job_id == 2:
            assert time.monotonic() < deadline, f"no wake-up after the cut: {listener.received}"
            sender.wake("q", job_id)
            sender.flush(3)
            listener.drain(0.2)
            job_id += 1
        assert sender._conn is not None and sender._conn.info.backend_pid != pid
    finally:
        sender.close()


def test_a_script_that_enqueues_and_exits_still_wakes_the_worker(
    app: pgtasks.App, dsn: str, listener: Listener
) -> None:
    script = textwrap.dedent(
        f"""
        import pgtasks
        app = pgtasks.App("script", dsn={dsn!r})
        task = app.task(name="wake.script", queue="script")(lambda: None)
        print(task.delay().id)
        """
    )
    command = [sys.executable, "-c", script]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=60)
    job_id = int(out.stdout.strip())
    listener.wait_for(f"script:{job_id}")


def test_an_idle_worker_starts_a_delayed_job_without_polling(app: pgtasks.App) -> None:
    started = threading.Event()

    @app.task(name="wake.run", queue="wake")
    def run() -> None:
        started.set()

    worker = Worker(app, queues=["wake"], concurrency=1, poll_interval=30.0)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        listener = worker._listener
        assert listener is not None
        eventually(listener.connected.is_set, timeout=10, message="listener connected")
        time.sleep(0.2)  # past the worker's first full claim
        before = time.monotonic()
        run.delay()
        assert started.wait(5), "the job did not start within 5 s with a 30 s poll interval"
        assert time.monotonic() - before < 2.0
    finally:
        worker.request_stop()
        thread.join(10)
