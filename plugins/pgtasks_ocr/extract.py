"""One entry point for every supported file: sniff its type, then hand it to its extractor."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pgtasks.errors import Reject

from . import sniff
from .files import read_document, shown
from .limits import DEFAULT_LIMITS, OcrLimits, limit_exceeded
from .mail import extract_mail
from .result import ExtractedText, normalise_text
from .tesseract import DEFAULT_LANGUAGES, OcrUnavailable, parse_languages
from .text import decode_text

__all__ = ["IMAGE_MIMES", "extract_text"]


#: Types handed to the image extractor (Pillow + Tesseract).
IMAGE_MIMES = frozenset({sniff.MIME_PNG, sniff.MIME_JPEG, sniff.MIME_TIFF, sniff.MIME_GIF, sniff.MIME_WEBP})


def extract_text(
    path: str | os.PathLike[str],
    *,
    password: str | None = None,
    languages: str = DEFAULT_LANGUAGES,
    roots: Sequence[str | os.PathLike[str]] | None = None,
    limits: OcrLimits = DEFAULT_LIMITS,
) -> ExtractedText:
    """Extract the text of a PDF, image, plain-text or mail file.

    The file is read once, by `pgtasks_ocr.files.read_document` (regular files only,
    inside ``roots``, at most ``limits.max_file_bytes``); the extractors work on the
    bytes read. The type comes from the file's first bytes (`pgtasks_ocr.sniff`). The
    name is used only to treat ``.eml`` files as mail, and to call a file corrupt rather
    than unsupported when its name promises a type its content lacks.

    Args:
        path: the file.
        password: password of an encrypted PDF; ignored for other types.
        languages: Tesseract languages joined by ``+`` for images and scanned PDF pages.
        roots: directories the file must lie in (after resolving symbolic links);
            empty refuses every path; None (the default, for library use) does not
            check. The ``pgtasks.ocr`` task always passes its app's roots.
        limits: the `OcrLimits` that bound the job's memory.

    Returns:
        `ExtractedText`. Method ``plain`` for text (one page); ``mail`` for a mail (one
        page, `MailMessage.to_text`); ``ocr`` for images (a page per frame); and
        ``text-layer``, ``ocr`` or ``mixed`` for PDFs (a page per PDF page). An empty
        file is an empty text unless its name claims a binary type.

    Raises:
        ValueError: ``languages`` is malformed.
        FileNotFoundError, PermissionError: the file cannot be read. Not a `Reject`,
            because storage that is briefly unavailable can come back.
        Reject: permanent failures, by ``code``:

            - ``PATH_NOT_ALLOWED``: outside ``roots``, or no root configured.
            - ``NOT_REGULAR_FILE``: a directory, FIFO, socket or device.
            - ``ENCRYPTED_PDF``: the password is missing or wrong.
            - ``CORRUPT_FILE``: the content is damaged, or does not match the type its
              name promises.
            - ``UNSUPPORTED_TYPE``: binary content of a type not handled here.
            - ``MALFORMED_MAIL``: a ``.eml`` file, or mail-like content, with no header
              fields, or nested deeper than ``limits.max_mail_depth``.
            - ``FILE_TOO_LARGE``: past one of ``limits`` (bytes, pixels, frames, pages,
              render size, mail parts); the message names it.
            - ``OCR_UNAVAILABLE``: `OcrUnavailable`, Tesseract or the languages are missing.
        OcrFailed: Tesseract crashed or timed out (may pass on a retry).
    """
    parse_languages(languages)
    document = read_document(path, roots=roots, limits=limits)
    data, name = document.data, shown(document.name)
    head = data[: sniff.HEAD_BYTES]
    mime = sniff.sniff_mime(head)
    claimed = sniff.SUFFIX_MIME.get(Path(document.name).suffix.lower())
    if claimed == sniff.MIME_MAIL and mime == sniff.MIME_TEXT:
        mime = sniff.MIME_MAIL  # a header-less .eml: let the mail parser judge it
    promised_binary = claimed not in (None, sniff.MIME_TEXT, sniff.MIME_MAIL)
    if promised_binary and mime in (sniff.MIME_TEXT, sniff.MIME_BINARY):
        if not head:
            raise Reject(f"{name}: the file is empty", code="CORRUPT_FILE")
        raise Reject(
            f"{name}: the name says {claimed} but the content has no {claimed} signature",
            code="CORRUPT_FILE",
        )

    # The PDF and image extractors import pypdfium2 and Pillow (the ``ocr`` extra): only
    # a job that needs them loads them, so a worker that never sees one does not carry
    # them (6 MiB of resident memory per process on CPython 3.11).
    if mime == sniff.MIME_PDF:
        with _ocr_extra(name, "pypdfium2 and Pillow"):
            from .pdf import extract_pdf
        return extract_pdf(data, name=name, password=password, languages=languages, mime=mime, limits=limits)
    if mime in IMAGE_MIMES:
        with _ocr_extra(name, "Pillow"):
            from .images import extract_image
        return extract_image(data, name=name, mime=mime, languages=languages, limits=limits)
    if mime == sniff.MIME_MAIL:
        text = normalise_text(extract_mail(data, limits=limits, name=name).to_text())
        return ExtractedText.from_pages((text,), method="mail", mime=mime)
    if mime == sniff.MIME_TEXT:
        if len(data) > limits.max_text_bytes:
            raise limit_exceeded(
                name, f"a text of {len(data):,} bytes", "max_text_bytes", limits.max_text_bytes
            )
        text = normalise_text(decode_text(data))
        return ExtractedText.from_pages((text,), method="plain", mime=mime)
    raise Reject(
        f"{name}: unsupported file type (not PDF, PNG, JPEG, TIFF, GIF, WebP, mail or text)",
        code="UNSUPPORTED_TYPE",
    )


@contextmanager
def _ocr_extra(name: str, libraries: str) -> Iterator[None]:
    """Import an extractor that needs ``libraries`` (the ``ocr`` extra) in the block.

    Raises:
        OcrUnavailable: they are not installed: the message says what to install
            (``OCR_UNAVAILABLE``, permanent).
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        raise OcrUnavailable(
            f"{name}: reading this file needs {libraries}, which are not installed "
            f"(no module named {exc.name!r}): pip install 'pgtasks[ocr]'"
        ) from None
