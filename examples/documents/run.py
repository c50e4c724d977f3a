"""Run the document pipeline end to end: ingest → OCR → taxonomy → index → search → delete.

Usage (from the repository root)::

    python -m examples.documents [FOLDER] [--query WORDS ...] [--concurrency N]

FOLDER defaults to ``../shared/corpus/documents`` when it exists, else to sample
files this example makes (`samples.make_samples`). The database is the one pgtasks
resolves (``PGTASKS_DSN``, ``DATABASE_URL``, else the embedded PostgreSQL).

Three tenants upload: ``acme`` uploads the whole folder in one bulk transaction,
then ``globex`` and ``initech`` upload a few documents each, one transaction per
document. The worker claims fairly across tenants, so the late, small uploads are
not stuck behind acme's bulk; the run prints when each tenant's documents started.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import psycopg
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import pgtasks
from pgtasks.db import describe_dsn
from pgtasks.states import JobStatus
from pgtasks.worker import Worker, WorkerConfig
from pgtasks_index import SearchHit

from .app import (
    QUEUES,
    Upload,
    allow_folder,
    delete_document,
    prepare,
    reset_tenants,
    upload,
    upload_bulk,
)
from .app import app as default_app
from .samples import SAMPLE_QUERIES, make_samples

__all__ = ["default_folder", "main", "run"]

REPO: Final = Path(__file__).resolve().parents[2]
CORPUS: Final = REPO.parent / "shared" / "corpus" / "documents"
CORPUS_QUERIES: Final = ("test document", "Abstract Syntax Notation One", "Привет", "invoice number")
BULK_TENANT: Final = "acme"
SMALL_TENANTS: Final = ("globex", "initech")
TERMINAL: Final = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.PARTIAL_FAILURE}
)


def default_folder() -> Path | None:
    """The shared corpus when present, else None (then samples are made)."""
    return CORPUS if CORPUS.is_dir() else None


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))


class Tracker:
    """Follows the OCR jobs and the index jobs at the end of each document's chain,
    through the public job API."""

    def __init__(self, application: pgtasks.App, uploads: Sequence[Upload]) -> None:
        self.app = application
        self.ocr: dict[int, JobStatus] = {u.job_id: JobStatus.QUEUED for u in uploads}
        self.index: dict[int, JobStatus] = {u.index_job_id: JobStatus.BLOCKED for u in uploads}

    def poll(self) -> None:
        """Refresh the jobs that have not finished."""
        for jobs in (self.ocr, self.index):
            for job_id, status in list(jobs.items()):
                if status not in TERMINAL:
                    jobs[job_id] = self.app.get_job(job_id).status

    def counts(self) -> tuple[int, int, int, int]:
        """(OCR done, OCR total, index done, index total): an index job a failed OCR
        cancelled counts as done."""
        ocr_done = sum(s in TERMINAL for s in self.ocr.values())
        index_done = sum(s in TERMINAL for s in self.index.values())
        return ocr_done, len(self.ocr), index_done, len(self.index)

    @property
    def finished(self) -> bool:
        """Every OCR job and every index job ended."""
        ocr_done, ocr_total, index_done, index_total = self.counts()
        return ocr_done == ocr_total and index_done == index_total


def _wait_with_progress(console: Console, tracker: Tracker, timeout: float) -> None:
    columns = (TextColumn("{task.description:<6}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    deadline = time.monotonic() + timeout
    with Progress(*columns, console=console, transient=False) as progress:
        ocr_bar = progress.add_task("OCR", total=len(tracker.ocr))
        index_bar = progress.add_task("index", total=len(tracker.index))
        while True:
            tracker.poll()
            ocr_done, _, index_done, index_total = tracker.counts()
            progress.update(ocr_bar, completed=ocr_done)
            progress.update(index_bar, completed=index_done, total=index_total)
            if tracker.finished:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs still running after {timeout:g} s")
            time.sleep(0.2)


def _print_taxonomy(
    console: Console, application: pgtasks.App, uploads: Sequence[Upload], tenant: str
) -> dict[str, tuple[str | None, str | None]]:
    """Print the type and correspondent the taxonomy step wrote to each document row of
    ``tenant``; returns them by file name."""
    ids = [u.document_id for u in uploads if u.tenant == tenant]
    with psycopg.connect(application.database.dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT name, doc_type, correspondent FROM example_docs.documents"
            " WHERE id = ANY(%s) ORDER BY name",
            (ids,),
        ).fetchall()
    table = Table(title=f"taxonomy of tenant {tenant!r}: type and correspondent, from the text")
    for column in ("document", "type", "correspondent"):
        table.add_column(column)
    for name, doc_type, correspondent in rows:
        table.add_row(name, doc_type or "(not reached)", correspondent or "")
    console.print(table)
    return {name: (doc_type, correspondent) for name, doc_type, correspondent in rows}


def _print_failures(console: Console, application: pgtasks.App, uploads: Sequence[Upload]) -> None:
    table = Table(title="documents that could not be read (permanent failures, not retried)")
    for column in ("tenant", "document", "error code", "attempts", "message"):
        table.add_column(column)
    for item in uploads:
        job = application.get_job(item.job_id)
        if job.status is not JobStatus.SUCCEEDED:
            error = job.error or {}
            table.add_row(
                item.tenant,
                escape(item.name),
                str(error.get("code")),
                str(len(job.attempts)),
                escape(str(error.get("message", ""))[:120]),
            )
    if table.row_count:
        console.print(table)


def _print_fairness(console: Console, application: pgtasks.App, uploads: Sequence[Upload]) -> None:
    jobs = {u.job_id: application.get_job(u.job_id) for u in uploads}
    started = sorted((j.started_at, j.id) for j in jobs.values() if j.started_at is not None)
    start_rank = {job_id: rank for rank, (_, job_id) in enumerate(started, 1)}
    enqueue_rank = {u.job_id: rank for rank, u in enumerate(sorted(uploads, key=lambda u: u.job_id), 1)}
    table = Table(title=f"fair dispatch: order of enqueue vs. order of start (of {len(uploads)} OCR jobs)")
    for column in ("tenant", "documents", "enqueued as #", "started as # (median)"):
        table.add_column(column)
    for tenant in (BULK_TENANT, *SMALL_TENANTS):
        mine = [u for u in uploads if u.tenant == tenant]
        if not mine:
            continue
        enq = [enqueue_rank[u.job_id] for u in mine]
        ranks = [start_rank[u.job_id] for u in mine if u.job_id in start_rank]
        median = f"{statistics.median(ranks):g}" if ranks else "-"
        table.add_row(
            tenant,
            str(len(mine)),
            f"{min(enq)}-{max(enq)}",
            f"{', '.join(map(str, sorted(ranks)[:6]))} ({median})",
        )
    console.print(table)


def _print_hits(console: Console, application: pgtasks.App, query: str, tenant: str) -> list[SearchHit]:
    hits = application.search(query, tenant=tenant, limit=5)
    if not hits:
        console.print(f"search {query!r} in tenant {tenant!r}: no hits")
        return hits
    table = Table(title=f"search {query!r} in tenant {tenant!r}: {len(hits)} hit(s)", title_justify="left")
    for column in ("#", "document", "key", "match", "rank", "snippet"):
        table.add_column(column)
    for number, hit in enumerate(hits, 1):
        snippet = escape(hit.snippet).replace("«", "[bold yellow]").replace("»", "[/bold yellow]")
        table.add_row(str(number), escape(hit.title), hit.key, hit.match, f"{hit.rank:.3f}", snippet)
    console.print(table)
    return hits


def run(
    folder: Path | None,
    queries: Sequence[str],
    *,
    concurrency: int = 4,
    timeout: float = 600.0,
    console: Console | None = None,
    application: pgtasks.App | None = None,
) -> dict[str, object]:
    """Run the whole example; returns what tests check (uploads, hits per query, deletion).

    Args:
        folder: the documents to ingest; None makes the sample files in a temporary folder.
        queries: what to search for afterwards (in the bulk tenant).
        concurrency: worker threads.
        timeout: seconds to wait for the jobs.
        console: where to print (default: stdout).
        application: the app (default: `examples.documents.app.app`, on the DSN pgtasks
            resolves); it is closed at the end.
    """
    app = application or default_app
    console = console or Console()
    with tempfile.TemporaryDirectory(prefix="pgtasks-samples-") as scratch:
        if folder is None:
            folder = Path(scratch)
            make_samples(folder)
            console.print(f"no corpus at {CORPUS}: using sample files made in {folder}")
        files = _files(folder)
        allow_folder(app, folder)  # the OCR task reads only from its roots
        console.print(f"ingesting {len(files)} file(s) from {folder}")
        dsn_source = app.settings.dsn_source
        prepare(app)
        console.print(f"database: {dsn_source} ({describe_dsn(app.database.dsn)})")
        reset_tenants(app, (BULK_TENANT, *SMALL_TENANTS))

        uploads = upload_bulk(app, BULK_TENANT, files)  # one transaction for the whole folder
        small = files[:2]
        for tenant in SMALL_TENANTS:
            uploads += [upload(app, tenant, path) for path in small]  # one transaction each

        # prefetch_multiplier=1: claim only what can start now, so each claim is a fair pick.
        config = WorkerConfig(
            queues=QUEUES, concurrency=concurrency, prefetch_multiplier=1, poll_interval=0.2
        )
        worker = Worker(app, config)
        thread = threading.Thread(target=worker.run, name="documents-worker", daemon=True)
        thread.start()
        try:
            _wait_with_progress(console, Tracker(app, uploads), timeout)
            _print_failures(console, app, uploads)
            taxonomy = _print_taxonomy(console, app, uploads, BULK_TENANT)
            _print_fairness(console, app, uploads)
            found: dict[str, list[str]] = {}
            for query in queries:
                found[query] = [h.key for h in _print_hits(console, app, query, BULK_TENANT)]
            _print_hits(console, app, queries[0], "nobody")  # tenants never see each other's documents

            deleted: dict[str, object] = {}
            first = next((keys[0] for keys in found.values() if keys), None)
            if first is not None:
                job_id = delete_document(app, BULK_TENANT, int(first))
                outcome = app.AsyncResult(job_id).get(timeout=60)
                console.print(f"deleted document {first} (job {job_id}): removed {outcome['removed']}")
                after = [h.key for h in app.search(queries[0], tenant=BULK_TENANT, limit=50)]
                console.print(
                    f"searching {queries[0]!r} again: document {first} "
                    f"{'is still there' if first in after else 'is gone'}"
                )
                deleted = {"key": first, "removed": outcome["removed"], "still_found": first in after}
        finally:
            worker.request_stop()
            thread.join(60)
            app.close()
    return {"uploads": uploads, "found": found, "deleted": deleted, "taxonomy": taxonomy}


def _default_queries(folder: Path | None) -> Sequence[str]:
    """The corpus's or the samples' queries; for another folder, the names of its first files."""
    if folder is None:
        return SAMPLE_QUERIES
    if folder.resolve() == CORPUS.resolve():
        return CORPUS_QUERIES
    return [p.stem.replace("_", " ").replace("-", " ") for p in _files(folder)[:3]] or ["document"]


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.documents", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "folder", nargs="?", type=Path, help="documents to ingest (default: the shared corpus)"
    )
    parser.add_argument("-q", "--query", action="append", dest="queries", help="search for this (repeatable)")
    parser.add_argument("-c", "--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, handlers=[RichHandler(show_path=False)], format="%(message)s")
    folder = args.folder if args.folder is not None else default_folder()
    if folder is not None and not folder.is_dir():
        parser.error(f"{folder} is not a folder")
    queries = args.queries or _default_queries(folder)
    run(folder, queries, concurrency=args.concurrency)
    return 0
