"""``pgtasks worker`` re-executes itself without the command line (pgtasks.worker.launch).

The process keeps its pid: it registers under it, runs jobs, and stops gracefully
on SIGTERM with exit code 0. ``python -m pgtasks.worker`` rejects a missing or bad
launch spec with a clear error. (That the spec, DSN included, stays out of the
command line is tests/test_secrets_argv.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps.worker_app import REPO, make_app, setup_ledger, status, worker_id_of, workers
from helpers import eventually

from pgtasks.errors import ConfigurationError
from pgtasks.worker import WorkerConfig
from pgtasks.worker.launch import WorkerLaunch


def _launch(**config: Any) -> WorkerLaunch:
    return WorkerLaunch(
        app_spec="tests.apps.worker_app:app",
        dsn="postgresql://example/db",
        plugins=("acme_plugin",),
        loglevel="WARNING",
        config=WorkerConfig(**config),
        beat=True,
    )


def test_a_launch_survives_its_json_form() -> None:
    launch = _launch(queues=("a", "b"), concurrency=3, prefetch_multiplier=7, lease_timeout=12.5)
    again = WorkerLaunch.from_json(launch.to_json())
    assert again == launch
    assert again.config.worker_id == launch.config.worker_id  # both images register one id


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("not json", "not a worker launch spec"),
        ("[]", "not a worker launch spec"),
        ('{"app_spec": "m:app"}', "not a worker launch spec"),
        ("concurrency0", "concurrency must be an int in 1..10000"),
        ("extra-field", "not a worker launch spec"),
    ],
)
def test_a_bad_launch_spec_is_a_configuration_error(text: str, reason: str) -> None:
    fields = json.loads(_launch().to_json())
    if text == "concurrency0":
        fields["config"]["concurrency"] = 0
        text = json.dumps(fields)
    elif text == "extra-field":
        fields["surprise"] = 1
        text = json.dumps(fields)
    with pytest.raises(ConfigurationError, match=reason):
        WorkerLaunch.from_json(text)


def _run_module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgtasks.worker", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_worker_module_needs_its_spec() -> None:
    missing = _run_module()
    assert missing.returncode == 2
    assert "usage: python -m pgtasks.worker --spec-fd N" in missing.stderr
    assert _run_module('{"app_spec": "m:app"}').returncode == 2  # a spec in argv is not read
    read_end, write_end = os.pipe()
    os.write(write_end, b'{"app_spec": 1}')
    os.close(write_end)
    try:
        bad = subprocess.run(
            [sys.executable, "-m", "pgtasks.worker", "--spec-fd", str(read_end)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            pass_fds=(read_end,),
        )
    finally:
        os.close(read_end)
    assert bad.returncode == 1
    assert bad.stderr.startswith("Error: not a worker launch spec")
    assert "Traceback" not in bad.stderr


def test_a_worker_process_reexecutes_under_its_pid_runs_jobs_and_stops_cleanly(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    setup_ledger(dsn)
    app = make_app(dsn)
    try:
        with workers(dsn, tmp_path, ["-c", "2", "--poll-interval", "0.1"]) as (worker,):
            worker_id_of(conn, worker.pid)  # registered under the pid the command started with
            cmdline = Path(f"/proc/{worker.pid}/cmdline").read_bytes().split(b"\0")
            assert cmdline[1:4] == [b"-m", b"pgtasks.worker", b"--spec-fd"], cmdline
            job = app.tasks["w.record"].delay(n=7)
            eventually(lambda: status(conn, job.id) == "succeeded", timeout=20, message="job done")
            assert job.get(timeout=5) == 7
            worker.signal(signal.SIGTERM)
            assert worker.wait(30) == 0, worker.log()
            assert "Traceback" not in worker.log()
    finally:
        app.close()


def test_the_opt_out_keeps_the_command_line_image(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGTASKS_WORKER_REEXEC", "0")
    setup_ledger(dsn)
    with workers(dsn, tmp_path, ["-c", "1", "--poll-interval", "0.1"]) as (worker,):
        worker_id_of(conn, worker.pid)
        cmdline = Path(f"/proc/{worker.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[1:3] == [b"-m", b"pgtasks"], cmdline
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.log()


def test_a_worker_that_cannot_reexecute_runs_in_its_first_image(dsn: str, tmp_path: Path) -> None:
    setup_ledger(dsn)
    script = (
        "import sys; sys.executable = '/nonexistent/python'\nfrom pgtasks.cli import main\nmain(sys.argv[1:])"
    )
    args = ["-A", "tests.apps.worker_app:app", "--dsn", dsn, "worker", "--burst", "--poll-interval", "0.1"]
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        env={**os.environ, "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "cannot re-execute the worker" in proc.stderr
    assert "/nonexistent/python" in proc.stderr
