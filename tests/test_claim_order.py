"""The claim returns jobs in the order they should start: fair turns, then priority."""

from __future__ import annotations

import dataclasses

import psycopg
import pytest

import pgtasks
from pgtasks.context import CLAIM_COLUMNS, Request, request_from_claim
from pgtasks.store import Row, text_array_literal


def _claim(app: pgtasks.App, limit: int, *, fair: bool) -> list[Row]:
    return app.store.fetch_all(
        "job_claim_batch",
        {
            "queues": ["default"],
            "start_tenant": "",
            "max_tenants": 100,
            "limit": limit,
            "now": None,
            "fair": fair,
            "worker_id": "w-order",
        },
    )


def test_fair_claim_interleaves_tenants_in_returned_order(app: pgtasks.App) -> None:
    @app.task(name="order.noop")
    def noop(i: int) -> int:
        return i

    noop.delay_many(range(10), tenant="a")
    noop.delay_many(range(2), tenant="b")
    rows = _claim(app, 6, fair=True)
    assert [r["tenant"] for r in rows] == ["a", "b", "a", "b", "a", "a"]
    assert [r["args"][0] for r in rows if r["tenant"] == "a"] == [0, 1, 2, 3]


def test_strict_claim_follows_priority_then_age(app: pgtasks.App) -> None:
    @app.task(name="order.prio")
    def prio(i: int) -> int:
        return i

    for i, priority in enumerate([0, 5, 1, 5, -3]):
        prio.apply_async((i,), priority=priority, tenant=f"t{i % 2}")
    rows = _claim(app, 5, fair=False)
    assert [r["args"][0] for r in rows] == [1, 3, 2, 0, 4]


def test_claim_columns_name_what_the_claim_returns(app: pgtasks.App) -> None:
    """The worker reads claimed rows by position: CLAIM_COLUMNS must match the query."""

    @app.task(name="order.cols")
    def cols(i: int) -> int:
        return i

    cols.apply_async((7,), tenant="t", priority=3, headers={"h": 1})
    rows = _claim(app, 1, fair=True)
    assert tuple(rows[0]) == CLAIM_COLUMNS
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
