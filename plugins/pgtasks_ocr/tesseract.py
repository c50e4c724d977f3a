"""Run the Tesseract OCR engine on one image.

Tesseract is called as a subprocess (``tesseract stdin stdout -l LANGS``) rather than
through pytesseract. The wrapper would add nothing we need and would take two things
away. First, the child's environment: we set ``OMP_THREAD_LIMIT=1`` (unless the operator
set it), as Tesseract's documentation advises when several instances run in parallel,
which worker threads do. On the 2-core test machine that was also faster for a single
page: 0.9 s instead of 1.4 s for the 3 pages of ``multi-page-images.pdf``. Second,
feeding the PNG through stdin, where pytesseract writes a temporary file. The timeout
kills the child.

The binary is looked up on ``PATH`` at every call (cheap), so installing Tesseract while
a worker runs takes effect without a restart; its version and language list are cached
per binary path.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import re
import shutil
import subprocess
from typing import TYPE_CHECKING, Final

from pgtasks.errors import PgtasksError, Reject

if TYPE_CHECKING:
    from PIL import Image

__all__ = [
    "DEFAULT_LANGUAGES",
    "OCR_PAGE_TIMEOUT",
    "TESSERACT_CMD",
    "OcrFailed",
    "OcrUnavailable",
    "installed_languages",
    "ocr_image",
    "parse_languages",
    "require_tesseract",
    "tesseract_available",
    "tesseract_version",
    "usable_languages",
]

log = logging.getLogger(__name__)

#: Name of the Tesseract executable looked up on ``PATH``.
TESSERACT_CMD: Final = "tesseract"
#: Languages OCR uses unless told otherwise (Tesseract ``-l`` syntax).
DEFAULT_LANGUAGES: Final = "eng+deu"
#: Longest one page may take in Tesseract before it is killed (seconds).
OCR_PAGE_TIMEOUT: Final = 120.0

_INSTALL_HINT: Final = (
    "install it with `apt-get install tesseract-ocr tesseract-ocr-eng` (Debian/Ubuntu; "
    "add tesseract-ocr-deu etc. for more languages) or your platform's tesseract package"
)
_LANGUAGE_RE: Final = re.compile(r"^[A-Za-z0-9_]+(?:/[A-Za-z0-9_]+)?$")
_VERSION_RE: Final = re.compile(r"tesseract\s+v?(\d+(?:\.\d+)*\S*)", re.IGNORECASE)


class OcrUnavailable(Reject):
    """Tesseract, or every language asked for, is not installed on this host.

    A `pgtasks.errors.Reject` with code ``"OCR_UNAVAILABLE"``: retrying on the same host
    cannot help; the message says what to install.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason, code="OCR_UNAVAILABLE")


class OcrFailed(PgtasksError):
    """Tesseract ran but failed on a page: non-zero exit, or killed at the timeout.

    Not a `Reject`: a crash or timeout on a loaded host may pass on a later attempt, so
    the task's retry policy decides.
    """


def tesseract_available() -> bool:
    """True when a ``tesseract`` executable is on ``PATH``."""
    return shutil.which(TESSERACT_CMD) is not None


def tesseract_version() -> str | None:
    """Version of the Tesseract on ``PATH`` (e.g. ``"5.3.0"``), or None if it is missing."""
    binary = shutil.which(TESSERACT_CMD)
    return None if binary is None else _version_of(binary)


def installed_languages() -> frozenset[str]:
    """Language codes Tesseract has data for (e.g. ``{"eng", "deu", "osd"}``).

    Raises:
        OcrUnavailable: Tesseract is not installed.
    """
    return _languages_of(require_tesseract())


def require_tesseract() -> str:
    """Return the path of the ``tesseract`` executable.

    Raises:
        OcrUnavailable: it is not on ``PATH``; the message says how to install it.
    """
    binary = shutil.which(TESSERACT_CMD)
    if binary is None:
        raise OcrUnavailable(
            f"Tesseract OCR is not installed (no {TESSERACT_CMD!r} on PATH); {_INSTALL_HINT}"
        )
    return binary


def ocr_image(
    image: Image.Image,
    *,
    languages: str = DEFAULT_LANGUAGES,
    dpi: int | None = None,
    timeout: float = OCR_PAGE_TIMEOUT,
) -> str:
    """OCR one page image and return its text exactly as Tesseract printed it.

    Args:
        image: any Pillow image; it is sent to Tesseract as PNG (convert to ``"L"``
            first for speed).
        languages: Tesseract language codes joined by ``+``, e.g. ``"eng+deu"``.
            Codes without installed data are dropped with a warning; if none is left,
            `OcrUnavailable` is raised.
        dpi: the image's resolution (dots per inch) if known; passed as ``--dpi`` so
            Tesseract does not guess it.
        timeout: seconds before Tesseract is killed.

    Raises:
        ValueError: ``languages`` is not ``code(+code)*``.
        OcrUnavailable: Tesseract or all the asked languages are missing.
        OcrFailed: Tesseract exited non-zero or ran past ``timeout``.
    """
    binary = require_tesseract()
    usable = _usable_languages(binary, languages)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    argv = [binary, "stdin", "stdout", "-l", usable]
    if dpi is not None and dpi > 0:
        argv += ["--dpi", str(dpi)]
    env = dict(os.environ)
    env.setdefault("OMP_THREAD_LIMIT", "1")
    try:
        done = subprocess.run(
            argv, input=buffer.getvalue(), capture_output=True, timeout=timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise OcrFailed(f"Tesseract took longer than {timeout:g} s on one page and was stopped") from exc
    if done.returncode != 0:
        stderr = done.stderr.decode("utf-8", errors="replace").strip()
        raise OcrFailed(f"Tesseract exited with status {done.returncode}: {stderr[-500:]}")
    return done.stdout.decode("utf-8", errors="replace")


def usable_languages(languages: str = DEFAULT_LANGUAGES) -> str:
    """Check that OCR can run with ``languages``; return the part of it that is installed.

    Args:
        languages: Tesseract language codes joined by ``+``, e.g. ``"eng+deu"``.

    Returns:
        The installed codes, in the order asked, joined by ``+``. Missing ones are
        dropped with a warning (logged once per set).

    Raises:
        ValueError: ``languages`` is not ``code(+code)*``.
        OcrUnavailable: Tesseract is missing, or none of the languages is installed.
    """
    return _usable_languages(require_tesseract(), languages)


def parse_languages(languages: str) -> tuple[str, ...]:
    """Split a Tesseract ``-l`` value (``"eng+deu"``) into codes.

    Raises:
        ValueError: a code is empty or holds characters other than letters, digits,
            ``_`` and one ``/`` (as in ``script/Latin``).
    """
    codes = tuple(languages.split("+"))
    if not all(_LANGUAGE_RE.match(code) for code in codes):
        raise ValueError(f"languages must look like 'eng' or 'eng+deu', not {languages!r}")
    return codes


def _usable_languages(binary: str, languages: str) -> str:
    wanted = parse_languages(languages)
    installed = _languages_of(binary)
    usable = [code for code in wanted if code in installed]
    missing = [code for code in wanted if code not in installed]
    packages = " ".join(f"tesseract-ocr-{code.replace('_', '-').lower()}" for code in missing)
    if not usable:
        raise OcrUnavailable(
            f"Tesseract has no data for {languages!r} (installed: {', '.join(sorted(installed)) or 'none'}); "
            f"install it with `apt-get install {packages}`"
        )
    if missing:
        _warn_missing_once(tuple(missing), packages)
    return "+".join(usable)


@functools.cache
def _warn_missing_once(missing: tuple[str, ...], packages: str) -> None:
    log.warning("Tesseract has no data for %s; OCR runs without it (apt-get install %s)", missing, packages)


@functools.cache
def _version_of(binary: str) -> str | None:
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    # Tesseract 3 printed its version on stderr, later ones on stdout.
    output = (done.stdout + done.stderr).decode("utf-8", errors="replace")
    match = _VERSION_RE.search(output)
    return match.group(1) if match else None


@functools.cache
def _languages_of(binary: str) -> frozenset[str]:
    try:
        done = subprocess.run([binary, "--list-langs"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OcrUnavailable(f"cannot run {binary!r} --list-langs: {exc}; {_INSTALL_HINT}") from exc
    output = (done.stdout + done.stderr).decode("utf-8", errors="replace")
    # First line: 'List of available languages in "/usr/share/tesseract-ocr/5/tessdata/" (3):'
    return frozenset(
        line.strip()
        for line in output.splitlines()
        if line.strip() and not line.startswith("List of available languages") and " " not in line.strip()
    )
