"""Plugins: discovery, strict hook names, isolation of notification hooks, real workers.

The third-party plugin here is a real distribution: a package and a ``.dist-info``
with an ``entry_points.txt`` written into a temporary directory put on the path,
so it is found exactly as a ``pip install``-ed plugin is, by a real worker process.
"""

from __future__ import annotations

import contextvars
import importlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps.worker_app import APP_SPEC, make_app
from click.testing import CliRunner

import pgtasks
from pgtasks import hookimpl
from pgtasks.cli import cli
from pgtasks.context import TaskContext
from pgtasks.errors import ConfigurationError, Reject
from pgtasks.plugins import PluginMigrations, describe_plugins, load_module_plugin, make_plugin_manager
from pgtasks.states import JobStatus
from pgtasks.worker import Worker, WorkerConfig

REPO = Path(__file__).resolve().parents[1]

PLUGIN_SOURCE = '''
"""A third-party pgtasks plugin, as a separate distribution would ship it."""
import os

import click
import psycopg

from pgtasks import hookimpl
from pgtasks.plugins import PluginMigrations


@hookimpl
def pgtasks_register_tasks(app):
    @app.task(name="acme.shout", queue="acme", bind=True)
    def shout(self, text):
        return {"text": text.upper(), "trace": self.request.headers.get("acme_trace")}


@hookimpl
def pgtasks_add_migrations():
    return PluginMigrations(plugin="acme_pgtasks", package="acme_pgtasks_plugin")


@hookimpl
def pgtasks_before_enqueue(task_name, options, headers):
    if task_name == "acme.shout":
        headers["acme_trace"] = "trace-42"


@hookimpl
def pgtasks_job_succeeded(job_id, task_name, result, runtime):
    if task_name == "acme.shout":
        with psycopg.connect(os.environ["PGTASKS_DSN"], autocommit=True) as conn:
            conn.execute(
                "INSERT INTO acme.ledger (job_id, result_text, pid) VALUES (%s, %s, %s)",
                (job_id, result["text"], os.getpid()),
            )


@hookimpl
def pgtasks_add_commands(cli):
    @cli.command("acme-hello")
    def hello():
        """Say hello from the acme plugin."""
        click.echo("hello from acme")
'''


@pytest.fixture
def acme_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Install the third-party plugin as a distribution on a temporary path entry."""
    site = tmp_path / "site"
    package = site / "acme_pgtasks_plugin"
    (package / "migrations").mkdir(parents=True)
    (package / "__init__.py").write_text(PLUGIN_SOURCE)
    (package / "migrations" / "0001_ledger.sql").write_text(
        "CREATE SCHEMA acme;\n"
        "CREATE TABLE acme.ledger (job_id bigint PRIMARY KEY, result_text text NOT NULL, pid integer);\n"
    )
    info = site / "acme_pgtasks-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-pgtasks\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pgtasks]\nacme = acme_pgtasks_plugin\n")
    (info / "RECORD").write_text("")
    # The application a worker runs: a plain app, plugins come from entry points.
    (site / "acme_app.py").write_text("import pgtasks\n\napp = pgtasks.App('acme')\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    yield site
    sys.modules.pop("acme_pgtasks_plugin", None)


def _env(dsn: str, *paths: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PGTASKS_DSN"] = dsn
    env["COLUMNS"] = "250"  # rich tables: no wrapping inside the checked strings
    env.pop("PGTASKS_DISABLE_PLUGIN_AUTOLOAD", None)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(REPO), env.get("PYTHONPATH", "")])
    return env


def test_third_party_plugin_from_its_entry_point_runs_in_a_real_worker(acme_dist: Path, dsn: str) -> None:
    app = pgtasks.App("acme-test", dsn=dsn, load_entry_points=True)
    try:
        assert "acme.shout" in app.tasks
        sources = {p.name: p.source for p in describe_plugins(app.plugin_manager)}
        assert sources["acme"] == "entry point acme = acme_pgtasks_plugin (acme-pgtasks 1.0)"
        assert "acme_pgtasks:0001_ledger" in app.migrate()
        result = app.get_task("acme.shout").delay("hello")
        assert app.get_job(result.id).headers == {"acme_trace": "trace-42"}  # before_enqueue hook

        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pgtasks",
                "-A",
                "acme_app:app",
                "worker",
                "-Q",
                "acme",
                "-c",
                "1",
                "--burst",
                "--poll-interval",
                "0.1",
            ],
            env=_env(dsn, acme_dist),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert result.get(timeout=10) == {"text": "HELLO", "trace": "trace-42"}
        with psycopg.connect(dsn) as conn:
            rows = conn.execute("SELECT job_id, result_text, pid FROM acme.ledger").fetchall()
        assert len(rows) == 1
        job_id, text, pid = rows[0]
        assert (job_id, text) == (result.id, "HELLO")
        assert pid != os.getpid()  # the hook ran in the worker process

        listing = subprocess.run(
            [sys.executable, "-m", "pgtasks", "plugins"],
            env=_env(dsn, acme_dist),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert listing.returncode == 0, listing.stderr
        assert "acme_pgtasks_plugin" in listing.stdout and "acme-pgtasks 1.0" in listing.stdout
        hello = subprocess.run(
            [sys.executable, "-m", "pgtasks", "acme-hello"],
            env=_env(dsn, acme_dist),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (hello.returncode, hello.stdout.strip()) == (0, "hello from acme"), hello.stderr
    finally:
        app.close()


def test_autoload_switch_leaves_entry_point_plugins_out(
    acme_dist: Path, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGTASKS_DISABLE_PLUGIN_AUTOLOAD", "1")
    app = pgtasks.App("no-autoload", dsn=dsn)
    assert "acme.shout" not in app.tasks and "pgtasks.index" not in app.tasks
    assert [p.name for p in describe_plugins(app.plugin_manager)] == ["pgtasks.core"]
    assert "acme.shout" in pgtasks.App("explicit", dsn=dsn, load_entry_points=True).tasks
    result = CliRunner().invoke(cli, ["--dsn", dsn, "plugins"], catch_exceptions=False)
    assert result.exit_code == 0
    assert "acme = acme_pgtasks_plugin" in result.output and "auto-loading is off" in result.output


# -- strict hook names ---------------------------------------------------------------


class Misspelled:
    @hookimpl
    def pgtasks_job_succeded(self, job_id: int) -> None:  # sic
        raise AssertionError("never called")


class MisspelledUnmarked:
    def pgtasks_worker_stared(self, worker_id: str) -> None:  # sic, and without @hookimpl
        raise AssertionError("never called")


class WrongArgument:
    @hookimpl
    def pgtasks_job_succeeded(self, job_id: int, outcome: str) -> None:  # no such argument
        raise AssertionError("never called")


@pytest.mark.parametrize(
    ("plugin", "message"),
    [
        (Misspelled(), "'pgtasks_job_succeded' (did you mean 'pgtasks_job_succeeded'?)"),
        (MisspelledUnmarked(), "'pgtasks_worker_stared' (did you mean 'pgtasks_worker_started'?)"),
        (WrongArgument(), "outcome"),
    ],
)
def test_a_misspelled_hook_fails_at_start_up(plugin: object, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        pgtasks.App("bad", dsn="postgresql://unused", load_entry_points=False, plugins=[plugin])
    assert message in str(info.value)
    app = pgtasks.App("late", dsn="postgresql://unused", load_entry_points=False)
    with pytest.raises(ConfigurationError, match="plugin"):
        app.plugin_manager.register(plugin)
    assert not app.plugin_manager.is_registered(plugin)


def test_a_misspelled_hook_in_a_plugin_module_stops_the_worker_command(tmp_path: Path, dsn: str) -> None:
    (tmp_path / "typo_plugin.py").write_text(
        "from pgtasks import hookimpl\n\n@hookimpl\ndef pgtasks_job_faild(job_id):\n    pass\n"
    )
    (tmp_path / "plain_app.py").write_text("import pgtasks\n\napp = pgtasks.App('plain')\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pgtasks",
            "-A",
            "plain_app:app",
            "--plugin",
            "typo_plugin",
            "worker",
            "--burst",
        ],
        env=_env(dsn, tmp_path),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "pgtasks_job_faild" in done.stderr and "did you mean 'pgtasks_job_failed'" in done.stderr


def test_a_broken_entry_point_fails_at_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "broken_pgtasks-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-pgtasks\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[pgtasks]\nbroken = no_such_module_for_pgtasks\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    with pytest.raises(ConfigurationError, match=r"'broken' .* failed to load"):
        make_plugin_manager(load_entry_points=True)


def test_module_plugins_load_once_and_bad_paths_are_clear() -> None:
    app = pgtasks.App("m", dsn="postgresql://unused", load_entry_points=False)
    first = load_module_plugin(app.plugin_manager, "pgtasks_delete.plugin")
    assert load_module_plugin(app.plugin_manager, "pgtasks_delete.plugin") is first
    assert "pgtasks.delete" in app.tasks  # historic hook reached the late plugin
    with pytest.raises(ConfigurationError, match=r"cannot load plugin 'nope\.nothing'"):
        load_module_plugin(app.plugin_manager, "nope.nothing")


def test_plugin_migration_sets_are_validated() -> None:
    with pytest.raises(ConfigurationError, match="key"):
        PluginMigrations(plugin="Bad-Key", package="pgtasks_index")
    with pytest.raises(ConfigurationError, match="no migrations folder"):
        PluginMigrations(plugin="ghost", package="pgtasks_index", directory="nowhere").migrations()


# -- hooks around real jobs ----------------------------------------------------------------

CURRENT_JOB: contextvars.ContextVar[int | None] = contextvars.ContextVar("current_job", default=None)


class Recorder:
    """Records notification hooks (thread-safe: the worker calls them from its threads)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.lock = threading.Lock()

    @hookimpl
    def pgtasks_job_succeeded(self, job_id: int, task_name: str, result: Any) -> None:
        with self.lock:
            self.calls.append(("succeeded", (task_name, result)))

    @hookimpl
    def pgtasks_job_failed(
        self, job_id: int, task_name: str, error: dict[str, Any], final_status: str
    ) -> None:
        with self.lock:
            self.calls.append(("failed", (task_name, error["code"], final_status)))

    @hookimpl
    def pgtasks_worker_started(self, worker_id: str, queues: list[str]) -> None:
        with self.lock:
            self.calls.append(("started", tuple(queues)))


class Exploding:
    """Every notification hook raises; none of it may change a job's outcome."""

    @hookimpl
    def pgtasks_job_succeeded(self, job_id: int) -> None:
        raise RuntimeError("boom in succeeded")

    @hookimpl
    def pgtasks_job_failed(self, job_id: int) -> None:
        raise RuntimeError("boom in failed")

    @hookimpl
    def pgtasks_worker_started(self, worker_id: str) -> None:
        raise RuntimeError("boom in started")

    @hookimpl
    def pgtasks_after_enqueue(self, job_ids: list[int]) -> None:
        raise RuntimeError("boom in after_enqueue")


class Tracing:
    """A wrapper around execution that sets a context variable for the task."""

    @hookimpl(wrapper=True)
    def pgtasks_execute_job(self, context: TaskContext) -> Any:
        token = CURRENT_JOB.set(context.request.id)
        try:
            return (yield)
        finally:
            CURRENT_JOB.reset(token)


def _run_burst(app: pgtasks.App) -> int:
    worker = Worker(app, WorkerConfig(queues=("default",), concurrency=2, burst=True, poll_interval=0.1))
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.run()))
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "worker did not finish"
    return codes[0]


def test_failing_notification_hooks_are_isolated_and_logged(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    app = pgtasks.App("iso", dsn=dsn, load_entry_points=False, plugins=[recorder, Exploding(), Tracing()])
    try:

        @app.task(name="ok")
        def ok() -> int | None:
            return CURRENT_JOB.get()

        @app.task(name="bad", max_retries=3)
        def bad() -> None:
            raise Reject("not this one", code="NOPE")

        caplog.set_level(logging.ERROR, logger="pgtasks.plugins")
        good = ok.delay()  # after_enqueue raises: the job is written all the same
        failing = bad.delay()
        assert _run_burst(app) == 0

        job = app.get_job(good.id)
        assert job.status is JobStatus.SUCCEEDED and job.result == good.id  # wrapper hook set the variable
        job = app.get_job(failing.id)
        assert job.status is JobStatus.FAILED and job.attempt == 1 and job.error is not None
        assert job.error["code"] == "NOPE"
        assert ("succeeded", ("ok", good.id)) in recorder.calls  # plugins after the failing one still run
        assert ("failed", ("bad", "NOPE", "failed")) in recorder.calls
        assert ("started", ("default",)) in recorder.calls
        for hook in (
            "pgtasks_job_succeeded",
            "pgtasks_job_failed",
            "pgtasks_worker_started",
            "pgtasks_after_enqueue",
        ):
            assert f"failed in {hook}; ignored" in caplog.text, hook
        assert "boom in succeeded" in caplog.text  # with the traceback
    finally:
        app.close()


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_plugin_module_wraps_execution_where_the_task_runs_in_either_pool(pool: str, dsn: str) -> None:
    """``--plugin`` modules reach the process that runs the task body: the children of the
    processes pool register them as the worker does, so an execution wrapper is not skipped."""
    app = make_app(dsn)
    try:
        job = app.tasks["w.pid"].delay()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pgtasks",
                "-A",
                APP_SPEC,
                "--plugin",
                "tests.apps.wrap_plugin",
                "worker",
                "-P",
                pool,
                "-c",
                "1",
                "--burst",
                "--poll-interval",
                "0.1",
            ],
            env={**os.environ, "PGTASKS_DSN": dsn, "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        record = app.get_job(job.id)
        assert record.status is JobStatus.SUCCEEDED, record.error
        result = record.result
        assert isinstance(result, dict), f"no wrapper ran around the job in the {pool} pool: {result!r}"
        task_pid = result["result"]  # w.pid returns the pid of the process running the task body
        assert result["wrapped_in"] == task_pid  # the wrapper ran in that same process
        assert record.worker_id is not None
        worker_pid = int(record.worker_id.split(":")[1])  # host:pid:random
        if pool == "threads":
            assert task_pid == worker_pid
        else:
            assert task_pid != worker_pid  # a child process ran it, and the plugin was there
    finally:
        app.close()


def test_plugins_command_lists_plugins_with_their_origin_and_hooks(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGTASKS_DISABLE_PLUGIN_AUTOLOAD", "1")
    result = CliRunner().invoke(
        cli, ["--dsn", dsn, "--plugin", "pgtasks_index.plugin", "plugins"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "pgtasks_index.plugin" in out and "module pgtasks_index.plugin" in out
    assert "pgtasks_search" in out and "pgtasks_add_migrations" in out
    assert "pgtasks.core" in out


def test_slow_hooks_are_reported(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from pgtasks import plugins

    class Slow:
        @hookimpl
        def pgtasks_worker_stopping(self, worker_id: str, reason: str) -> None:
            return None

    monkeypatch.setattr(plugins, "SLOW_HOOK_SECONDS", -1.0)  # every call counts as slow
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(Slow())
    with caplog.at_level(logging.WARNING, logger="pgtasks.plugins"):
        plugins.call_isolated(pm, "pgtasks_worker_stopping", worker_id="w", reason="signal")
    assert "hooks should be cheap" in caplog.text


def test_ocr_plugin_says_how_to_install_tesseract_when_a_worker_starts_without_it(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import pgtasks_ocr.plugin

    monkeypatch.setenv("PATH", str(tmp_path))  # no tesseract here
    app = pgtasks.App("ocr-check", dsn=dsn, load_entry_points=False, plugins=[pgtasks_ocr.plugin])
    try:
        with caplog.at_level(logging.INFO, logger="pgtasks_ocr"):
            worker = Worker(app, WorkerConfig(queues=("ocr",), concurrency=1, burst=True, poll_interval=0.1))
            assert worker.run(install_signal_handlers=False) == 0
        assert "Tesseract OCR is not installed" in caplog.text
        assert "apt-get install -y tesseract-ocr tesseract-ocr-eng tesseract-ocr-deu" in caplog.text
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pgtasks_ocr"):
            worker = Worker(
                app, WorkerConfig(queues=("index",), concurrency=1, burst=True, poll_interval=0.1)
            )
            assert worker.run(install_signal_handlers=False) == 0
        assert "Tesseract" not in caplog.text  # only workers serving the ocr queue check
    finally:
        app.close()


# Modules the built-in plugins may import from pgtasks (docs/plugins.md, "What a plugin may use").
PLUGIN_FACING = frozenset(
    {
        "pgtasks",
        "pgtasks.plugin_api",
        "pgtasks.errors",
        "pgtasks.states",
        "pgtasks.context",
        "pgtasks.serialization",
    }
)


def _pgtasks_imports(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every ``pgtasks`` module a file imports, at run time or for typing."""
    import ast

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            if name == "pgtasks" or name.startswith("pgtasks."):
                yield node.lineno, name


def test_built_in_plugins_import_only_the_plugin_facing_api() -> None:
    found: list[str] = []
    files = sorted((REPO / "plugins").glob("*/**/*.py"))
    for path in files:
        found += [
            f"{path.relative_to(REPO)}:{line}: {module}"
            for line, module in _pgtasks_imports(path)
            if module not in PLUGIN_FACING
        ]
    assert len(files) > 10, "the scan found the plugins"
    assert found == [], "plugins reaching past pgtasks.plugin_api:\n" + "\n".join(found)
