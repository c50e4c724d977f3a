"""The backup example runs end to end: in process, and as its one command."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from examples.backup.app import make_app  # noqa: E402 - needs the repository on the path
from examples.backup.run import run  # noqa: E402


def test_backup_example_steps(dsn: str, tmp_path: Path) -> None:
    app = make_app(dsn, workdir=tmp_path, agent="agent-1")
    out = io.StringIO()
    try:
        outcome = run(app, tmp_path, agent="agent-1", console=Console(file=out, width=220), timeout=90)
    finally:
        app.close()
    printed = out.getvalue()
    assert all(outcome["checks"].values()), printed
    nightly = outcome["runs"]["nightly"]
    failed, partial, manual = nightly
    assert (failed.error_code, failed.failure_class) == ("CONNECTIONERROR", "transient")
    assert partial.error_code == "FILES_UNREADABLE"
    assert partial.progress["files_failed"] >= 1  # the dangling link (and, for non-root, the mode-000 file)
    assert partial.result["failed"][0][0] in {"logs/current.log", "logs/unreadable.log"}
    # The archive the manual run wrote is real: it reads back to the bytes the sources hold.
    archive = Path(manual.result["archive"])
    with tarfile.open(archive, "r:gz") as tar:
        names = sorted(m.name for m in tar if m.isfile())
    assert "db/dump-part1.bin" in names and len(names) == manual.result["files"] == 7
    assert manual.result["bytes"] == outcome["sizes"]["data"] + 5_000
    assert manual.worker_id and manual.duration is not None
    assert "run history" in printed and "verify-backup" in printed and "dependency" in printed


@pytest.mark.slow
def test_backup_example_one_command(dsn: str, tmp_path: Path) -> None:
    env = {**os.environ, "PGTASKS_DSN": dsn, "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1", "COLUMNS": "220"}
    done = subprocess.run(
        [sys.executable, "-m", "examples.backup", "--workdir", str(tmp_path / "work")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok ") == 8 and "FAILED" not in done.stdout
    assert (tmp_path / "work" / "archives" / "nightly").is_dir()
