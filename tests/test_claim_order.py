"""The claim returns jobs in the order they should start: fair turns, then priority."""

from __future__ import annotations

import pgtasks


def _claim(app: pgtasks.App, limit: int, *, fair: bool) -> list[dict[str, object]]:
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
