"""Where each system runs: its own virtual environment, and the services it needs.

Every system's requirements are installed from PyPI into ``benchmarks/.venvs/<name>``
(git-ignored) with the ordinary ``python -m venv`` and ``pip``. A marker file records
the requirement list that was installed, so a later run reuses the environment unless
the list changed. pgtasks and the raw reference get theirs like every peer (the
project's dependencies, `project_requirements`; psycopg) and run this repository's
code from the source tree, which the drivers find on ``PYTHONPATH`` (the runner
byte-compiles it once per run, `compile_project`): none of the systems shares the
harness's environment, whose shared libraries the harness itself keeps mapped (see
`benchmarks.systems.memory.evict_shared_objects`). A system with no requirements
would run in the harness's own interpreter.
"""

from __future__ import annotations

import compileall
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

from benchmarks.systems.base import SystemSpec

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
VENVS_DIR = BENCH_DIR / ".venvs"
MARKER = ".bench-requirements"
PIP_TIMEOUT_SECONDS = 900
PROJECT_PACKAGES = ("pgtasks", "plugins", "benchmarks")


class EnvironmentUnavailable(Exception):
    """The system cannot run here; the message says why (shown in the report)."""


def interpreter_for(spec: SystemSpec, install: bool = True) -> Path:
    """Python interpreter that runs ``spec``'s driver, installing its venv if needed.

    Raises :class:`EnvironmentUnavailable` when the venv cannot be created or pip
    fails (the message holds the tail of pip's output).
    """
    requirements = spec.requirements + (project_requirements() if spec.project_dependencies else ())
    if not requirements:
        return Path(sys.executable)
    venv = VENVS_DIR / spec.name
    python = venv / "bin" / "python"
    wanted = "\n".join(requirements) + "\n"
    marker = venv / MARKER
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    if not install:
        raise EnvironmentUnavailable(f"virtual environment {venv} is not installed")
    if venv.exists():
        shutil.rmtree(venv)
    _run([sys.executable, "-m", "venv", str(venv)], f"creating {venv}")
    _run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements],
        f"pip install {' '.join(requirements)}",
    )
    marker.write_text(wanted)
    return python


def project_requirements() -> tuple[str, ...]:
    """The project's own dependencies, as ``pyproject.toml`` declares them.

    The environment of a system with ``project_dependencies`` (pgtasks) holds exactly
    these: what ``pip install pgtasks`` brings, with pgtasks itself taken from the
    source tree. Read here, in the harness, so that no worker process imports this
    module.
    """
    with open(REPO_ROOT / "pyproject.toml", "rb") as file:
        return tuple(tomllib.load(file)["project"]["dependencies"])


def compile_project() -> None:
    """Byte-compile the project's own packages, as pip does for every installed peer.

    The project runs from its source tree, so without this a
    worker started with ``PYTHONDONTWRITEBYTECODE`` set compiles every module from
    source at each start, which costs time and about 1.5 MiB of resident memory
    per process that the peers (compiled at install) do not pay. Up-to-date files
    are skipped.
    """
    for package in PROJECT_PACKAGES:
        compileall.compile_dir(REPO_ROOT / package, quiet=2)


def _run(command: list[str], what: str) -> None:
    try:
        done = subprocess.run(
            command, check=False, capture_output=True, text=True, timeout=PIP_TIMEOUT_SECONDS
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentUnavailable(f"{what} failed: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise EnvironmentUnavailable(f"{what} failed (exit {done.returncode}): {' | '.join(tail)}")


def check_services(spec: SystemSpec, redis_url: str) -> None:
    """Raise :class:`EnvironmentUnavailable` when a service ``spec`` needs is absent."""
    for service in spec.services:
        if service == "redis":
            redis_version(redis_url)
        else:
            raise EnvironmentUnavailable(f"unknown service {service!r}")


def redis_version(redis_url: str, timeout: float = 2.0) -> str:
    """``redis_version`` from ``INFO server`` of the Redis at ``redis_url``.

    Speaks the inline Redis protocol over a plain socket so the harness needs no
    Redis client. Raises :class:`EnvironmentUnavailable` when nothing answers.
    """
    parts = urlsplit(redis_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(b"INFO server\r\n")
            data = b""
            while b"redis_version" not in data or not data.endswith(b"\r\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        raise EnvironmentUnavailable(f"Redis at {host}:{port} is not reachable: {exc}") from exc
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("redis_version:"):
            return line.split(":", 1)[1].strip()
    raise EnvironmentUnavailable(f"Redis at {host}:{port} did not answer INFO")
