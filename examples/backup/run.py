"""Run the backup example end to end and print the run history.

Usage (from the repository root)::

    python -m examples.backup [--workdir DIR]

The database is the one pgtasks resolves (``PGTASKS_DSN``, ``DATABASE_URL``, else
the embedded PostgreSQL). In one process it starts an agent (a worker serving this
host's agent queue, concurrency 2) and a scheduler, then:

1. makes sample folders to back up, one file of which cannot be read (a symbolic
   link whose target is gone; also a file without read permission, which only
   stops a non-root user), and plants a fault: the nightly backup's target will
   be unreachable once;
2. writes the schedules as if the scheduler had been down since just before the
   last 02:00 in Berlin, so at start it runs that fire time (misfire policy
   ``skip``: the latest missed fire time runs): ``nightly-backup`` and
   ``config-backup`` both fire for 02:00, for the same agent, and run one after
   the other (lock key ``agent:<host>``);
3. the nightly run fails on the injected fault (``ConnectionError``, class
   transient), and the scheduler makes its retry run (trigger ``retry``,
   attempt 2), which ends ``partial_failure``: one file was unreadable;
4. the operator repairs the source and runs the backup by hand (trigger
   ``manual``); asking again while it is active is refused (``RunAlreadyActive``);
5. the manual run succeeds, which triggers ``verify-backup`` (trigger
   ``dependency``), which reads the archive back and checks its counts.

It exits 0 when every step ended as described, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import logging
import os
import random
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

import pgtasks
from pgtasks.cron import CronSchedule, load_zone
from pgtasks.db import describe_dsn
from pgtasks.errors import RunAlreadyActive, ScheduleNotFound
from pgtasks.scheduler import Run, Scheduler, SchedulerConfig
from pgtasks.worker import Worker, WorkerConfig

from .app import FAULT_MARKER, SCHEDULES, TIMEZONE, agent_queue, make_app

__all__ = ["main", "run"]

UNREADABLE: Final = "logs/unreadable.log"
DANGLING: Final = "logs/current.log"


def make_sources(workdir: Path, seed: int = 7) -> dict[str, int]:
    """Create ``data/`` and ``config/`` with files of random bytes; returns bytes per folder.

    ``data/`` also gets a file without read permission and a symbolic link to a
    file that does not exist.
    """
    rng = random.Random(seed)
    sizes: dict[str, int] = {}
    layout = {
        "data": {
            "db/dump-part1.bin": 700_000,
            "db/dump-part2.bin": 450_000,
            "photos/a.jpg": 120_000,
            "photos/b.jpg": 95_000,
            "notes.txt": 2_000,
            "logs/app.log": 30_000,
        },
        "config": {"app.toml": 1_200, "nginx/site.conf": 3_400, "cron/backup": 200},
    }
    for folder, files in layout.items():
        total = 0
        for relative, size in files.items():
            path = workdir / folder / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(rng.randbytes(size))
            total += size
        sizes[folder] = total
    unreadable = workdir / "data" / UNREADABLE
    unreadable.write_bytes(rng.randbytes(5_000))
    unreadable.chmod(0)
    (workdir / "data" / DANGLING).symlink_to(workdir / "data" / "logs" / "rotated-away.log")
    return sizes


def repair_sources(workdir: Path) -> None:
    """What the operator does after the partial failure: fix permissions, drop the stale link."""
    (workdir / "data" / UNREADABLE).chmod(0o644)
    (workdir / "data" / DANGLING).unlink()


def last_fire_before(cron: str, timezone: str, now: dt.datetime) -> dt.datetime:
    """The latest fire time of ``cron`` at or before ``now`` (looks back two days)."""
    times = CronSchedule.parse(cron, timezone).fires_between(now - dt.timedelta(days=2), now, 10)
    return times[-1]


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def _runs(app: pgtasks.App, name: str, since: int) -> list[Run]:
    return [r for r in reversed(app.schedules.history(name, per_page=100)) if r.id > since]


def _fmt_time(value: dt.datetime | None) -> str:
    if value is None:
        return ""
    return f"{value.astimezone(load_zone(TIMEZONE)):%Y-%m-%d %H:%M:%S %Z}"


def print_history(console: Console, runs: Sequence[Run]) -> None:
    """The run history as the backup run store shows it."""
    table = Table(title="run history (this invocation)", title_justify="left")
    for column in (
        "run",
        "schedule",
        "trigger",
        "attempt",
        "scheduled for",
        "started",
        "duration",
        "outcome",
        "error (class)",
        "bytes",
        "files ok/failed",
        "worker",
        "cause",
    ):
        table.add_column(column)
    for r in runs:
        p = r.progress
        error = f"{r.error_code} ({r.failure_class})" if r.error_code else ""
        table.add_row(
            str(r.id),
            r.schedule,
            r.trigger + (f" by {r.requested_by}" if r.requested_by else ""),
            str(r.attempt),
            _fmt_time(r.scheduled_for),
            _fmt_time(r.started_at),
            "" if r.duration is None else f"{r.duration:.2f}s",
            r.outcome or r.status,
            error,
            f"{p['bytes_processed']:,}" if "bytes_processed" in p else "",
            f"{p.get('files_processed', 0)}/{p.get('files_failed', 0)}" if "files_processed" in p else "",
            (r.worker_id or "").rsplit(":", 1)[0],
            f"#{r.parent_id}" if r.parent_id else "",
        )
    console.print(table)


def _overlaps(runs: Sequence[Run]) -> list[tuple[int, int]]:
    """Pairs of runs whose [started, finished] intervals overlap."""
    spans = [(r.started_at, r.finished_at, r.id) for r in runs if r.started_at and r.finished_at]
    return [(a[2], b[2]) for i, a in enumerate(spans) for b in spans[i + 1 :] if a[0] < b[1] and b[0] < a[1]]


def _reset(app: pgtasks.App) -> None:
    """Start from a clean slate on a database that ran the example before (old runs stay)."""
    for name in SCHEDULES:
        try:
            old = app.schedules.history(name, per_page=1000)
        except ScheduleNotFound:
            old = []
        for r in old:
            if r.status == "queued":
                app.cancel(r.id)
        with contextlib.suppress(ScheduleNotFound):
            app.schedules.delete(name)


def run(
    application: pgtasks.App | None = None,
    workdir: Path | None = None,
    *,
    agent: str | None = None,
    console: Console | None = None,
    timeout: float = 120.0,
) -> dict[str, Any]:
    """Run the example; returns what happened (runs by schedule, checks passed).

    Args:
        application: the app (default: `make_app` on the default DSN).
        workdir: where sources and archives go (default: a new temporary folder).
        agent: the agent's host name (default: this host's name).
        console: where to print.
        timeout: seconds each step may take.
    """
    if console is None:
        console = Console()
        if not console.is_terminal:  # logs and pipes: wide enough for the history table
            console = Console(width=180)
    agent = agent or socket.gethostname()
    workdir = workdir or Path(tempfile.mkdtemp(prefix="pgtasks-backup-"))
    app = application or make_app(workdir=workdir, agent=agent)
    console.print(f"database: {describe_dsn(app.database.dsn)}; work folder: {workdir}; agent: {agent}")
    app.migrate()
    _reset(app)
    newest = app.list_jobs(limit=1)
    since = newest[0].id if newest else 0
    for sub in ("data", "config", "archives"):
        shutil.rmtree(workdir / sub, ignore_errors=True)
    sizes = make_sources(workdir)
    (workdir / "archives" / "nightly").mkdir(parents=True, exist_ok=True)
    (workdir / "archives" / "nightly" / FAULT_MARKER).touch()

    last_0200 = last_fire_before("0 2 * * *", TIMEZONE, app.database.now())
    app.schedules.sync(now=last_0200 - dt.timedelta(minutes=1))
    console.print(
        f"schedules written as of {_fmt_time(last_0200 - dt.timedelta(minutes=1))}: the missed 02:00 runs now"
    )

    worker = Worker(
        app, WorkerConfig(queues=(agent_queue(agent), "default"), concurrency=2, poll_interval=0.1)
    )
    worker_thread = threading.Thread(
        target=worker.run, kwargs={"install_signal_handlers": False}, name="backup-agent"
    )
    scheduler = Scheduler(app, SchedulerConfig(interval=0.2, sync=False))
    refused: RunAlreadyActive | None = None
    worker_thread.start()
    scheduler.start()
    try:
        worker.started.wait(timeout)

        def nightly_done() -> bool:
            runs = _runs(app, "nightly-backup", since)
            return len(runs) >= 2 and runs[1].outcome is not None

        _wait(nightly_done, timeout, "the nightly run and its retry")
        _wait(
            lambda: any(r.outcome for r in _runs(app, "config-backup", since)), timeout, "the config backup"
        )
        console.print("nightly backup: failed (transient) then retried; the retry ended partial_failure")

        repair_sources(workdir)
        manual = app.schedules.trigger(
            "nightly-backup", requested_by=f"{os.environ.get('USER', 'ops')}@{agent}"
        )
        try:
            app.schedules.trigger("nightly-backup")
        except RunAlreadyActive as exc:
            refused = exc
            console.print(f"second manual trigger refused: {exc}")
        _wait(
            lambda: (
                bool(_runs(app, "verify-backup", since))
                and _runs(app, "verify-backup", since)[0].outcome is not None
            ),
            timeout,
            "the verify run",
        )
        console.print(f"manual run {manual.id} succeeded and triggered verify-backup")
    finally:
        scheduler.stop()
        worker.request_stop("example finished")
        worker_thread.join(timeout)

    nightly = _runs(app, "nightly-backup", since)
    config = _runs(app, "config-backup", since)
    verify = _runs(app, "verify-backup", since)
    everything = sorted([*nightly, *config, *verify], key=lambda r: r.id)
    print_history(console, everything)

    checks = {
        "nightly: schedule failed transient, retry partial_failure, manual succeeded": [
            (r.trigger, r.attempt, r.outcome, r.failure_class) for r in nightly
        ]
        == [
            ("schedule", 1, "failed", "transient"),
            ("retry", 2, "partial_failure", "permanent"),
            ("manual", 1, "succeeded", None),
        ],
        "retry links to the failed run": nightly[1].parent_id == nightly[0].id,
        "config backup succeeded at the same fire time": [
            (r.trigger, r.outcome, r.scheduled_for) for r in config
        ]
        == [("schedule", "succeeded", last_0200)],
        "one backup at a time on the agent": _overlaps([*nightly, *config]) == [],
        "second manual trigger refused with the active run": refused is not None
        and refused.run_id == nightly[2].id,
        "verify ran after the manual run and matched": [(r.trigger, r.parent_id, r.outcome) for r in verify]
        == [("dependency", nightly[2].id, "succeeded")],
        "bytes and files counted for real": nightly[2].progress.get("bytes_processed")
        == sizes["data"] + 5_000
        and nightly[2].progress.get("files_failed") == 0,
        "next nightly run unchanged by the manual run": app.schedules.get("nightly-backup").next_fire_at
        == CronSchedule.parse("0 2 * * *", TIMEZONE).next_fire(last_0200 + dt.timedelta(minutes=1)),
    }
    for label, ok in checks.items():
        console.print(f"[{'green' if ok else 'red'}]{'ok ' if ok else 'FAILED'}[/] {label}")
    return {
        "runs": {"nightly": nightly, "config": config, "verify": verify},
        "checks": checks,
        "workdir": workdir,
        "sizes": sizes,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (0 when every check passed)."""
    parser = argparse.ArgumentParser(prog="python -m examples.backup", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workdir", type=Path, default=None, help="folder for sources and archives (default: temp)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the work folder (default: removed at the end)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, handlers=[RichHandler(show_path=False)], format="%(message)s")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pgtasks-backup-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        outcome = run(workdir=workdir)
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(outcome["checks"].values()) else 1
