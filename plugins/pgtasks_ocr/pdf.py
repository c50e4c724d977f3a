"""PDF files: the text layer of every page, and OCR for pages that have none.

Library choice: pypdfium2 alone, for both text and rendering. It binds PDFium, the PDF
engine of Chromium, and so reads what a browser reads. It recovers damaged files:
``invalid_pdf.pdf`` of the corpus has junk before its header and a broken
cross-reference table, and PDFium reads both of its pages. It opens encrypted files
given the password and says why a file failed to load (wrong password, bad format,
unsupported security handler). It renders a page to a bitmap for Tesseract without a
second library, and is quick: 36 pages of text in under 0.05 s here. pypdf would give
text, but rendering would still need PDFium or poppler, that is two PDF parsers that
could disagree about a damaged file.

PDFium is not thread-safe (pypdfium2 README, "Incompatibility with Threading"), and
workers run tasks in threads. Every PDFium call therefore runs under one process-wide
lock (`PDFIUM_LOCK`). The lock is released while Tesseract runs, so OCR of several
documents still overlaps. Rendered bitmaps are copied out of PDFium's memory before the
lock is released.

A page "has no text layer" when its text holds fewer than `MIN_TEXT_CHARS` non-blank
characters. Such a page is rendered at `RENDER_DPI`, capped at `MAX_RENDER_PIXELS`. It is
left as it is if the rendering is blank, and OCR'd otherwise. The OCR text replaces the
text layer only when it has more non-blank characters, so a digital page that just says
"Thank you" keeps its exact text.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any, Final, cast

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PIL import Image

from pgtasks.errors import Reject

from .result import ExtractedText, Method, normalise_text
from .tesseract import OcrUnavailable, ocr_image, usable_languages

__all__ = [
    "BLANK_CONTRAST",
    "MAX_RENDER_PIXELS",
    "MIN_TEXT_CHARS",
    "PDFIUM_LOCK",
    "RENDER_DPI",
    "extract_pdf",
]

#: Serialises all PDFium calls in this process (PDFium is not thread-safe).
PDFIUM_LOCK: Final = threading.Lock()
#: Pages with fewer non-blank characters in their text layer are rendered and OCR'd.
MIN_TEXT_CHARS: Final = 16
#: Resolution pages are rendered at for OCR (dots per inch). 300 dpi is Tesseract's
#: documented sweet spot ("Improving the quality of the output": at least 300 dpi).
RENDER_DPI: Final = 300
#: Largest rendering (pixels); bigger pages are rendered at a lower resolution. An A4
#: page at 300 dpi is 8.7 million pixels; this allows A2 at 300 dpi.
MAX_RENDER_PIXELS: Final = 40_000_000
#: A rendering whose darkest and lightest gray values differ by less than this (0..255)
#: is blank and not OCR'd.
BLANK_CONTRAST: Final = 16
_POINTS_PER_INCH: Final = 72


def extract_pdf(path: Path, *, password: str | None, languages: str, mime: str) -> ExtractedText:
    """Extract the text of every page of a PDF, in page order.

    Args:
        path: the PDF file.
        password: user or owner password for an encrypted file; ignored otherwise.
        languages: Tesseract languages for pages without a text layer.
        mime: the sniffed type, stored in the result.

    Returns:
        `ExtractedText` whose method is ``text-layer`` (no page OCR'd, also for an empty
        document), ``ocr`` (every page OCR'd) or ``mixed``.

    Raises:
        Reject: ``ENCRYPTED_PDF`` when the file is encrypted and the password is missing
            or wrong, or its security handler is unsupported; ``CORRUPT_FILE`` when
            PDFium cannot load the file or one of its pages.
        OcrUnavailable: a page needs OCR and Tesseract is missing.
        OcrFailed: Tesseract failed on a page.
    """
    with PDFIUM_LOCK:
        document = _open(path, password)
    try:
        with PDFIUM_LOCK:
            count = len(document)
        pages: list[str] = []
        ocr_count = 0
        for index in range(count):
            text, used_ocr = _page_text(document, index, path=path, languages=languages)
            pages.append(text)
            ocr_count += used_ocr
    finally:
        with PDFIUM_LOCK:
            document.close()
    method: Method = "text-layer" if ocr_count == 0 else "ocr" if ocr_count == count else "mixed"
    return ExtractedText.from_pages(tuple(pages), method=method, mime=mime)


def _open(path: Path, password: str | None) -> Any:
    try:
        return pdfium.PdfDocument(path, password=password)
    except pdfium.PdfiumError as exc:
        code = exc.err_code
        if code == pdfium_c.FPDF_ERR_PASSWORD:
            reason = (
                f"{path.name}: the PDF is encrypted and needs a password; none was given"
                if password is None
                else f"{path.name}: the PDF is encrypted and the password given is wrong"
            )
            raise Reject(reason, code="ENCRYPTED_PDF") from exc
        if code == pdfium_c.FPDF_ERR_SECURITY:
            raise Reject(
                f"{path.name}: the PDF uses an encryption scheme PDFium does not support",
                code="ENCRYPTED_PDF",
            ) from exc
        raise Reject(f"{path.name}: not a readable PDF ({exc})", code="CORRUPT_FILE") from exc


def _page_text(document: Any, index: int, *, path: Path, languages: str) -> tuple[str, bool]:
    """Return (text, whether OCR produced it) for page ``index`` (0-based)."""
    with PDFIUM_LOCK:
        try:
            page = document[index]
            try:
                textpage = page.get_textpage()
                try:
                    layer = normalise_text(str(textpage.get_text_bounded()))
                finally:
                    textpage.close()
                rendering = None if _visible_chars(layer) >= MIN_TEXT_CHARS else _render(page)
            finally:
                page.close()
        except pdfium.PdfiumError as exc:
            raise Reject(
                f"{path.name}: page {index + 1} cannot be read ({exc})", code="CORRUPT_FILE"
            ) from exc
    if rendering is None:
        return layer, False
    image, dpi = rendering
    low, high = cast(tuple[int, int], image.getextrema())  # one band ("L"): (min, max)
    if high - low < BLANK_CONTRAST:
        return layer, False
    try:
        usable = usable_languages(languages)
    except OcrUnavailable:
        if layer:
            return layer, False  # some text is better than failing a mostly digital file
        raise
    ocr = normalise_text(ocr_image(image, languages=usable, dpi=dpi))
    if _visible_chars(ocr) > _visible_chars(layer):
        return ocr, True
    return layer, False


def _render(page: Any) -> tuple[Image.Image, int]:
    """Render ``page`` in grayscale; return a copy owned by Python and its dpi. Needs the lock."""
    width_pt, height_pt = page.get_size()
    scale = RENDER_DPI / _POINTS_PER_INCH
    area_pt = max(float(width_pt) * float(height_pt), 1.0)
    scale = min(scale, math.sqrt(MAX_RENDER_PIXELS / area_pt))
    bitmap = page.render(scale=scale, grayscale=True)
    try:
        image: Image.Image = bitmap.to_pil().copy()  # to_pil() shares PDFium's buffer
    finally:
        bitmap.close()
    return image, max(1, round(scale * _POINTS_PER_INCH))


def _visible_chars(text: str) -> int:
    return sum(1 for char in text if not char.isspace())
