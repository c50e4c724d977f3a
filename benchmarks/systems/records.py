"""The benchmark job, and how its completions are counted.

Every job carries its kind and its enqueue time in its arguments (`job_args`).
Tasks report to the benchmark through files, never through the system under test: the
benchmark task of every system calls :func:`run_task`, which appends one byte per job
to ``progress-<pid>`` and, for latency and fairness jobs, one line to
``records-<pid>`` in the directory named by ``BENCH_RECORD_DIR``. Counting completions
therefore costs the system nothing and is the same for all systems. The driver reads
those files back with `progress_count` and `read_records`.

Workers of every system import this module, so it imports nothing but the standard
library.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Job kinds, carried in every job's arguments as ``k``.
NOOP = "n"  # a no-op job of a throughput, fairness or deep-queue backlog
WARMUP = "w"  # a job that proves the workers are up before a latency run
LATENCY = "l"  # a latency probe: the task records when it started
TENANT_B = "b"  # one of tenant B's jobs in the fairness figure: the task records its end
FAIL_ONCE = "f"  # a job of the mixed-work figure whose first attempt fails (then retried)

TENANT_A = "a"
TENANT_B_NAME = "b"

RECORD_DIR_ENV = "BENCH_RECORD_DIR"

Job = tuple[str, float]  # (kind, enqueued_at as time.time() seconds)


def job_args(kind: str, enqueued_at: float) -> dict[str, Any]:
    """The JSON arguments of a benchmark job: ``{"k": kind, "t": enqueued_at}``."""
    return {"k": kind, "t": enqueued_at}


# --------------------------------------------------------------------------- task side


class _Recorder:
    """Per-process, lazily opened record files (re-opened after a fork)."""

    def __init__(self) -> None:
        self.pid = -1
        self.progress_fd = -1
        self.records_fd = -1
        self.committed_fd = -1
        self.retried_fd = -1

    def _open(self) -> bool:
        directory = os.environ.get(RECORD_DIR_ENV)
        if not directory:
            return False
        pid = os.getpid()
        if pid != self.pid:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
            self.progress_fd = os.open(os.path.join(directory, f"progress-{pid}"), flags, 0o644)
            self.records_fd = os.open(os.path.join(directory, f"records-{pid}"), flags, 0o644)
            self.committed_fd = os.open(os.path.join(directory, f"committed-{pid}"), flags, 0o644)
            self.retried_fd = os.open(os.path.join(directory, f"retried-{pid}"), flags, 0o644)
            self.pid = pid
        return True

    def finish(self, kind: str, enqueued_at: float, started_at: float, ended_at: float) -> None:
        if not self._open():
            return
        if kind in (LATENCY, TENANT_B):
            line = f"{kind} {enqueued_at!r} {started_at!r} {ended_at!r}\n"
            os.write(self.records_fd, line.encode())
        os.write(self.progress_fd, b".")

    def committed(self, jobs: int) -> None:
        if jobs > 0 and self._open():
            os.write(self.committed_fd, b"." * jobs)

    def failed_attempt(self) -> None:
        if self._open():
            os.write(self.retried_fd, b".")


_RECORDER = _Recorder()


def run_task(kind: str, enqueued_at: float) -> None:
    """Body of every system's benchmark task: do nothing, then record the job.

    ``kind`` is one of the job kinds above; ``enqueued_at`` is the producer's
    ``time.time()`` (seconds) when it called the enqueue API. Writes nothing when
    ``BENCH_RECORD_DIR`` is unset.
    """
    started = time.time()
    _RECORDER.finish(kind, enqueued_at, started, time.time())


def record_failed_attempt() -> None:
    """Tally one attempt that fails on purpose (a `FAIL_ONCE` job's first), before it raises.

    The mixed-work figure compares this tally with the retries the system recorded.
    Writes nothing when ``BENCH_RECORD_DIR`` is unset.
    """
    _RECORDER.failed_attempt()


def record_committed(jobs: int) -> None:
    """Tally ``jobs`` finished jobs whose completion the calling worker has committed.

    For a system whose worker code is the driver's own (the raw reference): its
    ``Driver.finished`` reads the tally with :func:`committed_count` instead of
    counting rows. Writes nothing when ``BENCH_RECORD_DIR`` is unset.
    """
    _RECORDER.committed(jobs)


# --------------------------------------------------------------------------- driver side


@dataclass(frozen=True, slots=True)
class Record:
    """One line of a records file; times are ``time.time()`` seconds."""

    kind: str
    enqueued_at: float
    started_at: float
    ended_at: float


def progress_count(directory: Path, prefix: str = "progress-") -> int:
    """Number of jobs whose task finished, summed over all worker processes."""
    total = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith(prefix):
                total += entry.stat().st_size
    return total


def committed_count(directory: Path) -> int:
    """Jobs tallied by :func:`record_committed`, summed over all worker processes."""
    return progress_count(directory, "committed-")


def failed_attempt_count(directory: Path) -> int:
    """Attempts tallied by :func:`record_failed_attempt`, summed over all worker processes."""
    return progress_count(directory, "retried-")


def read_records(directory: Path) -> list[Record]:
    """All complete record lines written so far by the tasks."""
    out: list[Record] = []
    for path in sorted(directory.glob("records-*")):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:
                out.append(Record(parts[0], float(parts[1]), float(parts[2]), float(parts[3])))
    return out
