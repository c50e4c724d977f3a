"""Built-in OCR plugin: text out of PDFs, scans, plain-text files and mails.

This package is the extraction layer, free of any database or task machinery:

- `extract_text` turns a file into `ExtractedText` (page texts in order, the method
  used, the MIME type sniffed from the content);
- `extract_mail` turns a mail into `MailMessage` (id, subject, addresses, date, body,
  attachment names);
- `tesseract_available` / `tesseract_version` report the OCR engine;
- failures a retry cannot fix are `pgtasks.errors.Reject` with a ``code``:
  ``ENCRYPTED_PDF``, ``CORRUPT_FILE``, ``UNSUPPORTED_TYPE``, ``MALFORMED_MAIL``,
  ``FILE_TOO_LARGE`` and ``OCR_UNAVAILABLE`` (`OcrUnavailable`). `OcrFailed` (crash or
  timeout of Tesseract) is left to the task's retry policy.

Modules: ``sniff`` (type detection), ``text`` (decoding), ``pdf`` (pypdfium2),
``images`` (Pillow), ``tesseract`` (the OCR subprocess), ``mail`` and ``html_text``
(stdlib email), ``result`` (the shared value type), ``extract`` (dispatch).

Needs the ``ocr`` extra (pypdfium2, Pillow) and, for scans, the ``tesseract`` program.
"""

from __future__ import annotations

from .extract import extract_text
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
    "ExtractedText",
    "MailMessage",
    "OcrFailed",
    "OcrUnavailable",
    "extract_mail",
    "extract_text",
    "installed_languages",
    "normalise_message_id",
    "sniff_mime",
    "tesseract_available",
    "tesseract_version",
]
