"""One chaos run from start to verdict: server, fleet, stream, faults, drain, checks, table.

`run` starts a private primary and its synchronous standby (and with ``pooler`` a
PgBouncer in front of the primary), migrates the run's database, creates the side
ledger and the cron
schedule (through the API, not in code, so a restarted scheduler's sync does not undo
the change made during the run), starts the supervised fleet, and for ``duration``
seconds feeds the seeded job stream while the injector carries out the seeded fault
plan. Half-way (at a half minute, well between fire times) the schedule's expression
and zone change. Then faults stop, the fleet drains the queue, stops, and the
invariants are checked on whichever server is the primary by then. Only the
servers this run started are ever restarted or failed over; they are stopped and
their directory removed at the end.
"""

from __future__ import annotations

import logging
import math
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from chaos.app import LEDGER_DDL, make_app
from chaos.faults import KILL_SCHEDULER_AT_FIRE, KILL_WORKER, STOP_WORKER, Injector, plan_faults
from chaos.fleet import Fleet
from chaos.invariants import CronPhase, Evidence, Findings, check, fire_times, minute_every
from chaos.server import Servers, find_bindir
from chaos.workload import PROBE_SEQ, Enqueuer, plan_jobs

log = logging.getLogger("chaos")

SCHEDULE = "chaos-minutely"
#: The schedule's two definitions: every minute in UTC, then every second minute of
#: Kathmandu's clock (UTC+05:45, so those are the odd minutes of UTC: a zone ignored
#: would fire on the wrong ones).
PHASES = (("* * * * *", "UTC", 1), ("*/2 * * * *", "Asia/Kathmandu", 2))


@dataclass(frozen=True)
class Options:
    """A run's parameters.

    Attributes:
        seed: fixes the fault plan and the job stream.
        duration: seconds of faults and job stream.
        workers: worker processes on the ``default`` queue (plus one on ``cron``).
        concurrency: jobs each of them runs at once.
        rate: jobs enqueued per second (mean).
        tick_slack: seconds a cron run may start after its fire time.
        drain_timeout: seconds the fleet gets to finish the queue after the faults.
        log_dir: where process logs go (default: a temporary directory, removed).
        pooler: the fleet and the producer go through PgBouncer in transaction pooling.
    """

    seed: int
    duration: float
    workers: int = 3
    concurrency: int = 4
    rate: float = 4.0
    tick_slack: float = 1.0
    drain_timeout: float = 90.0
    log_dir: Path | None = None
    pooler: bool = False


@dataclass
class Outcome:
    """What a run produced: the findings, the faults by kind and the figures of the run."""

    options: Options
    findings: Findings
    faults: Counter[str]
    jobs_planned: int
    jobs_landed: int
    probes: int
    enqueue_errors: int
    wall_seconds: float
    drained_in: float | None
    ticks_at_fire_killed: int
    servers: str = ""

    @property
    def ok(self) -> bool:
        """Whether every invariant held."""
        return self.findings.violations == 0


def _change_at(start: float, duration: float) -> float:
    """When the schedule changes: the first half minute (:30) after 45% of the run."""
    t = start + 0.45 * duration
    return math.floor(t / 60) * 60 + 30 + (60 if t % 60 > 30 else 0)


def _open_jobs(dsn: str) -> int | None:
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pgtasks.jobs WHERE status = 'running'"
                " OR (status = 'queued' AND run_at <= now())"
            ).fetchone()
            return None if row is None else int(row[0])
    except psycopg.Error:
        return None


def run(options: Options) -> Outcome:
    """Carry out one chaos run; see the module docstring."""
    bindir = find_bindir()
    if bindir is None:
        raise RuntimeError("no PostgreSQL binaries: set PGTASKS_CHAOS_PGBIN or install PostgreSQL")
    began = time.monotonic()
    servers = Servers(bindir, pooler=options.pooler)
    with tempfile.TemporaryDirectory(prefix="pgtasks-chaos-logs-") as tmp:
        log_dir = options.log_dir or Path(tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        try:
            servers.start()
            return _run(options, servers, log_dir, began)
        finally:
            servers.stop()


def _run(options: Options, servers: Servers, log_dir: Path, began: float) -> Outcome:
    dsn = servers.admin_dsn()
    admin = make_app(dsn)
    admin.migrate()
    admin.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LEDGER_DDL)
    pooled = {"prepare_threshold": None, "listen": False} if options.pooler else {}
    app = make_app(servers.fleet_dsn(), **pooled)
    cron, zone, _step = PHASES[0]
    app.schedules.create(SCHEDULE, "chaos.tick", cron, timezone=zone, queue="cron")
    fleet = Fleet(
        servers.fleet_dsn(),
        log_dir,
        workers=options.workers,
        concurrency=options.concurrency,
        env=servers.fleet_env(),
    )
    fleet.start()
    try:
        time.sleep(3.0)  # processes import and register
        start = time.time()
        end = start + options.duration
        change = _change_at(start, options.duration)
        phases = [
            CronPhase(0.0, PHASES[0][0], PHASES[0][1], minute_every(PHASES[0][2])),
            CronPhase(change, PHASES[1][0], PHASES[1][1], minute_every(PHASES[1][2])),
        ]
        fires = fire_times(phases, (start + 2.0, end))
        at_fire = [datetime.fromtimestamp(t, UTC) for i, t in enumerate(fires) if i % 2 == 0]
        faults = plan_faults(options.seed, options.duration)
        # A backlog just before each worker kill or stop, so that worker holds jobs it
        # claimed ahead: lost with it, or handed back while it is stopped.
        bursts = [f.at - 1.5 for f in faults if f.kind in (KILL_WORKER, STOP_WORKER) and f.at > 1.5]
        jobs = plan_jobs(options.seed, options.duration, options.rate, bursts)
        enqueuer = Enqueuer(app, f"chaos-{options.seed}")
        fire_instants = [datetime.fromtimestamp(t, UTC) for t in fires]
        injector = Injector(fleet, servers, dsn, fire_instants, at_fire, probe=enqueuer.probe)
        stop = threading.Event()
        threads = [
            threading.Thread(target=injector.run, args=(faults, start, stop)),
            threading.Thread(target=enqueuer.run, args=(jobs, start, stop)),
        ]
        for t in threads:
            t.start()
        try:
            if change < end:
                time.sleep(max(0.0, change - time.time()))
                _change_schedule(app)
            time.sleep(max(0.0, end - time.time()))
        finally:
            stop.set()
            for t in threads:
                t.join(120)
            injector.finish()
        drained_at = _drain(dsn, options.drain_timeout)
        (log_dir / "faults.log").write_text(injector.timeline())
    finally:
        fleet.stop()  # on any error too: no process outlives the run
        app.close()
    kills = [f for f in injector.log if f.pid is not None and f.worker_id]
    evidence = Evidence(
        landed=enqueuer.landed,
        pid_ends=fleet.pid_ends(),
        stopped=injector.stopped,
        db_faults=injector.outages + [(f.at, f.at) for f in injector.log if f.kind.startswith("terminate")],
        unstarted_at_kill=[(f.pid, f.worker_id, f.at, f.unstarted_jobs) for f in kills if f.pid is not None],
        cron_phases=phases,
        cron_window=(start + 2.0, end),
        schedule=SCHEDULE,
        tick_slack=options.tick_slack,
        killed_at_fire=frozenset(f.fire_time.timestamp() for f in injector.log if f.fire_time is not None),
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        findings = check(conn, evidence)
    return Outcome(
        options=options,
        findings=findings,
        faults=injector.counts(),
        jobs_planned=len(jobs),
        jobs_landed=sum(1 for seq in enqueuer.landed if seq < PROBE_SEQ),
        probes=sum(1 for seq in enqueuer.landed if seq >= PROBE_SEQ),
        enqueue_errors=enqueuer.write_errors,
        wall_seconds=time.monotonic() - began,
        drained_in=None if drained_at is None else drained_at - end,
        ticks_at_fire_killed=sum(1 for f in injector.log if f.kind == KILL_SCHEDULER_AT_FIRE),
        servers=servers.describe(),
    )


def _change_schedule(app: object) -> None:
    """Change the schedule's expression and zone, retrying through a database fault."""
    from pgtasks import App
    from pgtasks.errors import DatabaseError

    assert isinstance(app, App)
    deadline = time.monotonic() + 20
    while True:
        try:
            app.schedules.change(SCHEDULE, cron=PHASES[1][0], timezone=PHASES[1][1])
            return
        except DatabaseError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _drain(dsn: str, timeout: float) -> float | None:
    """Wait until no job is running or due; returns when (Unix seconds), None on timeout."""
    deadline = time.monotonic() + timeout
    quiet_since: float | None = None
    while time.monotonic() < deadline:
        if _open_jobs(dsn) == 0:
            quiet_since = quiet_since or time.time()
            if time.time() - quiet_since >= 1.0:
                return quiet_since
        else:
            quiet_since = None
        time.sleep(0.5)
    return None
