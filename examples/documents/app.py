"""The document archive: a documents table of its own, and pgtasks' built-in plugins.

Uploading a document writes its row and its pipeline in ONE transaction (enqueued
with ``connection=conn``): either the row and all its jobs exist or none does. The
pipeline is one chain per document (docs/workflows.md): the OCR task (plugin
``pgtasks_ocr``) extracts the text, ``documents.taxonomy`` gets OCR's result, assigns
the document a type and a correspondent by the rules below (`classify`) and writes
them to its row, and ``documents.index`` gets that and puts the document in the
full-text index (plugin ``pgtasks_index``). Each step is queued by the database when
the one before succeeds; a document OCR cannot read never reaches the others (they
end cancelled, ``DEPENDENCY_FAILED``). ``pgtasks.delete`` (plugin ``pgtasks_delete``)
removes a document from the index and, asked for derived data, lets this
application delete its row through the ``pgtasks_delete_item`` hook below.

The OCR task reads documents only from its roots: ``PGTASKS_OCR_ROOTS`` when set, else
the shared corpus folder (`DEFAULT_ROOT`); `examples.documents.run` adds the folder it
ingests. Workers can run this app on their own::

    PGTASKS_OCR_ROOTS=/srv/scans pgtasks -A examples.documents.app:app worker -Q ocr,taxonomy,index
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import psycopg

import pgtasks
import pgtasks_index
import pgtasks_ocr
from pgtasks import hookimpl
from pgtasks.context import TaskContext
from pgtasks.errors import ConfigurationError

__all__ = [
    "CORRESPONDENT_RULES",
    "DDL",
    "DEFAULT_ROOT",
    "QUEUES",
    "TYPE_RULES",
    "Upload",
    "allow_folder",
    "app",
    "classify",
    "delete_document",
    "make_app",
    "prepare",
    "reset_tenants",
    "upload",
    "upload_bulk",
]

OCR_TASK: Final = "pgtasks.ocr"
DELETE_TASK: Final = "pgtasks.delete"
TAXONOMY_TASK: Final = "documents.taxonomy"
INDEX_TASK: Final = "documents.index"
#: The queues of the pipeline's steps (a worker of this app serves them all).
QUEUES: Final = ("ocr", "taxonomy", "index")
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
-- Assigned by the taxonomy step (NULL until it ran).
ALTER TABLE example_docs.documents
    ADD COLUMN IF NOT EXISTS doc_type text,
    ADD COLUMN IF NOT EXISTS correspondent text;
"""

#: Document types, first match wins: (type, words or phrases any of which, ignoring
#: case, the text contains). A text that matches none is ``"other"``.
TYPE_RULES: Final = (
    ("mail", ("subject:", "from:")),
    ("invoice", ("invoice", "rechnung", "total due", "amount due")),
    ("report", ("report", "revenue", "quarter")),
    ("specification", ("specification", "abstract syntax", "database")),
    ("letter", ("dear ", "hi ", "hello", "greetings", "привет")),
)

#: Correspondents, first match wins: a pattern whose first group is the name, searched
#: in the text line by line (a mail's sender, an invoice's customer, a letter's signer).
CORRESPONDENT_RULES: Final = (
    re.compile(r"^from:\s*(?:\"?([^\"<]+?)\"?\s*<[^>]*>|\S+@\S+\s*\(([^)]+)\)|(\S+))", re.I | re.M),
    re.compile(r"^(?:customer|client|kunde):\s*(.+?)\s*$", re.I | re.M),
)


def classify(text: str) -> tuple[str, str | None]:
    """The type and correspondent of a document from its text, by `TYPE_RULES` and
    `CORRESPONDENT_RULES`: ``("invoice", "Example Trading Ltd")``; the correspondent is
    None when no rule finds one."""
    lowered = text.lower()
    doc_type = next((t for t, words in TYPE_RULES if any(w in lowered for w in words)), "other")
    correspondent = None
    for rule in CORRESPONDENT_RULES:
        found = rule.search(text)
        if found:
            correspondent = next((g.strip() for g in found.groups() if g and g.strip()), None)
            if correspondent:
                break
    return doc_type, correspondent


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

    @application.task(name=TAXONOMY_TASK, queue="taxonomy", bind=True, max_retries=3)
    def taxonomy(
        self: TaskContext, ocr: dict[str, Any], document_id: int, title: str, metadata: dict[str, Any]
    ) -> dict[str, Any]:
        """Assign the document's type and correspondent from the text OCR found (``ocr``,
        the OCR job's result), write them to its row (committed with this job's success),
        and hand the document on to the index step."""
        text = str(ocr.get("text", ""))
        doc_type, correspondent = classify(text)
        with self.transaction() as conn:
            conn.execute(
                "UPDATE example_docs.documents SET doc_type = %s, correspondent = %s"
                " WHERE id = %s AND tenant = %s",
                (doc_type, correspondent, document_id, self.request.tenant),
            )
        extra = {k: ocr[k] for k in ("mime", "method", "pages") if k in ocr}
        return {
            "kind": ocr.get("kind", "document"),
            "key": str(document_id),
            "text": text,
            "title": title,
            "metadata": {**metadata, **extra, "doc_type": doc_type, "correspondent": correspondent},
        }

    @application.task(name=INDEX_TASK, queue="index", bind=True, max_retries=3)
    def index_document(self: TaskContext, item: dict[str, Any]) -> dict[str, Any]:
        """Put the document the taxonomy step handed on (``item``) in the tenant's index."""
        done = pgtasks_index.upsert(
            self.app,
            tenant=self.request.tenant,
            kind=item["kind"],
            key=item["key"],
            text=item["text"],
            title=item["title"],
            metadata=item["metadata"],
        )
        return {"key": item["key"], "created": done.created}

    return application


def allow_folder(application: pgtasks.App, folder: Path) -> None:
    """Let the OCR task of ``application`` read the documents in ``folder`` too."""
    roots = pgtasks_ocr.ocr_config(application).roots
    pgtasks_ocr.configure(application, roots=[*roots, folder.resolve()])


app = make_app()


@dataclass(frozen=True, slots=True)
class Upload:
    """A stored document and the jobs of its pipeline: OCR (``job_id``), taxonomy, index."""

    tenant: str
    document_id: int
    name: str
    job_id: int
    taxonomy_job_id: int
    index_job_id: int


def prepare(application: pgtasks.App = app) -> str:
    """Migrate pgtasks and the index, create the documents table; returns the DSN in use.

    Raises:
        ConfigurationError: the built-in plugins are not loaded.
    """
    for task in (OCR_TASK, "pgtasks.index", DELETE_TASK):  # the index step writes through pgtasks_index
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


def _pipeline(application: pgtasks.App, document_id: int, path: Path) -> pgtasks.chain:
    """The chain of one document: OCR (its text kept in its result), taxonomy, index."""
    ocr = application.get_task(OCR_TASK)
    taxonomy = application.get_task(TAXONOMY_TASK)
    index = application.get_task(INDEX_TASK)
    return pgtasks.chain(
        ocr.s(str(path), kind="document", key=str(document_id), title=path.name, next_task=None),
        taxonomy.s(document_id=document_id, title=path.name, metadata={"path": str(path)}),
        index.s(),
    )


def _upload_of(tenant: str, document_id: int, path: Path, last: pgtasks.AsyncResult) -> Upload:
    taxonomy = last.parent
    ocr = taxonomy.parent
    return Upload(tenant, document_id, path.name, ocr.id, taxonomy.id, last.id)


def upload(application: pgtasks.App, tenant: str, path: Path) -> Upload:
    """Store one document and enqueue its pipeline in one transaction."""
    with psycopg.connect(application.database.dsn) as conn:  # commits all, or nothing
        row = conn.execute(
            "INSERT INTO example_docs.documents (tenant, name, path) VALUES (%s, %s, %s) RETURNING id",
            (tenant, path.name, str(path)),
        ).fetchone()
        assert row is not None
        document_id = int(row[0])
        last = _pipeline(application, document_id, path).apply_async(tenant=tenant, connection=conn)
    return _upload_of(tenant, document_id, path, last)


def upload_bulk(application: pgtasks.App, tenant: str, paths: Sequence[Path]) -> list[Upload]:
    """Store many documents and enqueue their pipelines in one transaction (one group of chains)."""
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
        pipelines = pgtasks.group(_pipeline(application, i, p) for i, p in zip(ids, paths, strict=True))
        results = pipelines.apply_async(tenant=tenant, connection=conn)
    return [_upload_of(tenant, i, p, last) for i, p, last in zip(ids, paths, results.results, strict=True)]


def delete_document(application: pgtasks.App, tenant: str, document_id: int) -> int:
    """Enqueue the deletion of a document everywhere (index entry and row); returns the job id."""
    job = application.get_task(DELETE_TASK).apply_async(
        ("document", str(document_id)), {"derived": True}, tenant=tenant
    )
    return job.id
