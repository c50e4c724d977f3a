"""The mail index example on the corpus's real, messy mail, with a real worker."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from rich.console import Console

import pgtasks_index
from pgtasks.states import JobStatus

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from examples.mail_index.app import make_app  # noqa: E402 - needs the repository on the path
from examples.mail_index.run import CORPUS_MAIL, print_status, run  # noqa: E402

SHARED_ID = "15090.61304.110929.45684@aaa.zzz.org"  # python-msg_01, _03 and _20


@pytest.mark.skipif(not CORPUS_MAIL.is_dir(), reason="the shared corpus is not present")
def test_corpus_mail_is_indexed_per_tenant_and_deleted_by_message_id(dsn: str) -> None:
    out = io.StringIO()
    app = make_app(dsn)
    outcome = run(CORPUS_MAIL, console=Console(file=out, width=200), application=app)
    files = sorted(p.name for p in CORPUS_MAIL.glob("*.eml"))
    jobs = outcome["jobs"]
    assert isinstance(jobs, dict)
    assert sorted(jobs) == sorted((t, f) for t in ("alice", "bob") for f in files)
    for (tenant, name), job_id in jobs.items():
        job = app.get_job(job_id)
        assert job.tenant == tenant
        if name == "broken.eml":  # not a mail: one attempt, a clear permanent failure
            assert job.status is JobStatus.FAILED and len(job.attempts) == 1
            assert job.error is not None and job.error["code"] == "MALFORMED_MAIL"
            assert "no header fields" in job.error["message"]
        else:
            assert job.status is JobStatus.SUCCEEDED, (name, job.error)
    readable = len(files) - 1
    assert outcome["counts"] == {"alice": readable, "bob": readable}
    # Shared and missing Message-IDs lose nothing: keys are the files.
    assert outcome["shared"] == SHARED_ID
    assert pgtasks_index.find_keys(app, tenant="alice", kind="mail", metadata={"message_id": SHARED_ID}) == [
        "python-msg_01.eml",
        "python-msg_03.eml",
        "python-msg_20.eml",
    ]
    no_id = pgtasks_index.find_keys(app, tenant="alice", kind="mail", metadata={"message_id": None})
    assert len(no_id) >= 5 and "python-msg_02.eml" in no_id
    # bob deleted the three messages sharing that id; alice, another tenant, kept hers.
    assert outcome["after"] == {"alice": readable, "bob": readable - 3}
    assert pgtasks_index.find_keys(app, tenant="bob", kind="mail", metadata={"message_id": SHARED_ID}) == []
    deleted = outcome["deleted"]
    assert isinstance(deleted, list) and len(deleted) == 3
    for job_id in deleted:
        assert app.get_job(job_id).result["removed"] == {"index_entries": 1}
    searched = outcome["searched"]
    assert isinstance(searched, dict)
    assert "python-msg_01.eml" in searched["alice"] and "python-msg_01.eml" not in searched["bob"]
    # Job status by id.
    status_out = io.StringIO()
    first = jobs[("alice", "broken.eml")]
    assert print_status(Console(file=status_out, width=200), app, first) is JobStatus.FAILED
    assert f"job {first}: mail.index for tenant 'alice' is failed" in status_out.getvalue()
    assert "MALFORMED_MAIL (permanent)" in status_out.getvalue()
    app.close()


def test_sample_mail_without_the_corpus(dsn: str) -> None:
    app = make_app(dsn)
    outcome = run(None, console=Console(file=io.StringIO(), width=200), application=app)
    assert outcome["counts"] == {"alice": 3, "bob": 3}
    assert outcome["shared"] == "shared@example.org"
    assert outcome["after"] == {"alice": 3, "bob": 1}
    app.close()


def test_bad_payloads_fail_permanently(dsn: str) -> None:
    from apps.pipeline_app import run_worker

    app = make_app(dsn)
    app.migrate()
    task = app.get_task("mail.index")
    no_path = task.apply_async(({"key": "x"},), tenant="alice")
    no_tenant = task.apply_async(({"path": str(REPO / "README.md")},))
    assert run_worker(app, timeout=60) == 0
    for result in (no_path, no_tenant):
        job = app.get_job(result.id)
        assert job.status is JobStatus.FAILED and len(job.attempts) == 1
        assert job.error is not None and job.error["code"] == "MAIL_BAD_PAYLOAD"
    app.close()
