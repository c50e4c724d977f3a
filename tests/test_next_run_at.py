"""job_next_run_at: when an idle worker's next job is due, at a cost that follows the
number of (tenant, priority) groups, not the number of queued jobs."""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pytest
from helpers import plan_nodes

import pgtasks
from pgtasks.worker.worker import NEXT_RUN_AT_MAX_GROUPS

PLAIN_MIN = """
SELECT min(run_at) FROM pgtasks.jobs WHERE status = 'queued' AND queue = ANY(%(queues)s::text[])
"""


def _next_run_at(app: pgtasks.App, queues: list[str], max_groups: int = NEXT_RUN_AT_MAX_GROUPS) -> Any:
    row = app.store.fetch_one(
        "job_next_run_at", {"queues": queues, "tasks": None, "now": None, "max_groups": max_groups}
    )
    assert row is not None, "the aggregate always returns one row"
    return row["run_at"]


@pytest.fixture
def mixed(app: pgtasks.App) -> pgtasks.App:
    """Future and due jobs in three queues, five tenants and three priorities; some cancelled."""

    @app.task(name="nra.noop")
    def noop() -> None:
        pass

    rng = random.Random(20261130)
    for i in range(90):
        result = noop.apply_async(
            queue=rng.choice(["a", "b", "c"]),
            tenant=f"t{rng.randrange(5)}",
            priority=rng.choice([-1, 0, 5]),
            countdown=rng.uniform(0, 3600),
        )
        if i % 7 == 0:
            assert result.revoke()  # cancelled jobs must not count
    return app


@pytest.mark.parametrize("queues", [["a"], ["b"], ["a", "c"], ["a", "b", "c"], ["a", "missing"]])
@pytest.mark.parametrize("max_groups", [1, 2, 7, NEXT_RUN_AT_MAX_GROUPS])
def test_matches_the_minimum_over_every_queued_job(
    mixed: pgtasks.App, conn: psycopg.Connection[Any], queues: list[str], max_groups: int
) -> None:
    expected = conn.execute(PLAIN_MIN, {"queues": queues}).fetchone()
    assert expected is not None and expected[0] is not None
    # A small bound takes the fallback, a large one the skip scan: both must agree.
    assert _next_run_at(mixed, queues, max_groups) == expected[0]


def test_no_queued_job_gives_none(mixed: pgtasks.App) -> None:
    assert _next_run_at(mixed, ["missing"]) is None


def test_a_deep_future_queue_costs_a_few_index_probes(
    app: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    @app.task(name="nra.later", queue="later")
    def later(n: int) -> None:
        pass

    for tenant in ("x", "y"):
        later.delay_many(list(range(10_000)), tenant=tenant, countdown=86_400)
    later.apply_async((0,), tenant="y", priority=3, countdown=60)  # the earliest job
    conn.execute("ANALYZE pgtasks.jobs")
    query = app.store.query("job_next_run_at")
    params = {"queues": ["later"], "tasks": None, "now": None, "max_groups": NEXT_RUN_AT_MAX_GROUPS}
    row = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}", params).fetchone()
    assert row is not None
    nodes = list(plan_nodes(row[0][0]["Plan"]))
    executed = [n for n in nodes if n.get("Actual Loops", 0) > 0]
    # (the rate windows, one row per rate key, are read whole: see job_next_run_at)
    jobs_scans = [n for n in executed if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs"]
    assert not jobs_scans, "the fallback scan ran"
    entries_read = sum(n["Actual Rows"] * n["Actual Loops"] for n in executed if "Index" in n["Node Type"])
    assert entries_read < 20, f"{entries_read} index entries read for 3 groups of 20,001 jobs"
    earliest = conn.execute(PLAIN_MIN, {"queues": ["later"]}).fetchone()
    assert earliest is not None
    assert _next_run_at(app, ["later"]) == earliest[0]
