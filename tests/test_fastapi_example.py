"""The FastAPI upload example (examples/fastapi_upload) through a real HTTP client.

Starlette's TestClient runs the API with its lifespan (pgtasks opened and migrated, the
asyncio connection pool opened) against the test database; the OCR jobs run on a real
in-process burst worker, and their results are read back through the API and through
``AsyncResult.get_async``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from starlette.testclient import TestClient

import pgtasks
from examples.fastapi_upload.app import create_api, make_tasks
from pgtasks.worker import Worker, WorkerConfig

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "documents"
TEXT = "Rechnung 2024-117\nQuarterly invoice for Müller & Söhne.\n"
ACME = {"X-Tenant": "acme"}
GLOBEX = {"X-Tenant": "globex"}


@pytest.fixture
def tasks(dsn: str) -> Iterator[pgtasks.App]:
    application = make_tasks(dsn)
    yield application
    application.close()


@pytest.fixture
def client(tasks: pgtasks.App) -> Iterator[TestClient]:
    with TestClient(create_api(tasks, quota_bytes=10_000, pool_size=2)) as http:
        yield http


def _counts(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM example_uploads.documents), (SELECT count(*) FROM pgtasks.jobs)"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _run_worker(tasks: pgtasks.App) -> int:
    config = WorkerConfig(queues=("ocr",), concurrency=2, burst=True, poll_interval=0.1, lease_timeout=30)
    return Worker(tasks, config).run()


def test_an_upload_is_stored_with_its_job_and_the_job_runs(
    client: TestClient, tasks: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    made = client.post(
        "/documents", headers=ACME, files={"file": ("invoice.txt", TEXT.encode(), "text/plain")}
    )
    assert made.status_code == 201, made.text
    document_id, job_id = made.json()["document_id"], made.json()["job_id"]
    job = tasks.get_job(job_id)
    assert (job.task_name, job.args, job.tenant, job.status) == (
        "uploads.ocr",
        [document_id],
        "acme",
        "queued",
    )
    assert _counts(conn) == (1, 1)

    before = client.get(f"/documents/{document_id}", headers=ACME).json()
    assert (before["status"], before["result"], before["text"]) == ("queued", None, None)
    assert client.get(f"/documents/{document_id}/result?timeout=0.2", headers=ACME).status_code == 504

    assert _run_worker(tasks) == 0

    after = client.get(f"/documents/{document_id}", headers=ACME).json()
    assert after["status"] == "succeeded"
    assert after["text"] == TEXT.strip()
    expected = {
        "document_id": document_id,
        "method": "plain",
        "mime": "text/plain",
        "pages": 1,
        "characters": len(TEXT.strip()),
    }
    assert after["result"] == expected
    waited = client.get(f"/documents/{document_id}/result?timeout=5", headers=ACME).json()
    assert waited == {"document_id": document_id, "status": "succeeded", "result": expected}
    assert asyncio.run(tasks.tenant("acme").AsyncResult(job_id).get_async(timeout=5)) == expected


def test_a_request_that_fails_after_enqueueing_leaves_no_row_and_no_job(
    client: TestClient, tasks: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    small = client.post("/documents", headers=ACME, files={"file": ("a.txt", b"x" * 6_000, "text/plain")})
    assert small.status_code == 201
    # The second file takes acme past its 10 000-byte quota: the endpoint raises after the
    # row and the job were written, inside the transaction.
    refused = client.post("/documents", headers=ACME, files={"file": ("b.txt", b"y" * 6_000, "text/plain")})
    assert refused.status_code == 413
    assert "quota" in refused.json()["detail"]
    assert _counts(conn) == (1, 1)
    assert [j.id for j in tasks.list_jobs()] == [small.json()["job_id"]]
    # Another tenant's quota is its own.
    assert (
        client.post("/documents", headers=GLOBEX, files={"file": ("c.txt", b"z" * 6_000)}).status_code == 201
    )
    assert _counts(conn) == (2, 2)


def test_a_tenant_sees_only_its_own_documents(client: TestClient) -> None:
    made = client.post("/documents", headers=ACME, files={"file": ("a.txt", TEXT.encode())}).json()
    assert client.get(f"/documents/{made['document_id']}", headers=GLOBEX).status_code == 404
    assert client.get(f"/documents/{made['document_id']}/result?timeout=0", headers=GLOBEX).status_code == 404
    assert client.get(f"/documents/{made['document_id']}", headers=ACME).status_code == 200
    assert (
        client.post("/documents", headers={"X-Tenant": ""}, files={"file": ("a.txt", b"a")}).status_code
        == 400
    )
    assert client.post("/documents", files={"file": ("a.txt", b"a")}).status_code == 422  # no tenant header


def test_a_long_file_name_is_refused_and_an_odd_one_is_read(
    client: TestClient, tasks: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    refused = client.post("/documents", headers=ACME, files={"file": ("x" * 300 + ".txt", b"text")})
    assert refused.status_code == 400
    assert "255 characters" in refused.json()["detail"]
    assert _counts(conn) == (0, 0)
    odd = client.post("/documents", headers=ACME, files={"file": ("..", b"dot dot")}).json()
    assert _run_worker(tasks) == 0
    assert client.get(f"/documents/{odd['document_id']}", headers=ACME).json()["text"] == "dot dot"


@pytest.mark.skipif(not (CORPUS / "simple.pdf").is_file(), reason="the shared corpus is not there")
def test_a_pdf_and_a_bad_file_end_as_the_ocr_layer_says(tasks: pgtasks.App) -> None:
    with TestClient(create_api(tasks)) as client:  # the default quota
        _pdf_and_bad_file(client, tasks)


def _pdf_and_bad_file(client: TestClient, tasks: pgtasks.App) -> None:
    pdf = client.post(
        "/documents",
        headers=GLOBEX,
        files={"file": ("simple.pdf", (CORPUS / "simple.pdf").read_bytes(), "application/pdf")},
    ).json()
    broken = client.post(
        "/documents",
        headers=GLOBEX,
        files={"file": ("broken.pdf", b"%PDF-1.7 not really", "application/pdf")},
    ).json()
    assert _run_worker(tasks) == 0
    done = client.get(f"/documents/{pdf['document_id']}/result?timeout=5", headers=GLOBEX).json()
    assert done["status"] == "succeeded"
    assert done["result"]["mime"] == "application/pdf" and done["result"]["characters"] > 0
    failed = client.get(f"/documents/{broken['document_id']}", headers=GLOBEX).json()
    assert failed["status"] == "failed" and failed["attempt"] == 1  # permanent: no retry
    assert failed["error"]["code"] == "CORRUPT_FILE"
    waited = client.get(f"/documents/{broken['document_id']}/result?timeout=5", headers=GLOBEX).json()
    assert waited["status"] == "failed" and "broken.pdf" in waited["error"]
