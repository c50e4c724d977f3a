"""Hook implementations of the ``pgtasks_ocr`` plugin (the entry point ``pgtasks_ocr``).

- ``pgtasks_register_tasks``: the ``pgtasks.ocr`` task (queue ``ocr``, time limit
  `OCR_TIME_LIMIT`): extract the text of one file (`extract_text`) inside the app's
  roots and limits (`pgtasks_ocr.configure`) and hand it on by enqueuing the index
  task *by name* (``pgtasks.index`` unless told otherwise). This plugin does not import the
  index plugin; if no task of that name is registered, the text stays in the OCR
  job's result.
- ``pgtasks_worker_started``: a worker serving the ``ocr`` queue checks for
  Tesseract and logs how to install it when it is missing. Without it, PDFs with a
  text layer, text files and mails still work; images and scanned pages fail with
  the permanent error ``OCR_UNAVAILABLE``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from pgtasks.context import TaskContext
from pgtasks.plugin_api import TaskRegistry, hookimpl, job_tenant

from .config import OCR_QUEUE, OCR_SOFT_TIME_LIMIT, OCR_TASK, OCR_TIME_LIMIT, ocr_config
from .extract import extract_text
from .files import shown
from .tesseract import (
    DEFAULT_LANGUAGES,
    OcrFailed,
    installed_languages,
    parse_languages,
    tesseract_available,
    tesseract_version,
)

__all__ = ["INSTALL_COMMAND", "OCR_QUEUE", "OCR_TASK", "OCR_TIME_LIMIT", "check_tesseract", "ocr_task"]

log = logging.getLogger("pgtasks_ocr")

#: Task the extracted text is handed to unless the job says otherwise.
DEFAULT_NEXT_TASK: Final = "pgtasks.index"
#: How to install Tesseract with the language data pgtasks uses by default (Debian/Ubuntu).
INSTALL_COMMAND: Final = "apt-get install -y tesseract-ocr tesseract-ocr-eng tesseract-ocr-deu"


def ocr_task(
    self: TaskContext,
    path: str,
    *,
    kind: str = "document",
    key: str | None = None,
    title: str | None = None,
    password: str | None = None,
    ocr_languages: str = DEFAULT_LANGUAGES,
    language: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    next_task: str | None = DEFAULT_NEXT_TASK,
    tenant: str | None = None,
) -> dict[str, Any]:
    """Extract the text of the file at ``path`` and enqueue its indexing.

    Args:
        self: the job's context (bound task).
        path: the file, readable by the worker (shared storage), inside one of the
            app's OCR roots (`pgtasks_ocr.configure`, ``PGTASKS_OCR_ROOTS``) once
            symbolic links and ``..`` are resolved.
        kind: the item's kind for the index (``"document"``, ``"mail"``).
        key: the item's key (default: ``path``).
        title: the item's title (default: the file name).
        password: password of an encrypted PDF; pass a reference
            (``pgtasks.secret_ref.env("PDF_PASSWORD")``) to keep it out of the
            stored job: the worker resolves it. A value given directly is stored
            with the job's arguments and masked everywhere else (``redact``).
        ocr_languages: Tesseract languages (``"eng+deu"``).
        language: text-search configuration for the index (default: the index's).
        metadata: JSON object passed on to the index (``mime``, ``method``, ``pages``
            and ``ocr_job`` are added).
        next_task: task to hand the text to, by name, with arguments
            ``(kind, key, text)`` and keywords ``title``, ``language``, ``metadata``,
            in the same tenant; None keeps the text in this job's result.
        tenant: accepted for callers that pass it, but the item's tenant (and the next
            task's) is always the job's own (``self.request.tenant``): None or that
            same tenant.

    Returns:
        ``{"key", "kind", "mime", "method", "pages", "chars", "next_job"}`` and, when
        the text was not handed on, ``"text"``.

    Raises:
        Reject: a ``tenant`` argument naming another tenant than the job's
            (``TENANT_MISMATCH``), or permanent failures of `extract_text` (``PATH_NOT_ALLOWED``,
            ``NOT_REGULAR_FILE``, ``ENCRYPTED_PDF``, ``CORRUPT_FILE``,
            ``UNSUPPORTED_TYPE``, ``MALFORMED_MAIL``, ``FILE_TOO_LARGE``,
            ``OCR_UNAVAILABLE``): never retried.
        OcrFailed, OSError: retried with backoff (a busy host, storage coming back).
    """
    owner = job_tenant(self, tenant)
    config = ocr_config(self.app)
    extracted = extract_text(
        path, password=password, languages=ocr_languages, roots=config.roots, limits=config.limits
    )
    file = Path(path)
    item_key = key or str(path)
    info: dict[str, Any] = {
        "key": item_key,
        "kind": kind,
        "mime": extracted.mime,
        "method": extracted.method,
        "pages": len(extracted.pages),
        "chars": len(extracted.text),
        "next_job": None,
    }
    follow = self.app.tasks.get(next_task) if next_task else None
    if follow is None:
        if next_task:
            log.warning(
                "task %r is not registered; the text of %s stays in job %s's result",
                next_task,
                shown(file.name),
                self.request.id,
            )
        info["text"] = extracted.text
        return info
    meta = dict(metadata or {})
    meta.update(
        mime=extracted.mime, method=extracted.method, pages=len(extracted.pages), ocr_job=self.request.id
    )
    job = follow.apply_async(
        (kind, item_key, extracted.text),
        {"title": title if title is not None else file.name, "language": language, "metadata": meta},
        tenant=owner,
    )
    info["next_job"] = job.id
    return info


def check_tesseract(languages: str = DEFAULT_LANGUAGES) -> str | None:
    """Describe Tesseract's state for a log line; None when everything asked for is installed.

    Returns:
        A message saying what is missing and the command that installs it, or None.
    """
    if not tesseract_available():
        return (
            "Tesseract OCR is not installed: images and scanned PDF pages will fail with "
            f"OCR_UNAVAILABLE (text layers, text files and mails still work). Install it with: "
            f"{INSTALL_COMMAND}"
        )
    missing = [code for code in parse_languages(languages) if code not in installed_languages()]
    if missing:
        packages = " ".join(f"tesseract-ocr-{code.replace('_', '-').lower()}" for code in missing)
        return (
            f"Tesseract has no data for {'+'.join(missing)}; install it with: apt-get install -y {packages}"
        )
    return None


@hookimpl
def pgtasks_register_tasks(app: TaskRegistry) -> None:
    """Register ``pgtasks.ocr``: 3 retries with backoff for OCR crashes and I/O errors,
    and the time limit `OCR_TIME_LIMIT` (`pgtasks_ocr.configure` changes it)."""
    app.register_task(
        ocr_task,
        name=OCR_TASK,
        queue=OCR_QUEUE,
        bind=True,
        max_retries=3,
        retry_backoff=True,
        autoretry_for=(OcrFailed, OSError),
        time_limit=OCR_TIME_LIMIT,
        soft_time_limit=OCR_SOFT_TIME_LIMIT,
        redact=("password",),  # a built-in sensitive name too; said here for readers
    )


@hookimpl
def pgtasks_worker_started(worker_id: str, queues: list[str], concurrency: int) -> None:
    """Check for Tesseract on workers that serve the ``ocr`` queue; log the install command if missing."""
    if OCR_QUEUE not in queues:
        return
    problem = check_tesseract()
    if problem is None:
        log.info(
            "pgtasks_ocr: Tesseract %s with languages %s",
            tesseract_version(),
            "+".join(sorted(installed_languages())),
        )
    else:
        log.warning("pgtasks_ocr: %s", problem)
