"""A backup run store on pgtasks: nightly backups per agent host, and a verify step.

Schedules (defined in code, written to ``pgtasks.schedules`` when the scheduler starts):

* ``nightly-backup``: ``0 2 * * *`` in Europe/Berlin, archives ``WORKDIR/data``;
* ``config-backup``: ``0 2 * * *`` in Europe/Berlin too, archives ``WORKDIR/config``;
* ``verify-backup``: no cron, ``after=["nightly-backup"]``: each successful nightly
  backup triggers it; it reads the archive that run wrote back to its end and checks
  the file count, byte count and checksum the backup recorded.

Agents: backup jobs go to the queue ``agent.<host>`` and carry the lock key
``agent:<host>``, so a host's agent (a worker serving that queue) holds at most one
backup job at a time, whatever its concurrency: the two 02:00 backups run one after
the other.

A backup reports ``bytes_processed``, ``files_processed`` and ``files_failed`` as it
goes (progress counters, which are also its heartbeat). Unreadable files make it end
as ``partial_failure`` (the archive holds everything else); an unreachable target is
a transient failure (``ConnectionError``), which the schedule retries.

Run the agent and the scheduler on their own::

    pgtasks -A examples.backup.app:app worker -Q agent.$(hostname),default --beat

(``PGTASKS_BACKUP_DIR`` sets WORKDIR; default: a folder in the user data directory.)
"""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path
from typing import Any, Final

import platformdirs

import pgtasks
from pgtasks.context import TaskContext
from pgtasks.errors import Reject

from .archive import archive_directory, list_archive

__all__ = ["FAULT_MARKER", "SCHEDULES", "TIMEZONE", "agent_queue", "app", "default_workdir", "make_app"]

TIMEZONE: Final = "Europe/Berlin"
SCHEDULES: Final = ("nightly-backup", "config-backup", "verify-backup")
#: A file of this name in a backup's destination makes its next attempt fail as if the
#: backup target were unreachable (a transient failure), once.
FAULT_MARKER: Final = "inject-transient-failure"


def agent_queue(agent: str) -> str:
    """The queue of one host's backup agent."""
    return f"agent.{agent}"


def _agent_lock(source: str, dest: str, agent: str) -> str:
    """Lock key rule of backup jobs: one backup at a time per agent host."""
    return f"agent:{agent}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def make_app(dsn: str | None = None, *, workdir: Path, agent: str) -> pgtasks.App:
    """The backup app for one agent host, backing up folders under ``workdir``.

    Args:
        dsn: PostgreSQL DSN (None: ``PGTASKS_DSN``, ``DATABASE_URL``, else embedded).
        workdir: holds ``data/`` and ``config/`` (the sources) and ``archives/``.
        agent: the host name the agent queue and lock are named after.
    """
    app = pgtasks.App("backup", dsn=dsn)
    queue = agent_queue(agent)

    def backup(self: TaskContext, source: str, dest: str, agent: str) -> dict[str, Any]:
        target = Path(dest)
        fault = target / FAULT_MARKER
        if fault.exists():
            fault.unlink()
            raise ConnectionError(f"backup target {target} unreachable (injected fault)")
        name = self.request.schedule_name or "adhoc"
        archive = target / f"{name}-run{self.request.id}-attempt{self.request.attempt}.tar.gz"

        def progress(done_bytes: int, files: int, failed: int) -> None:
            self.report_progress(bytes_processed=done_bytes, files_processed=files, files_failed=failed)

        report = archive_directory(Path(source), archive, progress)
        result = {
            "archive": str(report.archive),
            "files": report.files,
            "bytes": report.bytes,
            "archive_bytes": report.archive_bytes,
            "sha256": report.sha256,
            "failed": [list(f) for f in report.failed],
            "agent": agent,
        }
        if report.failed:
            first, reason = report.failed[0]
            self.partial_failure(
                f"{len(report.failed)} of {report.files + len(report.failed)} files unreadable "
                f"(first: {first}: {reason}); the archive holds the rest",
                result=result,
                code="FILES_UNREADABLE",
            )
        return result

    backup_options: dict[str, Any] = {
        "task_name": "backup.archive",
        "bind": True,
        "lock": _agent_lock,
        "max_retries": 2,
        "default_retry_delay": 1.0,
    }
    app.periodic_task(
        "0 2 * * *",
        name="nightly-backup",
        timezone=TIMEZONE,
        queue=queue,
        kwargs={
            "source": str(workdir / "data"),
            "dest": str(workdir / "archives" / "nightly"),
            "agent": agent,
        },
        **backup_options,
    )(backup)
    app.add_periodic_task(
        "0 2 * * *",
        "backup.archive",
        name="config-backup",
        timezone=TIMEZONE,
        kwargs={
            "source": str(workdir / "config"),
            "dest": str(workdir / "archives" / "config"),
            "agent": agent,
        },
    )

    @app.task(name="backup.verify", bind=True, max_retries=1)
    def verify(self: TaskContext) -> dict[str, Any]:
        if self.request.parent_id is None:
            raise Reject(
                "verify-backup checks the archive of the backup run that triggered it", code="NO_BACKUP"
            )
        recorded = self.app.get_job(self.request.parent_id).result
        archive = Path(recorded["archive"])
        files, size = list_archive(archive)
        self.report_progress(files_processed=files, bytes_processed=size)
        digest = _sha256(archive)
        if (files, size, digest) != (recorded["files"], recorded["bytes"], recorded["sha256"]):
            raise Reject(
                f"archive {archive} holds {files} files / {size} bytes / sha256 {digest[:12]}, the backup "
                f"recorded {recorded['files']} / {recorded['bytes']} / {recorded['sha256'][:12]}",
                code="ARCHIVE_MISMATCH",
            )
        return {"archive": str(archive), "files": files, "bytes": size, "sha256": digest}

    app.add_periodic_task(None, verify, name="verify-backup", after=["nightly-backup"])
    return app


def default_workdir() -> Path:
    """``PGTASKS_BACKUP_DIR``, else ``<user data dir>/pgtasks/backup-example``."""
    configured = os.environ.get("PGTASKS_BACKUP_DIR")
    if configured:
        return Path(configured)
    return Path(platformdirs.user_data_dir("pgtasks")) / "backup-example"


app = make_app(workdir=default_workdir(), agent=socket.gethostname())
