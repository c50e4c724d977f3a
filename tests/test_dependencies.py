"""Job dependencies and workflows (``depends_on``, chain, group, chord, link, link_error).

Ordering and wake-up claims are proven with real worker processes
(``pgtasks -A tests.apps.deps_app:app worker``) and the side ledger the tasks write
(start and finish on the database clock); the rules (failure cascade, results passed,
refusals, all-or-nothing enqueue, explain) run in process with the testing kit's
burst worker, through the same claim and completion code.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from apps.deps_app import dep_workers, make_app
from apps.worker_app import one, rows, worker_id_of
from click.testing import CliRunner
from helpers import eventually

import pgtasks
from pgtasks.cli import cli
from pgtasks.errors import ConfigurationError, JobNotFound, TaskRevoked
from pgtasks.records import ReasonCode
from pgtasks.testing import run_until_idle


@pytest.fixture
def dapp(wdsn: str) -> Any:
    application = make_app(wdsn)
    yield application
    application.close()


def _t(app: pgtasks.App, name: str) -> Any:
    return app.get_task(name)


def _ledger(conn: psycopg.Connection[Any], job_id: int) -> tuple[Any, Any]:
    """(started_at, finished_at) of the job's one ledger entry."""
    found = rows(conn, "SELECT started_at, finished_at FROM public.ledger WHERE job_id = %s", (job_id,))
    assert len(found) == 1, (job_id, found)
    return found[0][0], found[0][1]


def _nothing_written(conn: psycopg.Connection[Any]) -> None:
    assert one(conn, "SELECT count(*) FROM pgtasks.jobs") == 0
    assert one(conn, "SELECT count(*) FROM pgtasks.job_dependencies") == 0


# -- real workers ------------------------------------------------------------------------


@pytest.mark.slow
def test_diamonds_run_in_dependency_order_under_three_workers(
    dapp: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    step = _t(dapp, "d.step")
    diamonds = []
    for n in range(4):
        a = step.apply_async((f"a{n}", 0.2))
        b = step.apply_async((f"b{n}", 0.3), depends_on=[a])
        c = step.apply_async((f"c{n}", 0.1), depends_on=[a])
        d = step.apply_async((f"d{n}",), depends_on=[b, c.id])
        diamonds.append((a, b, c, d))
    assert {r.status for _, b, c, d in diamonds for r in (b, c, d)} == {"blocked"}
    with dep_workers(wdsn, tmp_path, *(["-c", "2", "--poll-interval", "0.2"] for _ in range(3))) as ws:
        eventually(
            lambda: all(d.status == "succeeded" for *_, d in diamonds),
            timeout=60,
            message="every diamond done",
        )
        pids = {w.pid for w in ws}
    for a, b, c, d in diamonds:
        a_end = _ledger(conn, a.id)[1]
        b_start, b_end = _ledger(conn, b.id)
        c_start, c_end = _ledger(conn, c.id)
        d_start = _ledger(conn, d.id)[0]
        assert b_start >= a_end and c_start >= a_end
        assert d_start >= max(b_end, c_end)
        job = d.job()
        assert (job.trigger, job.parent_id) == ("dependency", b.id)
    assert one(conn, "SELECT count(DISTINCT worker_pid) FROM public.ledger") >= 2
    assert {r[0] for r in rows(conn, "SELECT DISTINCT worker_pid FROM public.ledger")} <= pids
    assert one(conn, "SELECT count(*) FROM pgtasks.job_dependencies") == 0


@pytest.mark.slow
def test_a_chord_callback_gets_every_result_in_header_order(
    dapp: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    square, collect = _t(dapp, "d.square"), _t(dapp, "d.collect")
    # Earlier members take longer: they finish in the reverse of the header's order.
    header = pgtasks.group(square.s(i, 0.05 * (8 - i)) for i in range(8))
    r = pgtasks.chord(header, collect.s()).apply_async()
    assert r.status == "blocked"
    assert isinstance(r.parent, pgtasks.GroupResult) and len(r.parent) == 8
    with dep_workers(
        wdsn, tmp_path, ["-c", "4", "--poll-interval", "0.2"], ["-c", "4", "--poll-interval", "0.2"]
    ):
        assert r.get(timeout=60) == [i * i for i in range(8)]
    assert r.parent.get(timeout=5) == [i * i for i in range(8)]
    assert r.parent.ready() and r.parent.successful()
    ends = [_ledger(conn, i)[1] for i in r.parent.ids]
    assert _ledger(conn, r.id)[0] >= max(ends)


@pytest.mark.slow
def test_unblocking_wakes_an_idle_worker_without_polling(
    dapp: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    step = _t(dapp, "d.step")
    with dep_workers(wdsn, tmp_path, ["-c", "2", "--poll-interval", "30"]) as (w,):
        listening = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND query LIKE '%LISTEN pgtasks_cancel%'"
        )
        eventually(lambda: one(conn, listening) == 1, timeout=20, message="the worker listens")
        worker_id_of(conn, w.pid)
        time.sleep(1.0)  # past the worker's first claim: from now on only a notification wakes it
        # The dependent's enqueue locks its prerequisite for a moment: a claim woken by the
        # prerequisite's own wake-up may skip it then, and the enqueue wakes a worker
        # again on commit. The dependent's wake-up comes with its prerequisite's success.
        enqueued = one(conn, "SELECT clock_timestamp()")
        first = step.apply_async(("first", 0.3))
        then = step.apply_async(("then",), depends_on=[first])
        eventually(lambda: then.status == "succeeded", timeout=15, message="the dependent ran")
    first_start, first_end = _ledger(conn, first.id)
    then_start = _ledger(conn, then.id)[0]
    assert (first_start - enqueued).total_seconds() < 1.5
    gap = (then_start - first_end).total_seconds()
    print(f"dependent started {gap:.3f}s after its prerequisite finished (poll interval 30 s)")
    assert 0 <= gap < 1.5


@pytest.mark.slow
def test_dependents_enqueued_while_prerequisites_complete_never_stay_blocked(
    dapp: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    """The race of the enqueue with a concurrent completion: a dependent names jobs that
    may finish before, during or after its enqueue commits; none may be left blocked."""
    step = _t(dapp, "d.step")
    rng = random.Random(7)
    prerequisites = [step.apply_async((f"p{i}", rng.choice([0.0, 0.01, 0.05]))) for i in range(60)]
    dependents: list[tuple[Any, list[Any]]] = []
    args = ["-c", "4", "--poll-interval", "0.5"]
    with dep_workers(wdsn, tmp_path, args, args):

        def enqueue(seed: int) -> None:
            local = random.Random(seed)
            client = make_app(wdsn)
            try:
                for n in range(60):
                    picked = local.sample(prerequisites, local.randint(1, 3))
                    r = client.get_task("d.step").apply_async((f"dep{seed}.{n}",), depends_on=picked)
                    dependents.append((r, picked))
                    time.sleep(local.choice([0.0, 0.005, 0.02]))
            finally:
                client.close()

        threads = [threading.Thread(target=enqueue, args=(s,)) for s in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(dependents) == 180
        eventually(
            lambda: one(conn, "SELECT count(*) FROM pgtasks.jobs WHERE status <> 'succeeded'") == 0,
            timeout=90,
            message="every job succeeded",
        )
    for r, picked in dependents:
        start = _ledger(conn, r.id)[0]
        assert start >= max(_ledger(conn, p.id)[1] for p in picked)
    assert one(conn, "SELECT count(*) FROM pgtasks.job_dependencies") == 0


# -- the rules, with the testing kit's burst worker -------------------------------------------


def test_a_chain_of_three_passes_each_result_on(dapp: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    add = _t(dapp, "d.add")
    r = pgtasks.chain(add.s(1, 2), add.s(10), add.s(100)).apply_async()
    assert r.parent is not None and r.parent.parent is not None and r.parent.parent.parent is None
    assert [x.status for x in (r.parent.parent, r.parent, r)] == ["queued", "blocked", "blocked"]
    run_until_idle(dapp, raise_on_failure=True)
    assert (r.get(timeout=5), r.parent.get(timeout=5), r.parent.parent.get(timeout=5)) == (113, 13, 3)
    notes = [n for (n,) in rows(conn, "SELECT note FROM public.ledger ORDER BY id")]
    assert notes == ["add 1 2", "add 3 10", "add 13 100"]
    # The same with the | operator and an immutable step that ignores what came before.
    piped = (add.s(2, 2) | add.si(5, 5) | add.s(1)).apply_async()
    run_until_idle(dapp, raise_on_failure=True)
    assert piped.get(timeout=5) == 11


def test_a_failed_prerequisite_cancels_its_dependents_in_cascade(
    dapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    step, fail = _t(dapp, "d.step"), _t(dapp, "d.fail")
    a = fail.delay("a")
    b = step.apply_async(("b",), depends_on=[a])
    c = step.apply_async(("c",), depends_on=[b])
    anyway = step.apply_async(("anyway",), depends_on=[a, b], on_prerequisite_failure="run")
    run_until_idle(dapp)
    assert a.status == "failed"
    for job, prerequisite, outcome in ((b, a, "failed"), (c, b, "cancelled")):
        record = job.job()
        assert record.status == "cancelled"
        assert record.error is not None
        assert record.error["code"] == "DEPENDENCY_FAILED"
        assert record.error["message"] == f"prerequisite job {prerequisite.id} ended {outcome}, not succeeded"
        with pytest.raises(TaskRevoked):
            job.get(timeout=1)
    assert anyway.status == "succeeded"
    ran = [n for (n,) in rows(conn, "SELECT note FROM public.ledger ORDER BY id")]
    assert ran == ["a", "anyway"]


def test_cancelling_a_blocked_job_ends_it_and_its_dependents(dapp: pgtasks.App) -> None:
    step = _t(dapp, "d.step")
    a = step.apply_async(("a",), countdown=3600)
    b = step.apply_async(("b",), depends_on=[a])
    c = step.apply_async(("c",), depends_on=[b])
    assert b.revoke() is True
    assert (b.status, c.status, a.status) == ("cancelled", "cancelled", "queued")
    assert c.job().error["message"] == f"prerequisite job {b.id} ended cancelled, not succeeded"
    assert dapp.cancel_job(c.id) == "finished"


def test_explain_names_the_prerequisites_a_blocked_job_waits_for(dapp: pgtasks.App, wdsn: str) -> None:
    step = _t(dapp, "d.step")
    a = step.delay("a")
    b = step.apply_async(("b",), countdown=3600)
    c = step.apply_async(("c",), depends_on=[a, b])
    why = c.explain()
    assert why.status == "blocked" and why.codes == [ReasonCode.WAITING_FOR_PREREQUISITES]
    assert str(why) == (
        f"waiting for prerequisites {a.id} (queued), {b.id} (queued); it is queued when they have finished"
    )
    run_until_idle(dapp, queues=["default"])  # a runs; b is not due
    why = c.explain()
    assert why.reasons[0].details == {"waiting_for": [b.id], "finished": {str(a.id): "succeeded"}}
    out = CliRunner().invoke(
        cli, ["--dsn", wdsn, "jobs", "explain", str(c.id), "--json"], catch_exceptions=False
    )
    document = orjson.loads(out.stdout)
    assert document["status"] == "blocked"
    assert [r["code"] for r in document["reasons"]] == ["waiting_for_prerequisites"]
    assert a.explain().codes == [ReasonCode.FINISHED]  # the other reasons still hold


def test_link_runs_on_success_and_link_error_on_failure(
    dapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    step, fail, errback, collect = (_t(dapp, n) for n in ("d.step", "d.fail", "d.errback", "d.collect"))
    ok = step.apply_async(("ok",), link=collect.s(label="linked"), link_error=errback.s())
    bad = fail.apply_async(("bad",), link=step.si("never"), link_error=[errback.s(label="errback")])
    run_until_idle(dapp)
    linked, ok_errback = (dapp.AsyncResult(i) for i in _dependents(conn, ok.id))
    assert linked.get(timeout=1) == "ok"  # a partial callback gets the result
    assert ok_errback.status == "cancelled"
    assert ok_errback.job().error["code"] == "DEPENDENCY_NOT_FAILED"  # type: ignore[index]
    never, bad_errback = (dapp.AsyncResult(i) for i in _dependents(conn, bad.id))
    assert bad_errback.get(timeout=1) == bad.id  # a partial errback gets the failed job's id
    assert never.status == "cancelled" and never.job().error["code"] == "DEPENDENCY_FAILED"  # type: ignore[index]
    notes = {n for (n,) in rows(conn, "SELECT note FROM public.ledger")}
    assert notes == {"ok", "linked", "bad", f"errback {bad.id}"}


def _dependents(conn: psycopg.Connection[Any], job_id: int) -> list[int]:
    return [
        i for (i,) in rows(conn, "SELECT id FROM pgtasks.jobs WHERE parent_id = %s ORDER BY id", (job_id,))
    ]


def test_enqueue_refusals_write_nothing(dapp: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str) -> None:
    """Unknown and other tenants' ids are refused at the call, before any write. A cycle
    cannot be built: a job can only wait for jobs that exist when it is written, so the
    edges always point from newer to older jobs (a job naming an id not yet used is
    refused like any unknown id)."""
    step = _t(dapp, "d.step")
    with pytest.raises(JobNotFound) as info:
        step.apply_async(("x",), depends_on=[987654])
    assert info.value.job_id == 987654
    _nothing_written(conn)
    other = step.apply_async(("acme's",), tenant="acme")
    with pytest.raises(JobNotFound):
        step.apply_async(("x",), tenant="globex", depends_on=[other])
    with pytest.raises(JobNotFound):
        dapp.tenant("globex").send_task("d.step", ("x",), depends_on=[other.id])
    next_id = other.id + 1
    with pytest.raises(JobNotFound):
        step.apply_async(("x",), tenant="acme", depends_on=[next_id])  # itself, if it were written
    with pytest.raises(JobNotFound):
        pgtasks.chain(step.s("a"), step.s()).apply_async(depends_on=[next_id + 5])
    with pytest.raises(ConfigurationError, match="depends_on"):
        step.apply_async(("x",), depends_on="1")
    with pytest.raises(ConfigurationError, match="on_prerequisite_failure"):
        step.apply_async(("x",), depends_on=[other], on_prerequisite_failure="ignore")
    assert one(conn, "SELECT count(*) FROM pgtasks.jobs") == 1
    assert one(conn, "SELECT has_dependents FROM pgtasks.jobs WHERE id = %s", (other.id,)) is False
    assert one(conn, "SELECT count(*) FROM pgtasks.job_dependencies") == 0
    # In the caller's transaction: the refusal leaves it usable, and its own writes commit.
    with psycopg.connect(wdsn) as tx:
        tx.execute("INSERT INTO public.flags VALUES ('mine')")
        with pytest.raises(JobNotFound):
            step.apply_async(("x",), depends_on=[987654], connection=tx)
        tx.commit()
    assert one(conn, "SELECT count(*) FROM public.flags WHERE name = 'mine'") == 1
    assert one(conn, "SELECT count(*) FROM pgtasks.jobs") == 1
    # Through the tenant handle, its own job is a fine prerequisite.
    acme = dapp.tenant("acme")
    mine = acme.send_task("d.step", ("after",), depends_on=[other.id])
    assert mine.status == "blocked"


def test_a_workflow_is_written_all_or_nothing(
    dapp: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str
) -> None:
    step, collect, add = _t(dapp, "d.step"), _t(dapp, "d.collect"), _t(dapp, "d.add")
    with psycopg.connect(wdsn) as tx:
        pgtasks.chain(step.s("a"), step.s(), step.s()).apply_async(connection=tx)
        pgtasks.chord([step.s(str(i)) for i in range(3)], collect.s()).apply_async(connection=tx)
        assert tx.execute("SELECT count(*) FROM pgtasks.jobs").fetchone() == (7,)
        tx.rollback()
    _nothing_written(conn)
    # A part refused at the end (too many arguments for add) leaves none of the rest.
    with pytest.raises(ConfigurationError):
        pgtasks.chain(step.s("a"), step.s(), add.s(1, 2)).apply_async()
    _nothing_written(conn)
    # And committed with the caller's transaction, the whole of it runs.
    with psycopg.connect(wdsn) as tx:
        r = pgtasks.chord([add.s(i, i) for i in range(4)], collect.s()).apply_async(connection=tx)
        tx.commit()
    run_until_idle(dapp, raise_on_failure=True)
    assert r.get(timeout=5) == [0, 2, 4, 6]


def test_groups_and_nested_workflows(dapp: pgtasks.App) -> None:
    add, collect, square = _t(dapp, "d.add"), _t(dapp, "d.collect"), _t(dapp, "d.square")
    g = pgtasks.group(add.s(i, 1) for i in range(5)).apply_async()
    assert isinstance(g, pgtasks.GroupResult) and len(g.ids) == 5 and not g.ready()
    # A chain into a group (each member gets the result), then a chord's callback.
    r = pgtasks.chain(add.s(1, 1), pgtasks.group(add.s(10), add.s(20)), collect.s()).apply_async()
    # Celery's spelling: a group piped into a signature is a chord; chord(header)(body).
    piped = (pgtasks.group(square.s(2), square.s(3)) | collect.s()).apply_async()
    called = pgtasks.chord([square.s(4)])(collect.s())
    empty = pgtasks.chord(pgtasks.group(), collect.s()).apply_async()
    run_until_idle(dapp, raise_on_failure=True)
    assert g.get(timeout=5) == [1, 2, 3, 4, 5] and g.successful() and g.completed_count() == 5
    assert r.get(timeout=5) == [12, 22]
    assert piped.get(timeout=5) == [4, 9]
    assert called.get(timeout=5) == [16]
    assert empty.get(timeout=5) == []
    pending = pgtasks.group(add.s(1, 1).set(countdown=3600), add.s(2, 2).set(countdown=3600)).apply_async()
    assert pending.revoke() == 2 and pending.failed()


def test_delay_many_and_asyncio_enqueue_take_depends_on(dapp: pgtasks.App, wdsn: str) -> None:
    step, add = _t(dapp, "d.step"), _t(dapp, "d.add")
    a = add.delay(1, 1)
    many = step.delay_many(["x", "y", "z"], depends_on=[a])
    assert [r.status for r in many] == ["blocked"] * 3

    async def enqueue() -> Any:
        async with await psycopg.AsyncConnection.connect(wdsn) as aconn:
            r = await add.apply_async_async((5, 2), depends_on=[a], connection=aconn)
            await aconn.commit()
            return r

    later = asyncio.run(enqueue())
    assert later.status == "blocked"
    with pytest.raises(JobNotFound):
        asyncio.run(_async_unknown(add, wdsn))
    run_until_idle(dapp, raise_on_failure=True)
    assert [r.get(timeout=5) for r in many] == ["x", "y", "z"]
    assert later.get(timeout=5) == 7  # depends_on passes no result


async def _async_unknown(add: Any, dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as aconn:
        await add.apply_async_async((1, 2), depends_on=[987654], connection=aconn)


def test_a_long_chain_is_cancelled_in_one_completion(
    dapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    """The cascade is a loop in the database, not one nested trigger call per link: a chain
    of 500 behind a failed head is cancelled by the head's completion."""
    step, fail = _t(dapp, "d.step"), _t(dapp, "d.fail")
    last = pgtasks.chain(fail.si("head"), *(step.si(f"s{i}") for i in range(500))).apply_async()
    run_until_idle(dapp)
    counts = dict(rows(conn, "SELECT status, count(*) FROM pgtasks.jobs GROUP BY status"))
    assert counts == {"failed": 1, "cancelled": 500}
    assert last.job().error["prerequisite_id"] == last.parent.id  # type: ignore[index]
    assert one(conn, "SELECT count(*) FROM pgtasks.job_dependencies") == 0


def test_every_path_that_ends_a_prerequisite_moves_its_dependents_on(
    dapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    """Retries exhausted, the reaper failing a lost non-idempotent job, a requeued retry
    (not an end: the dependent keeps waiting), a by-hand requeue of the failed prerequisite
    (its dependents stay cancelled), and a manual requeue of a cancelled dependent."""

    @dapp.task(name="d.flaky", max_retries=1, autoretry_for=(ValueError,), default_retry_delay=0)
    def flaky() -> None:
        raise ValueError("again")

    @dapp.task(name="d.once", retry_on_worker_lost=False)
    def once() -> None: ...

    step = _t(dapp, "d.step")
    exhausted = flaky.delay()
    after_exhausted = step.apply_async(("x",), depends_on=[exhausted])
    run_until_idle(dapp)
    assert exhausted.status == "failed" and len(exhausted.job().attempts) == 2
    assert after_exhausted.job().error["code"] == "DEPENDENCY_FAILED"

    lost, retried = once.delay(), flaky.delay()
    after_lost = step.apply_async(("y",), depends_on=[lost])
    after_retried = step.apply_async(("z",), depends_on=[retried])
    conn.execute(
        "UPDATE pgtasks.jobs SET status = 'running', worker_id = 'gone', attempt = 1,"
        " started_at = now() - interval '1 hour', heartbeat_at = now() - interval '1 hour'"
        " WHERE id = ANY(%s)",
        ([lost.id, retried.id],),
    )
    reaped = {r.job_id: r.status for r in dapp.stores.jobs.reap_lost(lease_timeout=60, limit=10)}
    assert reaped == {lost.id: "failed", retried.id: "queued"}
    assert after_lost.status == "cancelled"
    assert after_lost.job().error["message"] == f"prerequisite job {lost.id} ended failed, not succeeded"
    assert after_retried.status == "blocked"  # a retry is not an end

    # By hand: the failed prerequisite requeued leaves its cancelled dependent as it is;
    # the dependent requeued by hand runs, without waiting.
    assert dapp.requeue(lost.id)
    assert after_lost.status == "cancelled"
    assert dapp.requeue(after_lost.id)
    run_until_idle(dapp)
    assert after_lost.get(timeout=5) == "y"
    assert after_retried.status == "cancelled"  # flaky's retry failed for good in the end


def test_only_jobs_with_dependents_fire_the_dependency_trigger(
    dapp: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str
) -> None:
    """The trigger's WHEN clause reads the row alone: an ordinary completion calls no
    function. Blocked jobs are listed and counted as such."""
    definition = one(
        conn,
        "SELECT pg_get_triggerdef(oid) FROM pg_trigger"
        " WHERE tgrelid = 'pgtasks.jobs'::regclass AND tgname = 'jobs_dependents_notify'",
    )
    assert "AFTER UPDATE OF status" in definition
    assert "WHEN ((new.has_dependents AND" in definition
    step = _t(dapp, "d.step")
    plain = step.delay("plain")
    a = step.apply_async(("a",), countdown=3600)
    b = step.apply_async(("b",), depends_on=[a])
    flags = dict(rows(conn, "SELECT id, has_dependents FROM pgtasks.jobs"))
    assert flags == {plain.id: False, a.id: True, b.id: False}
    listed = CliRunner().invoke(
        cli, ["--dsn", wdsn, "jobs", "list", "--status", "blocked", "--json"], catch_exceptions=False
    )
    assert [j["id"] for j in orjson.loads(listed.stdout)] == [b.id]
    counts = {r["queue"]: r["status"] for r in dapp.queue_stats() if r["status"] == "blocked"}
    assert counts == {"default": "blocked"}
