"""Run one driver op in a subprocess, bounded in time, and read its JSON line.

The driver is started in a new session so that on timeout the whole process group
(driver and the worker processes it started) is killed with SIGKILL: a stalled
system costs its deadline and becomes "n/a", never a hung run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.environments import REPO_ROOT

KILL_GRACE_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class OpResult:
    """Outcome of one op: ``result`` when ``ok``, else ``error`` (a one-line reason)."""

    ok: bool
    result: dict[str, Any]
    error: str
    seconds: float


def run_op(
    python: Path,
    module: str,
    op: str,
    *,
    dsn: str,
    redis_url: str,
    deadline: float,
    args: dict[str, Any] | None = None,
) -> OpResult:
    """Run ``python -m module op PARAMS`` with cwd and PYTHONPATH at the repository root.

    ``deadline`` (s) is passed to the driver, which gives up by itself; the harness
    kills the process group ``KILL_GRACE_SECONDS`` later if it has not.
    """
    with tempfile.TemporaryDirectory(prefix=f"bench-{op}-") as workdir:
        params = {
            "dsn": dsn,
            "redis_url": redis_url,
            "workdir": workdir,
            "deadline": deadline,
            "args": args or {},
        }
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.pop("VIRTUAL_ENV", None)
        stderr_path = Path(workdir) / "driver.stderr"
        start = time.perf_counter()
        with open(stderr_path, "wb") as stderr:
            process = subprocess.Popen(
                [str(python), "-m", module, op, json.dumps(params)],
                cwd=REPO_ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                stdout, _ = process.communicate(timeout=deadline + KILL_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                _kill_group(process)
                return OpResult(False, {}, f"killed after {deadline + KILL_GRACE_SECONDS:.0f} s", 0.0)
            finally:
                _kill_group(process)  # workers a crashed driver left behind
        seconds = time.perf_counter() - start
        lines = [line for line in stdout.decode(errors="replace").splitlines() if line.strip()]
        try:
            payload = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            tail = stderr_path.read_text(errors="replace").strip().splitlines()[-3:]
            return OpResult(False, {}, f"driver exited {process.returncode}: {' | '.join(tail)}", seconds)
        if not payload.get("ok"):
            return OpResult(False, {}, str(payload.get("error", "unknown error")), seconds)
        return OpResult(True, dict(payload.get("result", {})), "", seconds)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
