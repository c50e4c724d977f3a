"""A worker on a queue no registered task routes to warns once at start, and still starts.

``-Q emials`` while the task routes to ``emails`` used to wait forever without a
word. The check runs in the worker (`pgtasks.worker.routing`), against the app's
registered tasks, plugins' included; the warning reaches stderr of a real worker
process, and like every log line there it carries no raw control character.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import pgtasks
from pgtasks.cli import cli

CLEAR = "\x1b[2J"


def run(dsn: str, *args: str, app_spec: str) -> Result:
    """``pgtasks --dsn DSN -A SPEC ARGS`` in process (the worker runs in place, not re-executed)."""
    env = {"PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return CliRunner().invoke(cli, ["--dsn", dsn, "-A", app_spec, *args], env=env, catch_exceptions=False)


def assert_terminal_safe(output: str) -> None:
    """No control character but newlines reached the output."""
    raw = sorted({f"{ord(c):#x}" for c in output if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0})
    assert raw == [], f"raw control characters in the output: {raw}"


APP_MODULE = """
import pgtasks
import pgtasks.errors

app = pgtasks.App("routing", load_entry_points=False)


@app.task(name="send_mail", queue="emails")
def send_mail() -> None:
    return None


@app.task(name="resize", queue="images", max_retries=0)
def resize() -> None:
    raise pgtasks.errors.Reject("\\x1b[2J\\x07the screen is cleared")
"""


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``module:app`` of an app whose tasks route to ``emails`` and ``images``."""
    name = f"routing_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(APP_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{name}:app"
    sys.modules.pop(name, None)


def test_a_worker_on_an_unrouted_queue_warns_once_and_still_runs(
    app_module: str, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pgtasks")
    burst = ("--burst", "--poll-interval", "0.05")
    routed = run(dsn, "worker", "-Q", "emails,images", *burst, app_spec=app_module)
    assert routed.exit_code == 0, routed.output
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []  # the right queues: no word
    caplog.clear()
    result = run(dsn, "worker", "-Q", "emials,images", *burst, app_spec=app_module)
    assert result.exit_code == 0, result.output
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "'emials' (did you mean 'emails'?)" in warnings[0]
    assert "known queues: 'emails', 'images'" in warnings[0] and "'images' (" not in warnings[0]
    assert any("ready" in r.getMessage() for r in caplog.records)  # it started all the same


def test_a_real_worker_process_warns_on_stderr_and_logs_no_control_character(
    app_module: str, app: pgtasks.App, dsn: str, tmp_path: Path
) -> None:
    @app.task(name="resize", queue="images")
    def resize() -> None: ...

    job = resize.delay()
    env = {**os.environ, "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1", "PGTASKS_DSN": dsn}
    done = subprocess.run(
        [sys.executable, "-m", "pgtasks", "-A", app_module, "worker", "-Q", "emials,images", "--burst"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "no registered task routes to" in line]
    assert len(lines) == 1 and "WARNING" in lines[0] and "did you mean 'emails'?" in lines[0]
    assert app.get_job(job.id).status == "failed"  # its failure was logged, as escapes
    assert "\\x1b[2J\\x07the screen is cleared" in done.stderr
    assert_terminal_safe(done.stderr)


def test_the_warning_names_queues_without_control_characters() -> None:
    from pgtasks.worker.routing import unrouted_queues_warning

    app = pgtasks.App("names", load_entry_points=False)

    @app.task(name="t", queue="emails")
    def t() -> None: ...

    warning = unrouted_queues_warning([f"e{CLEAR}"], app.tasks)
    assert warning is not None and "\x1b" not in warning and "\\x1b[2J" in warning
    assert unrouted_queues_warning(["emails"], app.tasks) is None
    bare = unrouted_queues_warning(["default"], pgtasks.App("bare", load_entry_points=False).tasks)
    assert bare is not None and "the app registers no task" in bare


def test_queues_of_plugin_tasks_are_known(
    app_module: str, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    from pgtasks_delete import DELETE_QUEUE

    caplog.set_level(logging.INFO, logger="pgtasks")
    plugin = ("--plugin", "pgtasks_delete.plugin")
    result = CliRunner().invoke(
        cli,
        ["--dsn", dsn, "-A", app_module, *plugin, "worker", "-Q", f"emails,{DELETE_QUEUE}", "--burst"],
        env={"PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any("ready" in r.getMessage() for r in caplog.records)
