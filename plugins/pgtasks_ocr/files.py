"""Reading a document: only regular files, only inside the configured roots, never too much.

`read_document` is the one place the plugin opens a file named by a job:

1. **Roots.** With ``roots`` given, the path (relative paths from the worker's working
   directory) is resolved, symbolic links and ``..`` included (`os.path.realpath`), and
   must lie in one of the roots, themselves resolved. Otherwise the job fails with
   ``PATH_NOT_ALLOWED``, whether the file exists or not. An empty ``roots`` refuses
   every path (deny by default). ``roots=None`` (library use, the caller vouches for the
   path) skips the check.
2. **No race with the check.** The file is then opened from the root's directory down,
   one component at a time (``openat`` with ``O_NOFOLLOW``): a directory swapped for a
   symbolic link after the check is refused (``PATH_NOT_ALLOWED``), not followed.
3. **Regular files only.** The last component is checked with ``lstat`` before it is
   opened (a device or FIFO is not even opened), opened with ``O_NONBLOCK`` (a FIFO
   swapped in meanwhile cannot block the worker) and ``O_NOCTTY``, and checked again
   with ``fstat`` on the open descriptor, which is what is read. Anything but a
   regular file fails with ``NOT_REGULAR_FILE``.
4. **Bounded read.** The size from ``fstat`` must be within ``max_file_bytes``, and
   reading stops there if the file grows (``FILE_TOO_LARGE``).

The extractors then work on the bytes read, never on the path again.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pgtasks.errors import Reject

from .limits import DEFAULT_LIMITS, OcrLimits, limit_exceeded

__all__ = ["NOT_REGULAR_FILE", "PATH_NOT_ALLOWED", "Document", "read_document", "shown"]

#: Error code of a path outside the roots (or no root configured, or an unusable path).
PATH_NOT_ALLOWED: Final = "PATH_NOT_ALLOWED"
#: Error code of a path that names a directory, FIFO, socket or device.
NOT_REGULAR_FILE: Final = "NOT_REGULAR_FILE"

_O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_O_FILE: Final = (
    os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
)
_O_DIR: Final = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_WALK: Final = os.open in os.supports_dir_fd and os.stat in os.supports_dir_fd and bool(_O_NOFOLLOW)
_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


@dataclass(frozen=True, slots=True)
class Document:
    """A file read by `read_document`.

    Attributes:
        name: the last component of the path as given (used for its suffix and in
            messages).
        data: the file's bytes (at most ``max_file_bytes``).
    """

    name: str
    data: bytes


#: Most characters of a name or path repeated in an error message.
_SHOWN_CHARS: Final = 300


def shown(text: str) -> str:
    """``text`` as it may appear in an error message: as is if printable, else its repr
    (control characters escaped); cut to 300 characters either way."""
    text = text if text.isprintable() else repr(text)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def read_document(
    path: str | os.PathLike[str],
    *,
    roots: Sequence[str | os.PathLike[str]] | None = None,
    limits: OcrLimits = DEFAULT_LIMITS,
) -> Document:
    """Read the regular file at ``path``, inside ``roots``, within ``limits.max_file_bytes``.

    Args:
        path: the file; a relative path is taken from the working directory.
        roots: directories the file must lie in after resolving symbolic links and
            ``..``; empty refuses everything; None does not check (library use).
        limits: ``max_file_bytes`` applies.

    Raises:
        Reject: ``PATH_NOT_ALLOWED`` (outside the roots, no root configured, a path
            that is not a non-empty string without NUL, or a symbolic link swapped in
            while opening), ``NOT_REGULAR_FILE`` (directory, FIFO, socket, device),
            ``FILE_TOO_LARGE`` (more than ``max_file_bytes``).
        FileNotFoundError, PermissionError, OSError: the file cannot be read now (not a
            `Reject`: storage that is briefly unavailable can come back).
    """
    text = os.fspath(path) if isinstance(path, str | os.PathLike) else None
    if not isinstance(text, str) or not text or "\x00" in text:
        got = shown(repr(path))
        raise Reject(f"the path must be a non-empty string without NUL, got {got}", code=PATH_NOT_ALLOWED)
    name = shown(Path(text).name or text)
    fd = _open_plain(text, name) if roots is None else _open_beneath(text, name, roots)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(name, info.st_mode)
        if info.st_size > limits.max_file_bytes:
            raise limit_exceeded(
                name, f"a file of {info.st_size:,} bytes", "max_file_bytes", limits.max_file_bytes
            )
        return Document(
            name=Path(text).name, data=_read_bounded(fd, info.st_size, limits.max_file_bytes, name)
        )
    finally:
        os.close(fd)


def _open_plain(text: str, name: str) -> int:
    try:
        return os.open(text, _O_FILE)
    except IsADirectoryError:
        raise Reject(f"{name}: is a directory, not a regular file", code=NOT_REGULAR_FILE) from None


def _open_beneath(text: str, name: str, roots: Sequence[str | os.PathLike[str]]) -> int:
    if not roots:
        raise Reject(
            f"{name}: no OCR root is configured, so no file may be read "
            "(set PGTASKS_OCR_ROOTS, or call pgtasks_ocr.configure(app, roots=[...]))",
            code=PATH_NOT_ALLOWED,
        )
    real = os.path.realpath(text)
    for root in roots:
        base = os.path.realpath(root)
        if _inside(real, base):
            break
    else:
        raise Reject(
            f"{shown(text)}: outside the OCR roots once symbolic links and '..' are resolved",
            code=PATH_NOT_ALLOWED,
        )
    if real == base:
        raise Reject(f"{name}: is a directory, not a regular file", code=NOT_REGULAR_FILE)
    if not _WALK:  # no openat/O_NOFOLLOW on this platform: open the resolved path itself
        return _open_plain(real, name)
    *folders, last = os.path.relpath(real, base).split(os.sep)
    directory = os.open(base, _O_DIR)
    try:
        for folder in folders:
            inner = _open_folder(folder, directory, name)
            os.close(directory)
            directory = inner
        mode = os.stat(last, dir_fd=directory, follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            raise _raced(name)
        if not stat.S_ISREG(mode):  # refused before opening: opening a device can act on it
            raise _not_regular(name, mode)
        return os.open(last, _O_FILE | _O_NOFOLLOW, dir_fd=directory)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW met a link (EMLINK on BSD)
            raise _raced(name) from None
        raise
    finally:
        os.close(directory)


def _inside(real: str, base: str) -> bool:
    try:
        return os.path.commonpath([base, real]) == base
    except ValueError:  # different drives (Windows)
        return False


def _open_folder(folder: str, directory: int, name: str) -> int:
    try:
        return os.open(folder, _O_DIR | _O_NOFOLLOW, dir_fd=directory)
    except NotADirectoryError:  # Linux answers ENOTDIR for a link with O_DIRECTORY | O_NOFOLLOW
        if stat.S_ISLNK(os.stat(folder, dir_fd=directory, follow_symlinks=False).st_mode):
            raise _raced(name) from None
        raise


def _raced(name: str) -> Reject:
    """A component became a symbolic link between the root check and the open."""
    return Reject(
        f"{name}: a folder or the file was replaced by a symbolic link while it was opened",
        code=PATH_NOT_ALLOWED,
    )


def _not_regular(name: str, mode: int) -> Reject:
    kind = next((label for test, label in _KINDS if test(mode)), "not a regular file")
    return Reject(f"{name}: is {kind}, not a regular file", code=NOT_REGULAR_FILE)


def _read_bounded(fd: int, size: int, limit: int, name: str) -> bytes:
    with open(fd, "rb", buffering=0, closefd=False) as handle:
        data = handle.read(size) or b""
        extra = handle.read(1)
        if not extra:
            return data
        # The file grew after fstat: read on, in steps, up to one byte past the limit.
        parts = [data, extra]
        total = len(data) + 1
        while total <= limit:
            chunk = handle.read(min(1 << 20, limit + 1 - total))
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
            total += len(chunk)
    raise limit_exceeded(name, "a file growing past that while read", "max_file_bytes", limit)
