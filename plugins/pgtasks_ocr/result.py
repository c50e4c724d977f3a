"""The value every extractor returns, and the text clean-up they all share."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["METHODS", "ExtractedText", "Method", "normalise_text"]

Method = Literal["text-layer", "ocr", "mixed", "plain", "mail"]

#: How the text was obtained:
#: ``text-layer`` every PDF page from its embedded text; ``ocr`` every page (or the image)
#: through Tesseract; ``mixed`` a PDF with both kinds of pages; ``plain`` a text file;
#: ``mail`` an RFC 5322 message.
METHODS: Final[frozenset[str]] = frozenset({"text-layer", "ocr", "mixed", "plain", "mail"})

# C0 controls except tab and newline, plus DEL. NUL in particular: PostgreSQL text and
# jsonb refuse U+0000. PDFium marks a line-end hyphen it removed with U+0002, so dropping
# it rejoins the word ("manip\x02ulation" -> "manipulation"); Tesseract ends pages with a
# form feed.
_CONTROL_RE: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class ExtractedText:
    """Text taken out of one file.

    Attributes:
        text: all page texts joined with a blank line, normalised by `normalise_text`.
        pages: the page texts in document order (one entry for an image, a text file or
            a mail; one per frame of a multi-page TIFF; one per PDF page).
        method: one of `METHODS`.
        mime: the type detected from the file's content, e.g. ``"application/pdf"``.
    """

    text: str
    pages: tuple[str, ...]
    method: Method
    mime: str

    @classmethod
    def from_pages(cls, pages: tuple[str, ...], *, method: Method, mime: str) -> ExtractedText:
        """Build the result from already normalised page texts (``text`` is derived)."""
        return cls(text="\n\n".join(p for p in pages if p), pages=pages, method=method, mime=mime)


def normalise_text(text: str) -> str:
    """Return ``text`` with ``\\n`` line ends, no control characters and no trailing blanks.

    Line ends ``\\r\\n`` and ``\\r`` become ``\\n``; C0 control characters other than
    tab and newline are removed (see ``_CONTROL_RE``); trailing whitespace is cut from
    every line and leading/trailing blank lines from the whole. Non-ASCII text is kept
    as it is.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL_RE.sub("", text)
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")
