"""A rolling deploy: a task of the new release runs on the new workers at once.

An old worker started with ``--unknown-tasks defer`` claims only the tasks it knows, so
it never takes (and never defers) a job of a task added by the new release; a worker
that knows the task claims the job as soon as it is due. Workers are real processes
(`apps.deploy_app`'s two releases); the tasks write the side ledger of `apps.worker_app`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps.deploy_app import NEW_SPEC, NEW_TASK, OLD_SPEC, make_new_app
from apps.worker_app import WorkerProcess, one, rows, worker_id_of
from helpers import eventually, plan_nodes
from psycopg import sql

import pgtasks
from pgtasks.db import text_array_literal
from pgtasks.worker.worker import NEXT_RUN_AT_MAX_GROUPS

OLD_ARGS = ["-c", "2", "--unknown-tasks", "defer", "--poll-interval", "0.1"]
NEW_ARGS = ["-c", "4", "--poll-interval", "0.1"]
REPETITIONS = 20
JOBS = 10
PLACEHOLDER = re.compile(r"%\((\w+)\)s")


@pytest.fixture
def new_client(wdsn: str) -> Iterator[pgtasks.App]:
    """The new release's app on the test database (it enqueues the new task's jobs)."""
    application = make_new_app(wdsn)
    yield application
    application.close()


def _start(dsn: str, spec: str, args: list[str], tmp_path: Path, name: str) -> WorkerProcess:
    return WorkerProcess(dsn, args, tmp_path / f"{name}.log", app_spec=spec)


def _jobs(conn: psycopg.Connection[Any], ids: list[int]) -> list[tuple[Any, ...]]:
    """(id, status, attempt, worker_id, run_at, row version) of the jobs, by id."""
    return rows(
        conn,
        "SELECT id, status, attempt, worker_id, run_at, xmin::text FROM pgtasks.jobs"
        " WHERE id = ANY(%s) ORDER BY id",
        (ids,),
    )


def _ran_on(conn: psycopg.Connection[Any], ids: list[int]) -> list[tuple[Any, ...]]:
    """(job id, attempt, worker pid) of every ledger row of the jobs."""
    return rows(
        conn,
        "SELECT job_id, attempt, worker_pid FROM public.ledger WHERE job_id = ANY(%s) ORDER BY id",
        (ids,),
    )


def _enqueue(app: pgtasks.App, first: int) -> list[int]:
    """Ten jobs of the new task: five one by one (a notification naming each job, claimed
    by id), five in one bulk call (a bare queue notification, the full claim)."""
    task = app.tasks[NEW_TASK]
    single = [task.delay(first + i).id for i in range(JOBS // 2)]
    bulk = [r.id for r in task.delay_many([first + i for i in range(JOBS // 2, JOBS)])]
    return [int(i) for i in single + bulk if i is not None]


def test_new_tasks_run_on_the_new_worker_at_once_in_repeated_deploys(
    new_client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    old = _start(wdsn, OLD_SPEC, OLD_ARGS, tmp_path, "old")
    new: WorkerProcess | None = None
    try:
        worker_id_of(conn, old.pid)  # the old worker first
        new = _start(wdsn, NEW_SPEC, NEW_ARGS, tmp_path, "new")
        new_id = worker_id_of(conn, new.pid)
        for repetition in range(REPETITIONS):
            ids = _enqueue(new_client, repetition * JOBS)
            assert len(ids) == JOBS
            began = time.monotonic()
            eventually(
                lambda ids=ids: all(j[1] == "succeeded" for j in _jobs(conn, ids)),  # type: ignore[misc]
                timeout=10,
                message=f"repetition {repetition}: every job succeeded ({_jobs(conn, ids)})",
            )
            assert time.monotonic() - began < 10
            assert {(j[1], j[2], j[3]) for j in _jobs(conn, ids)} == {("succeeded", 1, new_id)}
            assert sorted(_ran_on(conn, ids)) == [(i, 1, new.pid) for i in sorted(ids)]
        assert "deferring it" not in old.log()
    finally:
        old.kill()
        if new is not None:
            new.kill()


def test_an_old_worker_alone_leaves_new_tasks_untouched_until_a_new_one_starts(
    client: pgtasks.App, new_client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    old = _start(wdsn, OLD_SPEC, OLD_ARGS, tmp_path, "old")
    new: WorkerProcess | None = None
    try:
        worker_id_of(conn, old.pid)
        ids = _enqueue(new_client, 0)
        before = _jobs(conn, ids)
        # A job the old worker knows, due after the new ones: once it ran, the old
        # worker's claims have passed over them (same queue, tenant and priority).
        known = client.tasks["w.record"].delay(7)
        assert known.get(timeout=10) == 7
        # Never claimed, never deferred: the same row versions (no write at all), queued,
        # attempt 0, due when they were enqueued.
        assert _jobs(conn, ids) == before
        assert {(j[1], j[2], j[3]) for j in before} == {("queued", 0, None)}
        assert _ran_on(conn, ids) == []
        assert "deferring it" not in old.log()

        new = _start(wdsn, NEW_SPEC, NEW_ARGS, tmp_path, "new")
        new_id = worker_id_of(conn, new.pid)
        eventually(
            lambda: all(j[1] == "succeeded" for j in _jobs(conn, ids)),
            timeout=5,
            message=f"the new worker ran them ({_jobs(conn, ids)})",
        )
        assert {(j[2], j[3]) for j in _jobs(conn, ids)} == {(1, new_id)}
        assert sorted(_ran_on(conn, ids)) == [(i, 1, new.pid) for i in sorted(ids)]
    finally:
        old.kill()
        if new is not None:
            new.kill()


def test_claims_and_the_next_due_probe_see_only_the_named_tasks(
    app: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    """In the database: the claim, the claim by id and job_next_run_at with a task list
    pass over other tasks' jobs (due or not) and leave them as they were; None takes all."""
    store = app.stores.jobs
    queues, known = text_array_literal(["q"]), text_array_literal(["known"])

    def add(task: str, later: timedelta) -> int:
        row = conn.execute(
            "INSERT INTO pgtasks.jobs (task_name, queue, args, run_at)"
            " VALUES (%s, 'q', '[]', now() + %s) RETURNING id",
            (task, later),
        ).fetchone()
        assert row is not None
        return int(row[0])

    due_unknown = add("unknown", timedelta(seconds=-2))
    add("unknown", timedelta(seconds=5))
    known_later = add("known", timedelta(minutes=5))
    due_known = add("known", timedelta(seconds=-1))
    params: dict[str, Any] = {"queues": queues, "worker_id": "w-deploy"}

    run_at, now = store.next_run_at(queues=queues, tasks=known, max_groups=NEXT_RUN_AT_MAX_GROUPS)
    assert run_at is not None and run_at <= now  # the due known job
    for max_groups in (1, NEXT_RUN_AT_MAX_GROUPS):  # the skip scan and its fallback
        all_run_at, _ = store.next_run_at(queues=queues, max_groups=max_groups)
        assert all_run_at is not None and all_run_at < run_at  # the unknown job due first

    assert store.claim_ids(ids=[due_unknown, due_known], tasks=known, **params) != []
    assert store.claim_ids(ids=[due_unknown], tasks=known, **params) == []
    assert store.claim_batch(limit=10, max_tenants=100, fair=True, tasks=known, **params) == []

    # Only the known job due in five minutes is left for this worker; the unknown ones
    # are still queued and unclaimed, for a worker that knows them.
    for max_groups in (1, NEXT_RUN_AT_MAX_GROUPS):
        run_at, now = store.next_run_at(queues=queues, tasks=known, max_groups=max_groups)
        assert run_at is not None and timedelta(minutes=4) < run_at - now <= timedelta(minutes=5)
    states = rows(
        conn, "SELECT task_name, status, attempt FROM pgtasks.jobs WHERE id <> %s ORDER BY id", (known_later,)
    )
    assert states == [
        ("unknown", "queued", 0),
        ("unknown", "queued", 0),
        ("known", "running", 1),
    ]
    everything = store.claim_batch(limit=10, max_tenants=100, fair=True, **params)
    assert [r[0] for r in everything] == [due_unknown]


def test_jobs_of_other_tasks_ahead_keep_the_claims_index_path(dsn: str) -> None:
    """10,000 due jobs of a task this worker does not know sit at the head of the
    (tenant, priority) range, ahead of its own, in a table never analyzed: the claim,
    planned as the worker plans it (a generic plan), keeps its index paths and reads
    each of them once, without locking them (about one page per 30 of them)."""
    unknown = 10_000
    with psycopg.connect(dsn, autocommit=True) as session, psycopg.connect(dsn, autocommit=True) as other:
        session.execute(
            pgtasks.App("plans", dsn=dsn, load_entry_points=False).store.query("worker_session_setup")
        )
        session.execute("ALTER TABLE pgtasks.jobs SET (autovacuum_enabled = false)")
        fill = (
            "INSERT INTO pgtasks.jobs (task_name, queue, args, run_at)"
            " SELECT %s, 'bench', '[]', now() - %s * interval '1 second' FROM generate_series(1, %s)"
        )
        session.execute(fill, ("old.unknown", 10, unknown))
        session.execute(fill, ("bench", 5, 1_000))
        text = pgtasks.App("plans", dsn=dsn, load_entry_points=False).store.query("job_claim_batch")
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        session.execute(f"PREPARE claim AS {PLACEHOLDER.sub(number, text).replace('%%', '%')}")
        values = {
            "queues": "{bench}", "tasks": "{bench}", "start_tenant": "", "max_tenants": 100, "limit": 256,
            "now": None, "fair": True, "worker_id": "w-deploy",
        }  # fmt: skip
        args = sql.SQL(", ").join(sql.Literal(values[n]) for n in names)
        with session.transaction(force_rollback=True):
            row = session.execute(
                sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE claim ({})").format(args)
            ).fetchone()
            assert row is not None
            free = one(
                other,
                "SELECT count(*) FROM (SELECT 1 FROM pgtasks.jobs WHERE task_name = 'old.unknown'"
                " FOR UPDATE SKIP LOCKED) s",
            )
    plan: dict[str, Any] = row[0][0]["Plan"]
    assert plan["Actual Rows"] == 256
    nodes = list(plan_nodes(plan))
    scans = {(n["Node Type"], n.get("Index Name")) for n in nodes if n.get("Relation Name") == "jobs"}
    assert not {s for s in scans if s[0] in ("Seq Scan", "Bitmap Heap Scan")}, scans
    assert ("Index Scan", "jobs_claim_idx") in scans
    # Rows of the jobs table its scans passed over (filters on the claim's own CTEs, such
    # as the flow-control keys' look at the picked rows, read no table).
    passed = sum(
        n.get("Rows Removed by Filter", 0) * n["Actual Loops"]
        for n in plan_nodes(plan)
        if n.get("Relation Name") == "jobs"
    )
    assert passed == unknown  # each read once
    pages = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    assert pages <= 25 * 256 + unknown // 10, f"{pages} pages"
    assert free == unknown  # while the claim's transaction was open, none of them was locked
