"""Image files (PNG, JPEG, TIFF, GIF, WebP): decode with Pillow, OCR every frame."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Final

from PIL import Image, UnidentifiedImageError

from pgtasks.errors import Reject

from . import sniff
from .limits import DEFAULT_LIMITS, OcrLimits, limit_exceeded
from .result import ExtractedText, normalise_text
from .tesseract import ocr_image, usable_languages

__all__ = ["MAX_IMAGE_PIXELS", "extract_image", "prepare_for_ocr"]

#: Largest frame decoded by default (pixels); see `OcrLimits.max_image_pixels`.
MAX_IMAGE_PIXELS: Final = DEFAULT_LIMITS.max_image_pixels
_MIN_TRUSTED_DPI: Final = 70
# The Pillow format of each sniffed type: only that decoder may read the bytes.
_FORMATS: Final = {
    sniff.MIME_PNG: "PNG",
    sniff.MIME_JPEG: "JPEG",
    sniff.MIME_TIFF: "TIFF",
    sniff.MIME_GIF: "GIF",
    sniff.MIME_WEBP: "WEBP",
}
# EXIF orientation -> the transpose that makes the image upright (as ImageOps.exif_transpose).
_ORIENTATION: Final = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_EXIF_ORIENTATION: Final = 0x0112


def extract_image(
    data: bytes, *, name: str, mime: str, languages: str, limits: OcrLimits = DEFAULT_LIMITS
) -> ExtractedText:
    """OCR an image file; a multi-frame TIFF (or GIF) gives one page per frame, in order.

    Nothing is decoded before the headers say the image fits ``limits``: the number of
    frames (``max_frames``) and each frame's width x height (``max_image_pixels``) are
    read from the headers Pillow parses lazily, all of them before Tesseract is looked
    for, so an image past a limit is refused as such whether or not OCR is installed.
    Frames are then decoded one at a time.

    Args:
        data: the file's bytes.
        name: the file's name, for messages.
        mime: its sniffed type (one of the image ``MIME_*`` of `pgtasks_ocr.sniff`),
            stored in the result; only Pillow's decoder for it reads ``data``.
        languages: Tesseract languages, e.g. ``"eng+deu"``.
        limits: ``max_frames`` and ``max_image_pixels`` apply.

    Raises:
        ValueError: ``languages`` is malformed.
        Reject: ``CORRUPT_FILE`` when Pillow cannot read the headers or decode the file;
            ``FILE_TOO_LARGE`` when it has more frames than ``max_frames`` or a frame
            has more pixels than ``max_image_pixels``.
        OcrUnavailable: Tesseract or the languages are missing (checked after the
            headers, before decoding).
        OcrFailed: Tesseract failed on a frame.
    """
    with _opened(data, name, mime, limits) as image:
        for index in range(_frame_count(image, name, limits)):
            image.seek(index)
            _check_size(image, name, limits)
    usable = usable_languages(languages)
    pages = [
        normalise_text(ocr_image(frame, languages=usable, dpi=dpi))
        for frame, dpi in _decoded_frames(data, name, mime, limits)
    ]
    return ExtractedText.from_pages(tuple(pages), method="ocr", mime=mime)


@contextlib.contextmanager
def _opened(data: bytes, name: str, mime: str, limits: OcrLimits) -> Iterator[Image.Image]:
    """The image, opened by the decoder of its sniffed type alone; Pillow's errors
    inside the block become `Reject` (``FILE_TOO_LARGE`` or ``CORRUPT_FILE``). Only
    header reading and decoding may run inside it: OCR happens outside."""
    formats = [_FORMATS[mime]] if mime in _FORMATS else None
    try:
        with Image.open(io.BytesIO(data), formats=formats) as image:
            yield image
    except Image.DecompressionBombError as exc:
        # Pillow's own guard (twice Image.MAX_IMAGE_PIXELS) met a limit set above it.
        raise Reject(
            f"{name}: {exc} (max_image_pixels = {limits.max_image_pixels:,})", code="FILE_TOO_LARGE"
        ) from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as exc:
        # Pillow reports truncated or malformed data as OSError ("image file is
        # truncated"), SyntaxError (bad header) or ValueError/EOFError from decoders.
        raise Reject(f"{name}: cannot decode the {mime} image: {exc}", code="CORRUPT_FILE") from exc


def _frame_count(image: Image.Image, name: str, limits: OcrLimits) -> int:
    """The image's frames, at most ``limits.max_frames`` (else `Reject` ``FILE_TOO_LARGE``)."""
    count = int(getattr(image, "n_frames", 1))
    if count > limits.max_frames:
        raise limit_exceeded(name, f"an image of {count:,} frames", "max_frames", limits.max_frames)
    return count


def _check_size(image: Image.Image, name: str, limits: OcrLimits) -> None:
    """Refuse the current frame past ``limits.max_image_pixels``, from its header alone."""
    width, height = image.size  # from the frame's header: nothing decoded yet
    if width * height > limits.max_image_pixels:
        raise limit_exceeded(
            name,
            f"an image of {width}x{height} = {width * height:,} pixels",
            "max_image_pixels",
            limits.max_image_pixels,
        )


def _decoded_frames(
    data: bytes, name: str, mime: str, limits: OcrLimits
) -> Iterator[tuple[Image.Image, int | None]]:
    """Yield each frame ready for OCR and its resolution (dpi), decoding one at a time."""
    with _opened(data, name, mime, limits) as image:
        for index in range(_frame_count(image, name, limits)):
            image.seek(index)
            _check_size(image, name, limits)
            prepared = prepare_for_ocr(image)
            yield prepared, _dpi_of(image)


def prepare_for_ocr(frame: Image.Image) -> Image.Image:
    """Return ``frame`` in grayscale ``"L"``, flattened onto white, upright (EXIF orientation).

    Transparent pixels would otherwise turn black when the alpha channel is dropped, and
    text drawn on a transparent background would vanish. The frame is made gray first,
    so flattening and turning work on 1-2 bytes per pixel, whatever the frame's mode.
    """
    if frame.mode in ("RGBA", "LA", "PA") or (frame.mode == "P" and "transparency" in frame.info):
        with_alpha = frame.convert("RGBA").convert("LA") if frame.mode in ("P", "PA") else frame.convert("LA")
        gray = Image.new("L", with_alpha.size, 255)
        gray.paste(with_alpha.getchannel("L"), mask=with_alpha.getchannel("A"))
        del with_alpha
    else:
        gray = frame.convert("L")
    method = _ORIENTATION.get(_orientation(frame))
    return gray if method is None else gray.transpose(method)


def _orientation(frame: Image.Image) -> int:
    try:
        value = frame.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # a damaged EXIF block: keep the image as it is (exif_transpose's choice too)
        return 1
    return value if isinstance(value, int) else 1


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
