"""Archiving a directory into a ``.tar.gz`` with real byte and file counts (no pgtasks here).

The archive is written to a temporary name beside its final one and renamed when
complete, so a crashed backup never leaves a half archive under the final name.
Symbolic links are followed (the backup stores what they point to); a file that
cannot be opened or read (no permission, a link whose target is gone) is skipped and
reported, and the backup goes on with the others.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ArchiveReport", "Progress", "archive_directory", "list_archive"]

#: Called with (bytes_processed, files_processed, files_failed) as the work goes on.
Progress = Callable[[int, int, int], None]

_CHUNK = 1 << 20
_REPORT_EVERY = 0.2  # seconds between progress reports


@dataclass(frozen=True, slots=True)
class ArchiveReport:
    """What one archive holds.

    Attributes:
        archive: path of the ``.tar.gz``.
        files: files stored.
        bytes: bytes of file content stored (before compression).
        archive_bytes: size of the archive on disk.
        sha256: hex digest of the archive file.
        failed: ``(relative path, reason)`` of files that could not be read.
    """

    archive: Path
    files: int
    bytes: int
    archive_bytes: int
    sha256: str
    failed: tuple[tuple[str, str], ...] = field(default=())


def _walk(source: Path) -> list[Path]:
    """Every non-directory entry under ``source``, sorted (links are not followed into dirs)."""
    out: list[Path] = []
    for root, dirs, files in os.walk(source):
        dirs.sort()
        out.extend(Path(root) / name for name in sorted(files))
    return out


def archive_directory(source: Path, archive: Path, progress: Progress | None = None) -> ArchiveReport:
    """Write every readable file under ``source`` into the gzip tarball ``archive``.

    Args:
        source: the directory to back up.
        archive: the final path of the ``.tar.gz`` (its directory is created).
        progress: called every 0.2 s and at the end with running counts.

    Returns:
        The `ArchiveReport`.

    Raises:
        FileNotFoundError: ``source`` is not a directory.
        OSError: the archive cannot be written (disk full, no permission ...).
    """
    if not source.is_dir():
        raise FileNotFoundError(f"backup source {source} is not a directory")
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    files = done_bytes = 0
    failed: list[tuple[str, str]] = []
    last_report = 0.0
    with tarfile.open(partial, "w:gz") as tar:
        for path in _walk(source):
            relative = path.relative_to(source).as_posix()
            try:
                with path.open("rb") as fh:  # follows symbolic links
                    info = tar.gettarinfo(arcname=relative, fileobj=fh)
                    tar.addfile(info, fh)
                    size = info.size
            except OSError as exc:
                failed.append((relative, exc.strerror or type(exc).__name__))
            else:
                files += 1
                done_bytes += size
            now = time.monotonic()
            if progress is not None and now - last_report >= _REPORT_EVERY:
                progress(done_bytes, files, len(failed))
                last_report = now
    os.replace(partial, archive)
    if progress is not None:
        progress(done_bytes, files, len(failed))
    digest = hashlib.sha256()
    with archive.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return ArchiveReport(
        archive, files, done_bytes, archive.stat().st_size, digest.hexdigest(), tuple(failed)
    )


def list_archive(archive: Path) -> tuple[int, int]:
    """Read an archive back to its end: (files, bytes of content).

    Raises:
        tarfile.TarError, OSError: the archive is damaged or missing.
    """
    files = size = 0
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            if not member.isfile():
                continue
            extracted = tar.extractfile(member)
            assert extracted is not None
            while chunk := extracted.read(_CHUNK):
                size += len(chunk)
            files += 1
    return files, size
