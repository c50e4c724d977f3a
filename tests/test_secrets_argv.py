"""No DSN password in the command line of any process ``pgtasks worker`` leaves running.

Every local user can read ``/proc/<pid>/cmdline``. A worker started with ``--dsn``
re-executes itself (pgtasks.worker.launch); its launch spec, DSN included, must
reach the new image through an inherited file descriptor, never through argv.
The processes pool's children (``spawn``) and the scheduler beside the worker
(``-B``) must not carry it there either, and the worker's log must not show it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from apps.worker_app import APP_SPEC, REPO, make_app, status, worker_id_of
from helpers import eventually
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgtasks.worker import WorkerConfig
from pgtasks.worker.launch import WorkerLaunch, main, read_spec_fd, spec_fd
from pgtasks.worker.processes import ChildSpec

PASSWORD = "s3cr3t-pw"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux /proc")


def _with_password(dsn: str) -> str:
    """``dsn`` with `PASSWORD` (the test server trusts local connections, so any password works)."""
    params = conninfo_to_dict(dsn)
    params["password"] = PASSWORD
    return make_conninfo("", **params)


def _tree(pid: int) -> list[psutil.Process]:
    """The process ``pid`` and every live descendant."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _secret_in(path: Path) -> bool:
    try:
        return PASSWORD.encode() in path.read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False  # the process exited meanwhile


@pytest.fixture
def worker_with_password(wdsn: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``pgtasks --dsn DSN-WITH-PASSWORD worker --pool processes -B``: a worker, children, a scheduler."""
    log_path = tmp_path / "worker.log"
    env = {**os.environ, "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONUNBUFFERED": "1"}
    for name in ("PGTASKS_DSN", "DATABASE_URL"):
        env.pop(name, None)
    args = ["-A", APP_SPEC, "--dsn", _with_password(wdsn), "-l", "DEBUG", "worker"]
    args += ["--pool", "processes", "-c", "2", "--poll-interval", "0.1", "-B"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgtasks", *args], cwd=REPO, env=env, stdout=log, stderr=log
        )
    try:
        yield proc, log_path
    finally:
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        for child in children:
            try:
                child.kill()
                child.wait(10)
            except psutil.NoSuchProcess:
                pass


def test_no_process_of_a_worker_shows_the_dsn_password(
    worker_with_password: tuple[subprocess.Popen[bytes], Path], wdsn: str, conn: psycopg.Connection[Any]
) -> None:
    proc, log_path = worker_with_password
    worker_id_of(conn, proc.pid)
    app = make_app(wdsn)
    try:
        jobs = [app.tasks["w.pid"].delay() for _ in range(2)]
        eventually(
            lambda: all(status(conn, job.id) == "succeeded" for job in jobs), timeout=60, message="jobs done"
        )
        child_pids = {job.get(timeout=5) for job in jobs}
    finally:
        app.close()
    processes = _tree(proc.pid)
    pids = {p.pid for p in processes}
    assert child_pids <= pids - {proc.pid}, "the jobs ran in the pool's children"
    for process in processes:
        cmdline = Path(f"/proc/{process.pid}/cmdline")
        assert not _secret_in(cmdline), (process.pid, cmdline.read_bytes())
        # environ is readable by the owner only, but nothing should copy --dsn there either
        assert not _secret_in(Path(f"/proc/{process.pid}/environ")), process.pid
    assert Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[1:4] == [
        b"-m",
        b"pgtasks.worker",
        b"--spec-fd",
    ]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, log_path.read_text(errors="replace")
    log = log_path.read_text(errors="replace")
    assert "worker" in log and "ready" in log, log
    assert PASSWORD not in log


def test_the_spec_goes_through_a_descriptor_the_new_image_reads_and_closes() -> None:
    launch = WorkerLaunch(
        app_spec="m:app",
        dsn=f"postgresql://u:{PASSWORD}@h/db",
        plugins=(),
        loglevel="INFO",
        config=WorkerConfig(queues=tuple(f"queue-{i:05d}" for i in range(20_000))),  # past a pipe's buffer
    )
    assert PASSWORD not in repr(launch)  # a launch or child spec in a log line shows no password
    assert PASSWORD not in repr(ChildSpec("m:app", (), launch.dsn or "", None, "w1"))
    fd = spec_fd(launch.to_json().encode())
    try:
        assert os.get_inheritable(fd)
    finally:
        text = read_spec_fd(fd)
    assert WorkerLaunch.from_json(text) == launch
    with pytest.raises(OSError):
        os.fstat(fd)  # closed after reading


def test_the_worker_module_refuses_a_bad_descriptor(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--spec-fd", "not-a-number"]) == 2
    assert "--spec-fd" in capsys.readouterr().err
    closed_fd = os.open(os.devnull, os.O_RDONLY)
    os.close(closed_fd)
    assert main(["--spec-fd", str(closed_fd)]) == 1
    assert f"cannot read the worker launch spec from descriptor {closed_fd}" in capsys.readouterr().err


def test_without_memfd_a_pipe_carries_the_spec_or_refuses_what_does_not_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(os, "memfd_create", raising=False)  # macOS, the BSDs
    fd = spec_fd(b'{"dsn": "postgresql://u:' + PASSWORD.encode() + b'@h/db"}')
    assert os.get_inheritable(fd)
    assert PASSWORD in read_spec_fd(fd)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match="does not fit in a pipe"):
        spec_fd(b"x" * (16 * 1024 * 1024))  # a write that would block the only reader
    assert set(os.listdir("/proc/self/fd")) == before  # both ends closed
