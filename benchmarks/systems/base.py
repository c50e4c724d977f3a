"""Driver side of a benchmarked system: every figure, built from a few primitives.

A *driver* is a module under ``benchmarks/systems/`` named ``<name>_system.py``. The
harness runs it as ``python -m benchmarks.systems.<name>_system OP PARAMS_JSON`` with
the interpreter of the system's own virtual environment, and reads the last line the
driver prints on stdout: one JSON object, ``{"ok": true, "result": {...}}`` or
``{"ok": false, "error": "..."}``.

This module runs inside every system's virtual environment, so it imports nothing but
the standard library. A system implements the primitives of :class:`Driver`
(``migrate``, ``enqueue_one``, ``enqueue_bulk``, ``worker_commands``, ``pending``;
optionally ``fill``, ``reset``, ``serve_worker``, ``close``) and the figures below are
measured the same way for all of them.

Tasks report to the benchmark through files, never through the system under test: the
benchmark task of every system calls :func:`run_task`, which appends one byte per job
to ``progress-<pid>`` and, for latency and fairness jobs, one line to
``records-<pid>`` in the directory named by ``BENCH_RECORD_DIR``. Counting completions
therefore costs the system nothing and is the same for all systems.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

# Job kinds, carried in every job's arguments as ``k``.
NOOP = "n"  # a no-op job of a throughput, fairness or deep-queue backlog
WARMUP = "w"  # a job that proves the workers are up before a latency run
LATENCY = "l"  # a latency probe: the task records when it started
TENANT_B = "b"  # one of tenant B's jobs in the fairness figure: the task records its end

TENANT_A = "a"
TENANT_B_NAME = "b"

RECORD_DIR_ENV = "BENCH_RECORD_DIR"
DSN_ENV = "BENCH_DSN"
REDIS_ENV = "BENCH_REDIS_URL"

Job = tuple[str, float]  # (kind, enqueued_at as time.time() seconds)


class BenchmarkError(Exception):
    """A figure could not be measured (timeout, a worker died, a bad parameter)."""


@dataclass(frozen=True, slots=True)
class SystemSpec:
    """What the harness needs to know about a system before running its driver.

    ``requirements`` are pip requirement strings installed into
    ``benchmarks/.venvs/<name>``; with none (and no ``project_dependencies``) the
    driver runs in the harness's own interpreter. ``packages`` are distribution
    names whose installed versions the report lists. ``project_dependencies`` adds the
    project's own dependencies (``pyproject.toml``) to ``requirements``: pgtasks' code
    runs from the source tree, in an environment holding what ``pip install pgtasks``
    brings. ``services`` names local services the system needs besides PostgreSQL
    (only ``"redis"`` is known). ``settings`` says, in words, the worker setting used
    for 2 cores (processes x concurrency).
    ``has_tables`` is False for a system that keeps its jobs outside PostgreSQL
    (its table sizes are then n/a, not 0).
    """

    name: str
    requirements: tuple[str, ...]
    packages: tuple[str, ...]
    settings: str
    services: tuple[str, ...] = ()
    notes: str = ""
    has_tables: bool = True
    project_dependencies: bool = False


# --------------------------------------------------------------------------- task side


class _Recorder:
    """Per-process, lazily opened record files (re-opened after a fork)."""

    def __init__(self) -> None:
        self.pid = -1
        self.progress_fd = -1
        self.records_fd = -1
        self.committed_fd = -1

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


_RECORDER = _Recorder()


def run_task(kind: str, enqueued_at: float) -> None:
    """Body of every system's benchmark task: do nothing, then record the job.

    ``kind`` is one of the job kinds above; ``enqueued_at`` is the producer's
    ``time.time()`` (seconds) when it called the enqueue API. Writes nothing when
    ``BENCH_RECORD_DIR`` is unset.
    """
    started = time.time()
    _RECORDER.finish(kind, enqueued_at, started, time.time())


def record_committed(jobs: int) -> None:
    """Tally ``jobs`` finished jobs whose completion the calling worker has committed.

    For a system whose worker code is the driver's own (the raw reference): its
    :meth:`Driver.finished` reads the tally with :func:`committed_count` instead of
    counting rows. Writes nothing when ``BENCH_RECORD_DIR`` is unset.
    """
    _RECORDER.committed(jobs)


def job_args(kind: str, enqueued_at: float) -> dict[str, Any]:
    """The JSON arguments of a benchmark job: ``{"k": kind, "t": enqueued_at}``."""
    return {"k": kind, "t": enqueued_at}


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


def read_records(directory: Path) -> list[Record]:
    """All complete record lines written so far by the tasks."""
    out: list[Record] = []
    for path in sorted(directory.glob("records-*")):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:
                out.append(Record(parts[0], float(parts[1]), float(parts[2]), float(parts[3])))
    return out


# --------------------------------------------------------------------------- workers


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # The command name may hold spaces: fields resume after its closing parenthesis.
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(name))
    return children


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants, read from ``/proc``."""
    children = _children_map()
    tree, stack = [], [root]
    while stack:
        pid = stack.pop()
        tree.append(pid)
        stack.extend(children.get(pid, []))
    return tree


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (from ``state``), or None.

    Field ``i`` here is field ``i + 3`` of proc(5): the command name, in parentheses,
    may hold spaces, so the split starts after its closing parenthesis.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (None when it is gone)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (0 when it is gone)."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else 0.0


def resident_bytes(pid: int) -> tuple[int, int]:
    """Resident set size of one process and its anonymous part, in bytes ((0, 0) when gone).

    The anonymous part is what the process allocated itself (heap, stacks): RSS less
    the resident pages mapped from files or shared memory (the ``shared`` field of
    ``/proc/PID/statm``, proc(5)). How many of a shared library's pages are resident in
    a process depends on the page cache's history (see `evict_shared_objects`); the
    anonymous part does not.
    """
    try:
        with open(f"/proc/{pid}/statm") as handle:
            fields = handle.read().split()
        page = os.sysconf("SC_PAGE_SIZE")
        return int(fields[1]) * page, (int(fields[1]) - int(fields[2])) * page
    except (OSError, IndexError, ValueError):
        return 0, 0


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


class WorkerFleet:
    """The worker processes of one figure, with a sampler of their summed RSS.

    ``commands`` is one argv per worker process. Worker output goes to
    ``<log_dir>/worker-<i>.log``. ``peak_rss`` is the largest sum, over all samples
    (every ``sample_interval`` seconds), of the RSS of every worker process and its
    descendants; shared pages of forked children count once per process.
    ``peak_anon`` is the largest sum of their anonymous parts (`resident_bytes`). `start`
    first evicts the shared objects of this interpreter's environment from the page
    cache (`evict_shared_objects`), so every system's RSS starts from the same state.
    """

    def __init__(
        self,
        commands: Sequence[Sequence[str]],
        env: dict[str, str],
        log_dir: Path,
        sample_interval: float = 0.2,
    ) -> None:
        self.commands = [list(c) for c in commands]
        self.env = env
        self.log_dir = log_dir
        self.sample_interval = sample_interval
        self.processes: list[subprocess.Popen[bytes]] = []
        self.peak_rss = 0
        self.peak_anon = 0
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def start(self) -> None:
        evict_shared_objects([sys.prefix, sys.base_prefix])
        for i, command in enumerate(self.commands):
            log = open(self.log_dir / f"worker-{i}.log", "ab")  # noqa: SIM115 - closed by the child's exit
            self.processes.append(
                subprocess.Popen(command, env=self.env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
            )
            log.close()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

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
            self._stop.wait(self.sample_interval)

    def memory(self) -> dict[str, int]:
        """The figure fields of the peaks sampled so far: ``rss_peak_bytes``, ``rss_anon_peak_bytes``."""
        return {"rss_peak_bytes": self.peak_rss, "rss_anon_peak_bytes": self.peak_anon}

    def check_alive(self) -> None:
        """Raise :class:`BenchmarkError` with the log's tail if a worker has exited."""
        for i, process in enumerate(self.processes):
            code = process.poll()
            if code is not None:
                tail = (self.log_dir / f"worker-{i}.log").read_text(errors="replace")[-600:]
                raise BenchmarkError(f"worker {i} exited with code {code}: {tail}")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every worker, then SIGKILL whatever of its tree is left after ``grace`` s."""
        self._stop.set()
        # (pid, start time) of every process in the trees, so a pid reused meanwhile is spared.
        trees = [
            (pid, start_time(pid)) for p in self.processes if p.poll() is None for pid in process_tree(p.pid)
        ]
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.0, deadline - time.monotonic()))
        for pid, started in trees:
            if started is not None and start_time(pid) == started:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for process in self.processes:
            process.wait()
        if self._sampler is not None:
            self._sampler.join()


# --------------------------------------------------------------------------- driver


@dataclass(slots=True)
class Params:
    """Parameters of one driver invocation, as sent by the harness.

    ``dsn`` names the figure's own fresh database; ``workdir`` is an empty directory
    the driver may use; ``deadline`` is the number of seconds after which the figure
    gives up; ``args`` holds the figure's own sizes.
    """

    dsn: str
    workdir: Path
    deadline: float
    redis_url: str = ""
    args: dict[str, Any] = field(default_factory=dict)


class Driver:
    """Primitives a system implements; the figures are the module-level functions.

    Subclasses set ``spec`` and implement the primitives. Each primitive documents
    what "one job" means; ``tenant`` is ``"a"`` for tenant A's backlog and ``"b"``
    for tenant B's jobs in the fairness figure, ``None`` elsewhere. Systems without a
    tenant notion ignore it and queue everything FIFO in one queue, as their users do.
    """

    spec: ClassVar[SystemSpec]

    def __init__(self, params: Params) -> None:
        self.params = params
        self.record_dir = params.workdir / "records"
        self.record_dir.mkdir(parents=True, exist_ok=True)
        os.environ[DSN_ENV] = params.dsn
        os.environ[REDIS_ENV] = params.redis_url
        os.environ[RECORD_DIR_ENV] = str(self.record_dir)

    # -- primitives -----------------------------------------------------------------

    def migrate(self) -> None:
        """Create the system's schema in the (empty) database ``params.dsn``."""
        raise NotImplementedError

    def reset(self) -> None:
        """Empty any state kept outside PostgreSQL (the database is always fresh)."""

    def enqueue_one(self, kind: str, enqueued_at: float, tenant: str | None = None) -> None:
        """Enqueue one job with the system's single-job API (one call, one commit)."""
        raise NotImplementedError

    def enqueue_bulk(self, jobs: Sequence[Job], tenant: str | None = None) -> None:
        """Enqueue all ``jobs`` with the system's best bulk API (chunking is its call)."""
        raise NotImplementedError

    def bulk_references(self, jobs: Sequence[Job]) -> dict[str, float]:
        """Further bulk-enqueue references timed on ``jobs``: {result field: jobs/s}.

        Runs before the timed bulk enqueue of the throughput figure and must leave the
        queue as it found it. Only the raw-SQL reference has any (its multi-row INSERT
        beside its COPY); systems keep the default, none.
        """
        return {}

    def fill(self, n: int, tenant: str | None = None) -> None:
        """Put ``n`` due no-op jobs in the queue by the fastest documented way."""
        self.enqueue_bulk([(NOOP, 0.0)] * n, tenant)

    def analyze(self) -> None:
        """Refresh the planner statistics of the system's tables (``ANALYZE``).

        Called after a backlog is filled and before the workers start: every figure
        runs in a fresh database whose tables were never analyzed, and a long-lived
        queue table would have statistics from autovacuum. Without them the planner
        may sort the whole queue for every claim (seen with procrastinate: 11 ms
        instead of 0.08 ms per fetch with 20,000 queued jobs, 60 instead of 900
        jobs/s). The default runs ``ANALYZE`` on ``params.dsn`` with psycopg; a
        system whose venv lacks psycopg overrides it. Raises ImportError then.
        """
        if not self.spec.has_tables:
            return
        import psycopg  # the system's venv has it unless the system overrides this method

        with psycopg.connect(self.params.dsn, autocommit=True) as conn:
            conn.execute("ANALYZE")

    def worker_commands(self) -> list[list[str]]:
        """One argv per worker process, for the 2-core setting named in ``spec.settings``."""
        raise NotImplementedError

    def pending(self) -> int | None:
        """Jobs the system itself still counts as not finished, or None if it cannot tell."""
        raise NotImplementedError

    def finished(self) -> int | None:
        """Jobs the system has recorded as finished in this figure's database, or None.

        Optional: a system whose schema counts its finished jobs cheaply (an index, a
        worker-side tally written after each commit) returns that count, and the
        harness waits on it instead of :meth:`pending`. Counting what is still
        unfinished reads the whole backlog, about 0.3 s per count with 1,000,000 jobs
        queued here, and the last such count before the system agreed lands inside the
        timed window of the deep-queue figure.
        """
        return None

    @classmethod
    def serve_worker(cls, params: Params) -> None:
        """Run a worker in this process (only for systems whose worker is the driver module)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release connections."""

    # -- helpers ----------------------------------------------------------------------

    def fleet(self, processes: int | None = None) -> WorkerFleet:
        """A not yet started fleet running :meth:`worker_commands` (the first ``processes`` of them)."""
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        return WorkerFleet(self.worker_commands()[:processes], env, self.params.workdir)


# --------------------------------------------------------------------------- figures


class Clock:
    """A figure's deadline: ``deadline`` seconds from now; `check` raises `BenchmarkError` past it."""

    def __init__(self, deadline: float) -> None:
        self.end = time.monotonic() + deadline
        self.deadline = deadline

    def check(self, what: str) -> None:
        if time.monotonic() > self.end:
            raise BenchmarkError(f"timeout after {self.deadline:.0f} s while {what}")


@dataclass(slots=True)
class Drain:
    """How a pre-filled queue was worked off: `wait_processed`'s result."""

    first_at: float  # perf_counter seconds of the first sample that saw a completion
    count_at_first: int
    last_at: float  # perf_counter seconds when the last counted job was done and confirmed
    done: int  # jobs done at last_at: the target, or fewer when the deadline cut in
    partial: bool

    def rate(self) -> float:
        """Jobs/s between the first and the last sample (NaN when nothing was timed)."""
        elapsed = self.last_at - self.first_at
        jobs = self.done - self.count_at_first
        return jobs / elapsed if elapsed > 0 and jobs > 0 else float("nan")

    def as_result(self) -> dict[str, Any]:
        return {
            "process_seconds": self.last_at - self.first_at,
            "process_jobs_per_s": self.rate(),
            "jobs_done": self.done,
            "partial": self.partial,
        }


def wait_processed(
    driver: Driver,
    fleet: WorkerFleet,
    target: int,
    total: int,
    clock: Clock,
    *,
    cap: float | None = None,
    poll: float = 0.005,
) -> Drain:
    """Wait until ``target`` jobs of ``total`` queued are done; time first to last.

    When ``cap`` seconds (from this call) or the figure's deadline pass after some
    jobs were done, the result is *partial*: the rate over the jobs done so far, so a
    slow system still gets a number (flagged) while a stalled one (nothing done)
    raises :class:`BenchmarkError`.
    """
    cap_end = time.monotonic() + (cap if cap is not None else float("inf"))
    first_at: float | None = None
    count_at_first = 0
    while True:
        count = progress_count(driver.record_dir)
        now = time.perf_counter()
        if count > 0 and first_at is None:
            first_at, count_at_first = now, count
        if count >= target:
            break
        fleet.check_alive()
        progressed = first_at is not None and count > count_at_first
        if progressed and time.monotonic() > cap_end:
            assert first_at is not None
            return Drain(first_at, count_at_first, now, count, partial=True)
        try:
            clock.check(f"processing ({count} of {target} done)")
        except BenchmarkError:
            if first_at is None or not progressed:
                raise
            return Drain(first_at, count_at_first, now, count, partial=True)
        time.sleep(poll)
    # The task has run; wait for the system's own bookkeeping to agree.
    while True:
        last_at = time.perf_counter()
        finished = driver.finished()
        if finished is not None:
            if finished >= target:
                break
            pending: int | None = total - finished
        else:
            pending = driver.pending()
            if pending is None or pending <= total - target:
                break
        clock.check(f"waiting for the system to record completions ({pending} pending)")
        time.sleep(0.02)
    assert first_at is not None
    return Drain(first_at, count_at_first, last_at, target, partial=False)


def figure_enqueue_one(driver: Driver, clock: Clock, n: int) -> dict[str, Any]:
    """Enqueue ``n`` jobs one call each; ``jobs_per_s`` is n over the wall time."""
    start = time.perf_counter()
    for i in range(n):
        driver.enqueue_one(NOOP, time.time())
        if i % 500 == 0:
            clock.check(f"enqueueing one by one ({i} of {n})")
    seconds = time.perf_counter() - start
    return {"jobs": n, "seconds": seconds, "jobs_per_s": n / seconds}


def figure_throughput(driver: Driver, clock: Clock, n: int, cap: float | None = None) -> dict[str, Any]:
    """Bulk-enqueue ``n`` jobs (timed), then process them with the workers (timed).

    The driver's `Driver.bulk_references` are timed first, on the same jobs.

    Processing stops after ``cap`` seconds (partial result) if not done by then.
    """
    jobs = [(NOOP, 0.0)] * n
    references = driver.bulk_references(jobs)
    start = time.perf_counter()
    driver.enqueue_bulk(jobs)
    bulk_seconds = time.perf_counter() - start
    clock.check("bulk enqueueing")
    driver.analyze()
    fleet = driver.fleet()
    fleet.start()
    try:
        drain = wait_processed(driver, fleet, n, n, clock, cap=cap)
    finally:
        fleet.stop()
    return {
        "jobs": n,
        "bulk_seconds": bulk_seconds,
        "bulk_jobs_per_s": n / bulk_seconds,
        **references,
        **drain.as_result(),
        **fleet.memory(),
    }


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an ascending sequence."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


def figure_latency(driver: Driver, clock: Clock, rate: float, seconds: float) -> dict[str, Any]:
    """Enqueue at ``rate`` jobs/s for ``seconds`` s; enqueue -> task start, in ms."""
    fleet = driver.fleet()
    fleet.start()
    try:
        warm = 2 * max(1, len(fleet.commands))
        for _ in range(warm):
            driver.enqueue_one(WARMUP, time.time())
        while progress_count(driver.record_dir) < warm:
            fleet.check_alive()
            clock.check("waiting for the workers to start")
            time.sleep(0.01)
        time.sleep(0.5)  # let the workers settle back into their idle wait
        count = max(1, int(rate * seconds))
        start = time.perf_counter()
        for i in range(count):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            driver.enqueue_one(LATENCY, time.time())
        produce_seconds = time.perf_counter() - start
        while True:
            records = [r for r in read_records(driver.record_dir) if r.kind == LATENCY]
            if len(records) >= count:
                break
            fleet.check_alive()
            clock.check(f"waiting for latency probes ({len(records)} of {count})")
            time.sleep(0.02)
    finally:
        fleet.stop()
    latencies = sorted((r.started_at - r.enqueued_at) * 1000.0 for r in records)
    return {
        "jobs": count,
        "achieved_rate": count / produce_seconds if produce_seconds > 0 else float("nan"),
        "p50_ms": _percentile(latencies, 50),
        "p95_ms": _percentile(latencies, 95),
        "p99_ms": _percentile(latencies, 99),
        "max_ms": latencies[-1],
        **fleet.memory(),
    }


def figure_fairness(
    driver: Driver, clock: Clock, backlog: int, n_b: int, cap: float | None = None
) -> dict[str, Any]:
    """Tenant A's backlog is being worked off; then B enqueues ``n_b`` jobs.

    ``seconds`` runs from just before B's first enqueue call to the end of B's last
    task. ``a_left`` is how many of A's jobs were still undone at that moment. If B
    is not done ``cap`` seconds after its enqueue, the result is partial and
    ``seconds`` (the time waited) is a lower bound.
    """
    driver.fill(backlog, TENANT_A)
    clock.check("filling tenant A's backlog")
    driver.analyze()
    fleet = driver.fleet()
    fleet.start()
    try:
        while progress_count(driver.record_dir) < 1:
            fleet.check_alive()
            clock.check("waiting for the workers to start")
            time.sleep(0.005)
        t0 = time.time()
        cap_end = time.monotonic() + (cap if cap is not None else float("inf"))
        for _ in range(n_b):
            driver.enqueue_one(TENANT_B, t0, TENANT_B_NAME)
        partial = False
        while True:
            done = progress_count(driver.record_dir)
            records = [r for r in read_records(driver.record_dir) if r.kind == TENANT_B]
            if len(records) >= n_b:
                break
            fleet.check_alive()
            if time.monotonic() > cap_end:
                partial = True
                break
            clock.check(f"waiting for tenant B ({len(records)} of {n_b} done)")
            time.sleep(0.01)
    finally:
        fleet.stop()
    finished = time.time() if partial else max(r.ended_at for r in records)
    return {
        "backlog": backlog,
        "b_jobs": n_b,
        "b_done": len(records),
        "seconds": finished - t0,
        "a_left": max(0, backlog - (done - len(records))),
        "partial": partial,
        **fleet.memory(),
    }


def figure_deep(driver: Driver, clock: Clock, depth: int, n: int, cap: float | None = None) -> dict[str, Any]:
    """With ``depth`` due jobs queued, time the processing of the first ``n`` (cut at ``cap`` s)."""
    start = time.perf_counter()
    driver.fill(depth)
    fill_seconds = time.perf_counter() - start
    clock.check("filling the deep queue")
    driver.analyze()
    fleet = driver.fleet()
    fleet.start()
    try:
        drain = wait_processed(driver, fleet, n, depth, clock, cap=cap)
    finally:
        fleet.stop()
    return {
        "depth": depth,
        "jobs": n,
        "fill_seconds": fill_seconds,
        **drain.as_result(),
        **fleet.memory(),
    }


def _versions(driver_cls: type[Driver]) -> dict[str, Any]:
    from importlib import metadata

    packages: dict[str, str] = {}
    for name in driver_cls.spec.packages:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = "not installed"
    return {"python": sys.version.split()[0], "packages": packages}


def main(driver_cls: type[Driver], argv: Sequence[str] | None = None) -> None:
    """Entry point of a driver module: ``OP PARAMS_JSON`` -> one JSON line on stdout.

    Ops: ``versions``, ``setup``, ``enqueue_one``, ``throughput``, ``latency``,
    ``fairness``, ``deep``, and ``worker`` (runs :meth:`Driver.serve_worker`).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    op = args[0]
    raw = json.loads(args[1]) if len(args) > 1 else {}
    if op == "versions":
        _emit({"ok": True, "result": _versions(driver_cls)})
        return
    params = Params(
        dsn=raw.get("dsn") or os.environ.get(DSN_ENV, ""),
        workdir=Path(raw.get("workdir") or os.environ.get(RECORD_DIR_ENV, "/tmp")),
        deadline=float(raw.get("deadline", 600)),
        redis_url=raw.get("redis_url") or os.environ.get(REDIS_ENV, ""),
        args=raw.get("args", {}),
    )
    if op == "worker":
        driver_cls.serve_worker(params)
        return
    figures: dict[str, Callable[..., dict[str, Any]]] = {
        "enqueue_one": figure_enqueue_one,
        "throughput": figure_throughput,
        "latency": figure_latency,
        "fairness": figure_fairness,
        "deep": figure_deep,
    }
    try:
        driver = driver_cls(params)
        try:
            clock = Clock(params.deadline)
            if op == "setup":
                driver.reset()
                driver.migrate()
                result: dict[str, Any] = {}
            elif op in figures:
                driver.reset()
                result = figures[op](driver, clock, **params.args)
            else:
                raise BenchmarkError(f"unknown op {op!r}")
        finally:
            driver.close()
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        _emit({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]})
        return
    _emit({"ok": True, "result": result})


def _emit(payload: dict[str, Any]) -> None:
    sys.stdout.write("\n" + json.dumps(payload) + "\n")
    sys.stdout.flush()
