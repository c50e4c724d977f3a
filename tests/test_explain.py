"""Why is my job not running? ``explain`` names each reason, in a situation made for real.

A queued job: not due yet, its lock key held by a running job, no live worker for its
queue, due jobs ahead of it, or nothing (``ready``). Another job: claimed ahead by a
worker, running, finished. Through a tenant handle the answer names no other
tenant's job; ``pgtasks jobs explain`` prints it, also as JSON.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
from collections.abc import Iterator

import orjson
import pytest
from click.testing import CliRunner
from helpers import eventually

import pgtasks
from pgtasks.cli import cli
from pgtasks.errors import JobNotFound
from pgtasks.records import ReasonCode
from pgtasks.testing import run_until_idle
from pgtasks.worker import Worker, WorkerConfig

QUEUE = "work"
GATE = threading.Event()


@pytest.fixture
def tapp(dsn: str) -> Iterator[pgtasks.App]:
    app = pgtasks.App("explain", dsn=dsn, load_entry_points=False)

    @app.task(name="t.quick", queue=QUEUE)
    def quick(n: int) -> int:
        return n

    @app.task(name="t.gated", queue=QUEUE)
    def gated(n: int) -> int:
        GATE.wait(30)
        return n

    GATE.clear()
    yield app
    GATE.set()
    app.close()


def _live_worker(app: pgtasks.App, queue: str = QUEUE) -> None:
    """A worker registered for ``queue`` with a lease that has not run out (it claims nothing)."""
    app.stores.workers.register(
        id=f"idle:{os.getpid()}:{queue}", host="idle", pid=os.getpid(), queues=[queue], concurrency=1,
        pool="threads", lease_timeout=300,
    )  # fmt: skip


@pytest.fixture
def running(tapp: pgtasks.App) -> Iterator[Worker]:
    """A worker with one slot and jobs claimed ahead (prefetch), running until the test ends."""
    worker = Worker(
        tapp, WorkerConfig(queues=(QUEUE,), concurrency=1, prefetch_multiplier=4, poll_interval=0.1)
    )
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    yield worker
    GATE.set()
    worker.request_stop("test")
    thread.join(30)


def test_a_queued_job_with_nothing_holding_it_back_is_ready(tapp: pgtasks.App) -> None:
    _live_worker(tapp)
    job = tapp.get_task("t.quick").delay(1)
    explanation = job.explain()
    assert explanation.codes == ["ready"]
    assert explanation.status == "queued" and explanation.job_id == job.id
    assert "next claim on 'work'" in str(explanation)


def test_no_live_worker_serves_the_queue(tapp: pgtasks.App) -> None:
    _live_worker(tapp, "elsewhere")
    job = tapp.get_task("t.quick").delay(1)
    explanation = tapp.explain(job.id)
    assert explanation.codes == ["no_worker"]
    assert "-Q work" in explanation.reasons[0].message


def test_not_due_until_its_countdown_ends(tapp: pgtasks.App) -> None:
    _live_worker(tapp)
    job = tapp.get_task("t.quick").apply_async((1,), countdown=3600)
    reason = job.explain().reasons[0]
    assert reason.code is ReasonCode.NOT_DUE
    assert 3590 < reason.details["seconds"] <= 3600
    assert reason.details["run_at"] == tapp.get_job(job.id).run_at.isoformat()


def test_due_jobs_ahead_by_priority_and_age(tapp: pgtasks.App) -> None:
    _live_worker(tapp)
    quick = tapp.get_task("t.quick")
    quick.delay_many(range(3), tenant="a")
    quick.delay_many(range(2), tenant="b")
    urgent = quick.apply_async((9,), priority=5, tenant="a")
    last = quick.apply_async((10,), tenant="a")
    reason = last.explain().reasons[0]
    assert reason.code is ReasonCode.BEHIND
    assert reason.details == {"ahead": 6, "ahead_in_tenant": 4, "at_least": False}
    assert urgent.explain().codes == ["ready"]  # the highest priority comes first


def test_lock_key_held_claimed_ahead_running_and_finished(tapp: pgtasks.App, running: Worker) -> None:
    gated = tapp.get_task("t.gated")
    first = gated.apply_async((1,), lock="mailbox-7")
    eventually(lambda: tapp.get_job(first.id).started_at is not None)
    second = gated.apply_async((2,), lock="mailbox-7")
    other = tapp.get_task("t.quick").delay(3)  # no key: claimed ahead while the slot is busy
    eventually(lambda: tapp.get_job(other.id).status == "running")
    assert first.explain().codes == ["running"]
    assert first.explain().reasons[0].details["worker_id"] == running.id
    assert other.explain().codes == ["claimed"]
    held = second.explain().reasons
    assert [r.code for r in held] == [ReasonCode.LOCK_HELD]
    assert held[0].details == {"lock_holder": first.id}
    GATE.set()
    assert second.get(timeout=30) == 2
    assert second.explain().codes == ["finished"]
    assert "succeeded" in str(second.explain())


def test_a_tenant_handle_names_no_other_tenants_job(tapp: pgtasks.App, running: Worker) -> None:
    gated = tapp.get_task("t.gated")
    theirs = tapp.tenant("b").apply_async(gated, (1,), lock="shared-key")
    eventually(lambda: tapp.get_job(theirs.id).started_at is not None)
    ours = tapp.tenant("a").apply_async(gated, (2,), lock="shared-key")
    reason = tapp.tenant("a").explain(ours.id).reasons[0]
    assert reason.code is ReasonCode.LOCK_HELD and reason.details == {"lock_holder": None}
    assert str(theirs.id) not in reason.message and "another tenant's" in reason.message
    assert tapp.explain(ours.id).reasons[0].details == {"lock_holder": theirs.id}  # the operator sees it
    with pytest.raises(JobNotFound):
        tapp.tenant("a").explain(theirs.id)


def test_cli_explain_prints_reasons_and_json(tapp: pgtasks.App, dsn: str) -> None:
    _live_worker(tapp)
    job = tapp.get_task("t.quick").apply_async((1,), countdown=60)
    runner = CliRunner()
    text = runner.invoke(cli, ["--dsn", dsn, "jobs", "explain", str(job.id)], catch_exceptions=False)
    assert text.exit_code == 0
    assert text.output.splitlines()[0] == f"job {job.id}: queued"
    assert text.output.splitlines()[1].startswith("  not_due: not due until ")
    as_json = runner.invoke(
        cli, ["--dsn", dsn, "jobs", "explain", str(job.id), "--json"], catch_exceptions=False
    )
    document = orjson.loads(as_json.stdout)
    assert document["job_id"] == job.id and document["status"] == "queued"
    assert [r["code"] for r in document["reasons"]] == ["not_due"]
    missing = runner.invoke(cli, ["--dsn", dsn, "jobs", "explain", "9000000000"])
    assert missing.exit_code == 1 and "9000000000" in missing.output
    other = runner.invoke(cli, ["--dsn", dsn, "jobs", "explain", str(job.id), "--tenant", "someone"])
    assert other.exit_code == 1 and "no job with id" in other.output


def test_cli_explain_says_finished_once_and_agrees_with_one_job_ahead(tapp: pgtasks.App, dsn: str) -> None:
    _live_worker(tapp)
    quick = tapp.get_task("t.quick")
    done = quick.delay(1)
    run_until_idle(tapp, queues=[QUEUE])
    quick.delay(2)
    second = quick.delay(3)
    runner = CliRunner()

    def explained(job_id: int) -> list[str]:
        out = runner.invoke(cli, ["--dsn", dsn, "jobs", "explain", str(job_id)], catch_exceptions=False)
        assert out.exit_code == 0, out.output
        return out.output.splitlines()

    head, line = explained(done.id)
    assert head == f"job {done.id}: succeeded"
    assert line.startswith("  finished: succeeded at "), line
    finished_at = tapp.get_job(done.id).finished_at
    assert dt.datetime.fromisoformat(line.removeprefix("  finished: succeeded at ")) == finished_at
    assert explained(second.id)[1] == (
        "  behind: 1 due job of queue 'work' comes before it by priority and age"
        " (1 of its own tenant; claims serve tenants in turn)"
    )
