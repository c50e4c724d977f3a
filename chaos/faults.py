"""The seeded fault plan and the injector that carries it out.

`plan_faults` turns a seed into the run's fault schedule: kinds, targets (slot
numbers) and offsets in seconds from the start of the fault period. The same seed
gives the same plan. Each kind comes once, in an order the seed shuffles, before
kinds are drawn by weight. The one fault tied to the wall clock, a scheduler killed exactly at a cron
fire time, is planned per fire time (the first, then every other one).

While the run goes on, the injector keeps the cron schedule's fire times quiet: a
planned fault that would land just before a fire time (where it would delay the run
of that tick by the time a killed process takes to come back) is held until just
after it, so the start-within-a-second check measures the scheduler, not the fault.
A failover returns only once the old primary is rebuilt as the new primary's
synchronous standby (`chaos.server.Servers.failover`), so every failover of a run
has a standby to promote and no acknowledged commit is ever on one server alone.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

from chaos.fleet import LEASE_TIMEOUT, Fleet
from chaos.server import Servers

KILL_WORKER = "kill worker (SIGKILL)"
TERM_WORKER = "drain worker (SIGTERM)"
STOP_WORKER = "stop worker past its lease (SIGSTOP, SIGCONT)"
KILL_SCHEDULER = "kill scheduler (SIGKILL)"
KILL_SCHEDULER_AT_FIRE = "kill scheduler at a fire time (SIGKILL)"
TERM_SCHEDULER = "stop scheduler (SIGTERM)"
TERMINATE_BACKENDS = "terminate connections (pg_terminate_backend)"
RESTART_POSTGRES = "restart PostgreSQL"
FAILOVER = "fail over to the standby (stop primary, promote)"

KINDS: dict[str, int] = {
    KILL_WORKER: 4,
    TERM_WORKER: 2,
    STOP_WORKER: 1,
    KILL_SCHEDULER: 2,
    TERM_SCHEDULER: 1,
    TERMINATE_BACKENDS: 2,
    RESTART_POSTGRES: 1,
    FAILOVER: 1,
}
#: Kinds that take a ``mode``: how the server (the primary) is stopped.
STOP_MODES = (RESTART_POSTGRES, FAILOVER)

#: Seconds a stopped worker stays stopped: past its lease and the reaper's next round.
STOP_SECONDS = LEASE_TIMEOUT + 8.0
#: Seconds the fencing probe's body works (longer than the stop).
PROBE_SECONDS = 12.0
#: Seconds before a fire time no planned fault lands (after: held until QUIET_AFTER).
QUIET_BEFORE = {RESTART_POSTGRES: 15.0, FAILOVER: 20.0, STOP_WORKER: 2.0}
QUIET_DEFAULT = 6.0
QUIET_AFTER = 2.0


@dataclass(frozen=True)
class Fault:
    """One planned fault: ``kind``, seconds after the fault period began, target slot number."""

    at: float
    kind: str
    target: int
    mode: str = ""  # restart or failover: the primary stops fast or immediate


def plan_faults(seed: int, duration: float, mean_gap: float = 8.0) -> list[Fault]:
    """The fault schedule of ``seed`` over ``duration`` seconds (mean ``mean_gap`` between faults)."""
    rng = random.Random(seed)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    faults: list[Fault] = []
    at = rng.uniform(2.0, 4.0)
    while at < duration - 3.0:
        kind = kinds.pop() if kinds else rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        mode = rng.choice(("fast", "immediate")) if kind in STOP_MODES else ""
        faults.append(Fault(round(at, 3), kind, rng.randrange(1000), mode))
        at += rng.uniform(0.4 * mean_gap, 1.6 * mean_gap)
    return faults


@dataclass
class Injected:
    """A fault as it happened: kind, when (Unix seconds), on what, and details."""

    kind: str
    at: float
    target: str
    pid: int | None = None
    detail: str = ""
    fire_time: datetime | None = None
    unstarted_jobs: tuple[int, ...] = ()
    worker_id: str = ""


@dataclass
class Injector:
    """Carries out a fault plan against the fleet and the private server.

    Args:
        fleet: the supervised processes.
        servers: the run's primary and standby (RESTART_POSTGRES restarts the primary,
            FAILOVER promotes the standby).
        dsn: the run's database on the primary, directly (for pg_terminate_backend
            and reading held jobs).
        fire_times: the cron schedule's fire times over the run (for quiet windows).
        at_fire: fire times at which a scheduler is killed.
        probe: enqueues a fencing probe of the given seconds on the ``probe`` queue and
            returns its job id (None: no probe was written); see `Injector._probe`.
    """

    fleet: Fleet
    servers: Servers
    dsn: str
    fire_times: Sequence[datetime]
    at_fire: Sequence[datetime]
    probe: Callable[[float], int | None] | None = None
    log: list[Injected] = field(default_factory=list)
    stopped: list[tuple[int, float, float]] = field(default_factory=list)  # pid, from, to
    outages: list[tuple[float, float]] = field(default_factory=list)  # restarts, failovers
    _timers: list[threading.Timer] = field(default_factory=list)

    def counts(self) -> Counter[str]:
        """Faults injected, by kind."""
        return Counter(f.kind for f in self.log)

    def _quiet_until(self, kind: str, now: float) -> float | None:
        before = QUIET_BEFORE.get(kind, QUIET_DEFAULT)
        for fire in self.fire_times:
            t = fire.timestamp()
            if t - before <= now < t + QUIET_AFTER:
                return t + QUIET_AFTER
        return None

    def run(self, plan: Sequence[Fault], start: float, stop: threading.Event) -> None:
        """Inject ``plan`` (offsets from ``start``, Unix seconds) until done or ``stop`` is set."""
        events: list[tuple[float, Fault | datetime]] = [(start + f.at, f) for f in plan]
        events += [(t.timestamp(), t) for t in self.at_fire]
        events.sort(key=lambda e: e[0])
        while events and not stop.is_set():
            when, what = events.pop(0)
            if stop.wait(max(0.0, when - time.time())):
                break
            if isinstance(what, datetime):
                self._kill_scheduler_at(what)
                continue
            held = self._quiet_until(what.kind, time.time())
            if held is not None:
                events.append((held, what))
                events.sort(key=lambda e: e[0])
                continue
            self._inject(what)

    def _inject(self, fault: Fault) -> None:
        kind = fault.kind
        if kind in (KILL_WORKER, TERM_WORKER):
            slot = self.fleet.pick(("worker", "cron-worker"), fault.target)
            worker_id, unstarted = "", ()
            if kind == KILL_WORKER and slot.life is not None:
                worker_id, unstarted = self._unstarted(slot.life.pid)  # type: ignore[assignment]
            life = self.fleet.signal(slot, signal.SIGKILL if kind == KILL_WORKER else signal.SIGTERM)
            pid = life.pid if life else None
            self._note(kind, slot.name, pid, unstarted_jobs=unstarted, worker_id=worker_id)
        elif kind == STOP_WORKER:
            probe, pid = self._probe()
            running = self.fleet.slot_of(pid) if pid is not None else None
            slot = running or self.fleet.pick(("worker",), fault.target)
            proc = slot.proc
            if proc is None or proc.poll() is not None:
                return
            proc.send_signal(signal.SIGSTOP)
            began = time.time()
            self._note(kind, slot.name, proc.pid, f"{STOP_SECONDS:.0f} s, probe job {probe}")

            def resume() -> None:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                self.stopped.append((proc.pid, began, time.time()))

            timer = threading.Timer(STOP_SECONDS, resume)
            timer.daemon = True
            timer.start()
            self._timers.append(timer)
        elif kind in (KILL_SCHEDULER, TERM_SCHEDULER):
            slot = self.fleet.pick(("scheduler",), fault.target)
            life = self.fleet.signal(slot, signal.SIGKILL if kind == KILL_SCHEDULER else signal.SIGTERM)
            self._note(kind, slot.name, life.pid if life else None)
        elif kind == TERMINATE_BACKENDS:
            count = self._terminate()
            self._note(kind, "every connection of the run's database", detail=f"{count} terminated")
        elif kind == RESTART_POSTGRES:
            began = time.time()
            target = f"the primary (port {self.servers.primary.port})"
            took = self.servers.restart(fault.mode)
            self.outages.append((began, time.time()))
            self._note(kind, target, detail=f"-m {fault.mode}, {took:.1f} s")
        elif kind == FAILOVER:
            done = self.servers.failover(fault.mode)
            self.outages.append((done.began, done.promoted))
            target = f"primary port {done.old_port} to standby port {done.new_port}"
            detail = (
                f"-m {fault.mode}, promoted in {done.promoted - done.began:.1f} s,"
                f" new standby synchronous {done.rebuilt - done.promoted:.1f} s later"
            )
            self.log.append(Injected(kind, done.began, target, detail=detail))

    def _probe(self) -> tuple[int | None, int | None]:
        """Enqueue a fencing probe and wait until a worker runs it: its job id and the pid
        of that worker (None when there is no probe or it did not start in time).

        The probe works `PROBE_SECONDS`, longer than the stop, so when the stopped worker
        resumes and its body returns at once, the job's newer execution on another
        worker is still running: a stale success that were not fenced would overwrite
        that running job's row.
        """
        if self.probe is None:
            return None, None
        job_id = self.probe(PROBE_SECONDS)
        if job_id is None:
            return None, None
        deadline = time.monotonic() + 6.0
        pid: int | None = None
        while time.monotonic() < deadline:
            rows = self._query(
                "SELECT l.worker_pid, j.started_at IS NOT NULL FROM public.chaos_ledger l"
                " JOIN pgtasks.jobs j ON j.id = l.job_id WHERE l.job_id = %s",
                (job_id,),
                [],
            )
            if rows:
                pid = int(rows[0][0])
                if rows[0][1]:  # its start is recorded: the reaper will record the attempt lost
                    break
            time.sleep(0.1)
        return job_id, pid

    def _kill_scheduler_at(self, fire: datetime) -> None:
        index = int(fire.timestamp() // 60)
        slot = self.fleet.pick(("scheduler",), index)
        life = self.fleet.signal(slot, signal.SIGKILL)
        self._note(KILL_SCHEDULER_AT_FIRE, slot.name, life.pid if life else None, fire_time=fire)

    def _note(self, kind: str, target: str, pid: int | None = None, detail: str = "", **extra: Any) -> None:
        self.log.append(Injected(kind, time.time(), target, pid, detail, **extra))

    def timeline(self) -> str:
        """Every injected fault, one line each (UTC time, kind, target, pid, details)."""
        lines = []
        for f in self.log:
            stamp = datetime.fromtimestamp(f.at, UTC).strftime("%H:%M:%S.%f")[:-3]
            held = f" held unstarted {list(f.unstarted_jobs)}" if f.unstarted_jobs else ""
            lines.append(f"{stamp} {f.kind}: {f.target} pid {f.pid} {f.worker_id} {f.detail}{held}".rstrip())
        for pid, began, resumed in self.stopped:
            span = " to ".join(
                datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S.%f")[:-3] for t in (began, resumed)
            )
            lines.append(f"pid {pid} stopped {span}")
        return "\n".join(lines) + "\n"

    def _query(self, query: str, params: Any, default: Any) -> Any:
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=3) as conn:
                return conn.execute(query, params).fetchall()
        except psycopg.Error:
            return default

    def _unstarted(self, pid: int) -> tuple[str, tuple[int, ...]]:
        """The worker id of process ``pid`` and the jobs it holds without having started
        them (read just before it is killed)."""
        rows = self._query(
            "SELECT w.id, j.id FROM pgtasks.workers w LEFT JOIN pgtasks.jobs j"
            " ON j.worker_id = w.id AND j.status = 'running' AND j.started_at IS NULL"
            " WHERE w.pid = %s ORDER BY w.started_at DESC",
            (pid,),
            [],
        )
        if not rows:
            return "", ()
        worker_id = rows[0][0]
        return worker_id, tuple(r[1] for r in rows if r[0] == worker_id and r[1] is not None)

    def _terminate(self) -> int:
        rows = self._query(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()",
            (),
            [(0,)],
        )
        return int(rows[0][0])

    def finish(self) -> None:
        """Resume every stopped worker now (the end of the fault period)."""
        for timer in self._timers:
            if timer.is_alive():
                timer.cancel()
                timer.function(*timer.args, **timer.kwargs)
        self._timers.clear()
