"""The claim's plan does not depend on planner statistics.

A queue table rarely has fresh statistics: freshly deployed and never analyzed, or
analyzed by autovacuum while nearly empty and then handed a burst of jobs. Here the
statistics lie in each of those ways at several backlog sizes, and the statements the
worker runs on every batch (claim, claim by id, a job's outcome) are planned as the
worker plans them (generic plans of prepared statements, `worker_session_setup`) and
run under ``EXPLAIN (ANALYZE, BUFFERS)``: they must take the intended index paths and
read a bounded number of pages per claimed job. With the claim's write stated with a
constant status, the never-analyzed table at 20,000 jobs read 130 pages per claimed job
(every entry of jobs_claim_idx, once per id).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from helpers import plan_nodes
from psycopg import sql

import pgtasks

PLACEHOLDER = re.compile(r"%\((\w+)\)s")
LIMIT = 256
# Pages (shared hits and reads) per claimed job: about 12-16 on the intended paths (the row
# versions, the index entries the write adds, the claim index's due range); 130 when the
# write scanned the whole claim index for its ids.
MAX_PAGES_PER_JOB = 25
# Nodes that read a whole table or a whole range of an index. A bitmap of the primary key
# (the ids of job_claim_ids) is key lookups too; a bitmap of another index is not.
WHOLE_SCANS = frozenset({"Seq Scan", "Bitmap Index Scan"})
# Bitmaps that are key lookups: the ids of job_claim_ids, and the flow-control rows of the
# claimed jobs' keys (concurrency counters, their given-back slots, rate windows).
KEY_BITMAPS = frozenset(
    {"jobs_pkey", "concurrency_keys_pkey", "concurrency_releases_key_idx", "rate_windows_pkey"}
)

# How the statistics lie: never analyzed; analyzed while empty; analyzed holding ten
# jobs. And "analyzed" after the fill, the reference.
STATES = ("never analyzed", "analyzed empty", "analyzed with 10 rows", "analyzed")

FILL = """
INSERT INTO pgtasks.jobs (task_name, queue, tenant, args, kwargs, priority, max_attempts, run_at)
SELECT 'bench', 'bench', '', '[]',
       jsonb_build_object('k', 'job-' || i, 't', extract(epoch FROM now())),
       0, 1, now() - interval '1 second'
FROM generate_series(1, %(n)s) AS i
"""


def _prepare(conn: psycopg.Connection[Any], name: str, text: str) -> list[str]:
    """PREPARE a named query as ``name`` with $n parameters; returns the parameter names in order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    conn.execute(f"PREPARE {name} AS {PLACEHOLDER.sub(number, text).replace('%%', '%')}")
    return names


def _execute(name: str, names: list[str], values: dict[str, Any]) -> sql.Composed:
    """``EXECUTE name (...)`` of the prepared ``name``, its parameters taken from ``values``."""
    args = sql.SQL(", ").join(sql.Literal(values[n]) for n in names)
    return sql.SQL("EXECUTE {} ({})").format(sql.Identifier(name), args)


def _explain(
    conn: psycopg.Connection[Any], name: str, names: list[str], values: dict[str, Any]
) -> dict[str, Any]:
    """Run the prepared ``name`` under EXPLAIN (ANALYZE, BUFFERS) with its generic plan; its plan."""
    query = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}").format(_execute(name, names, values))
    row = conn.execute(query).fetchone()
    assert row is not None
    plan: dict[str, Any] = row[0][0]["Plan"]
    return plan


def _pages(plan: dict[str, Any]) -> int:
    return int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])


@pytest.fixture
def session(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection set up as a worker's (generic plans, no JIT), statements autocommitted."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            pgtasks.App("plans", dsn=dsn, load_entry_points=False).store.query("worker_session_setup")
        )
        yield conn


def _fill(conn: psycopg.Connection[Any], state: str, jobs: int) -> None:
    conn.execute("ALTER TABLE pgtasks.jobs SET (autovacuum_enabled = false)")
    if state == "analyzed empty":
        conn.execute("ANALYZE pgtasks.jobs")
    elif state == "analyzed with 10 rows":
        conn.execute(FILL, {"n": 10})
        conn.execute("ANALYZE pgtasks.jobs")
        jobs -= 10
    conn.execute(FILL, {"n": jobs})
    if state == "analyzed":
        conn.execute("ANALYZE pgtasks.jobs")


def _assert_key_paths(plan: dict[str, Any], what: str) -> None:
    nodes = list(plan_nodes(plan))
    whole = [
        (n["Node Type"], n.get("Index Name"))
        for n in nodes
        if n["Node Type"] in WHOLE_SCANS and n.get("Index Name") not in KEY_BITMAPS
    ]
    assert not whole, f"{what}: scans of a whole range instead of key lookups: {whole}"
    sorts = [n for n in nodes if n["Node Type"] == "Sort" and n["Actual Rows"] > LIMIT]
    assert not sorts, f"{what}: sorted {[n['Actual Rows'] for n in sorts]} rows for {LIMIT} jobs"
    # The write finds the claimed rows by their primary key.
    write = next(n for n in nodes if n["Node Type"] == "ModifyTable" and n.get("Relation Name") == "jobs")
    targets = [n for n in plan_nodes(write) if n.get("Relation Name") == "jobs" and n is not write]
    assert targets and all(
        n.get("Index Name") == "jobs_pkey" and "Bitmap" not in n["Node Type"] for n in targets
    ), f"{what}: the write reads {[(n['Node Type'], n.get('Index Name')) for n in targets]}"
    read = sum(n["Actual Rows"] * n["Actual Loops"] for n in targets)
    assert read <= LIMIT, f"{what}: the write read {read} rows for {LIMIT} jobs"


@pytest.mark.parametrize("jobs", [5_000, 20_000, 100_000])
@pytest.mark.parametrize("state", STATES)
def test_claims_take_the_index_paths_whatever_the_statistics_say(
    app: pgtasks.App, session: psycopg.Connection[Any], state: str, jobs: int
) -> None:
    _fill(session, state, jobs)
    values = {
        "queues": "{bench}", "start_tenant": "", "max_tenants": 100, "limit": LIMIT, "now": None,
        "fair": True, "worker_id": "w-plans", "tasks": None,
        "ids": "{" + ",".join(str(i) for i in range(1, LIMIT + 1)) + "}",
    }  # fmt: skip
    for query in ("job_claim_batch", "job_claim_ids"):
        names = _prepare(session, query, app.store.query(query))
        with session.transaction(force_rollback=True):
            plan = _explain(session, query, names, values)
        assert plan["Actual Rows"] == LIMIT, f"{query}: claimed {plan['Actual Rows']}"
        _assert_key_paths(plan, f"{query}, {state}, {jobs} jobs")
        pages = _pages(plan)
        assert pages <= MAX_PAGES_PER_JOB * LIMIT, (
            f"{query}, {state}, {jobs} jobs: {pages / LIMIT:.1f} pages per claimed job"
        )


def _first_run(conn: psycopg.Connection[Any], name: str, names: list[str], values: dict[str, Any]) -> None:
    """Run the prepared ``name`` once and roll it back: PostgreSQL makes its generic plan
    now, from the table as it is, and keeps it for the session."""
    with conn.transaction(force_rollback=True):
        conn.execute(_execute(name, names, values))


@pytest.mark.parametrize("jobs", [20_000, 100_000])
def test_statements_planned_on_an_empty_queue_keep_their_key_paths_after_a_burst(
    app: pgtasks.App, session: psycopg.Connection[Any], jobs: int
) -> None:
    """A worker started on an empty queue plans its statements then (a generic plan is
    made at a statement's first run on a connection and kept). The table then looks empty
    whatever its statistics, and a sequential scan is the cheapest way to read it: the
    claim's write scanned every job once per claimed id (20,000 jobs: 700 ms a claim
    instead of 4). After a burst the plans must still be key lookups."""
    session.execute("ALTER TABLE pgtasks.jobs SET (autovacuum_enabled = false)")
    values = {
        "queues": "{bench}", "start_tenant": "", "max_tenants": 100, "limit": LIMIT, "now": None,
        "fair": True, "worker_id": "w-plans", "tasks": None,
        "ids": "{" + ",".join(str(i) for i in range(1, LIMIT + 1)) + "}",
    }  # fmt: skip
    claims = {
        query: _prepare(session, query, app.store.query(query))
        for query in ("job_claim_batch", "job_claim_ids")
    }
    marks = _prepare(session, "job_mark_started", app.store.query("job_mark_started"))
    starts = {"ids": values["ids"], "starts": "{" + ",".join(["1.5"] * LIMIT) + "}", "worker_id": "w-plans"}
    for query, names in claims.items():
        _first_run(session, query, names, values)
    _first_run(session, "job_mark_started", marks, starts)
    session.execute(FILL, {"n": jobs})
    for query, names in claims.items():
        with session.transaction(force_rollback=True):
            plan = _explain(session, query, names, values)
            if query == "job_claim_ids":  # the jobs it claimed start: their starts are written
                marked = _explain(session, "job_mark_started", marks, starts)
        assert plan["Actual Rows"] == LIMIT, f"{query}: claimed {plan['Actual Rows']}"
        _assert_key_paths(plan, f"{query}, planned on an empty queue, {jobs} jobs")
        assert _pages(plan) <= MAX_PAGES_PER_JOB * LIMIT, f"{query}: {_pages(plan) / LIMIT:.1f} pages per job"
    assert marked["Actual Rows"] == LIMIT
    scans = [n for n in plan_nodes(marked) if n.get("Relation Name") == "jobs" and n is not marked]
    assert [(n["Node Type"], n.get("Index Name")) for n in scans] == [("Index Scan", "jobs_pkey")], scans
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in scans) == LIMIT


@pytest.mark.parametrize("state", STATES)
def test_outcomes_find_the_job_by_its_key_whatever_the_statistics_say(
    app: pgtasks.App, session: psycopg.Connection[Any], state: str
) -> None:
    """A job's outcome and progress look it up by primary key, not among every job the
    worker holds (which stale statistics made look cheaper)."""
    _fill(session, state, 20_000)
    claimed = app.store.fetch_all(
        "job_claim_batch",
        {"queues": "{bench}", "start_tenant": "", "max_tenants": 100, "limit": 1024, "now": None,
         "fair": True, "worker_id": "w-plans", "tasks": None},
    )  # fmt: skip
    assert len(claimed) == 1024
    job_id = claimed[0]["id"]
    values = {
        "id": job_id, "worker_id": "w-plans", "status": "failed", "error": "{}", "result": None, "now": None,
        "delay": 1.0, "max_attempts": 1, "progress": '{"done": 1}', "started": None, "attempt": 1,
    }  # fmt: skip
    # job_retry_batch takes one entry per job in parallel arrays (here one job).
    batch = {
        "ids": [job_id], "delays": [1.0], "max_attempts": [1], "errors": "[{}]", "starts": [None],
        "attempts": [1],
    }  # fmt: skip
    for query in ("job_finish", "job_retry_batch", "job_report_progress"):
        names = _prepare(session, query, app.store.query(query))
        with session.transaction(force_rollback=True):
            plan = _explain(
                session, query, names, {**values, **batch} if query == "job_retry_batch" else values
            )
        assert plan["Actual Rows"] == 1, f"{query}: wrote {plan['Actual Rows']} rows"
        scans = [n for n in plan_nodes(plan) if n.get("Relation Name") == "jobs" and n is not plan]
        assert [n.get("Index Name") for n in scans] == ["jobs_pkey"], (
            f"{query}, {state}: {[(n['Node Type'], n.get('Index Name')) for n in scans]}"
        )


def test_a_drained_queue_head_is_walked_once_per_claim(
    app: pgtasks.App, session: psycopg.Connection[Any]
) -> None:
    """The entries a drain leaves at the head of the claim index (finished jobs, until
    VACUUM removes them) are walked by the tenant probe that finds the first queued job;
    the claim's per-tenant scan starts at that job instead of walking them again. Each
    walk costs a claim one page per ~160 finished jobs, so a second one grew the claim's
    cost with every job the queue had run since its last vacuum."""
    drained = 100_000
    _fill(session, "never analyzed", drained + 2 * LIMIT)
    session.execute(
        "UPDATE pgtasks.jobs SET status = 'succeeded', finished_at = now() WHERE id <= %s", (drained,)
    )
    values = {
        "queues": "{bench}", "start_tenant": "", "max_tenants": 100, "limit": LIMIT, "now": None,
        "fair": True, "worker_id": "w-plans", "tasks": None,
    }  # fmt: skip
    names = _prepare(session, "job_claim_batch", app.store.query("job_claim_batch"))
    with session.transaction(force_rollback=True):
        plan = _explain(session, "job_claim_batch", names, values)
    assert plan["Actual Rows"] == LIMIT
    scans = [n for n in plan_nodes(plan) if n.get("Index Name") == "jobs_claim_idx"]
    walks = sorted((_pages(n) for n in scans), reverse=True)
    # The test can fail: the head holds many more pages than a claim of LIMIT jobs reads.
    assert walks[0] > 2 * LIMIT, f"the drained head was not walked at all: {walks}"
    assert sum(walks[1:]) <= 2 * LIMIT, f"the drained head was walked again: pages per scan {walks}"
