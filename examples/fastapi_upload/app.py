"""Document uploads over HTTP: FastAPI, an asyncio connection pool, and pgtasks.

``POST /documents`` stores the uploaded file as a row of the application's own table
and enqueues its OCR job **in the same transaction**, on an asyncio connection of a
``psycopg_pool.AsyncConnectionPool``: ``await ocr_document.apply_async_async(...,
connection=aconn)`` writes the job in the event loop, inside that transaction. Either
both exist or neither does; the job's workers are woken when the transaction commits.
The tenant's storage quota is checked last, with the new row counted: a refusal there
(``413``) rolls the row and its job back together.

``GET /documents/{id}`` reads the row and its job's status on the same pool
(``AsyncResult.job_async(connection=aconn)``); ``GET /documents/{id}/result``
waits for the job to finish without holding the event loop
(``AsyncResult.get_async``). Every request names its tenant (header ``X-Tenant``),
and acts through that tenant's handle (``app.tenant(...)``): another tenant's
document is a 404.

The OCR task reads the file from the row and extracts its text with the built-in OCR
plugin's extraction layer (`pgtasks_ocr.extract_text`: plain text and mail with the
core install; PDFs and images with the ``ocr`` extra). Run a worker for it with::

    pgtasks -A examples.fastapi_upload.app:tasks worker -Q ocr

and the HTTP server with ``python -m examples.fastapi_upload`` (or
``uvicorn --factory examples.fastapi_upload.app:create_api``).
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Final

import psycopg
from fastapi import Depends, FastAPI, Header, HTTPException, Request, UploadFile
from psycopg_pool import AsyncConnectionPool

import pgtasks
import pgtasks.asgi
import pgtasks_ocr
from pgtasks.context import TaskContext
from pgtasks.errors import ConfigurationError, JobNotFound, Reject, ResultTimeout, TaskFailed

__all__ = [
    "DDL",
    "DEFAULT_QUOTA_BYTES",
    "MAX_NAME_LENGTH",
    "MAX_UPLOAD_BYTES",
    "create_api",
    "make_tasks",
    "ocr_document",
    "tasks",
]

#: The application's own table (its schema is the application's business, not pgtasks').
DDL: Final = """
CREATE SCHEMA IF NOT EXISTS example_uploads;
CREATE TABLE IF NOT EXISTS example_uploads.documents (
    id bigserial PRIMARY KEY,
    tenant text NOT NULL,
    name text NOT NULL,
    content bytea NOT NULL,
    job_id bigint,
    text text,
    uploaded_at timestamptz NOT NULL DEFAULT now()
);
"""

#: Largest upload accepted, in bytes.
MAX_UPLOAD_BYTES: Final = 20 * 1024 * 1024
#: Longest file name accepted, in characters.
MAX_NAME_LENGTH: Final = 255
#: Bytes of documents a tenant may store, unless `create_api` is told otherwise.
DEFAULT_QUOTA_BYTES: Final = 200 * 1024 * 1024


def make_tasks(dsn: str | None = None) -> pgtasks.App:
    """The pgtasks app of the example, with its one task, ``uploads.ocr``.

    Args:
        dsn: the database (None: ``PGTASKS_DSN``, ``DATABASE_URL``, else the embedded server).
    """
    app = pgtasks.App("fastapi_upload", dsn=dsn, load_entry_points=False)

    @app.task(name="uploads.ocr", queue="ocr", bind=True, max_retries=3, retry_backoff=True)
    def ocr_document(self: TaskContext, document_id: int) -> dict[str, Any]:
        """Extract the text of the tenant's document ``document_id`` and store it in its row."""
        tenant = self.request.tenant
        with app.database.connection() as conn:
            row = conn.execute(
                "SELECT name, content FROM example_uploads.documents WHERE id = %s AND tenant = %s",
                (document_id, tenant),
            ).fetchone()
        if row is None:
            raise Reject(f"tenant {tenant!r} has no document {document_id}", code="NO_DOCUMENT")
        name, content = str(row[0]), bytes(row[1])
        extracted = _extract(name, content)
        with app.database.connection() as conn:
            conn.execute(
                "UPDATE example_uploads.documents SET text = %s WHERE id = %s AND tenant = %s",
                (extracted.text, document_id, tenant),
            )
        return {
            "document_id": document_id,
            "method": extracted.method,
            "mime": extracted.mime,
            "pages": len(extracted.pages),
            "characters": len(extracted.text),
        }

    return app


def _extract(name: str, content: bytes) -> pgtasks_ocr.ExtractedText:
    """The text of an uploaded file (its name matters only for ``.eml``), through a
    private temporary folder: the OCR layer reads files, and only from its roots."""
    safe = Path(name).name.strip()
    if safe in ("", ".", ".."):
        safe = "upload"
    with tempfile.TemporaryDirectory(prefix="pgtasks-upload-") as folder:
        path = Path(folder) / safe
        path.write_bytes(content)
        return pgtasks_ocr.extract_text(path, roots=[folder])


tasks = make_tasks()
#: The OCR task (what the upload endpoint enqueues).
ocr_document = tasks.get_task("uploads.ocr")


def _pool(request: Request) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
    """The request's asyncio connection pool (opened by the API's lifespan)."""
    pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = request.state.pool
    return pool


# What the endpoints take (FastAPI dependencies): the pool, the pgtasks app, the tenant.
Pool = Annotated[AsyncConnectionPool[psycopg.AsyncConnection[Any]], Depends(_pool)]
App = Annotated[pgtasks.App, Depends(pgtasks.asgi.current_app)]
Tenant = Annotated[str, Header(alias="X-Tenant")]


def _handle(app: pgtasks.App, tenant: str) -> pgtasks.tenancy.TenantScope:
    """The tenant's handle, or a 400 for a tenant name the handle refuses."""
    try:
        return app.tenant(tenant)
    except ConfigurationError as exc:
        raise HTTPException(400, f"bad X-Tenant header: {exc}") from None


def create_api(
    app: pgtasks.App | None = None, *, quota_bytes: int = DEFAULT_QUOTA_BYTES, pool_size: int = 10
) -> FastAPI:
    """The HTTP API over ``app`` (default: `tasks`).

    Startup migrates pgtasks, creates the documents table and opens an asyncio
    connection pool of ``pool_size`` connections on the app's database; shutdown
    closes the pool and the app (`pgtasks.asgi.lifespan`).

    Args:
        app: the pgtasks app whose ``uploads.ocr`` task the uploads enqueue.
        quota_bytes: bytes of documents one tenant may store.
        pool_size: most connections of the asyncio pool.
    """
    application = tasks if app is None else app
    ocr = application.get_task("uploads.ocr")

    @asynccontextmanager
    async def documents_pool(api: FastAPI) -> AsyncIterator[dict[str, Any]]:
        async with AsyncConnectionPool(
            application.database.dsn, min_size=1, max_size=pool_size, open=False
        ) as pool:
            async with pool.connection() as aconn:
                await aconn.execute(DDL)
            yield {"pool": pool}

    api = FastAPI(
        title="pgtasks upload example",
        lifespan=pgtasks.asgi.lifespan(application, migrate=True, inner=documents_pool),
    )

    @api.post("/documents", status_code=201)
    async def upload(file: UploadFile, tenant: Tenant, pool: Pool, app: App) -> dict[str, Any]:
        """Store the document and enqueue its OCR job, in one transaction."""
        handle = _handle(app, tenant)
        content = await file.read(MAX_UPLOAD_BYTES + 1)
        if len(content) > MAX_UPLOAD_BYTES:
            raise HTTPException(413, f"a document may have at most {MAX_UPLOAD_BYTES} bytes")
        name = file.filename or "upload"
        if "\x00" in name or len(name) > MAX_NAME_LENGTH:
            raise HTTPException(400, f"a file name has at most {MAX_NAME_LENGTH} characters and no NUL")
        async with pool.connection() as aconn, aconn.transaction():
            cur = await aconn.execute(
                "INSERT INTO example_uploads.documents (tenant, name, content)"
                " VALUES (%s, %s, %s) RETURNING id",
                (handle.tenant, name, content),
            )
            row = await cur.fetchone()
            assert row is not None
            document_id = int(row[0])
            job = await handle.apply_async_async(ocr, (document_id,), connection=aconn)
            await aconn.execute(
                "UPDATE example_uploads.documents SET job_id = %s WHERE id = %s", (job.id, document_id)
            )
            cur = await aconn.execute(
                "SELECT sum(octet_length(content)) FROM example_uploads.documents WHERE tenant = %s",
                (handle.tenant,),
            )
            used = await cur.fetchone()
            if used is not None and int(used[0]) > quota_bytes:
                # Raised inside the transaction: the row and its job are rolled back together.
                raise HTTPException(
                    413, f"tenant {handle.tenant!r} would exceed its {quota_bytes}-byte quota"
                )
        return {"document_id": document_id, "job_id": job.id, "status": f"/documents/{document_id}"}

    async def _document(pool: Pool, handle: pgtasks.tenancy.TenantScope, document_id: int) -> tuple[Any, ...]:
        async with pool.connection() as aconn:
            cur = await aconn.execute(
                "SELECT name, job_id, text FROM example_uploads.documents WHERE id = %s AND tenant = %s",
                (document_id, handle.tenant),
            )
            row = await cur.fetchone()
        if row is None or row[1] is None:
            raise HTTPException(404, f"no document {document_id}")
        return tuple(row)

    @api.get("/documents/{document_id}")
    async def status(document_id: int, tenant: Tenant, pool: Pool, app: App) -> dict[str, Any]:
        """The document, its OCR job's status and result (or error) and its text once extracted."""
        handle = _handle(app, tenant)
        name, job_id, text = await _document(pool, handle, document_id)
        async with pool.connection() as aconn:
            try:
                job = await handle.AsyncResult(job_id).job_async(connection=aconn)
            except JobNotFound:
                raise HTTPException(404, f"the job of document {document_id} was purged") from None
        error = job.error or {}
        return {
            "document_id": document_id,
            "name": name,
            "job_id": job.id,
            "status": job.status,
            "attempt": job.attempt,
            "result": job.result,
            "error": {"code": error.get("code"), "message": error.get("message")} if job.error else None,
            "text": text,
        }

    @api.get("/documents/{document_id}/result")
    async def result(
        document_id: int, tenant: Tenant, pool: Pool, app: App, timeout: float = 10.0
    ) -> dict[str, Any]:
        """Wait up to ``timeout`` seconds (0 to 60) for the OCR job, then its result; 504 if
        it has not finished by then."""
        if not 0 <= timeout <= 60:
            raise HTTPException(422, "timeout must be between 0 and 60 seconds")
        handle = _handle(app, tenant)
        _, job_id, _ = await _document(pool, handle, document_id)
        try:
            value = await handle.AsyncResult(job_id).get_async(timeout=timeout)
        except ResultTimeout:
            raise HTTPException(504, f"the OCR job of document {document_id} has not finished yet") from None
        except TaskFailed as failure:
            return {
                "document_id": document_id,
                "status": failure.status,
                "error": failure.error.get("message"),
            }
        return {"document_id": document_id, "status": "succeeded", "result": value}

    return api
