"""The supervised fleet: worker and scheduler processes kept alive through the faults.

Each `Slot` is one place in the fleet (``worker-0``, ``cron-worker``, ``scheduler-1``)
holding one live process at a time. The `Fleet`'s supervisor thread replaces a
process that exited at once; a process told to drain (SIGTERM) leaves its slot, which
gets a fresh process while the old one finishes its jobs. Every process's start and
end (wall clock, the database server's own clock on this machine) is kept, so the
invariants can tell when an execution's process died.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chaos.app import APP_SPEC

REPO = Path(__file__).resolve().parents[1]

#: Seconds a worker's lease lasts without a heartbeat (short, so faults recover fast).
LEASE_TIMEOUT = 5.0
#: Seconds a draining worker gets for its running jobs (longer than any job).
SHUTDOWN_TIMEOUT = 30.0


@dataclass
class Life:
    """One process of a slot: pid, when it started and ended (Unix seconds), how it ended."""

    slot: str
    pid: int
    started: float
    ended: float | None = None
    returncode: int | None = None


@dataclass
class Slot:
    """A place in the fleet and the command its processes run."""

    name: str
    role: str  # "worker", "cron-worker" or "scheduler"
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    life: Life | None = None


@dataclass
class Fleet:
    """Worker and scheduler processes on ``dsn``, supervised.

    Args:
        dsn: the run's database.
        log_dir: where each process's log goes (one file per process).
        workers: processes serving the ``default`` and ``probe`` queues.
        concurrency: jobs each of them runs at once.
        env: environment every process gets on top of the harness's (the pooler's
            settings).
    """

    dsn: str
    log_dir: Path
    workers: int = 3
    concurrency: int = 4
    env: Mapping[str, str] = field(default_factory=dict)
    slots: list[Slot] = field(default_factory=list)
    lives: list[Life] = field(default_factory=list)
    draining: list[tuple[subprocess.Popen[bytes], Life]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        worker = ["--lease-timeout", str(LEASE_TIMEOUT), "--poll-interval", "0.2"]
        worker += ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT)]
        for i in range(self.workers):
            queues = "default,probe"  # probe: the fencing probe of a stop (chaos.faults)
            argv = ["worker", "-Q", queues, "-c", str(self.concurrency), "-n", f"chaos-w{i}", *worker]
            self.slots.append(Slot(f"worker-{i}", "worker", argv))
        self.slots.append(Slot("cron-worker", "cron-worker", ["worker", "-Q", "cron", "-c", "2", *worker]))
        for i in range(2):
            argv = ["scheduler", "--interval", "0.2", "--lease-timeout", str(LEASE_TIMEOUT)]
            self.slots.append(Slot(f"scheduler-{i}", "scheduler", argv))

    def _spawn(self, slot: Slot) -> None:
        env = {
            **os.environ,
            **self.env,
            "PGTASKS_DSN": self.dsn,
            "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        n = sum(1 for life in self.lives if life.slot == slot.name)
        log = (self.log_dir / f"{slot.name}.{n}.log").open("wb")
        try:
            slot.proc = subprocess.Popen(
                [sys.executable, "-m", "pgtasks", "-A", APP_SPEC, "-l", "INFO", *slot.argv],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        finally:
            log.close()
        slot.life = Life(slot.name, slot.proc.pid, time.time())
        self.lives.append(slot.life)

    def start(self) -> None:
        """Start every slot's process and the supervisor thread."""
        with self._lock:
            for slot in self.slots:
                self._spawn(slot)
        self._thread = threading.Thread(target=self._supervise, name="chaos-supervisor", daemon=True)
        self._thread.start()

    def _supervise(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                self._reap_and_respawn()

    def _reap_and_respawn(self) -> None:
        now = time.time()
        for slot in self.slots:
            if slot.proc is not None and slot.life is not None and slot.proc.poll() is not None:
                slot.life.ended, slot.life.returncode = now, slot.proc.returncode
                if not self._stop.is_set():
                    self._spawn(slot)
        for proc, life in list(self.draining):
            if proc.poll() is not None:
                life.ended, life.returncode = now, proc.returncode
                self.draining.remove((proc, life))

    def pick(self, roles: Sequence[str], index: int) -> Slot:
        """The slot number ``index`` (modulo their count) among the slots of ``roles``."""
        chosen = [s for s in self.slots if s.role in roles]
        return chosen[index % len(chosen)]

    def slot_of(self, pid: int) -> Slot | None:
        """The worker slot whose current process is ``pid``, if any."""
        with self._lock:
            return next((s for s in self.slots if s.role == "worker" and s.life and s.life.pid == pid), None)

    def signal(self, slot: Slot, signum: int) -> Life | None:
        """Send ``signum`` to the slot's current process; returns its life (None: none alive).

        SIGTERM moves the process out of its slot (it drains) and starts its successor.
        """
        with self._lock:
            proc, life = slot.proc, slot.life
            if proc is None or life is None or proc.poll() is not None:
                return None
            if signum == signal.SIGKILL:
                os.kill(proc.pid, signal.SIGCONT)  # a stopped process dies as well either way
            proc.send_signal(signum)
            if signum == signal.SIGTERM:
                self.draining.append((proc, life))
                self._spawn(slot)
            return life

    def pid_ends(self) -> dict[int, float]:
        """Each ended process's pid and the time it was seen gone (Unix seconds)."""
        with self._lock:
            return {life.pid: life.ended for life in self.lives if life.ended is not None}

    def stop(self, timeout: float = SHUTDOWN_TIMEOUT + 15) -> None:
        """SIGCONT then SIGTERM every process, wait for them, kill what is left."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        with self._lock:
            procs = [(s.proc, s.life) for s in self.slots if s.proc is not None and s.life is not None]
            procs += self.draining
            for proc, _life in procs:
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for proc, life in procs:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
                if life.ended is None:
                    life.ended, life.returncode = time.time(), proc.returncode
            self.draining.clear()
