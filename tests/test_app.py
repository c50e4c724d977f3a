"""The App: settings and DSN resolution, connection failures, the task registry, enqueue hooks."""

from __future__ import annotations

import asyncio
import traceback
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

import pgtasks
from pgtasks.errors import ConfigurationError, ConnectionFailed, DatabaseError, UnknownTask
from pgtasks.settings import Settings

UNREACHABLE = "postgresql://postgres:s3cret-pw@127.0.0.1:1/test"


def double(x: int) -> int:
    """Return twice ``x``."""
    return 2 * x


# -- settings ----------------------------------------------------------------------------------


def test_dsn_resolution_order() -> None:
    env = {"PGTASKS_DSN": "postgresql:///from-pgtasks", "DATABASE_URL": "postgresql:///from-url"}
    s = Settings.from_env("postgresql:///from-arg", environ=env)
    assert (s.dsn, s.dsn_source) == ("postgresql:///from-arg", "argument")
    s = Settings.from_env(environ=env)
    assert (s.dsn, s.dsn_source) == ("postgresql:///from-pgtasks", "PGTASKS_DSN")
    s = Settings.from_env(environ={"DATABASE_URL": "postgresql:///from-url"})
    assert (s.dsn, s.dsn_source) == ("postgresql:///from-url", "DATABASE_URL")
    s = Settings.from_env(environ={"PGTASKS_DSN": "", "DATABASE_URL": "postgresql:///from-url"})
    assert s.dsn_source == "DATABASE_URL"  # an empty variable counts as unset
    s = Settings.from_env(environ={})
    assert (s.dsn, s.dsn_source) == (None, "embedded")


def test_embedded_dir_and_plugin_autoload_switch() -> None:
    s = Settings.from_env(environ={"PGTASKS_EMBEDDED_DIR": "/srv/pg"})
    assert s.embedded_dir == Path("/srv/pg")
    assert s.load_entry_points is True
    assert Settings.from_env(environ={}).embedded_dir is None
    for value in ("1", "true", "yes", "TRUE"):
        assert (
            Settings.from_env(environ={"PGTASKS_DISABLE_PLUGIN_AUTOLOAD": value}).load_entry_points is False
        )
    for value in ("", "0", "no"):
        assert Settings.from_env(environ={"PGTASKS_DISABLE_PLUGIN_AUTOLOAD": value}).load_entry_points is True


def test_settings_are_validated_and_frozen() -> None:
    with pytest.raises(ConfigurationError, match="empty DSN"):
        Settings.from_env("   ")
    with pytest.raises(ConfigurationError, match="pool_size"):
        Settings.from_env("postgresql:///x", pool_size=0)
    s = Settings.from_env("postgresql:///x", pool_size=3, prepare_threshold=None)
    assert (s.pool_size, s.prepare_threshold) == (3, None)
    with pytest.raises(AttributeError):
        s.dsn = "other"  # type: ignore[misc]


def test_app_takes_dsn_or_settings_not_both() -> None:
    with pytest.raises(ConfigurationError, match="not both"):
        pgtasks.App(
            "x", dsn="postgresql:///a", settings=Settings(dsn="postgresql:///b", dsn_source="argument")
        )
    app = pgtasks.App(
        "x", settings=Settings(dsn="postgresql:///b", dsn_source="argument"), load_entry_points=False
    )
    assert app.settings.dsn == "postgresql:///b"
    assert repr(app) == "<App x dsn from argument>"


def test_app_reads_pgtasks_dsn_from_the_environment(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGTASKS_DSN", dsn)
    monkeypatch.setenv("DATABASE_URL", UNREACHABLE)
    monkeypatch.setenv("PGTASKS_DISABLE_PLUGIN_AUTOLOAD", "1")
    app = pgtasks.App("env")
    try:
        assert app.settings.dsn_source == "PGTASKS_DSN"
        assert app.migrate() == []
        assert app.task(name="double")(double).delay(2).status == "queued"
    finally:
        app.close()


def test_plugin_autoload_follows_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGTASKS_DISABLE_PLUGIN_AUTOLOAD", "1")
    off = pgtasks.App("off", dsn=UNREACHABLE)
    names = {name for name, _ in off.plugin_manager.list_name_plugin()}
    assert names == {"pgtasks.core"}
    assert off.tasks == {}
    installed = {ep.name for ep in entry_points(group="pgtasks")}
    if not installed:
        pytest.skip("no plugin of the pgtasks entry-point group is installed")
    on = pgtasks.App("on", dsn=UNREACHABLE, load_entry_points=True)
    loaded = {name for name, _ in on.plugin_manager.list_name_plugin()}
    assert installed <= loaded


# -- connection failures -------------------------------------------------------------------------


def test_unreachable_database_raises_connection_failed_naming_host_and_port() -> None:
    app = pgtasks.App("down", dsn=UNREACHABLE, load_entry_points=False)
    t = app.task(name="double")(double)
    try:
        for call in (
            app.migrate,
            lambda: t.delay(1),
            lambda: app.get_job(1),
            lambda: app.AsyncResult(1).status,
        ):
            with pytest.raises(ConnectionFailed) as info:
                call()
            err = info.value
            assert "127.0.0.1:1" in str(err)
            assert "s3cret-pw" not in str(err)
            assert isinstance(err, DatabaseError)
            assert err.transient is True
            assert err.sqlstate is None
            assert err.__cause__ is None
            assert err.__suppress_context__ is True
            text = "".join(traceback.format_exception(err))
            assert "During handling of the above exception" not in text
            assert "direct cause" not in text
            assert "psycopg.OperationalError" not in text
    finally:
        app.close()


def test_connection_failure_writes_nothing_and_the_app_recovers(dsn: str) -> None:
    app = pgtasks.App("down", dsn=UNREACHABLE, load_entry_points=False)
    with pytest.raises(ConnectionFailed):
        app.migrate()
    app.close()
    good = pgtasks.App("up", dsn=dsn, load_entry_points=False)
    try:
        assert good.list_jobs() == []
    finally:
        good.close()


# -- the task registry ---------------------------------------------------------------------------


def test_task_registration_and_lookup(app: pgtasks.App) -> None:
    t = app.task(double)
    assert t.name == "test_app.double"
    assert app.get_task("test_app.double") is t
    assert app.tasks == {"test_app.double": t}
    assert t.__name__ == "double"
    assert t.__doc__ == double.__doc__
    assert t.__wrapped__ is double
    assert repr(t) == "<Task test_app.double queue=default>"
    with pytest.raises(UnknownTask, match="nope") as info:
        app.get_task("nope")
    assert info.value.name == "nope"
    assert isinstance(info.value, LookupError)


def test_send_task_enqueues_by_name_with_options_and_refuses_unknown_names(app: pgtasks.App) -> None:
    app.task(double)
    r = app.send_task("test_app.double", args=(21,), queue="other", tenant="acme", countdown=60)
    job = app.get_job(r.id)
    assert (job.task_name, job.args, job.queue, job.tenant) == ("test_app.double", [21], "other", "acme")
    assert (job.run_at - job.created_at).total_seconds() == pytest.approx(60, abs=5)
    before = len(app.list_jobs())
    with pytest.raises(UnknownTask, match=r"test_app\.nope"):
        app.send_task("test_app.nope", args=(1,))
    with pytest.raises(ConfigurationError, match="unknown option"):
        app.send_task("test_app.double", args=(1,), contdown=5)
    assert len(app.list_jobs()) == before  # nothing written by the refused calls
    r2 = asyncio.run(app.send_task_async("test_app.double", args=(2,), kwargs={}))
    assert app.get_job(r2.id).args == [2]


def test_task_options_defaults_are_celerys(app: pgtasks.App) -> None:
    opts = app.task(name="d")(double).options
    assert opts.queue == "default"
    assert opts.priority == 0
    assert opts.max_retries == 3
    assert opts.max_attempts == 4
    assert opts.retry_backoff is False
    assert opts.retry_backoff_max == 600
    assert opts.retry_jitter is True
    assert opts.default_retry_delay == 180
    assert opts.acks_late is True
    assert opts.retry_on_worker_lost is True
    assert app.task(name="once", max_retries=0)(double).options.max_attempts == 1


def test_calling_a_task_runs_it_in_process(app: pgtasks.App) -> None:
    assert app.task(name="d")(double)(21) == 42


def test_calling_a_bound_task_passes_a_detached_context(app: pgtasks.App) -> None:
    seen: list[Any] = []

    @app.task(bind=True, name="bound")
    def bound(self: pgtasks.TaskContext, x: int) -> int:
        seen.append((self.request.id, self.request.args, self.name, self.is_cancelled()))
        self.report_progress(done=1)  # no job: ignored
        return x + 1

    assert bound(1) == 2
    assert seen == [(None, (1,), "bound", False)]


def test_calling_an_async_task_runs_it_to_completion(app: pgtasks.App) -> None:
    @app.task(name="async")
    async def slow_double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    assert slow_double.is_async
    assert slow_double(4) == 8


def test_autoretry_for_accepts_any_iterable(app: pgtasks.App) -> None:
    t = app.task(name="r", autoretry_for=[OSError, ValueError])(double)
    assert t.options.autoretry_for == (OSError, ValueError)


# -- enqueue hooks ------------------------------------------------------------------------------


class _Recorder:
    def __init__(self) -> None:
        self.after: list[tuple[str, list[int], bool]] = []

    @pgtasks.hookimpl
    def pgtasks_before_enqueue(
        self, task_name: str, options: dict[str, Any], headers: dict[str, Any]
    ) -> None:
        headers["trace_id"] = f"trace-{task_name}"
        headers["seen_queue"] = options["queue"]

    @pgtasks.hookimpl
    def pgtasks_after_enqueue(self, task_name: str, job_ids: list[int], in_transaction: bool) -> None:
        self.after.append((task_name, job_ids, in_transaction))


class _Broken:
    @pgtasks.hookimpl
    def pgtasks_after_enqueue(self, task_name: str, job_ids: list[int], in_transaction: bool) -> None:
        raise RuntimeError("plugin bug")


def test_enqueue_hooks_add_headers_and_see_job_ids(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    recorder = _Recorder()
    app = pgtasks.App("hooks", dsn=dsn, load_entry_points=False, plugins=[_Broken(), recorder])
    try:
        t = app.task(name="double", queue="math")(double)
        r = t.delay(1)
        assert app.get_job(r.id).headers == {"trace_id": "trace-double", "seen_queue": "math"}
        many = t.delay_many(range(3))
        assert recorder.after == [("double", [r.id], False), ("double", [m.id for m in many], False)]
        assert "plugin bug" in caplog.text  # logged, and the enqueue still happened
    finally:
        app.close()


def test_bulk_copy_keeps_each_calls_lock_key_and_hook_headers(dsn: str) -> None:
    # 200 calls take the COPY path; the lock key comes from each call's argument and
    # the headers from the before-enqueue hook, row by row.
    recorder = _Recorder()
    app = pgtasks.App("hooks", dsn=dsn, load_entry_points=False, plugins=[recorder])
    try:
        t = app.task(name="locked", queue="math", lock=lambda x: f"doc:{x}")(double)
        many = t.delay_many(range(200), priority=2)
        assert recorder.after == [("locked", [m.id for m in many], False)]
        for i in (0, 1, 137, 199):
            job = app.get_job(many[i].id)
            assert (job.args, job.lock_key, job.priority, job.queue) == ([i], f"doc:{i}", 2, "math")
            assert job.headers == {"trace_id": "trace-locked", "seen_queue": "math"}
    finally:
        app.close()


def test_close_and_reuse(app: pgtasks.App) -> None:
    t = app.task(name="d")(double)
    first = t.delay(1)
    app.close()
    assert first.status == "queued"  # the pool reopens on next use
