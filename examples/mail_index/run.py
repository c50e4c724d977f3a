"""Index a folder of mail for two tenants, search, delete by Message-ID, show job status by id.

Usage (from the repository root)::

    python -m examples.mail_index [FOLDER]          # default: ../shared/corpus/documents/mail
    python -m examples.mail_index status JOB_ID     # one job's status, attempts and error

The database is the one pgtasks resolves (``PGTASKS_DSN``, ``DATABASE_URL``, else
the embedded PostgreSQL).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table

import pgtasks
import pgtasks_index
from pgtasks.errors import JobNotFound
from pgtasks.states import JobStatus
from pgtasks.worker import Worker, WorkerConfig

from .app import allow_folder, delete_by_message_id, enqueue_mail
from .app import app as default_app

__all__ = ["default_folder", "main", "print_status", "run"]

REPO: Final = Path(__file__).resolve().parents[2]
CORPUS_MAIL: Final = REPO.parent / "shared" / "corpus" / "documents" / "mail"
TENANTS: Final = ("alice", "bob")
TERMINAL: Final = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.PARTIAL_FAILURE}
)


def default_folder() -> Path | None:
    """The corpus's mail folder when present."""
    return CORPUS_MAIL if CORPUS_MAIL.is_dir() else None


def _make_sample_mail(folder: Path) -> None:
    """Three messages for a machine without the corpus: two share a Message-ID, one has none."""
    bodies = {
        "first.eml": ("<shared@example.org>", "Budget review", "The budget review is on Monday."),
        "resent.eml": ("<shared@example.org>", "Budget review (resent)", "Resent: budget review moved."),
        "no-id.eml": (None, "Lunch", "Lunch at noon?"),
    }
    for name, (message_id, subject, body) in bodies.items():
        header = f"Message-ID: {message_id}\n" if message_id else ""
        (folder / name).write_text(
            f"From: carol@example.org\nTo: team@example.org\nSubject: {subject}\n{header}\n{body}\n",
            encoding="utf-8",
        )
    (folder / "broken.eml").write_text("This is not a valid eml.\n", encoding="utf-8")


def _wait(application: pgtasks.App, job_ids: Sequence[int], timeout: float) -> None:
    pending = set(job_ids)
    deadline = time.monotonic() + timeout
    while pending:
        pending = {j for j in pending if application.get_job(j).status not in TERMINAL}
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} job(s) still unfinished after {timeout:g} s")
        time.sleep(0.1)


def print_status(console: Console, application: pgtasks.App, job_id: int) -> JobStatus:
    """Print one job's status, attempts, result or error (the "job status by id" of the brief)."""
    job = application.get_job(job_id)
    console.print(
        f"job {job.id}: {job.task_name} for tenant {job.tenant!r} is [bold]{job.status.value}[/bold] "
        f"(attempt {job.attempt} of {job.max_attempts}, {len(job.attempts)} failed attempt(s))"
    )
    if job.error:
        console.print(
            f"  error {job.error.get('code')} ({job.error.get('class')}): "
            f"{escape(str(job.error.get('message')))}"
        )
    if job.result is not None:
        console.print(f"  result: {escape(repr(job.result))}")
    return job.status


def run(
    folder: Path | None,
    *,
    console: Console | None = None,
    application: pgtasks.App | None = None,
    timeout: float = 300.0,
) -> dict[str, object]:
    """Index ``folder`` for both tenants, search, delete by Message-ID; returns what tests check."""
    console = console or Console()
    app = application or default_app
    with tempfile.TemporaryDirectory(prefix="pgtasks-mail-") as scratch:
        if folder is None:
            folder = Path(scratch)
            _make_sample_mail(folder)
            console.print(f"no corpus at {CORPUS_MAIL}: using sample messages made in {folder}")
        files = sorted(folder.glob("*.eml"))
        allow_folder(app, folder)  # mail.index reads only from the app's OCR roots
        app.migrate()
        for tenant in TENANTS:
            pgtasks_index.remove_tenant(app, tenant)  # start from an empty index for the demo tenants
        jobs = {(tenant, path.name): enqueue_mail(app, tenant, path) for tenant in TENANTS for path in files}
        console.print(
            f"enqueued {len(jobs)} mail.index job(s) for {len(files)} message(s) x {len(TENANTS)} tenants"
        )

        worker = Worker(app, WorkerConfig(queues=("index",), concurrency=4, poll_interval=0.1))
        thread = threading.Thread(target=worker.run, name="mail-worker", daemon=True)
        thread.start()
        try:
            _wait(app, list(jobs.values()), timeout)
            results = {key: app.get_job(job_id) for key, job_id in jobs.items()}
            message_ids = Counter(
                job.result["message_id"]
                for (tenant, _), job in results.items()
                if tenant == TENANTS[0] and job.status is JobStatus.SUCCEEDED
            )
            table = Table(title=f"mail.index jobs of tenant {TENANTS[0]!r}")
            for column in ("job", "file", "status", "Message-ID", "note"):
                table.add_column(column)
            for (tenant, name), job in sorted(results.items()):
                if tenant != TENANTS[0]:
                    continue
                mid = job.result["message_id"] if job.status is JobStatus.SUCCEEDED else None
                note = ""
                if job.status is not JobStatus.SUCCEEDED:
                    note = f"{(job.error or {}).get('code')}: {(job.error or {}).get('message')}"
                elif mid is None:
                    note = "no Message-ID: kept, keyed by file"
                elif message_ids[mid] > 1:
                    note = f"Message-ID shared by {message_ids[mid]} messages: each kept"
                table.add_row(
                    str(job.id), escape(name), job.status.value, escape(str(mid or "-")), escape(note)
                )
            console.print(table)
            counts = {t: pgtasks_index.count_entries(app, t).get("mail", 0) for t in TENANTS}
            console.print(f"indexed mails per tenant: {counts}")

            shared = next((m for m, n in message_ids.most_common() if m is not None and n > 1), None)
            deleted: list[int] = []
            if shared is not None:
                deleted = delete_by_message_id(app, TENANTS[1], shared)
                _wait(app, deleted, timeout)
                console.print(f"{TENANTS[1]} deleted every message with Message-ID {shared!r}:")
                for job_id in deleted:
                    print_status(console, app, job_id)
            after = {t: pgtasks_index.count_entries(app, t).get("mail", 0) for t in TENANTS}
            console.print(f"indexed mails per tenant after the deletion: {after}")
            searched = {t: [h.key for h in app.search("test message", tenant=t, limit=50)] for t in TENANTS}
            for tenant, keys in searched.items():
                console.print(f"search 'test message' in {tenant!r}: {', '.join(keys) or 'no hits'}")
            first_failed = next((j.id for j in results.values() if j.status is JobStatus.FAILED), None)
            if first_failed is not None:
                console.print("status of a failed job, by id:")
                print_status(console, app, first_failed)
        finally:
            worker.request_stop()
            thread.join(60)
            app.close()
    return {
        "jobs": jobs,
        "counts": counts,
        "after": after,
        "shared": shared,
        "deleted": deleted,
        "searched": searched,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, handlers=[RichHandler(show_path=False)], format="%(message)s")
    console = Console()
    if args[:1] == ["status"]:
        parser = argparse.ArgumentParser(prog="python -m examples.mail_index status")
        parser.add_argument("job_id", type=int)
        job_id = parser.parse_args(args[1:]).job_id
        try:
            print_status(console, default_app, job_id)
        except JobNotFound as exc:
            console.print(f"[red]{exc}[/red]")
            return 1
        finally:
            default_app.close()
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m examples.mail_index", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("folder", nargs="?", type=Path, help="folder of .eml files (default: the corpus's)")
    folder = parser.parse_args(args).folder or default_folder()
    run(folder, console=console)
    return 0
