"""Flow control in the claim (docs/flow-control.md), proven with real worker processes.

Concurrency keys: at most N running jobs per key across the fleet, with no overshoot
under concurrent claims; the side ledger the tasks write (`apps.worker_app`) holds each
attempt's start and end on the database clock, so overlaps are counted independently
of pgtasks' own counters. Rate limits: starts per window, and a job over the limit
starts when its window ends, not a poll interval later. Tenant weights: completed
shares follow the weights. Explain: each new reason in the situation that produces it.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps.worker_app import one, rows, workers
from helpers import assert_all_ran_within_key_limit, eventually, most_of_a_key_at_once
from test_rls import roles, setup  # noqa: F401 - fixtures of the row-level security test

import pgtasks
from pgtasks.errors import ConfigurationError
from pgtasks.records import ReasonCode


def _fleet(n: int = 3, *extra: str) -> list[list[str]]:
    return [["-c", "4", "--burst", "--poll-interval", "0.5", *extra] for _ in range(n)]


# -- concurrency keys ---------------------------------------------------------------------------


@pytest.mark.slow
def test_three_workers_never_run_more_than_three_jobs_of_a_key(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    """1,000 jobs over 50 keys, limit 3, enqueued key by key (so a claim would like to take a
    dozen jobs of one key at once): the ledger never shows four of a key at once."""
    keyed = client.tasks["w.keyed"]
    ids = [r.id for r in keyed.delay_many([(f"k{i // 20:02d}", 0.01) for i in range(1000)])]
    assert len(ids) == 1000
    with workers(wdsn, tmp_path, *_fleet()) as ws:
        codes = [w.wait(180) for w in ws]
    assert codes == [0, 0, 0], [w.log()[-2000:] for w in ws]
    assert_all_ran_within_key_limit(conn, jobs=1000, limit=3)
    # Every slot was given back: the counters, less the slots waiting to be folded in, are 0.
    assert (
        one(
            conn,
            "SELECT coalesce(sum(running), 0) - (SELECT count(*) FROM pgtasks.concurrency_releases)"
            " FROM pgtasks.concurrency_keys",
        )
        == 0
    )


@pytest.mark.slow
def test_a_limit_of_one_runs_the_jobs_of_a_key_one_at_a_time(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    """N = 1, given per enqueue (over the task's 3), on 3 keys: never two of a key at once,
    and the keys run side by side (the backlog of a busy key does not block the others)."""
    keyed = client.tasks["w.keyed"]
    for i in range(60):
        keyed.apply_async((f"one{i % 3}", 0.02), concurrency_key=f"key=one{i % 3}", concurrency_limit=1)
    with workers(wdsn, tmp_path, *_fleet()) as ws:
        codes = [w.wait(120) for w in ws]
    assert codes == [0, 0, 0], [w.log()[-2000:] for w in ws]
    assert one(conn, "SELECT count(*) FROM pgtasks.jobs WHERE status = 'succeeded'") == 60
    assert most_of_a_key_at_once(conn) == 1
    # Different keys overlapped: some job of one key started while another key's ran.
    assert (
        one(
            conn,
            "SELECT count(*) FROM public.ledger a JOIN public.ledger b ON b.note <> a.note"
            " AND b.started_at <= a.started_at AND b.finished_at > a.started_at",
        )
        > 0
    )


# -- rate limits ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_rate_limit_of_5_per_second_starts_20_jobs_in_4_seconds(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    client.tasks["w.rated"].delay_many(list(range(200)))
    with workers(wdsn, tmp_path, *(["-c", "4", "--poll-interval", "1"] for _ in range(3))):
        eventually(lambda: one(conn, "SELECT count(*) FROM public.ledger") >= 1, timeout=20)
        first = one(conn, "SELECT min(started_at) FROM public.ledger")
        eventually(
            lambda: one(conn, "SELECT clock_timestamp()") > first + dt.timedelta(seconds=4.5), timeout=20
        )
    starts = one(
        conn,
        "SELECT count(*) FROM public.ledger WHERE started_at < %s",
        (first + dt.timedelta(seconds=4),),
    )
    assert 19 <= starts <= 21, f"{starts} starts in 4 s at 5/s"
    # Per window of the rate key, never more than 5 starts.
    windows = rows(
        conn,
        "SELECT floor(extract(epoch FROM started_at - %s))::int AS w, count(*) FROM public.ledger"
        " GROUP BY 1 ORDER BY 1",
        (first,),
    )
    assert max(n for _, n in windows) <= 5 + 1, windows  # +1: a step's edge vs a whole second
    # Spread one step (0.2 s) apart, as the claims gave them: the claims' instants, not the
    # bodies' starts, are what the limit spaces.
    assert len(windows) >= 4 and min(n for w, n in windows if w < 4) >= 4, windows


@pytest.mark.slow
def test_a_job_over_the_rate_waits_and_starts_when_the_window_opens(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    """One start per 2 s; the workers poll every 30 s: the second job starts about 2 s after
    the first (the worker sleeps until the window ends), not a poll interval later."""
    rated = client.tasks["w.rated"]
    first, second = (rated.apply_async((n,), rate_limit="1/2s", rate_limit_key="slow") for n in (1, 2))
    with workers(wdsn, tmp_path, ["-c", "2", "--poll-interval", "30"]):
        eventually(lambda: one(conn, "SELECT count(*) FROM public.ledger") >= 1, timeout=20)
        time.sleep(0.3)
        assert client.AsyncResult(second.id).status == "queued"  # waiting, not failed
        reasons = client.explain(second.id).reasons
        assert reasons[0].code == ReasonCode.RATE_LIMITED, reasons
        assert "rate-limited until" in reasons[0].message
        eventually(lambda: one(conn, "SELECT count(*) FROM public.ledger") == 2, timeout=10)
        assert first.get(timeout=10) == 1 and second.get(timeout=10) == 2  # written before the workers stop
    gap = one(conn, "SELECT extract(epoch FROM max(started_at) - min(started_at)) FROM public.ledger")
    assert 1.9 <= gap <= 4.0, f"the second job started {gap:.2f}s after the first"


# -- tenant weights ---------------------------------------------------------------------------


@pytest.mark.slow
def test_weights_1_to_3_give_completed_shares_near_1_to_3(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    record = client.tasks["w.record"]
    for tenant in ("light", "heavy"):
        record.delay_many([(i, 0.005) for i in range(600)], tenant=tenant)
    client.set_tenant_weight("heavy", 3)
    with workers(wdsn, tmp_path, *(["-c", "2", "--poll-interval", "0.5"] for _ in range(2))):
        eventually(lambda: one(conn, "SELECT count(*) FROM public.ledger") >= 400, timeout=60)
    done = dict(
        rows(
            conn,
            "SELECT j.tenant, count(*) FROM (SELECT job_id FROM public.ledger ORDER BY id LIMIT 400) l"
            " JOIN pgtasks.jobs j ON j.id = l.job_id GROUP BY j.tenant",
        )
    )
    share = done["heavy"] / 400
    assert 0.68 <= share <= 0.82, f"heavy got {share:.2f} of the first 400 starts (weights 1:3)"


@pytest.mark.slow
def test_a_lone_weighted_tenant_gets_every_slot(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    """Work-conserving: a tenant of weight 0.1 alone in its queue runs as fast as it can."""
    client.set_tenant_weight("small", 0.1)
    client.tasks["w.record"].delay_many([(i, 0.0) for i in range(300)], tenant="small")
    with workers(wdsn, tmp_path, ["-c", "4", "--burst", "--poll-interval", "5"]) as (w,):
        assert w.wait(60) == 0, w.log()[-2000:]
    assert one(conn, "SELECT count(*) FROM pgtasks.jobs WHERE status = 'succeeded'") == 300
    # No idle gap: a burst worker that waited for a poll between claims would take 5 s.
    span = one(conn, "SELECT extract(epoch FROM max(started_at) - min(started_at)) FROM public.ledger")
    assert span < 4.5, f"300 jobs took {span:.1f}s"


def test_weights_are_set_listed_and_dropped(app: pgtasks.App) -> None:
    app.set_tenant_weight("acme", 3)
    app.set_tenant_weight("acme", 0.5, queue="mail")
    weights = [(w.queue, w.tenant, w.weight) for w in app.tenant_weights()]
    assert weights == [("", "acme", 3.0), ("mail", "acme", 0.5)]
    app.set_tenant_weight("acme", None, queue="mail")
    assert [w.queue for w in app.tenant_weights("acme")] == [""]
    for bad in (0, -1, float("nan"), 2e6, "3", True):
        with pytest.raises(ConfigurationError):
            app.set_tenant_weight("acme", bad)  # type: ignore[arg-type]


# -- explain ----------------------------------------------------------------------------------


def test_explain_names_the_key_at_its_limit_and_its_running_jobs(app: pgtasks.App) -> None:
    @app.task(name="f.agent", concurrency_key="agent", concurrency_limit=1)
    def agent_job(agent: str) -> None: ...

    first = agent_job.delay("host-1")
    second = agent_job.delay("host-1")
    other = agent_job.delay("host-2")
    claimed = app.stores.jobs.claim_batch(
        queues="{default}", worker_id="w1", limit=10, max_tenants=10, fair=True
    )
    assert sorted(r[0] for r in claimed) == sorted([first.id, other.id])  # one per key
    reasons = app.explain(second.id).reasons
    assert reasons[0].code == ReasonCode.CONCURRENCY_LIMIT
    assert f"(1 running: {first.id})" in reasons[0].message
    assert reasons[0].message.endswith("; at most 1 job of the key runs at once")
    assert reasons[0].details["running_ids"] == [first.id]


def test_explain_names_a_tenant_over_its_share(app: pgtasks.App) -> None:
    @app.task(name="f.plain")
    def plain(n: int) -> None: ...

    for n in range(4):
        plain.apply_async((n,), tenant="big")
    app.stores.jobs.claim_batch(queues="{default}", worker_id="w1", limit=3, max_tenants=10, fair=True)
    waiting = plain.apply_async((9,), tenant="big")
    plain.apply_async((1,), tenant="small")
    reasons = {r.code: r for r in app.explain(waiting.id).reasons}
    assert ReasonCode.OVER_SHARE in reasons, reasons
    assert "its tenant 'big' over its share" in reasons[ReasonCode.OVER_SHARE].message


# -- validation at the call site --------------------------------------------------------------


def test_bad_flow_options_are_refused_where_they_are_given(app: pgtasks.App) -> None:
    def fn(agent: str) -> None: ...

    for options, match in (
        ({"rate_limit": "10/x"}, "rate_limit"),
        ({"rate_limit": "fast"}, "rate_limit"),
        ({"rate_limit": "0/s"}, "rate_limit"),
        ({"concurrency_key": "agent", "concurrency_limit": 0}, "concurrency_limit"),
        ({"concurrency_key": "agent"}, "go together"),
        ({"concurrency_key": "nope", "concurrency_limit": 1}, "names no argument"),
        ({"rate_limit_key": "agent"}, "needs a rate_limit"),
        ({"cost": 0}, "cost"),
    ):
        with pytest.raises(ConfigurationError, match=match):
            app.task(name=f"bad.{len(match)}", **options)(fn)
    ok = app.task(name="f.ok", concurrency_key="agent", concurrency_limit=2, rate_limit="100/m")(fn)
    with pytest.raises(ConfigurationError, match="bytes"):
        ok.delay("x" * 5000)  # the key goes into an index
    with pytest.raises(ConfigurationError, match="concurrency_limit"):
        ok.apply_async(("a",), concurrency_limit=-1)
    with pytest.raises(ConfigurationError, match="rate_limit"):
        ok.apply_async(("a",), rate_limit="1/0s")
    jobs = app.stores.jobs
    assert jobs.claim_batch(queues="{default}", worker_id="w", limit=5, max_tenants=5, fair=True) == []


def test_rates_parse_as_celery_writes_them() -> None:
    from pgtasks.flow import Rate, parse_rate

    assert parse_rate("r", "10/s") == Rate(10, 1.0)
    assert parse_rate("r", "100/m") == Rate(100, 60.0)
    assert parse_rate("r", "1000/h") == Rate(1000, 3600.0)
    assert parse_rate("r", "5/10s") == Rate(5, 10.0)
    assert parse_rate("r", 7) == Rate(7, 1.0)
    assert parse_rate("r", " 3 ") == Rate(3, 1.0)


def test_a_key_from_a_dict_argument_does_not_depend_on_the_order_of_its_keys(
    app: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    """A dict (or set) argument gives its key as canonical JSON; strings and numbers as before."""

    @app.task(
        name="f.params",
        concurrency_key="params",
        concurrency_limit=1,
        rate_limit="9/s",
        rate_limit_key="params",
    )
    def report(params: Any) -> None: ...

    report.delay({"a": 1, "b": {"y": 2, "x": 1}})
    report.delay({"b": {"x": 1, "y": 2}, "a": 1})
    report.delay_many([({"b": {"y": 2, "x": 1}, "a": 1},)])
    report.delay([{"b": 2, "a": 1}])
    report.delay({"red", "green", "blue"})
    for plain in ("host-1", 7, 1.5, [1, 2], True):  # as str() writes them, as before
        report.delay(plain)
    found = rows(conn, "SELECT concurrency_key, rate_key FROM pgtasks.jobs ORDER BY id")
    assert [k for k, r in found if k == r] == [k for k, _ in found]  # one rule for both keys
    assert [k for k, _ in found] == [
        'params={"a":1,"b":{"x":1,"y":2}}',
        'params={"a":1,"b":{"x":1,"y":2}}',
        'params={"a":1,"b":{"x":1,"y":2}}',
        'params=[{"a":1,"b":2}]',
        'params={"$pgtasks":"set","v":["blue","green","red"]}',
        "params=host-1",
        "params=7",
        "params=1.5",
        "params=[1, 2]",
        "params=True",
    ]
    claimed = app.stores.jobs.claim_batch(
        queues="{default}", worker_id="w1", limit=10, max_tenants=10, fair=True
    )
    assert len(claimed) == 8  # one job of the dict's key, one of each other key


def test_flow_columns_reach_the_row(app: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    @app.task(name="f.cols", concurrency_key=pgtasks.TENANT, concurrency_limit=2, rate_limit="3/m", cost=2.5)
    def cols(n: int) -> None: ...

    one_job = cols.apply_async((1,), tenant="acme")
    batch = cols.delay_many([2, 3], tenant="beta")
    app.queue_rate_limit("mail", "50/s")
    mailed = app.task(name="f.mail", queue="mail")(lambda: None).delay()
    found = rows(
        conn,
        "SELECT id, concurrency_key, concurrency_limit, rate_key, rate_limit, rate_period, cost"
        " FROM pgtasks.jobs ORDER BY id",
    )
    assert found == [
        (one_job.id, "tenant=acme", 2, "task=f.cols", 3, 60.0, 2.5),
        (batch[0].id, "tenant=beta", 2, "task=f.cols", 3, 60.0, 2.5),
        (batch[1].id, "tenant=beta", 2, "task=f.cols", 3, 60.0, 2.5),
        (mailed.id, None, None, "queue=mail", 50, 1.0, 1.0),
    ]


def test_the_cli_sets_lists_and_drops_weights(app: pgtasks.App, dsn: str) -> None:
    from click.testing import CliRunner

    from pgtasks.cli import cli

    def run(*args: str) -> str:
        env = {"COLUMNS": "200", "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
        result = CliRunner().invoke(cli, ["--dsn", dsn, "tenants", *args], env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    assert "tenant acme weighs 3" in run("weight", "acme", "3")
    run("weight", "beta", "0.5", "--queue", "mail")
    assert [(w.queue, w.tenant, w.weight) for w in app.tenant_weights()] == [
        ("", "acme", 3.0),
        ("mail", "beta", 0.5),
    ]
    import json

    assert json.loads(run("weights", "--json")) == [
        {"queue": None, "tenant": "acme", "weight": 3.0},
        {"queue": "mail", "tenant": "beta", "weight": 0.5},
    ]
    assert "acme" in run("weights")
    run("unweight", "acme")
    assert [w.tenant for w in app.tenant_weights()] == ["beta"]
    bad = CliRunner().invoke(
        cli, ["--dsn", dsn, "tenants", "weight", "acme", "0"], env={"PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    )
    assert isinstance(bad.exception, ConfigurationError) and "weight must be above 0" in str(bad.exception)


# -- row-level security mode (tests/test_rls.py's roles and setup) ---------------------------


def test_a_tenant_role_reads_only_its_weight_and_only_its_keys_through_functions(
    setup: dict[str, Any],  # noqa: F811 - the fixture imported above
) -> None:
    from test_rls import A, B

    owner, web = setup["owner"], setup["web"]
    owner.set_tenant_weight(A, 2)
    owner.set_tenant_weight(B, 5)
    with web.tenant(A).connection() as conn:
        assert conn.execute("SELECT tenant, weight FROM pgtasks.tenant_weights").fetchall() == [(A, 2.0)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE pgtasks.tenant_weights SET weight = 100")
    work = web.tenant(A).bind("t.work")
    first, second = (
        work.apply_async((n,), queue="flowq", rate_limit="1/h", rate_limit_key="r") for n in (1, 2)
    )
    claimed = owner.stores.jobs.claim_batch(
        queues="{flowq}", worker_id="w", limit=5, max_tenants=5, fair=True
    )
    assert [r[0] for r in claimed] == [first.id]
    # What explain reads of the windows and counters, through the functions a tenant's role
    # may call (it has no right on those tables: their rows name every tenant's keys).
    with web.tenant(A).connection() as conn:
        ends = conn.execute("SELECT pgtasks.rate_window_end('r', now())").fetchone()
        assert ends is not None and ends[0] is not None
        assert conn.execute("SELECT pgtasks.concurrency_running('nothing')").fetchone() == (0,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM pgtasks.rate_windows")
    assert second.status == "queued"


def test_cost_shares_claims_of_one_job_by_cost(app: pgtasks.App) -> None:
    """Equal weights, costs 1 and 3, claims of one job each: the dear tenant gets about a
    quarter of the jobs (the same cost as the cheap one's three quarters), not none."""

    @app.task(name="f.cheap")
    def cheap(n: int) -> None: ...

    @app.task(name="f.dear", cost=3)
    def dear(n: int) -> None: ...

    cheap.delay_many(range(400), tenant="cheap")
    dear.delay_many(range(400), tenant="dear")
    jobs = app.stores.jobs
    got: dict[str, int] = {"cheap": 0, "dear": 0}
    for _ in range(240):
        (row,) = jobs.claim_batch(queues="{default}", worker_id="w", limit=1, max_tenants=10, fair=True)
        got[row[8]] += 1  # the tenant (CLAIM_COLUMNS)
        jobs.succeed_batch(worker_id="w", ids=[row[0]], results_json=["null"])
    assert 0.12 <= got["dear"] / 240 <= 0.40, got
