"""How worker memory is measured: the same page-cache start, then peaks sampled in a thread.

`evict_shared_objects` gives every system's workers the same start, `PeakMemory`
samples the summed resident size of a fleet's process trees (`procfs.resident_bytes`)
while they run.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from benchmarks.systems.procfs import process_tree, resident_bytes


def evict_shared_objects(roots: Sequence[str | Path]) -> int:
    """Drop from the page cache every shared object (``*.so``, ``*.so.N``) under ``roots``.

    The resident size of a process counts the pages of each shared library it has
    mapped, and for the same file that number depends on the history of the file's
    pages in the page cache, not only on what the process uses: psycopg-binary's
    libcrypto, byte for byte the same in two virtual environments, measured 2.6 MiB
    resident in a worker of one and 1.7 MiB in the other, and 1.7 MiB in both after
    both were evicted. Evicting each system's libraries (and the interpreter's)
    before its workers start gives every system the same start. Pages some running
    process maps stay (``POSIX_FADV_DONTNEED``, posix_fadvise(2)). Returns the number
    of files advised.
    """
    advised = 0
    for root in dict.fromkeys(Path(r).resolve() for r in roots):
        for path in root.rglob("*.so*"):
            if not path.is_file() or not (path.name.endswith(".so") or ".so." in path.name):
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                advised += 1
            finally:
                os.close(fd)
    return advised


class PeakMemory:
    """Peaks of the summed RSS of some processes and their descendants, sampled in a thread.

    ``processes`` is read at every sample, so processes appended to it later count
    from then on; one that has exited does not count. ``peak_rss`` is the largest sum,
    over all samples (every ``interval`` seconds), of the RSS of every running process
    and its descendants; shared pages of forked children count once per process.
    ``peak_anon`` is the largest sum of their anonymous parts (`resident_bytes`).
    """

    def __init__(self, processes: Sequence[subprocess.Popen[bytes]], interval: float) -> None:
        self.processes = processes
        self.interval = interval
        self.peak_rss = 0
        self.peak_anon = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start sampling (a daemon thread)."""
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            total = anon = 0
            for process in self.processes:
                if process.poll() is None:
                    for pid in process_tree(process.pid):
                        resident, anonymous = resident_bytes(pid)
                        total += resident
                        anon += anonymous
            self.peak_rss = max(self.peak_rss, total)
            self.peak_anon = max(self.peak_anon, anon)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        """Ask the thread to stop after its current sample; `join` waits for it."""
        self._stop.set()

    def join(self) -> None:
        """Wait for the thread to end (at once if it never started)."""
        if self._thread is not None:
            self._thread.join()

    def fields(self) -> dict[str, int]:
        """The figure fields of the peaks sampled so far: ``rss_peak_bytes``, ``rss_anon_peak_bytes``."""
        return {"rss_peak_bytes": self.peak_rss, "rss_anon_peak_bytes": self.peak_anon}
