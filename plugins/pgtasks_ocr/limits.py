"""What one OCR job may read and decode: the limits that bound its memory.

A worker runs documents it did not choose, for many tenants at once, so every input
is bounded before the expensive step starts: the file's size before it is read, an
image's dimensions from its header before its pixels are decoded, a PDF's page count
before any page is rendered, a mail's size before it is parsed and its nesting while
it is parsed. Exceeding a limit is a permanent failure (`pgtasks.errors.Reject`) whose
message names the limit and its value.

Memory one job holds at most, with these limits (docs/plugins.md, "Limits: what one
job may cost"; the growth of a worker's peak RSS measured on CPython 3.11, Pillow 11,
pypdfium2 4):

- the file's bytes: ``max_file_bytes`` (100 MiB);
- an image: one decoded frame and its gray copy for Tesseract, frames one at a time:
  11 bytes per pixel for an RGBA frame (its alpha flattened onto white), 5 for RGB, 2
  for gray or black-and-white, so at most 440 MB at the default ``max_image_pixels``
  of 40 million (a 40-million-pixel RGBA PNG: 420 MB);
- a PDF page rendered for OCR: 2 bytes per pixel (PDFium's gray bitmap and its copy;
  80 MB at ``max_render_pixels`` = 40 million), plus the PNG sent to Tesseract;
- a mail: about 8 times its bytes (Python's parser keeps lines, parts and decoded
  payloads; a 25 MiB mail: 190 MB); a text file: about 6 times (140 MB at 25 MiB).

Tesseract runs in its own process, one page at a time; its memory grows with the page
too and is not counted here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Final

from pgtasks.errors import ConfigurationError, Reject

__all__ = ["DEFAULT_LIMITS", "FILE_TOO_LARGE", "MALFORMED_MAIL", "OcrLimits", "limit_exceeded"]

#: Error code of a file past a size limit (bytes, pixels, frames, pages, parts).
FILE_TOO_LARGE: Final = "FILE_TOO_LARGE"
#: Error code of a mail that cannot be read as one (no header at all, nested too deep).
MALFORMED_MAIL: Final = "MALFORMED_MAIL"

_MIB: Final = 1024 * 1024
#: Largest value a limit may be set to: past it a limit limits nothing.
_MAX_LIMIT: Final = 2**53


@dataclass(frozen=True, slots=True)
class OcrLimits:
    """Limits on one OCR job's input; each is a positive integer.

    Attributes:
        max_file_bytes: bytes read from one file (any type); checked on the opened
            file before reading, and while reading (a file that grows).
        max_image_pixels: pixels (width x height) of one image frame, from the image's
            header, before it is decoded. 40 million holds an A4 page scanned at 600 dpi
            (35 million) or A3 at 400 dpi.
        max_frames: frames of one image file (multi-page TIFF, animated GIF, WebP or
            PNG), each one OCR'd as a page.
        max_pdf_pages: pages of one PDF.
        max_render_pixels: pixels of one PDF page rendered for OCR. A page larger than
            this at 300 dpi is rendered at a lower resolution; one that would need
            less than 72 dpi to fit fails.
        max_text_bytes: bytes of a plain-text file (decoded in Python).
        max_mail_bytes: bytes of a mail (parsed in Python).
        max_mail_parts: MIME parts of a mail, attachments and embedded messages
            included.
        max_mail_depth: nesting of a mail: multiparts and embedded messages
            (``message/rfc822``) inside each other, and comments ``( ... )`` inside
            each other in one header field. Deeper mail fails with ``MALFORMED_MAIL``.

    Raises:
        ConfigurationError: a limit that is not an integer between 1 and 2**53.
    """

    max_file_bytes: int = 100 * _MIB
    max_image_pixels: int = 40_000_000
    max_frames: int = 200
    max_pdf_pages: int = 1000
    max_render_pixels: int = 40_000_000
    max_text_bytes: int = 25 * _MIB
    max_mail_bytes: int = 25 * _MIB
    max_mail_parts: int = 1000
    max_mail_depth: int = 32

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_LIMIT:
                raise ConfigurationError(
                    f"OcrLimits.{field.name} must be an integer from 1 to 2**53, got {value!r}"
                )


#: The limits used unless an app configures its own (`pgtasks_ocr.configure`).
DEFAULT_LIMITS: Final = OcrLimits()


def limit_exceeded(name: str, what: str, limit: str, value: int, *, code: str = FILE_TOO_LARGE) -> Reject:
    """The permanent failure for an input past a limit, naming the limit and its value.

    Args:
        name: the file, as shown to an operator (`pgtasks_ocr.files.shown`).
        what: what was too large, e.g. ``"an image of 10000x10000 = 100,000,000 pixels"``.
        limit: the `OcrLimits` field, e.g. ``"max_image_pixels"``.
        value: its value.
        code: the error code (``FILE_TOO_LARGE``; ``MALFORMED_MAIL`` for nesting).
    """
    return Reject(f"{name}: {what}; the limit {limit} is {value:,}", code=code)
