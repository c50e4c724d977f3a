"""Decide a file's type from its first bytes, not from its name.

Signatures used (each from the format's own specification):

- PDF: ``%PDF-`` anywhere in the first 1024 bytes. ISO 32000-1 (7.5.2) puts the header
  on the first line, but Adobe's implementation notes to that section say readers accept
  it anywhere in the first 1024 bytes, and real files (``invalid_pdf.pdf`` of the corpus)
  carry junk before it.
- PNG: the 8-byte signature of PNG (Third Edition) section 5.2.
- JPEG: SOI marker ``FF D8`` followed by another marker (ITU-T T.81, B.1.1.3).
- TIFF: ``II*\\0`` or ``MM\\0*`` (TIFF 6.0, section 2, "Image File Header").
- GIF: ``GIF87a`` / ``GIF89a``; WebP: ``RIFF....WEBP`` (RFC 9649, section 2.5).
- Mail: RFC 5322 header fields at the very start, at least two of them ones a mail
  carries (``From``, ``Date``, ``Received``, ...), or an mbox ``From `` line.
- Text: no NUL byte and few other control bytes in the sampled head (the same idea as
  file(1)'s text test); its encoding is decided later by `pgtasks_ocr.text`.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "HEAD_BYTES",
    "MIME_BINARY",
    "MIME_GIF",
    "MIME_JPEG",
    "MIME_MAIL",
    "MIME_PDF",
    "MIME_PNG",
    "MIME_TEXT",
    "MIME_TIFF",
    "MIME_WEBP",
    "SUFFIX_MIME",
    "sniff_mime",
]

#: How many bytes of the file's start `sniff_mime` needs (bytes).
HEAD_BYTES: Final = 8192

MIME_PDF: Final = "application/pdf"
MIME_PNG: Final = "image/png"
MIME_JPEG: Final = "image/jpeg"
MIME_TIFF: Final = "image/tiff"
MIME_GIF: Final = "image/gif"
MIME_WEBP: Final = "image/webp"
MIME_MAIL: Final = "message/rfc822"
MIME_TEXT: Final = "text/plain"
MIME_BINARY: Final = "application/octet-stream"

#: The type a file name claims, used only to tell "corrupt" from "unsupported" and to
#: route ``.eml`` files whose content has no headers to the mail parser.
SUFFIX_MIME: Final[dict[str, str]] = {
    ".pdf": MIME_PDF,
    ".png": MIME_PNG,
    ".jpg": MIME_JPEG,
    ".jpeg": MIME_JPEG,
    ".tif": MIME_TIFF,
    ".tiff": MIME_TIFF,
    ".gif": MIME_GIF,
    ".webp": MIME_WEBP,
    ".eml": MIME_MAIL,
    ".txt": MIME_TEXT,
}

_PDF_WINDOW: Final = 1024
_MAGIC: Final[tuple[tuple[bytes, str], ...]] = (
    (b"\x89PNG\r\n\x1a\n", MIME_PNG),
    (b"II*\x00", MIME_TIFF),
    (b"MM\x00*", MIME_TIFF),
    (b"GIF87a", MIME_GIF),
    (b"GIF89a", MIME_GIF),
)

# RFC 5322 3.6.8: field-name is printable US-ASCII except colon.
_HEADER_LINE_RE: Final = re.compile(rb"^([\x21-\x39\x3b-\x7e]+)[ \t]*:")
_MAIL_HEADERS: Final = frozenset(
    b"""from to cc subject date message-id received return-path delivered-to mime-version
    content-type reply-to sender in-reply-to references x-mailer user-agent""".split()
)
_MAIL_SCAN_LINES: Final = 40
# Bytes that make a head "binary" if they are more than 1 % of it: C0 controls other than
# tab, newline, vertical tab, form feed, carriage return and escape.
_BINARY_BYTES: Final = frozenset(range(0x20)) - {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1B}
_UTF16_BOMS: Final = (b"\xff\xfe", b"\xfe\xff")


def sniff_mime(head: bytes) -> str:
    """Return the MIME type of a file whose first bytes are ``head``.

    Args:
        head: the file's first bytes; `HEAD_BYTES` of them give the full answer (fewer
            work for short files).

    Returns:
        One of the ``MIME_*`` constants; `MIME_BINARY` when no signature matches and the
        bytes do not look like text.
    """
    for magic, mime in _MAGIC:
        if head.startswith(magic):
            return mime
    if head[:2] == b"\xff\xd8" and head[2:3] == b"\xff":
        return MIME_JPEG
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return MIME_WEBP
    if b"%PDF-" in head[:_PDF_WINDOW]:
        return MIME_PDF
    if head.startswith(_UTF16_BOMS):
        return MIME_TEXT
    if _looks_binary(head):
        return MIME_BINARY
    if looks_like_mail(head):
        return MIME_MAIL
    return MIME_TEXT


def looks_like_mail(head: bytes) -> bool:
    """True when ``head`` starts with an RFC 5322 header block that a mail would carry.

    Every line up to the first blank line (or the first line that is neither a header
    field nor a folded continuation, or `_MAIL_SCAN_LINES` lines) is read; the head is a
    mail when it starts with an mbox ``From `` line, or when at least two distinct names
    from ``_MAIL_HEADERS`` appear. A text file that merely starts with "Note: ..." is not
    a mail.
    """
    lines = head.lstrip(b"\r\n").splitlines()
    if not lines:
        return False
    if lines[0].startswith(b"From "):
        return True
    seen: set[bytes] = set()
    for index, line in enumerate(lines[:_MAIL_SCAN_LINES]):
        if not line.strip():
            break
        if line[:1] in (b" ", b"\t") and index > 0:
            continue
        match = _HEADER_LINE_RE.match(line)
        if match is None:
            break
        name = match.group(1).lower()
        if name in _MAIL_HEADERS:
            seen.add(name)
    return len(seen) >= 2


def _looks_binary(head: bytes) -> bool:
    if b"\x00" in head:
        return True
    if not head:
        return False
    controls = sum(1 for byte in head if byte in _BINARY_BYTES)
    return controls * 100 > len(head)
