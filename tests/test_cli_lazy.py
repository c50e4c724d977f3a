"""The command line imports each sub-command on first use.

``pgtasks --help`` still lists every built-in and plugin command, and a real
``pgtasks worker`` process loads nothing that only the other commands need (rich
for tables, the scheduler package, croniter and dateutil, the embedded server
helpers): 4.2 MiB of peak resident memory per worker process on CPython 3.11.
Once its options are checked, the worker process re-executes itself without the
command line at all (click, `pgtasks.cli`): see tests/test_worker_launch.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import pgtasks
from pgtasks.cli import COMMANDS, cli

REPO = Path(__file__).resolve().parents[1]

# Modules a worker process must not import (each one only serves other commands).
NOT_IN_A_WORKER = (
    "rich",
    "croniter",
    "dateutil",
    "platformdirs",
    "pgtasks.cron",
    "pgtasks.embedded",
    "pgtasks.scheduler",
    "pgtasks.cli.jobs_cmd",
    "pgtasks.cli.schedules_cmd",
    "pgtasks.cli.embedded_cmd",
    "pgtasks.cli.migrate_cmd",
    "pgtasks.cli",
    "click",
)

# The app module reports, when the process that imported it exits, which of the
# watched modules that process had loaded: the worker's image after its re-exec.
APP_MODULE = """
import atexit, json, os, sys
import pgtasks

def _report():
    watched = json.loads(os.environ["WATCHED_MODULES"])
    with open(os.environ["LOADED_FILE"], "w") as out:
        json.dump(sorted(m for m in watched if m in sys.modules), out)

atexit.register(_report)

app = pgtasks.App("lazy-cli", load_entry_points=False)


@app.task(name="noop", queue="lazy")
def noop() -> None:
    return None
"""


def _help_commands(output: str) -> list[str]:
    """Command names in the ``Commands:`` section of click's help."""
    section = output.split("Commands:", 1)[1]
    return [line.split()[0] for line in section.splitlines() if line.startswith("  ") and line.split()]


def test_every_listed_command_resolves_to_its_click_command() -> None:
    ctx = click.Context(cli)
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert isinstance(command, click.Command), name
    assert cli.get_command(ctx, "stats") is cli.get_command(ctx, "queues")  # an alias, same object


def test_help_lists_every_builtin_and_entry_point_plugin_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGTASKS_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    result = CliRunner().invoke(cli, ["--help"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    listed = _help_commands(result.output)
    assert listed == sorted(listed)
    # metrics and search come from this project's own entry points (pgtasks_metrics, pgtasks_index).
    assert set(listed) == set(COMMANDS) | {"metrics", "search"}


def test_help_from_the_real_entry_point_lists_every_command() -> None:
    env = {**os.environ, "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "pgtasks", "--help"], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert _help_commands(out) == sorted(COMMANDS)


def test_unknown_command_is_still_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["no-such-command"], env={"PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert result.exit_code == 2
    assert "No such command" in result.output


def test_scheduler_names_stay_importable_from_the_package() -> None:
    from pgtasks import Run, Schedule, ScheduleSpec
    from pgtasks.records import schedule as records
    from pgtasks.scheduler import spec

    assert (Run, Schedule, ScheduleSpec) == (records.Run, records.Schedule, spec.ScheduleSpec)
    assert pgtasks.Schedule is Schedule
    assert {"Run", "Schedule", "ScheduleSpec"} <= set(dir(pgtasks))
    with pytest.raises(AttributeError):
        pgtasks.NoSuchName  # noqa: B018


def test_importing_pgtasks_does_not_import_the_scheduler() -> None:
    code = (
        "import sys, pgtasks; print(sorted(m for m in ('pgtasks.scheduler', 'croniter') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _loaded_in_worker(dsn: str, tmp_path: Path, **env_extra: str) -> list[str]:
    """Run ``pgtasks worker --burst`` as a process; the watched modules its last image had loaded."""
    (tmp_path / "lazy_cli_app.py").write_text(APP_MODULE, encoding="utf-8")
    loaded_file = tmp_path / "loaded.json"
    args = ["-A", "lazy_cli_app:app", "--dsn", dsn, "-l", "WARNING", "worker", "-Q", "lazy", "--burst"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
        "WATCHED_MODULES": json.dumps(NOT_IN_A_WORKER),
        "LOADED_FILE": str(loaded_file),
        **env_extra,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pgtasks", *args],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    loaded: list[str] = json.loads(loaded_file.read_text(encoding="utf-8"))
    return loaded


def test_a_worker_process_imports_nothing_only_other_commands_need(dsn: str, tmp_path: Path) -> None:
    assert _loaded_in_worker(dsn, tmp_path) == []


def test_a_worker_kept_in_its_first_image_still_has_the_command_line(dsn: str, tmp_path: Path) -> None:
    # The opt-out (PGTASKS_WORKER_REEXEC=0) runs the worker inside the click command.
    loaded = _loaded_in_worker(dsn, tmp_path, PGTASKS_WORKER_REEXEC="0")
    assert {"click", "pgtasks.cli"} <= set(loaded)
    assert "rich" not in loaded and "pgtasks.scheduler" not in loaded
