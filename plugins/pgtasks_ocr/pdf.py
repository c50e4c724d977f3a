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
characters. Such a page is rendered at `RENDER_DPI`, at a lower resolution when that
would exceed ``max_render_pixels`` (`OcrLimits`), but never below `MIN_RENDER_DPI`: a page
that large fails with ``FILE_TOO_LARGE``. It is left as it is if the rendering is blank,
and OCR'd otherwise. The OCR text replaces the
text layer only when it has more non-blank characters, so a digital page that just says
"Thank you" keeps its exact text.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Final, cast

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PIL import Image

from pgtasks.errors import Reject

from .limits import DEFAULT_LIMITS, OcrLimits, limit_exceeded
from .result import ExtractedText, Method, normalise_text
from .tesseract import OcrUnavailable, ocr_image, usable_languages

__all__ = [
    "BLANK_CONTRAST",
    "MAX_RENDER_PIXELS",
    "MIN_RENDER_DPI",
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
#: Largest rendering by default (pixels; `OcrLimits.max_render_pixels`); bigger pages are
#: rendered at a lower resolution. An A4 page at 300 dpi is 8.7 million pixels; this
#: allows A2 at 300 dpi.
MAX_RENDER_PIXELS: Final = DEFAULT_LIMITS.max_render_pixels
#: Lowest resolution a page is rendered at to fit ``max_render_pixels`` (dots per inch);
#: text rendered coarser than this cannot be read, so a larger page fails instead.
MIN_RENDER_DPI: Final = 72
#: A rendering whose darkest and lightest gray values differ by less than this (0..255)
#: is blank and not OCR'd.
BLANK_CONTRAST: Final = 16
_POINTS_PER_INCH: Final = 72


def extract_pdf(
    data: bytes,
    *,
    name: str,
    password: str | None,
    languages: str,
    mime: str,
    limits: OcrLimits = DEFAULT_LIMITS,
) -> ExtractedText:
    """Extract the text of every page of a PDF, in page order.

    Args:
        data: the PDF file's bytes.
        name: the file's name, for messages.
        password: user or owner password for an encrypted file; ignored otherwise.
        languages: Tesseract languages for pages without a text layer.
        mime: the sniffed type, stored in the result.
        limits: ``max_pdf_pages`` and ``max_render_pixels`` apply.

    Returns:
        `ExtractedText` whose method is ``text-layer`` (no page OCR'd, also for an empty
        document), ``ocr`` (every page OCR'd) or ``mixed``.

    Raises:
        Reject: ``ENCRYPTED_PDF`` when the file is encrypted and the password is missing
            or wrong, or its security handler is unsupported; ``CORRUPT_FILE`` when
            PDFium cannot load the file or one of its pages (PDFium bounds the nesting
            of objects and refuses cyclic page trees itself); ``FILE_TOO_LARGE`` when
            it has more than ``max_pdf_pages`` pages, or a page needing OCR would not
            fit ``max_render_pixels`` even at `MIN_RENDER_DPI`.
        OcrUnavailable: a page needs OCR and Tesseract is missing.
        OcrFailed: Tesseract failed on a page.
    """
    with PDFIUM_LOCK:
        document = _open(data, name, password)
    try:
        with PDFIUM_LOCK:
            count = len(document)
        if count > limits.max_pdf_pages:
            raise limit_exceeded(name, f"a PDF of {count:,} pages", "max_pdf_pages", limits.max_pdf_pages)
        pages: list[str] = []
        ocr_count = 0
        for index in range(count):
            text, used_ocr = _page_text(document, index, name=name, languages=languages, limits=limits)
            pages.append(text)
            ocr_count += used_ocr
    finally:
        with PDFIUM_LOCK:
            document.close()
    method: Method = "text-layer" if ocr_count == 0 else "ocr" if ocr_count == count else "mixed"
    return ExtractedText.from_pages(tuple(pages), method=method, mime=mime)


def _open(data: bytes, name: str, password: str | None) -> Any:
    try:
        return pdfium.PdfDocument(data, password=password)
    except pdfium.PdfiumError as exc:
        code = exc.err_code
        if code == pdfium_c.FPDF_ERR_PASSWORD:
            reason = (
                f"{name}: the PDF is encrypted and needs a password; none was given"
                if password is None
                else f"{name}: the PDF is encrypted and the password given is wrong"
            )
            raise Reject(reason, code="ENCRYPTED_PDF") from exc
        if code == pdfium_c.FPDF_ERR_SECURITY:
            raise Reject(
                f"{name}: the PDF uses an encryption scheme PDFium does not support",
                code="ENCRYPTED_PDF",
            ) from exc
        raise Reject(f"{name}: not a readable PDF ({exc})", code="CORRUPT_FILE") from exc


def _page_text(
    document: Any, index: int, *, name: str, languages: str, limits: OcrLimits
) -> tuple[str, bool]:
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
                rendering = (
                    None
                    if _visible_chars(layer) >= MIN_TEXT_CHARS
                    else _render(page, index=index, name=name, limits=limits)
                )
            finally:
                page.close()
        except pdfium.PdfiumError as exc:
            raise Reject(f"{name}: page {index + 1} cannot be read ({exc})", code="CORRUPT_FILE") from exc
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


def _render(page: Any, *, index: int, name: str, limits: OcrLimits) -> tuple[Image.Image, int] | None:
    """Render ``page`` in grayscale; return a copy owned by Python and its dpi, or None for
    a page without area. Needs the lock.

    Raises:
        Reject: ``FILE_TOO_LARGE``: the page does not fit ``max_render_pixels`` at
            `MIN_RENDER_DPI`.
    """
    width_pt, height_pt = (float(side) for side in page.get_size())
    if not (math.isfinite(width_pt) and math.isfinite(height_pt)) or width_pt < 1 or height_pt < 1:
        return None
    area_pt = width_pt * height_pt
    scale = min(RENDER_DPI / _POINTS_PER_INCH, math.sqrt(limits.max_render_pixels / area_pt))
    if scale * _POINTS_PER_INCH < MIN_RENDER_DPI:
        pixels = math.ceil(area_pt * (MIN_RENDER_DPI / _POINTS_PER_INCH) ** 2)
        raise limit_exceeded(
            name,
            f"page {index + 1} ({width_pt:.0f}x{height_pt:.0f} points) needs {pixels:,} pixels "
            f"at {MIN_RENDER_DPI} dpi",
            "max_render_pixels",
            limits.max_render_pixels,
        )
    bitmap = page.render(scale=scale, grayscale=True)
    try:
        image: Image.Image = bitmap.to_pil().copy()  # to_pil() shares PDFium's buffer
    finally:
        bitmap.close()
    return image, max(1, round(scale * _POINTS_PER_INCH))


def _visible_chars(text: str) -> int:
    return sum(1 for char in text if not char.isspace())
