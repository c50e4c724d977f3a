"""The documents example runs end to end: on its own sample files, with and without Tesseract."""

from __future__ import annotations

import io
import os
import shutil
import sys
from pathlib import Path

import pytest
from rich.console import Console

import pgtasks
from pgtasks.states import JobStatus
from pgtasks_ocr import tesseract_available

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from examples.documents.app import Upload, make_app  # noqa: E402 - needs the repository on the path
from examples.documents.run import run  # noqa: E402
from examples.documents.samples import SAMPLE_QUERIES  # noqa: E402


def _by_name(uploads: object, tenant: str) -> dict[str, Upload]:
    assert isinstance(uploads, list)
    return {u.name: u for u in uploads if u.tenant == tenant}


def _run(dsn: str) -> tuple[dict[str, object], str, pgtasks.App]:
    out = io.StringIO()
    app = make_app(dsn)
    outcome = run(
        None,
        SAMPLE_QUERIES,
        concurrency=2,
        timeout=240,
        console=Console(file=out, width=200),
        application=app,
    )
    return outcome, out.getvalue(), app


@pytest.mark.skipif(not tesseract_available(), reason="Tesseract is not installed")
def test_sample_files_are_ingested_ocrd_indexed_found_and_deleted(dsn: str) -> None:
    outcome, printed, app = _run(dsn)
    acme = _by_name(outcome["uploads"], "acme")
    assert sorted(acme) == ["greetings.txt", "invoice.pdf", "meeting.eml", "quarterly-report-scan.png"]
    found = outcome["found"]
    assert isinstance(found, dict)
    assert str(acme["invoice.pdf"].document_id) in found["invoice"]
    assert str(acme["quarterly-report-scan.png"].document_id) in found["quarterly report"]  # OCR text
    assert found["Привет"] == [str(acme["greetings.txt"].document_id)]
    deleted = outcome["deleted"]
    assert deleted == {
        "key": found["invoice"][0],
        "removed": {"documents": 1, "index_entries": 1},
        "still_found": False,
    }
    for name in ("OCR", "index", "fair dispatch", "search 'invoice' in tenant 'acme'", "is gone"):
        assert name in printed
    # Each document row was written with its chain: OCR, taxonomy, index, all succeeded.
    for item in acme.values():
        for job_id in (item.job_id, item.taxonomy_job_id, item.index_job_id):
            assert app.get_job(job_id).status is JobStatus.SUCCEEDED
        taxonomy = app.get_job(item.taxonomy_job_id)
        assert (taxonomy.trigger, taxonomy.parent_id) == ("dependency", item.job_id)
    # The taxonomy step wrote each document's type and correspondent to its row.
    assert outcome["taxonomy"] == {
        "greetings.txt": ("letter", None),
        "invoice.pdf": ("invoice", "Example Trading Ltd"),
        "meeting.eml": ("mail", "Alice Example"),
        "quarterly-report-scan.png": ("report", None),
    }
    assert "taxonomy of tenant 'acme'" in printed
    app.close()


def test_without_tesseract_scans_fail_clearly_and_the_rest_works(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A PATH with the Python interpreter's folder but no tesseract.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}")
    assert shutil.which("tesseract") is None
    outcome, printed, app = _run(dsn)
    acme = _by_name(outcome["uploads"], "acme")
    scan = app.get_job(acme["quarterly-report-scan.png"].job_id)
    assert scan.status is JobStatus.FAILED and len(scan.attempts) == 1
    assert scan.error is not None and scan.error["code"] == "OCR_UNAVAILABLE"
    assert "apt-get install" in scan.error["message"]
    assert "OCR_UNAVAILABLE" in printed
    # The rest of the scan's chain never ran: cancelled by its failed OCR.
    for job_id in (
        acme["quarterly-report-scan.png"].taxonomy_job_id,
        acme["quarterly-report-scan.png"].index_job_id,
    ):
        later = app.get_job(job_id)
        assert later.status is JobStatus.CANCELLED
        assert later.error is not None and later.error["code"] == "DEPENDENCY_FAILED"
    taxonomy = outcome["taxonomy"]
    assert isinstance(taxonomy, dict)
    assert taxonomy["quarterly-report-scan.png"] == (None, None)
    assert taxonomy["invoice.pdf"] == ("invoice", "Example Trading Ltd")
    found = outcome["found"]
    assert isinstance(found, dict)
    assert str(acme["invoice.pdf"].document_id) in found["invoice"]
    assert str(acme["meeting.eml"].document_id) in found["quarterly report"]  # the mail mentions it
    assert str(acme["quarterly-report-scan.png"].document_id) not in found["quarterly report"]
    assert found["Привет"] == [str(acme["greetings.txt"].document_id)]
    app.close()
