"""Built-in OCR plugin: text out of PDFs, scans, plain-text files and mails.

This package is the extraction layer, free of any database or task machinery:

- `extract_text` turns a file into `ExtractedText` (page texts in order, the method
  used, the MIME type sniffed from the content);
- `extract_mail` turns a mail into `MailMessage` (id, subject, addresses, date, body,
  attachment names);
- `tesseract_available` / `tesseract_version` report the OCR engine;
- `read_document` opens a file the safe way (regular files only, inside roots, within
  ``max_file_bytes``); `OcrLimits` bounds what one job reads and decodes;
  `configure` / `ocr_config` hold an app's roots, limits and time limit;
- failures a retry cannot fix are `pgtasks.errors.Reject` with a ``code``:
  ``PATH_NOT_ALLOWED``, ``NOT_REGULAR_FILE``, ``ENCRYPTED_PDF``, ``CORRUPT_FILE``,
  ``UNSUPPORTED_TYPE``, ``MALFORMED_MAIL``, ``FILE_TOO_LARGE`` and ``OCR_UNAVAILABLE``
  (`OcrUnavailable`). `OcrFailed` (crash or timeout of Tesseract) is left to the
  task's retry policy.

Modules: ``files`` (opening), ``limits`` and ``config`` (what a job may read),
``sniff`` (type detection), ``text`` (decoding), ``pdf`` (pypdfium2), ``images``
(Pillow), ``tesseract`` (the OCR subprocess), ``mail`` and ``html_text`` (stdlib
email), ``result`` (the shared value type), ``extract`` (dispatch).

Needs the ``ocr`` extra (pypdfium2, Pillow) and, for scans, the ``tesseract`` program.
"""

from __future__ import annotations

from .config import OCR_TIME_LIMIT, OcrConfig, configure, ocr_config
from .extract import extract_text
from .files import NOT_REGULAR_FILE, PATH_NOT_ALLOWED, Document, read_document
from .limits import DEFAULT_LIMITS, FILE_TOO_LARGE, MALFORMED_MAIL, OcrLimits
from .mail import MailMessage, extract_mail, normalise_message_id
from .result import ExtractedText
from .sniff import sniff_mime
from .tesseract import (
    DEFAULT_LANGUAGES,
    OcrFailed,
    OcrUnavailable,
    installed_languages,
    tesseract_available,
    tesseract_version,
)

__all__ = [
    "DEFAULT_LANGUAGES",
    "DEFAULT_LIMITS",
    "FILE_TOO_LARGE",
    "MALFORMED_MAIL",
    "NOT_REGULAR_FILE",
    "OCR_TIME_LIMIT",
    "PATH_NOT_ALLOWED",
    "Document",
    "ExtractedText",
    "MailMessage",
    "OcrConfig",
    "OcrFailed",
    "OcrLimits",
    "OcrUnavailable",
    "configure",
    "extract_mail",
    "extract_text",
    "installed_languages",
    "normalise_message_id",
    "ocr_config",
    "read_document",
    "sniff_mime",
    "tesseract_available",
    "tesseract_version",
]
