"""Image files (PNG, JPEG, TIFF, GIF, WebP): decode with Pillow, OCR every frame."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from PIL import Image, ImageOps, UnidentifiedImageError

from pgtasks.errors import Reject

from .result import ExtractedText, normalise_text
from .tesseract import ocr_image, usable_languages

__all__ = ["MAX_IMAGE_PIXELS", "extract_image", "prepare_for_ocr"]

#: Largest frame decoded (pixels): an A3 page scanned at 600 dpi is about 70 million.
#: Pillow's own guard (``Image.MAX_IMAGE_PIXELS``) is 89 million.
MAX_IMAGE_PIXELS: Final = 100_000_000
_MIN_TRUSTED_DPI: Final = 70


def extract_image(path: Path, *, mime: str, languages: str) -> ExtractedText:
    """OCR an image file; a multi-frame TIFF (or GIF) gives one page per frame, in order.

    Args:
        path: the image file.
        mime: its sniffed type, stored in the result.
        languages: Tesseract languages, e.g. ``"eng+deu"``.

    Raises:
        ValueError: ``languages`` is malformed.
        OcrUnavailable: Tesseract or the languages are missing (checked before decoding).
        Reject: ``CORRUPT_FILE`` when Pillow cannot decode the file;
            ``FILE_TOO_LARGE`` when a frame exceeds `MAX_IMAGE_PIXELS`.
        OcrFailed: Tesseract failed on a frame.
    """
    usable = usable_languages(languages)
    pages = [
        normalise_text(ocr_image(frame, languages=usable, dpi=dpi))
        for frame, dpi in _decoded_frames(path, mime)
    ]
    return ExtractedText.from_pages(tuple(pages), method="ocr", mime=mime)


def _decoded_frames(path: Path, mime: str) -> Iterator[tuple[Image.Image, int | None]]:
    """Yield each frame ready for OCR and its resolution (dpi), decoding one at a time."""
    try:
        with warnings.catch_warnings():
            # Our own size limit below replaces Pillow's DecompressionBombWarning.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                for index in range(getattr(image, "n_frames", 1)):
                    image.seek(index)
                    width, height = image.size
                    if width * height > MAX_IMAGE_PIXELS:
                        raise Reject(
                            f"{path.name}: image of {width}x{height} pixels is larger than "
                            f"{MAX_IMAGE_PIXELS} pixels",
                            code="FILE_TOO_LARGE",
                        )
                    prepared = prepare_for_ocr(image)
                    yield prepared, _dpi_of(image)
    except Image.DecompressionBombError as exc:
        raise Reject(f"{path.name}: {exc}", code="FILE_TOO_LARGE") from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as exc:
        # Pillow reports truncated or malformed data as OSError ("image file is
        # truncated"), SyntaxError (bad header) or ValueError/EOFError from decoders.
        # Only decoding runs inside this block: OCR happens in the caller.
        raise Reject(f"{path.name}: cannot decode the {mime} image: {exc}", code="CORRUPT_FILE") from exc


def prepare_for_ocr(frame: Image.Image) -> Image.Image:
    """Return ``frame`` upright (EXIF orientation), flattened onto white, in grayscale ``"L"``.

    Transparent pixels would otherwise turn black when the alpha channel is dropped, and
    text drawn on a transparent background would vanish.
    """
    image = ImageOps.exif_transpose(frame)
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, rgba)
    return image.convert("L")


def _dpi_of(frame: Image.Image) -> int | None:
    dpi = frame.info.get("dpi")
    if not isinstance(dpi, tuple) or not dpi:
        return None
    try:
        value = round(float(dpi[0]))
    except (TypeError, ValueError):
        return None
    # Many files carry a meaningless 72 or 1 dpi; Tesseract guesses better from the text.
    return value if value >= _MIN_TRUSTED_DPI and value != 72 else None
