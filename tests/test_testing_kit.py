"""The testing kit (`pgtasks.testing`): its fixtures, `run_until_idle`, the test clock
and eager mode, against a real PostgreSQL, and its pytest plugin as a user gets it.

The tasks record what they see in lists of their own, so each test checks what ran
independently of the kit's summary; the job rows are read back through the app.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

import pgtasks
from pgtasks.errors import ConfigurationError, Reject, ResultTimeout, SerializationError, TaskFailed
from pgtasks.testing import RunSummary, TestClock, clock_for, eager, run_until_idle

pytest_plugins = ["pytester"]

DOCS = Path(__file__).resolve().parents[1] / "docs"
HOUR = dt.timedelta(hours=1)


def statuses(app: pgtasks.App, *results: pgtasks.AsyncResult) -> list[str]:
    return [app.get_job(r.id).status for r in results]


# -- fixtures ------------------------------------------------------------------------


def test_each_test_gets_its_own_migrated_database(pgtasks_app: pgtasks.App, pgtasks_dsn: str) -> None:
    assert pgtasks_app.settings.dsn == pgtasks_dsn
    with psycopg.connect(pgtasks_dsn) as conn:
        row = conn.execute("SELECT current_database(), count(*) FROM pgtasks.jobs").fetchone()
    assert row is not None
    assert row[0].startswith("pgtasks_kit_") and row[1] == 0


def test_use_database_refuses_an_empty_dsn_and_keeps_the_old_one(pgtasks_app: pgtasks.App) -> None:
    before = pgtasks_app.settings.dsn
    with pytest.raises(ConfigurationError):
        pgtasks_app.use_database("  ")
    assert pgtasks_app.settings.dsn == before
    assert pgtasks_app.queue_stats() == []


# -- run_until_idle ------------------------------------------------------------------


def test_run_until_idle_runs_due_jobs_through_the_worker_and_counts_outcomes(
    pgtasks_app: pgtasks.App,
) -> None:
    app = pgtasks_app
    seen: list[tuple[str, int]] = []

    @app.task(name="kit.add")
    def add(a: int, b: int) -> int:
        seen.append(("add", a + b))
        return a + b

    @app.task(name="kit.refuse", queue="other")
    def refuse(n: int) -> None:
        seen.append(("refuse", n))
        raise Reject(f"no {n}")

    ok, bad = add.delay(2, 3), refuse.delay(7)
    summary = run_until_idle(app)

    assert isinstance(summary, RunSummary)
    assert summary.counts == {"succeeded": 1, "retried": 0, "failed": 1, "cancelled": 0, "partial_failure": 0}
    assert summary.ran == 2 and summary.idle
    assert sorted(seen) == [("add", 5), ("refuse", 7)]
    assert ok.get(timeout=1) == 5
    assert statuses(app, ok, bad) == ["succeeded", "failed"]
    [failure] = summary.failures
    assert failure.job_id == bad.id and "no 7" in str(failure)
    assert run_until_idle(app).ran == 0  # nothing left


def test_a_failure_raises_only_when_asked(pgtasks_app: pgtasks.App) -> None:
    @pgtasks_app.task(name="kit.boom")
    def boom() -> None:
        raise RuntimeError("boom")

    r = boom.delay()
    with pytest.raises(TaskFailed) as info:
        run_until_idle(pgtasks_app, raise_on_failure=True)
    assert info.value.job_id == r.id and "RuntimeError" in str(info.value)
    assert info.value.traceback is not None and "boom" in info.value.traceback


def test_queues_and_max_jobs_bound_the_run(pgtasks_app: pgtasks.App) -> None:
    ran: list[int] = []

    @pgtasks_app.task(name="kit.note")
    def note(n: int) -> None:
        ran.append(n)

    others = [note.apply_async((n,), queue="elsewhere") for n in range(2)]
    for n in range(10, 13):
        note.delay(n)
    first = run_until_idle(pgtasks_app, queues=["default"], max_jobs=2)
    assert first.ran == 2 and not first.idle and ran == [10, 11]
    assert run_until_idle(pgtasks_app, queues=["default"]).ran == 1
    assert statuses(pgtasks_app, *others) == ["queued", "queued"]
    assert run_until_idle(pgtasks_app).succeeded == 2
    assert sorted(ran) == [0, 1, 10, 11, 12]


def test_jobs_a_task_enqueues_run_in_the_same_call(pgtasks_app: pgtasks.App) -> None:
    order: list[str] = []

    @pgtasks_app.task(name="kit.child", queue="children")
    def child(n: int) -> None:
        order.append(f"child {n}")

    @pgtasks_app.task(name="kit.parent")
    def parent() -> None:
        order.append("parent")
        child.delay(1)

    parent.delay()
    assert run_until_idle(pgtasks_app).succeeded == 2
    assert order == ["parent", "child 1"]


def test_the_timeout_stops_a_run_that_does_not_end(pgtasks_app: pgtasks.App) -> None:
    release = threading.Event()

    @pgtasks_app.task(name="kit.stuck")
    def stuck() -> None:
        release.wait(10)

    stuck.delay()
    began = time.monotonic()
    try:
        with pytest.raises(ResultTimeout):
            run_until_idle(pgtasks_app, timeout=0.3)
        assert time.monotonic() - began < 5
    finally:
        release.set()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_jobs": 0},
        {"timeout": 0},
        {"timeout": float("nan")},
        {"advance": -1},
        {"advance": dt.timedelta(seconds=-1)},
        {"queues": "default"},
        {"queues": []},
        {"schedules": "yes"},
    ],
)
def test_run_until_idle_refuses_bad_arguments_and_runs_nothing(
    pgtasks_app: pgtasks.App, kwargs: dict[str, Any]
) -> None:
    @pgtasks_app.task(name="kit.noop")
    def noop() -> None: ...

    r = noop.delay()
    with pytest.raises(ConfigurationError):
        run_until_idle(pgtasks_app, **kwargs)
    assert statuses(pgtasks_app, r) == ["queued"]


# -- time: countdown, backoff, cron ------------------------------------------------------


def test_a_countdown_runs_when_the_clock_has_moved_that_far(
    pgtasks_app: pgtasks.App, pgtasks_clock: TestClock
) -> None:
    @pgtasks_app.task(name="kit.later")
    def later() -> str:
        return "done"

    r = later.apply_async(countdown=60)
    assert run_until_idle(pgtasks_app).ran == 0
    assert run_until_idle(pgtasks_app, advance=59).ran == 0
    assert statuses(pgtasks_app, r) == ["queued"]
    summary = run_until_idle(pgtasks_app, advance=dt.timedelta(seconds=30))
    assert summary.succeeded == 1
    assert summary.advanced == dt.timedelta(seconds=30)  # the clock moved the whole window
    assert pgtasks_clock.offset == dt.timedelta(seconds=89)
    assert r.get(timeout=1) == "done"


def test_a_retry_with_backoff_runs_all_its_attempts_without_sleeping(pgtasks_app: pgtasks.App) -> None:
    attempts: list[int] = []

    @pgtasks_app.task(
        name="kit.flaky",
        bind=True,
        autoretry_for=(OSError,),
        max_retries=3,
        retry_backoff=60,
        retry_jitter=False,
    )
    def flaky(task: pgtasks.TaskContext) -> None:
        attempts.append(task.request.attempt)
        raise OSError("down")

    r = flaky.delay()
    first = run_until_idle(pgtasks_app)
    assert first.counts["retried"] == 1 and attempts == [1]
    job = pgtasks_app.get_job(r.id)
    assert job.status == "queued" and job.run_at is not None

    began = time.monotonic()
    rest = run_until_idle(pgtasks_app, advance=dt.timedelta(hours=2))
    assert time.monotonic() - began < 20  # backoff of 60 s, 120 s, 240 s... and no sleep
    assert attempts == [1, 2, 3, 4]
    assert rest.counts["retried"] == 2 and rest.failed == 1
    assert statuses(pgtasks_app, r) == ["failed"]
    assert [a.attempt for a in pgtasks_app.get_job(r.id).history()] == [1, 2, 3, 4]


def test_a_cron_schedule_fires_at_its_times_on_the_test_clock(
    pgtasks_app: pgtasks.App, pgtasks_clock: TestClock
) -> None:
    fired: list[dt.datetime | None] = []

    @pgtasks_app.periodic_task("0 2 * * *", timezone="Europe/Berlin", name="kit-nightly", bind=True)
    def nightly(task: pgtasks.TaskContext) -> None:
        fired.append(task.request.scheduled_for)

    start = pgtasks_clock.now()
    summary = run_until_idle(pgtasks_app, advance=dt.timedelta(days=2))
    assert summary.fired == 2 and summary.succeeded == 2
    assert len(fired) == 2
    for instant in fired:
        assert instant is not None
        local = instant.astimezone(ZoneInfo("Europe/Berlin"))
        assert (local.hour, local.minute) == (2, 0)
        assert start < instant <= start + dt.timedelta(days=2)
    history = pgtasks_app.schedules.history("kit-nightly")
    assert sorted(run.status for run in history) == ["succeeded", "succeeded"]


def test_a_dependent_schedule_runs_after_its_prerequisite_on_the_test_clock(pgtasks_app: pgtasks.App) -> None:
    order: list[tuple[str, str]] = []

    @pgtasks_app.periodic_task("0 1 * * *", timezone="UTC", name="kit-backup", bind=True)
    def backup(task: pgtasks.TaskContext) -> None:
        order.append(("backup", task.request.trigger))

    @pgtasks_app.periodic_task(None, after=["kit-backup"], name="kit-verify", bind=True)
    def verify(task: pgtasks.TaskContext) -> None:
        order.append(("verify", task.request.trigger))

    summary = run_until_idle(pgtasks_app, advance=dt.timedelta(days=1))
    assert order == [("backup", "schedule"), ("verify", "dependency")]
    assert summary.fired == 2 and summary.succeeded == 2
    assert pgtasks_app.schedules.get("kit-backup").last_outcome == "succeeded"


def test_the_clock_only_moves_on(pgtasks_app: pgtasks.App, pgtasks_clock: TestClock) -> None:
    assert clock_for(pgtasks_app) is pgtasks_clock
    for bad in (-1, dt.timedelta(seconds=-5), "1h", float("inf")):
        with pytest.raises(ConfigurationError):
            pgtasks_clock.advance(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        pgtasks_clock.move_to(dt.datetime(2000, 1, 1))  # naive
    with pytest.raises(ConfigurationError):
        pgtasks_clock.move_to(dt.datetime(2000, 1, 1, tzinfo=dt.UTC))  # the past
    assert pgtasks_clock.offset == dt.timedelta(0)
    target = pgtasks_clock.now() + HOUR
    pgtasks_clock.move_to(target)
    assert abs((pgtasks_clock.now() - target).total_seconds()) < 5


def test_an_app_on_another_database_gets_a_new_clock(
    pgtasks_app: pgtasks.App, pgtasks_clock: TestClock
) -> None:
    pgtasks_clock.advance(HOUR)
    assert clock_for(pgtasks_app) is pgtasks_clock
    first = pgtasks_app.settings.dsn
    assert first is not None
    try:
        pgtasks_app.use_database(first + " application_name=kit-other")
        fresh = clock_for(pgtasks_app)
        assert fresh is not pgtasks_clock and fresh.offset == dt.timedelta(0)
    finally:
        pgtasks_app.use_database(first)


# -- eager ---------------------------------------------------------------------------


def test_eager_runs_the_job_before_delay_returns(pgtasks_eager: pgtasks.App) -> None:
    app = pgtasks_eager
    seen: list[int] = []

    @app.task(name="kit.square")
    def square(n: int) -> int:
        seen.append(n)
        return n * n

    r = square.delay(4)
    assert seen == [4]
    assert r.status == "succeeded" and r.get(timeout=0.5) == 16


def test_eager_serialises_arguments_as_a_worker_would(pgtasks_eager: pgtasks.App) -> None:
    app = pgtasks_eager
    seen: list[object] = []

    @app.task(name="kit.keep")
    def keep(value: object) -> None:
        seen.append(value)

    # Values a plain function call would take, and that the enqueue path refuses.
    for value in (object(), {1: "int key comes back as str"}, "NUL \x00 in jsonb"):
        with pytest.raises(SerializationError):
            keep.delay(value)
    assert seen == [] and app.queue_stats() == []
    payload = {"items": [1, (2, 3)]}
    keep.delay(payload)
    assert seen == [payload] and seen[0] is not payload  # decoded from the row, as a worker does


def test_eager_failures_show_in_the_result_not_at_the_call(pgtasks_eager: pgtasks.App) -> None:
    @pgtasks_eager.task(name="kit.fails")
    def fails() -> None:
        raise ValueError("bad value")

    r = fails.delay()
    assert r.status == "failed"
    with pytest.raises(TaskFailed, match="bad value"):
        r.get(timeout=0.5)


def test_eager_keeps_the_tenant_of_a_tenant_handle(pgtasks_eager: pgtasks.App) -> None:
    seen: list[str] = []

    @pgtasks_eager.task(name="kit.whose", bind=True)
    def whose(task: pgtasks.TaskContext) -> str:
        seen.append(task.request.tenant)
        return task.request.tenant

    acme = pgtasks_eager.tenant("acme")
    r = acme.send_task("kit.whose")
    assert seen == ["acme"] and r.get(timeout=0.5) == "acme"
    assert acme.AsyncResult(r.id).status == "succeeded"
    assert pgtasks_eager.get_job(r.id).tenant == "acme"


def test_eager_leaves_transactional_and_future_jobs_queued(
    pgtasks_app: pgtasks.App, pgtasks_dsn: str
) -> None:
    ran: list[str] = []

    @pgtasks_app.task(name="kit.mark")
    def mark(label: str) -> None:
        ran.append(label)

    with eager(pgtasks_app):
        later = mark.apply_async(("later",), countdown=30)
        with psycopg.connect(pgtasks_dsn) as conn:
            in_tx = mark.apply_async(("in tx",), connection=conn)
            assert ran == []
        assert statuses(pgtasks_app, later, in_tx) == ["queued", "queued"]
        mark.delay("now")  # runs what is due: the committed one too
        assert sorted(ran) == ["in tx", "now"]
        assert run_until_idle(pgtasks_app, advance=30).succeeded == 1
    assert sorted(ran) == ["in tx", "later", "now"]
    mark.delay("after the block")
    assert "after the block" not in ran


# -- the plugin as a user gets it --------------------------------------------------------


def _docs_block(marker: str) -> str:
    text = (DOCS / "testing.md").read_text(encoding="utf-8")
    match = re.search(rf"<!-- test: skip \({re.escape(marker)}[^)]*\) -->\n```python\n(.*?)```", text, re.S)
    assert match is not None, f"docs/testing.md has no block marked {marker!r}"
    return match.group(1)


def test_the_plugin_gives_a_user_s_tests_their_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(shop=_docs_block("the app module"))
    pytester.makepyfile(test_shop=_docs_block("the tests"))
    pytester.makeini("[pytest]\npgtasks_app = shop:app\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=len(re.findall(r"^def test_", _docs_block("the tests"), re.M)))


def test_the_plugin_finds_a_failing_user_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_wrong="""
        from pgtasks.testing import run_until_idle

        def test_counts(pgtasks_app):
            @pgtasks_app.task(name="t.echo")
            def echo(x):
                return x

            echo.delay(1)
            assert run_until_idle(pgtasks_app).succeeded == 2
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*assert 1 == 2*"])


SERVER_CHECK = """
def test_server(pgtasks_app, pgtasks_server_dsn):
    import psycopg

    with psycopg.connect(pgtasks_server_dsn) as conn:
        data = conn.execute("SHOW data_directory").fetchone()[0]
    print(f"SERVER DATA {data}")
    assert pgtasks_app.queue_stats() == []
"""


def test_the_dsn_option_wins_over_the_environment(
    pytester: pytest.Pytester, pgtasks_server_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_server=SERVER_CHECK)
    monkeypatch.setenv("PGTASKS_TEST_DSN", "postgresql://nobody@127.0.0.1:1/none")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-q", "-s", "--pgtasks-dsn", pgtasks_server_dsn
    )
    result.assert_outcomes(passed=1)


@pytest.mark.embedded
def test_without_a_dsn_the_embedded_server_is_used(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_server=SERVER_CHECK)
    monkeypatch.delenv("PGTASKS_TEST_DSN", raising=False)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-s")
    result.assert_outcomes(passed=1)
    # A server of its own, in a temporary directory of the kit's, stopped at the end.
    (data,) = re.findall(r"SERVER DATA (\S+)", result.stdout.str())
    assert "pgtasks-kit-embedded-" in data
    assert not Path(data).exists()


def test_p_no_pgtasks_turns_the_plugin_off(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_off="def test_off(pgtasks_app):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-p", "no:pgtasks")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'pgtasks_app' not found*"])
