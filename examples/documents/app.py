"""The document archive: a documents table of its own, and pgtasks' built-in plugins.

Uploading a document writes its row and its OCR job in ONE transaction (the job is
enqueued with ``connection=conn``): either both exist or neither does. The OCR
task (plugin ``pgtasks_ocr``) extracts the text and enqueues ``pgtasks.index`` by
name (plugin ``pgtasks_index``); ``pgtasks.delete`` (plugin ``pgtasks_delete``)
removes a document from the index and, asked for derived data, lets this
application delete its row through the ``pgtasks_delete_item`` hook below.

The OCR task reads documents only from its roots: ``PGTASKS_OCR_ROOTS`` when set, else
the shared corpus folder (`DEFAULT_ROOT`); `examples.documents.run` adds the folder it
ingests. Workers can run this app on their own::

    PGTASKS_OCR_ROOTS=/srv/scans pgtasks -A examples.documents.app:app worker -Q ocr,index
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import psycopg

import pgtasks
import pgtasks_index
import pgtasks_ocr
from pgtasks import hookimpl
from pgtasks.errors import ConfigurationError

__all__ = [
    "DDL",
    "DEFAULT_ROOT",
    "Upload",
    "allow_folder",
    "app",
    "delete_document",
    "make_app",
    "prepare",
    "reset_tenants",
    "upload",
    "upload_bulk",
]

OCR_TASK: Final = "pgtasks.ocr"
DELETE_TASK: Final = "pgtasks.delete"
#: Where the OCR task may read documents when ``PGTASKS_OCR_ROOTS`` is not set: the
#: shared corpus beside the repository.
DEFAULT_ROOT: Final = Path(__file__).resolve().parents[2].parent / "shared" / "corpus" / "documents"

#: The application's own table (its schema is the application's business, not pgtasks').
DDL: Final = """
CREATE SCHEMA IF NOT EXISTS example_docs;
CREATE TABLE IF NOT EXISTS example_docs.documents (
    id bigserial PRIMARY KEY,
    tenant text NOT NULL,
    name text NOT NULL,
    path text NOT NULL,
    uploaded_at timestamptz NOT NULL DEFAULT now()
);
"""


class DocumentRows:
    """This application's answer to ``pgtasks_delete_item``: its row is derived data."""

    @hookimpl
    def pgtasks_delete_item(
        self, tenant: str, kind: str, key: str, derived: bool, conn: psycopg.Connection[Any]
    ) -> dict[str, int]:
        """Delete the document row when derived data goes too (same transaction as the index)."""
        if not derived or kind != "document" or not key.isdigit():
            return {"documents": 0}
        cur = conn.execute(
            "DELETE FROM example_docs.documents WHERE tenant = %s AND id = %s", (tenant, int(key))
        )
        return {"documents": cur.rowcount}


def make_app(dsn: str | None = None) -> pgtasks.App:
    """The archive's app; plugins come from the ``pgtasks`` entry-point group (installed with pgtasks).

    Its OCR roots are ``PGTASKS_OCR_ROOTS`` when set, else `DEFAULT_ROOT`.
    """
    application = pgtasks.App("documents", dsn=dsn, load_entry_points=True, plugins=[DocumentRows()])
    if OCR_TASK in application.tasks and not application.settings.ocr_roots:
        pgtasks_ocr.configure(application, roots=[DEFAULT_ROOT])
    return application


def allow_folder(application: pgtasks.App, folder: Path) -> None:
    """Let the OCR task of ``application`` read the documents in ``folder`` too."""
    roots = pgtasks_ocr.ocr_config(application).roots
    pgtasks_ocr.configure(application, roots=[*roots, folder.resolve()])


app = make_app()


@dataclass(frozen=True, slots=True)
class Upload:
    """A stored document and the OCR job that will make it searchable."""

    tenant: str
    document_id: int
    name: str
    job_id: int


def prepare(application: pgtasks.App = app) -> str:
    """Migrate pgtasks and the index, create the documents table; returns the DSN in use.

    Raises:
        ConfigurationError: the built-in plugins are not loaded.
    """
    for task in (OCR_TASK, "pgtasks.index", DELETE_TASK):
        if task not in application.tasks:
            raise ConfigurationError(
                f"task {task!r} is missing: the built-in plugins were not loaded "
                "(is PGTASKS_DISABLE_PLUGIN_AUTOLOAD set, or pgtasks not installed with pip install -e .?)"
            )
    application.migrate()
    dsn = application.database.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DDL)
    return dsn


def reset_tenants(application: pgtasks.App, tenants: Iterable[str]) -> None:
    """Forget earlier runs' documents and index entries of these tenants."""
    with psycopg.connect(application.database.dsn) as conn:
        for tenant in tenants:
            conn.execute("DELETE FROM example_docs.documents WHERE tenant = %s", (tenant,))
            pgtasks_index.remove_tenant(application, tenant, conn=conn)


def _ocr_kwargs(document_id: int, path: Path) -> dict[str, Any]:
    return {"kind": "document", "key": str(document_id), "title": path.name, "metadata": {"path": str(path)}}


def upload(application: pgtasks.App, tenant: str, path: Path) -> Upload:
    """Store one document and enqueue its OCR job in one transaction."""
    ocr = application.get_task(OCR_TASK)
    with psycopg.connect(application.database.dsn) as conn:  # commits both, or neither
        row = conn.execute(
            "INSERT INTO example_docs.documents (tenant, name, path) VALUES (%s, %s, %s) RETURNING id",
            (tenant, path.name, str(path)),
        ).fetchone()
        assert row is not None
        document_id = int(row[0])
        job = ocr.apply_async((str(path),), _ocr_kwargs(document_id, path), tenant=tenant, connection=conn)
    return Upload(tenant, document_id, path.name, job.id)


def upload_bulk(application: pgtasks.App, tenant: str, paths: Sequence[Path]) -> list[Upload]:
    """Store many documents and enqueue their OCR jobs in one transaction (one round trip for the jobs)."""
    ocr = application.get_task(OCR_TASK)
    with psycopg.connect(application.database.dsn) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO example_docs.documents (tenant, name, path) VALUES (%s, %s, %s) RETURNING id",
            [(tenant, p.name, str(p)) for p in paths],
            returning=True,
        )
        ids: list[int] = []
        while True:
            row = cur.fetchone()
            assert row is not None
            ids.append(int(row[0]))
            if not cur.nextset():
                break
        jobs = application.bulk_apply(
            [ocr.s(str(p), **_ocr_kwargs(i, p)).set(tenant=tenant) for i, p in zip(ids, paths, strict=True)],
            connection=conn,
        )
    return [Upload(tenant, i, p.name, j.id) for i, p, j in zip(ids, paths, jobs, strict=True)]


def delete_document(application: pgtasks.App, tenant: str, document_id: int) -> int:
    """Enqueue the deletion of a document everywhere (index entry and row); returns the job id."""
    job = application.get_task(DELETE_TASK).apply_async(
        ("document", str(document_id)), {"derived": True}, tenant=tenant
    )
    return job.id
