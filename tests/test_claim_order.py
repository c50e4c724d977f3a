"""The claim returns jobs in the order they should start: fair turns, then priority."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from helpers import plan_nodes

import pgtasks
from pgtasks.context import CLAIM_COLUMNS, Request, request_from_claim
from pgtasks.db import Row, text_array_literal


def _params(limit: int, *, fair: bool, now: Any = None, queue: str = "default") -> dict[str, Any]:
    return {
        "queues": [queue],
        "start_tenant": "",
        "max_tenants": 100,
        "limit": limit,
        "now": now,
        "fair": fair,
        "worker_id": "w-order",
        "tasks": None,
    }


def _claim(app: pgtasks.App, limit: int, *, fair: bool, now: Any = None) -> list[Row]:
    return app.store.fetch_all("job_claim_batch", _params(limit, fair=fair, now=now))


def test_fair_claim_interleaves_tenants_in_returned_order(app: pgtasks.App) -> None:
    @app.task(name="order.noop")
    def noop(i: int) -> int:
        return i

    noop.delay_many(range(10), tenant="a")
    noop.delay_many(range(2), tenant="b")
    rows = _claim(app, 6, fair=True)
    # Each tenant's share of the limit: 6 / 2 tenants. b has only 2, so the claim is short,
    # and says so: a gave its whole share.
    assert [r["tenant"] for r in rows] == ["a", "b", "a", "b", "a"]
    assert [r["args"][0] for r in rows if r["tenant"] == "a"] == [0, 1, 2]
    assert {r["tenant_share"] for r in rows} == {3}
    # With b's jobs running, a is the only tenant left: its share is the whole limit.
    rows = _claim(app, 6, fair=True)
    assert [r["args"][0] for r in rows] == [3, 4, 5, 6, 7, 8]
    assert {r["tenant_share"] for r in rows} == {6}


def test_strict_claim_follows_priority_then_age(app: pgtasks.App) -> None:
    @app.task(name="order.prio")
    def prio(i: int) -> int:
        return i

    for i, priority in enumerate([0, 5, 1, 5, -3]):
        prio.apply_async((i,), priority=priority, tenant=f"t{i % 2}")
    rows = _claim(app, 5, fair=False)
    assert [r["args"][0] for r in rows] == [1, 3, 2, 0, 4]
    assert {r["tenant_share"] for r in rows} == {5}  # strict order: any tenant may fill the limit


@pytest.mark.parametrize("fair", [True, False])
@pytest.mark.parametrize("limit", [1, 5, 40, 500])
def test_claim_takes_due_jobs_between_future_ones_in_order(
    app: pgtasks.App, conn: psycopg.Connection[Any], fair: bool, limit: int
) -> None:
    """Due and future jobs mixed in every (tenant, priority): the claim takes exactly the
    due ones, each tenant's up to its share of the limit, in the order a plain sort of them
    gives."""

    @app.task(name="order.mixed")
    def mixed(i: int) -> int:
        return i

    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    base = row[0]
    rng = random.Random(limit * 2 + fair)
    for i in range(300):
        mixed.apply_async(
            (i,),
            tenant=rng.choice(["a", "b", "c"]),
            priority=rng.choice([-2, 0, 3, 7]),
            eta=base + timedelta(seconds=rng.choice([-50, -5, 0, 5, 50]) + i / 1000),
        )
    now = base + timedelta(seconds=1)
    jobs = conn.execute(
        "SELECT id, tenant, priority, run_at FROM pgtasks.jobs WHERE run_at <= %s", (now,)
    ).fetchall()
    by_tenant: dict[str, list[tuple[int, int, Any]]] = {}
    for job_id, tenant, priority, run_at in sorted(jobs, key=lambda j: (-j[2], j[3], j[0])):
        by_tenant.setdefault(tenant, []).append((job_id, priority, run_at))
    # A fair claim's share per tenant: the limit over the tenants whose first job (highest
    # priority, then earliest) is due.
    first_due = conn.execute(
        "SELECT count(*) FROM (SELECT DISTINCT ON (tenant) run_at FROM pgtasks.jobs"
        " ORDER BY tenant, priority DESC, run_at) f WHERE run_at <= %s",
        (now,),
    ).fetchone()
    assert first_due is not None
    share = -(-limit // max(1, first_due[0])) if fair else limit
    ranked = [
        (turn if fair else 0, -priority, run_at, job_id)
        for tenant_jobs in by_tenant.values()
        for turn, (job_id, priority, run_at) in enumerate(tenant_jobs[:share])
    ]
    expected = [job_id for *_, job_id in sorted(ranked)[:limit]]
    rows = _claim(app, limit, fair=fair, now=now)
    assert [r["id"] for r in rows] == expected
    assert {r["tenant_share"] for r in rows} == {share}
    assert conn.execute("SELECT count(*) FROM pgtasks.jobs WHERE status = 'running'").fetchone() == (
        len(expected),
    )


def test_jobs_due_later_cost_the_claim_no_index_reads(app: pgtasks.App, dsn: str) -> None:
    """A claim reads each (tenant, priority) range of the claim index up to its first job
    due later: the 40,000 jobs due later here add none of their pages to the read."""

    @app.task(name="order.deep", queue="deep")
    def deep(i: int) -> int:
        return i

    deep.delay_many(list(range(20_000)), tenant="x", countdown=86_400)
    deep.delay_many(list(range(5)), tenant="x")
    deep.delay_many(list(range(3)), tenant="x", priority=-1)
    deep.delay_many(list(range(20_000)), tenant="y", priority=2, countdown=86_400)
    deep.delay_many(list(range(4)), tenant="y", priority=2)
    with psycopg.connect(dsn) as conn:
        conn.execute("ANALYZE pgtasks.jobs")
        query = app.store.query("job_claim_batch")
        row = conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {query}", _params(256, fair=True, queue="deep")
        ).fetchone()
        assert row is not None
        claimed = conn.execute("SELECT count(*) FROM pgtasks.jobs WHERE status = 'running'").fetchone()
        conn.rollback()
    assert claimed == (12,)
    scans = [n for n in plan_nodes(row[0][0]["Plan"]) if n.get("Index Name") == "jobs_claim_idx"]
    assert scans, "the claim did not use the claim index"
    pages = sum(n["Shared Hit Blocks"] + n["Shared Read Blocks"] for n in scans)
    # Reading the 40,000 future entries takes over 200 leaf pages; the due ranges take a few.
    assert pages < 60, f"{pages} pages of the claim index read for 12 due jobs"


def test_claim_columns_name_what_the_claim_returns(app: pgtasks.App) -> None:
    """The worker reads claimed rows by position: CLAIM_COLUMNS must match the query."""

    @app.task(name="order.cols")
    def cols(i: int) -> int:
        return i

    cols.apply_async((7,), tenant="t", priority=3, headers={"h": 1})
    rows = _claim(app, 1, fair=True)
    assert tuple(rows[0]) == (*CLAIM_COLUMNS, "due", "tenant_share", "keyed")
    # The claim by id returns the same columns, so the worker reads both alike.
    by_id = cols.apply_async((8,))
    named = app.store.fetch_all(
        "job_claim_ids",
        {"ids": [by_id.id], "queues": "{default}", "tasks": None, "now": None, "worker_id": "w-order"},
    )
    assert tuple(named[0]) == tuple(rows[0])
    assert (*CLAIM_COLUMNS, "worker_id") == tuple(f.name for f in dataclasses.fields(Request))
    values = tuple(rows[0].values())
    request = request_from_claim(values, "w-order")
    assert request == Request(
        id=rows[0]["id"],
        task_name="order.cols",
        attempt=1,
        max_attempts=rows[0]["max_attempts"],
        trigger="api",
        args=(7,),
        kwargs={},
        queue="default",
        tenant="t",
        priority=3,
        headers={"h": 1},
        worker_id="w-order",
    )


@pytest.mark.parametrize(
    "queues",
    [
        ["default"],
        ['say "hi"', "back\\slash", "a,b", "{braces}", "NULL", " spaced ", "ünï", ""],
    ],
)
def test_text_array_literal_round_trips_through_postgres(
    conn: psycopg.Connection[tuple[object, ...]], queues: list[str]
) -> None:
    row = conn.execute("SELECT %s::text[]", (text_array_literal(queues),)).fetchone()
    assert row is not None and row[0] == queues


def test_a_lock_key_started_after_the_claim_began_is_not_taken_again(app: pgtasks.App, dsn: str) -> None:
    """A claim's statement snapshot cannot see a job of its lock key that another claim
    started and committed after the statement began (that claim's advisory lock is gone
    by then): read there, the key looks free, and the claim's write then collides with
    the running job on jobs_lock_running_idx, or deadlocks with its success. The claim
    asks `pgtasks.lock_key_free`, which reads after it holds the key's advisory lock.
    Here a statement starts, sleeps while another session claims a job of the key, then
    reads both ways."""

    @app.task(name="order.locked")
    def locked(i: int) -> int:
        return i

    locked.delay_many(range(2), lock="mailbox-7")
    found: dict[str, Any] = {}

    def late_reader() -> None:
        with psycopg.connect(dsn, autocommit=True) as reader:
            found["pid"] = reader.info.backend_pid
            found["row"] = reader.execute(
                "SELECT pg_sleep(1) IS NULL,"
                " NOT EXISTS (SELECT 1 FROM pgtasks.jobs r"
                "             WHERE r.lock_key = 'mailbox-7' AND r.status = 'running'),"
                " pgtasks.lock_key_free('mailbox-7')"
            ).fetchone()

    thread = threading.Thread(target=late_reader)
    thread.start()
    with psycopg.connect(dsn, autocommit=True) as watcher:
        deadline = time.monotonic() + 10
        while not watcher.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event = 'PgSleep'", (found.get("pid"),)
        ).fetchone():
            assert time.monotonic() < deadline, "the reader's statement never started"
            time.sleep(0.01)
        assert len(_claim(app, 2, fair=True)) == 1  # one job per lock key, committed now
    thread.join(10)
    assert found["row"] is not None
    _, free_in_snapshot, free_now = found["row"]
    # The statement's own snapshot still shows the key free: the race is real here.
    assert free_in_snapshot is True
    assert free_now is False
    # And a claim that starts now passes over the key's second job.
    assert _claim(app, 2, fair=True) == []
