"""The worker processes of one figure: started with their logs, watched, stopped for good."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.systems.clock import BenchmarkError
from benchmarks.systems.memory import PeakMemory, evict_shared_objects
from benchmarks.systems.procfs import process_tree, start_time


class WorkerFleet:
    """The worker processes of one figure, with a sampler of their summed RSS.

    ``commands`` is one argv per worker process. Worker output goes to
    ``<log_dir>/worker-<i>.log``. ``peaks`` samples the summed RSS of every worker
    process and its descendants every ``sample_interval`` seconds (`PeakMemory`);
    `memory` gives its peaks as figure fields. `start` first evicts the shared objects
    of this interpreter's environment from the page cache (`evict_shared_objects`), so
    every system's RSS starts from the same state.
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
        self.processes: list[subprocess.Popen[bytes]] = []
        self.peaks = PeakMemory(self.processes, sample_interval)

    def start(self) -> None:
        evict_shared_objects([sys.prefix, sys.base_prefix])
        for i, command in enumerate(self.commands):
            log = open(self.log_dir / f"worker-{i}.log", "ab")  # noqa: SIM115 - closed by the child's exit
            self.processes.append(
                subprocess.Popen(command, env=self.env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
            )
            log.close()
        self.peaks.start()

    def memory(self) -> dict[str, int]:
        """The figure fields of the peaks sampled so far: ``rss_peak_bytes``, ``rss_anon_peak_bytes``."""
        return self.peaks.fields()

    def check_alive(self) -> None:
        """Raise :class:`BenchmarkError` with the log's tail if a worker has exited."""
        for i, process in enumerate(self.processes):
            code = process.poll()
            if code is not None:
                tail = (self.log_dir / f"worker-{i}.log").read_text(errors="replace")[-600:]
                raise BenchmarkError(f"worker {i} exited with code {code}: {tail}")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every worker, then SIGKILL whatever of its tree is left after ``grace`` s."""
        self.peaks.stop()
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
        self.peaks.join()
