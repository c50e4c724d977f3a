"""Pruning of flow-control state (`pgtasks.maintenance.FlowPrune`, ``flow_state_prune``).

Idle concurrency counters and recharged rate windows are deleted; a counter a job holds,
one with a release waiting, one whose key lock another transaction holds, and a window
still within its period are kept. A claim never waits on a pass, and the per-key limit
holds across passes: an in-process worker runs keyed jobs in rounds while a pruner
races it, and the side ledger the tasks write counts what ran at once.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from apps.worker_app import one, rows
from helpers import assert_all_ran_within_key_limit, eventually, in_process_worker

import pgtasks
from pgtasks.db.flow import FlowStore
from pgtasks.errors import ConfigurationError
from pgtasks.maintenance import FlowPrune, FlowPruneConfig, FlowPruneResult
from pgtasks.sql import QUERIES
from pgtasks.worker import Worker

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
KEY_LOCK = "SELECT pg_advisory_xact_lock(1885828195, hashtext(%s))"


def _keys(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in rows(conn, "SELECT key FROM pgtasks.concurrency_keys ORDER BY key")]


def _windows(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in rows(conn, "SELECT key FROM pgtasks.rate_windows ORDER BY key")]


def _pruner(app: pgtasks.App, *, now: dt.datetime | None = None, **config: Any) -> FlowPrune:
    return FlowPrune(FlowStore(app.stores.database), FlowPruneConfig(**config), now=now)


def _pruned(pruner: FlowPrune, conn: psycopg.Connection[Any]) -> bool:
    """Run a pass; whether no counter is left (the racing pruner may have taken them)."""
    pruner.run_once()
    return _keys(conn) == []


def _claim(app: pgtasks.App) -> list[Any]:
    return list(
        app.stores.jobs.claim_batch(queues="{default}", worker_id="w1", limit=5, max_tenants=5, fair=True)
    )


def test_idle_counters_go_and_held_ones_stay(app: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    """'released': its job ended while a claim held the key, so the slot came back as a
    release row no claim has folded in yet: counter less releases is 0, so it goes, with
    its release row (else a key whose last job ended so would be kept for ever).
    'partly': 2 slots, 1 given back: one still held. 'locked': its lock held elsewhere."""
    conn.execute(
        "INSERT INTO pgtasks.concurrency_keys (key, running) VALUES"
        " ('idle-1', 0), ('idle-2', 0), ('busy', 2), ('released', 1), ('partly', 2), ('locked', 0)"
    )
    conn.execute("INSERT INTO pgtasks.concurrency_releases (key) VALUES ('released'), ('partly')")
    pruner = _pruner(app)
    with psycopg.connect(app.stores.database.dsn) as other:  # a claim holding 'locked'
        other.execute(KEY_LOCK, ("locked",))
        result = pruner.run_once()
        assert result == FlowPruneResult(concurrency_keys=3, concurrency_releases=1, batches=1)
        assert _keys(conn) == ["busy", "locked", "partly"]
    assert rows(conn, "SELECT key FROM pgtasks.concurrency_releases") == [("partly",)]
    # Committed: the key's lock is free, so its counter goes now.
    assert pruner.run_once().concurrency_keys == 1
    assert _keys(conn) == ["busy", "partly"]
    # The other job of 'partly' ends the same way: now it goes too.
    conn.execute("INSERT INTO pgtasks.concurrency_releases (key) VALUES ('partly')")
    assert pruner.run_once() == FlowPruneResult(concurrency_keys=1, concurrency_releases=2, batches=1)
    assert _keys(conn) == ["busy"]
    assert one(conn, "SELECT count(*) FROM pgtasks.concurrency_releases") == 0


def test_a_counter_of_a_running_job_stays_even_at_zero(
    app: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    """A counter that says 0 while a job of its key runs (drift) is kept: deleted, the
    job's end would leave a release row that a later counter would wrongly subtract."""

    @app.task(name="p.keyed", concurrency_key="agent", concurrency_limit=1)
    def keyed(agent: str) -> None: ...

    keyed.delay("h1")
    claimed = app.stores.jobs.claim_batch(
        queues="{default}", worker_id="w1", limit=5, max_tenants=5, fair=True
    )
    assert len(claimed) == 1
    conn.execute("UPDATE pgtasks.concurrency_keys SET running = 0")
    assert _pruner(app).run_once().concurrency_keys == 0
    assert _keys(conn) == ["agent=h1"]


def test_recharged_rate_windows_go_and_recent_ones_stay(
    app: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    """Pinned time: a window goes once its next start is max(1 hour, period) old."""
    for key, period, age in (
        ("minute-recent", 60.0, dt.timedelta(minutes=30)),  # within the hour
        ("minute-old", 60.0, dt.timedelta(hours=2)),
        ("day-recent", 86400.0, dt.timedelta(hours=20)),  # within its period
        ("day-old", 86400.0, dt.timedelta(hours=25)),
        ("future", 1.0, -dt.timedelta(seconds=5)),  # its next start still to come
    ):
        next_at = NOW - age
        conn.execute(
            "INSERT INTO pgtasks.rate_windows (key, lim, period, window_start, taken, next_at)"
            " VALUES (%s, 10, %s, %s, 10, %s)",
            (key, period, next_at - dt.timedelta(seconds=period), next_at),
        )
    result = _pruner(app, now=NOW).run_once()
    assert (result.rate_windows, result.concurrency_keys) == (2, 0)
    assert _windows(conn) == ["day-recent", "future", "minute-recent"]
    assert _pruner(app, now=NOW + dt.timedelta(days=1)).run_once().rate_windows == 3
    assert _windows(conn) == []


def test_rows_locked_elsewhere_are_skipped_not_waited_for(
    app: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("INSERT INTO pgtasks.concurrency_keys (key, running) VALUES ('a', 0), ('b', 0)")
    conn.execute(
        "INSERT INTO pgtasks.rate_windows (key, lim, period, window_start, taken, next_at)"
        " VALUES ('r', 1, 1, %s, 1, %s), ('s', 1, 1, %s, 1, %s)",
        (NOW, NOW, NOW, NOW),
    )
    pruner = _pruner(app, now=NOW + dt.timedelta(hours=2))
    with psycopg.connect(app.stores.database.dsn) as other:
        other.execute("SET LOCAL lock_timeout = '20s'")
        other.execute("SELECT 1 FROM pgtasks.concurrency_keys WHERE key = 'a' FOR UPDATE")
        other.execute("SELECT 1 FROM pgtasks.rate_windows WHERE key = 'r' FOR UPDATE")
        started = time.monotonic()
        result = pruner.run_once()
        assert time.monotonic() - started < 5
        assert (result.concurrency_keys, result.rate_windows) == (1, 1)
        assert (_keys(conn), _windows(conn)) == (["a"], ["r"])
    assert pruner.run_once() == FlowPruneResult(concurrency_keys=1, rate_windows=1, batches=1)


def test_a_counter_written_since_the_snapshot_is_kept(
    app: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    """The version check. The statement, slowed down between its snapshot and its lock
    try, sees key k idle (counter 1, one release row); meanwhile a claim folds the
    release, takes a slot and commits, leaving the lock free. Re-checking the newest
    counter (1) against the snapshot's release row would delete the counter of a key
    with a running job; comparing versions keeps it."""
    conn.execute("INSERT INTO pgtasks.concurrency_keys (key, running) VALUES ('k', 1)")
    conn.execute("INSERT INTO pgtasks.concurrency_releases (key) VALUES ('k')")
    text = QUERIES["flow_state_prune"]
    try_lock = "WHERE pg_try_advisory_xact_lock(1885828195"
    assert text.count(try_lock) == 1
    slowed = text.replace(
        try_lock, "WHERE (SELECT 1 FROM pg_sleep(1.5)) = 1 AND pg_try_advisory_xact_lock(1885828195"
    )
    found: list[tuple[Any, ...]] = []

    def prune() -> None:
        with psycopg.connect(app.stores.database.dsn, autocommit=True) as pruner:
            found.extend(pruner.execute(slowed, {"key_limit": 10, "limit": 10, "now": None}).fetchall())

    thread = threading.Thread(target=prune)
    thread.start()
    eventually(
        lambda: one(conn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"),
        message="the statement is past its snapshot",
    )
    with psycopg.connect(app.stores.database.dsn) as claim:
        claim.execute(KEY_LOCK, ("k",))
        claim.execute("DELETE FROM pgtasks.concurrency_releases WHERE key = 'k'")
        claim.execute("UPDATE pgtasks.concurrency_keys SET running = 1, granted = 1 WHERE key = 'k'")
    thread.join(30)
    assert found == [(1, 0, 0, 0)]  # found idle in its snapshot, not deleted
    assert rows(conn, "SELECT key, running FROM pgtasks.concurrency_keys") == [("k", 1)]


def test_a_pass_loops_batches_until_one_comes_back_short(
    app: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("INSERT INTO pgtasks.concurrency_keys (key) SELECT 'k' || i FROM generate_series(1, 25) i")
    result = _pruner(app, key_batch=10, batch=10, pause=0).run_once()
    assert result == FlowPruneResult(concurrency_keys=25, batches=3)
    assert _keys(conn) == []


def test_a_claim_does_not_wait_for_a_counter_being_deleted(
    app: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    """A claim that sees a counter (or window) a pass is deleting passes over its key,
    where INSERT ... ON CONFLICT would wait for the pass to commit."""

    @app.task(name="p.both", concurrency_key="agent", concurrency_limit=1, rate_limit="1000/s")
    def both(agent: str) -> None: ...

    conn.execute("INSERT INTO pgtasks.concurrency_keys (key, running) VALUES ('agent=h1', 0)")
    both.delay("h1")
    with psycopg.connect(app.stores.database.dsn) as other:  # the pass, not yet committed
        other.execute(KEY_LOCK, ("agent=h1",))
        other.execute("DELETE FROM pgtasks.concurrency_keys WHERE key = 'agent=h1'")
        assert _claim_within(app, 5) == []
    assert len(eventually(lambda: _claim(app), message="a claim after the pass")) == 1
    assert one(conn, "SELECT running FROM pgtasks.concurrency_keys WHERE key = 'agent=h1'") == 1
    # The same for a rate window being deleted.
    both.delay("h2")
    with psycopg.connect(app.stores.database.dsn) as other:
        other.execute("DELETE FROM pgtasks.rate_windows")
        assert _claim_within(app, 5) == []
    assert len(eventually(lambda: _claim(app), message="a claim after the pass")) == 1


def _claim_within(app: pgtasks.App, seconds: float) -> list[Any] | None:
    """A claim in a thread; what it claimed, or None if it did not return in time (it
    is then left to finish once the caller's transaction ends)."""
    got: list[list[Any]] = []
    thread = threading.Thread(target=lambda: got.append(_claim(app)), daemon=True)
    thread.start()
    thread.join(seconds)
    return got[0] if got else None


def test_bad_config_is_refused() -> None:
    for bad in (
        {"interval": 0},
        {"interval": True},
        {"batch": 0},
        {"batch": 100_001},
        {"key_batch": 5001},
        {"key_batch": 1.5},
        {"pause": -1},
    ):
        with pytest.raises(ConfigurationError, match="flow prune"):
            FlowPruneConfig(**bad)
    assert FlowPruneConfig() == FlowPruneConfig(interval=300.0, batch=10_000, key_batch=1000, pause=0.05)


@pytest.fixture
def running(client: pgtasks.App) -> Iterator[Worker]:
    """An in-process worker (threads pool) on the test app, until the test ends."""
    with in_process_worker(client, concurrency=12) as worker:
        yield worker


def test_the_limit_holds_across_prunes(
    client: pgtasks.App, running: Worker, conn: psycopg.Connection[Any]
) -> None:
    """Three rounds of 48 jobs over 3 keys (limit 3) on 12 threads (so the worker always
    wants more of a key than its limit), a pruner racing the worker all along and a pass
    between rounds that deletes every key's counter: never four of a key at once, every
    job succeeds, and nothing is left to prune or fold in."""
    keyed = client.tasks["w.keyed"]
    racer = _pruner(client, interval=0.005, pause=0)
    between = _pruner(client)
    racer.start()
    try:
        for _ in range(3):
            keyed.delay_many([(f"k{i % 3}", 0.05) for i in range(48)])
            eventually(
                lambda: one(conn, "SELECT count(*) FROM pgtasks.jobs WHERE status <> 'succeeded'") == 0,
                timeout=60,
                message="the round finished",
            )
            eventually(lambda: _pruned(between, conn), timeout=10, message="every counter pruned")
    finally:
        racer.stop()
    assert racer.ticks > 10
    assert_all_ran_within_key_limit(conn, jobs=144, limit=3)
    assert one(conn, "SELECT count(*) FROM pgtasks.concurrency_releases") == 0
