"""Plain-text files: decode the bytes into text.

The order follows the WHATWG Encoding Standard's "decode" algorithm: a byte order mark
wins (UTF-8, UTF-16LE, UTF-16BE; UTF-32 is checked first because its LE mark starts with
UTF-16LE's); otherwise UTF-8 if the bytes are valid UTF-8; otherwise windows-1252, the
standard's fallback for legacy Western text, and Latin-1 for the five bytes windows-1252
leaves undefined (0x81, 0x8D, 0x8F, 0x90, 0x9D), which then decode to C1 controls as the
WHATWG mapping does.
"""

from __future__ import annotations

import codecs
from typing import Final

__all__ = ["decode_text"]

_BOMS: Final[tuple[tuple[bytes, str], ...]] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def decode_text(data: bytes) -> str:
    """Decode the bytes of a text file; never fails.

    Args:
        data: the whole file.

    Returns:
        The text without its byte order mark. Bytes invalid in the encoding a BOM names
        become U+FFFD.
    """
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return data[len(bom) :].decode(encoding, errors="replace")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    try:
        return data.decode("cp1252")
    except UnicodeDecodeError:
        return data.decode("latin-1")
