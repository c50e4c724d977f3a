"""The document pipeline on every corpus file, with a real worker and real PostgreSQL.

Each file of ``corpus/documents`` (and its ``mail/`` folder) goes through the
``pgtasks.ocr`` task, which hands the text on by enqueuing ``pgtasks.index`` by name;
then search and ``pgtasks.delete``. Expected results are those of the corpus README.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from apps.pipeline_app import CORPUS, enqueue_file, make_app, run_worker
from helpers import scratch_database

import pgtasks
from pgtasks.states import JobStatus
from pgtasks_ocr import tesseract_available

pytestmark = pytest.mark.skipif(not CORPUS.is_dir(), reason="the shared corpus is not present")

needs_tesseract = pytest.mark.skipif(
    not tesseract_available(),
    reason="Tesseract is not installed (apt-get install -y tesseract-ocr tesseract-ocr-eng)",
)

TENANT = "acme"

# file -> phrases its indexed text contains, in this order (corpus README)
EXPECTED_TEXT = {
    "simple.pdf": ["This is a test document."],
    "simple.png": ["This is a test document."],
    "simple.jpg": ["This is a test document."],
    "simple.tiff": ["This is a test document."],
    "multi-page-digital.pdf": ["Page 1", "Page 2", "Page 3"],
    "multi-page-images.pdf": ["Page 1", "Page 2", "Page 3"],
    "libtasn1.pdf": ["Abstract Syntax Notation One"],
    "shared-mime-info-spec.pdf": ["Shared MIME-info Database"],
    "invalid_pdf.pdf": ["Invoice number: 123456"],
    "simple.txt": ["This is a test file."],
    "content.txt": ["Ωμέγα", "Привет", "你好"],
}
IMAGE_ONLY = {"simple.png", "simple.jpg", "simple.tiff", "multi-page-images.pdf"}
PERMANENT_FAILURES = {"password-is-test.pdf": "ENCRYPTED_PDF", "broken.eml": "MALFORMED_MAIL"}


@pytest.fixture(scope="module")
def pipeline(admin_dsn: str, template_db: str) -> Iterator[dict[str, object]]:
    """Run every corpus file through OCR and indexing once; yield the app and the jobs."""
    stack = contextlib.ExitStack()
    app = make_app(stack.enter_context(scratch_database(admin_dsn, template=template_db, prefix="pgtasks_p")))
    try:
        assert app.migrate() == ["pgtasks_index:0001_entries"]
        files = sorted(p for p in CORPUS.iterdir() if p.is_file())
        files += sorted((CORPUS / "mail").glob("*.eml"))
        if not tesseract_available():
            files = [f for f in files if f.name not in IMAGE_ONLY]
        ocr_jobs = {f.name: enqueue_file(app, f, tenant=TENANT).id for f in files}
        unlocked = enqueue_file(app, CORPUS / "password-is-test.pdf", tenant="unlocked", password="test").id
        assert run_worker(app) == 0
        yield {"app": app, "ocr_jobs": ocr_jobs, "unlocked": unlocked}
    finally:
        app.close()
        stack.close()


def _app(pipeline: dict[str, object]) -> pgtasks.App:
    app = pipeline["app"]
    assert isinstance(app, pgtasks.App)
    return app


def _jobs(pipeline: dict[str, object]) -> dict[str, int]:
    jobs = pipeline["ocr_jobs"]
    assert isinstance(jobs, dict)
    return jobs


def test_plugins_came_from_their_entry_points(pipeline: dict[str, object]) -> None:
    from pgtasks.plugins import describe_plugins

    sources = {p.name: p.source for p in describe_plugins(_app(pipeline).plugin_manager)}
    for name in ("pgtasks_ocr", "pgtasks_index", "pgtasks_delete"):
        assert sources[name].startswith(f"entry point {name} = {name}.plugin"), sources


@pytest.mark.parametrize("file_name", sorted(EXPECTED_TEXT))
def test_every_readable_file_is_indexed_with_the_right_text(
    pipeline: dict[str, object], file_name: str
) -> None:
    import pgtasks_index

    if file_name in IMAGE_ONLY and not tesseract_available():
        pytest.skip("Tesseract is not installed")
    app = _app(pipeline)
    ocr = app.get_job(_jobs(pipeline)[file_name])
    assert ocr.status is JobStatus.SUCCEEDED, ocr.error
    assert ocr.attempt == 1
    index_job = app.get_job(ocr.result["next_job"])
    assert index_job.status is JobStatus.SUCCEEDED, index_job.error
    assert index_job.tenant == TENANT
    entry = pgtasks_index.get_entry(app, tenant=TENANT, kind="document", key=file_name)
    assert entry is not None
    positions = [entry.body.find(phrase) for phrase in EXPECTED_TEXT[file_name]]
    assert all(p >= 0 for p in positions), (file_name, entry.body[:300])
    assert positions == sorted(positions), f"{file_name}: phrases out of order"
    assert entry.metadata["ocr_job"] == ocr.id
    if file_name in IMAGE_ONLY:
        assert entry.metadata["method"] == "ocr"


def test_every_mail_but_the_headerless_one_is_indexed(pipeline: dict[str, object]) -> None:
    import pgtasks_index

    app = _app(pipeline)
    mails = [n for n in _jobs(pipeline) if n.endswith(".eml")]
    assert len(mails) == len(list((CORPUS / "mail").glob("*.eml")))
    for name in mails:
        if name in PERMANENT_FAILURES:
            continue
        job = app.get_job(_jobs(pipeline)[name])
        assert job.status is JobStatus.SUCCEEDED, (name, job.error)
        entry = pgtasks_index.get_entry(app, tenant=TENANT, kind="mail", key=name)
        assert entry is not None and entry.metadata["method"] == "mail", name
    # Three messages share one Message-ID: all three are kept (keys are the files).
    for name in ("python-msg_01.eml", "python-msg_03.eml", "python-msg_20.eml"):
        assert pgtasks_index.get_entry(app, tenant=TENANT, kind="mail", key=name) is not None


@pytest.mark.parametrize("file_name", sorted(PERMANENT_FAILURES))
def test_unreadable_files_fail_once_permanently_with_a_clear_message(
    pipeline: dict[str, object], file_name: str
) -> None:
    job = _app(pipeline).get_job(_jobs(pipeline)[file_name])
    assert job.status is JobStatus.FAILED
    assert job.attempt == 1 and len(job.attempts) == 1  # never retried
    assert job.error is not None
    assert job.error["code"] == PERMANENT_FAILURES[file_name]
    assert job.error["class"] == "permanent"
    assert file_name in job.error["message"]
    if file_name.endswith(".pdf"):
        assert "password" in job.error["message"].lower()


def test_the_encrypted_pdf_is_readable_with_its_password(pipeline: dict[str, object]) -> None:
    import pgtasks_index

    app = _app(pipeline)
    job = app.get_job(int(pipeline["unlocked"]))  # type: ignore[call-overload]
    assert job.status is JobStatus.SUCCEEDED, job.error
    entry = pgtasks_index.get_entry(app, tenant="unlocked", kind="document", key="password-is-test.pdf")
    assert entry is not None and entry.body.strip()


@needs_tesseract
def test_search_finds_a_scan_by_a_word_of_its_ocr_text(pipeline: dict[str, object]) -> None:
    hits = _app(pipeline).search("test document", tenant=TENANT, limit=50)
    keys = {h.key for h in hits}
    assert {"simple.png", "simple.jpg", "simple.tiff", "simple.pdf"} <= keys
    assert all(h.tenant == TENANT for h in hits)


def test_search_finds_content_by_a_cyrillic_word(pipeline: dict[str, object]) -> None:
    hits = _app(pipeline).search("Привет", tenant=TENANT)
    assert [h.key for h in hits] == ["content.txt"]
    assert "«Привет»" in hits[0].snippet
    assert _app(pipeline).search("Привет", tenant="someone-else") == []


def test_delete_removes_a_document_and_is_idempotent(pipeline: dict[str, object]) -> None:
    app = _app(pipeline)
    delete = app.get_task("pgtasks.delete")
    assert [h.key for h in app.search("Abstract Syntax Notation", tenant=TENANT)][:1] == ["libtasn1.pdf"]
    first = delete.apply_async(("document", "libtasn1.pdf"), tenant=TENANT)
    second = delete.apply_async(("document", "libtasn1.pdf"), tenant=TENANT)
    unknown = delete.apply_async(("mail", "never-indexed"), tenant=TENANT)
    assert run_worker(app) == 0
    # The two deletes of one document may run at once (two threads, no lock key):
    # exactly one of them removes the entry, the other finds nothing to remove.
    removed = sorted(r.get(timeout=10)["removed"]["index_entries"] for r in (first, second))
    assert removed == [0, 1]
    assert unknown.get(timeout=10)["removed"] == {"index_entries": 0}
    assert "libtasn1.pdf" not in {h.key for h in app.search("Abstract Syntax Notation", tenant=TENANT)}
