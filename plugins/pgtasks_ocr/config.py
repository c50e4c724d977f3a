"""An app's OCR configuration: the roots documents are read from, the limits, the time limit.

The roots come from the app's settings (``PGTASKS_OCR_ROOTS``, `pgtasks.Settings.ocr_roots`)
unless `configure` sets them for that app. With no root at all, the ``pgtasks.ocr``
task refuses every path (``PATH_NOT_ALLOWED``): a worker serving many tenants reads only
what its operator named, never "whatever the worker can read".
"""

from __future__ import annotations

import dataclasses
import enum
import os
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pgtasks.errors import ConfigurationError
from pgtasks.plugin_api import Engine

from .limits import DEFAULT_LIMITS, OcrLimits

__all__ = [
    "OCR_QUEUE",
    "OCR_SOFT_TIME_LIMIT",
    "OCR_TASK",
    "OCR_TIME_LIMIT",
    "OcrConfig",
    "configure",
    "ocr_config",
]

#: Name applications enqueue by.
OCR_TASK: Final = "pgtasks.ocr"
#: Default queue of the OCR task (CPU-heavy: give it its own workers if needed).
OCR_QUEUE: Final = "ocr"
#: Default hard time limit of one OCR job (seconds): a job still running then fails with
#: ``TIME_LIMIT`` (the ``processes`` pool kills it; the ``threads`` pool raises in it
#: at its next Python instruction, and Tesseract is stopped with it). 30 minutes is
#: about 1,000 scanned pages; each page has its own 120 s Tesseract timeout.
OCR_TIME_LIMIT: Final = 1800.0
#: Default soft time limit (seconds): none; the hard limit alone ends a job.
OCR_SOFT_TIME_LIMIT: Final[float | None] = None


class _Keep(enum.Enum):
    KEEP = enum.auto()


_KEEP: Final = _Keep.KEEP


@dataclass(frozen=True, slots=True)
class OcrConfig:
    """What the OCR task of one app reads, and how much.

    Attributes:
        roots: resolved-at-use directories documents must lie in; empty refuses all.
        limits: the `OcrLimits` of every job.
    """

    roots: tuple[Path, ...]
    limits: OcrLimits


@dataclass(frozen=True, slots=True)
class _Override:
    roots: tuple[Path, ...] | None = None
    limits: OcrLimits | None = None


_OVERRIDES: weakref.WeakKeyDictionary[object, _Override] = weakref.WeakKeyDictionary()
_LOCK: Final = threading.Lock()


def ocr_config(app: Engine) -> OcrConfig:
    """The OCR configuration of ``app``: `configure`'s, else its settings' roots and the
    default limits."""
    override = _OVERRIDES.get(app) or _Override()
    roots = override.roots if override.roots is not None else app.settings.ocr_roots
    return OcrConfig(roots=roots, limits=override.limits or DEFAULT_LIMITS)


def configure(
    app: Engine,
    *,
    roots: Iterable[str | os.PathLike[str]] | None = None,
    limits: OcrLimits | None = None,
    time_limit: float | _Keep | None = _KEEP,
    soft_time_limit: float | _Keep | None = _KEEP,
) -> OcrConfig:
    """Set what the ``pgtasks.ocr`` task of ``app`` may read, and its time limits.

    Arguments left out keep their value. Call it where the app is built (the module
    ``-A`` names), so that every worker process of the app, and the children of the
    ``processes`` pool, configure it the same way.

    Args:
        app: the application (its ``pgtasks.ocr`` task must be registered for the
            time limits).
        roots: absolute directories documents must lie in, replacing the settings'
            ``ocr_roots`` for this app; an empty list refuses every path.
        limits: `OcrLimits` for every job of this app.
        time_limit: hard time limit of one job in seconds, or None for none (default
            `OCR_TIME_LIMIT`).
        soft_time_limit: soft time limit in seconds, or None (default none).

    Returns:
        The app's configuration now.

    Raises:
        ConfigurationError: a root that is not an absolute path, ``limits`` that is not
            an `OcrLimits`, a time limit that is not a positive number of seconds, or
            time limits for an app without the ``pgtasks.ocr`` task; nothing is changed.
    """
    with _LOCK:
        current = _OVERRIDES.get(app) or _Override()
        new_roots = current.roots if roots is None else _check_roots(roots)
        if limits is not None and not isinstance(limits, OcrLimits):
            raise ConfigurationError(f"limits must be a pgtasks_ocr.OcrLimits, got {type(limits).__name__}")
        if time_limit is not _KEEP or soft_time_limit is not _KEEP:
            task = app.tasks.get(OCR_TASK)
            if task is None:
                raise ConfigurationError(f"the app has no {OCR_TASK!r} task to set time limits on")
            options = task.options
            if not isinstance(time_limit, _Keep):
                options = dataclasses.replace(options, time_limit=time_limit)  # validates
            if not isinstance(soft_time_limit, _Keep):
                options = dataclasses.replace(options, soft_time_limit=soft_time_limit)
            task.options = options
        _OVERRIDES[app] = _Override(roots=new_roots, limits=limits or current.limits)
    return ocr_config(app)


def _check_roots(roots: Iterable[str | os.PathLike[str]]) -> tuple[Path, ...]:
    if isinstance(roots, str | bytes | os.PathLike):
        raise ConfigurationError(f"roots must be a list of directories, not one path: {roots!r}")
    checked: list[Path] = []
    for root in roots:
        if not isinstance(root, str | os.PathLike) or not os.fspath(root) or "\x00" in os.fspath(root):
            raise ConfigurationError(f"roots must hold non-empty paths without NUL, got {root!r}")
        path = Path(root)
        if not path.is_absolute():
            raise ConfigurationError(f"roots must hold absolute directories, got {str(path)!r}")
        checked.append(path)
    return tuple(checked)
