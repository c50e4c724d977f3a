"""What row-level security mode costs: claims by the fleet, and a tenant's enqueue.

``python -m benchmarks.rls [--jobs 20000] [--tenants 150] [--enqueues 2000] [--reps 3] [--dsn ADMIN_DSN]``

Each repetition runs both modes, interleaved, each in a fresh database migrated by the
admin role:

- **claims**: ``--jobs`` no-op jobs spread over ``--tenants`` tenants, drained by the
  processing figure's worker fleet (2 processes, the setting of
  ``benchmarks/systems/pgtasks_system.py``), timed as the processing figure times its
  drain. The workers and the enqueue connect as a role of their own that is neither a
  superuser nor ``BYPASSRLS`` (PostgreSQL exempts those from every policy, which would
  make "on" measure nothing); with the mode on, that role is the fleet
  (``pgtasks rls enable --fleet-role``). The statistics are left as the fill leaves
  them (not analyzed), as users meet them.
- **tenant enqueue**: ``--enqueues`` calls of ``app.tenant(t).delay(...)`` in one
  thread by a tenant-facing role (granted with ``pgtasks rls grant``), beside the
  same number of unscoped ``delay(..., tenant=t)`` calls by the fleet role: a tenant
  handle's statement sets ``pgtasks.tenant`` first whether or not the mode is on, so
  the unscoped figure is the price of the handle itself.

Prints per mode the median jobs/s and calls/s and the ratio of "on" to "off". It
writes no report. The roles are created for the run and dropped at its end.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

import pgtasks
from benchmarks import pg
from benchmarks.environments import compile_project
from benchmarks.probe import add_common_options, interleaved
from benchmarks.systems.base import Params
from benchmarks.systems.clock import Clock
from benchmarks.systems.drain import wait_processed
from benchmarks.systems.pgtasks_system import PgtasksDriver
from benchmarks.systems.records import NOOP
from pgtasks import isolation

MODES = ("off", "on")
JOBS = 20_000
TENANTS = 150
ENQUEUES = 2_000
DEADLINE_SECONDS = 600.0


def as_role(dsn: str, role: str) -> str:
    """``dsn`` with another user."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params["user"] = role
    return psycopg.conninfo.make_conninfo("", **params)


@dataclass(frozen=True)
class Server:
    """Where a run measures: the admin DSN, and the roles made for the run."""

    admin_dsn: str
    fleet: str
    web: str


@contextmanager
def roles(admin_dsn: str) -> Iterator[tuple[str, str]]:
    """A fleet role and a tenant-facing role for this run: (fleet, web)."""
    suffix = f"{os.getpid()}_{uuid.uuid4().hex[:6]}"
    names = (f"bench_rls_fleet_{suffix}", f"bench_rls_web_{suffix}")
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOBYPASSRLS").format(sql.Identifier(name)))
    try:
        yield names
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            for name in names:
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


@contextmanager
def database(server: Server, mode: str, rep: int) -> Iterator[str]:
    """A fresh, migrated database with the roles granted and the mode set; its DSN."""
    name = f"bench_rls_{mode}_{os.getpid()}_{rep}"
    fleet, web = server.fleet, server.web
    dsn = pg.create_database(server.admin_dsn, name)
    try:
        owner = pgtasks.App("bench-owner", dsn=dsn, load_entry_points=False)
        try:
            owner.migrate()
            with psycopg.connect(dsn, autocommit=True) as conn:
                role = sql.Identifier(fleet)
                conn.execute(sql.SQL("GRANT USAGE ON SCHEMA pgtasks TO {}").format(role))
                conn.execute(sql.SQL("GRANT ALL ON ALL TABLES IN SCHEMA pgtasks TO {}").format(role))
                conn.execute(sql.SQL("GRANT ALL ON ALL SEQUENCES IN SCHEMA pgtasks TO {}").format(role))
                me = conn.execute("SELECT current_user").fetchone()
            isolation.grant_tenant_role(owner.stores, web)
            if mode == "on":
                assert me is not None
                isolation.enable(owner.stores, [me[0], fleet])
            if isolation.is_enabled(isolation.status(owner.stores)) != (mode == "on"):
                raise RuntimeError(f"row-level security is not {mode}")
        finally:
            owner.close()
        yield dsn
    finally:
        pg.drop_database(server.admin_dsn, name)


def measure_claims(server: Server, mode: str, rep: int, *, jobs: int, tenants: int) -> float:
    """One drain of ``jobs`` jobs over ``tenants`` tenants by the fleet role; jobs/s."""
    with database(server, mode, rep) as dsn, tempfile.TemporaryDirectory() as workdir:
        params = Params(dsn=as_role(dsn, server.fleet), workdir=Path(workdir), deadline=DEADLINE_SECONDS)
        driver = PgtasksDriver(params)
        try:
            for i in range(tenants):
                count = jobs // tenants + (1 if i < jobs % tenants else 0)
                driver.task.delay_many([(NOOP, 0.0)] * count, tenant=f"t{i:04d}")
            fleet_processes = driver.fleet()
            fleet_processes.start()
            try:
                drain = wait_processed(driver, fleet_processes, jobs, jobs, Clock(DEADLINE_SECONDS))
            finally:
                fleet_processes.stop()
        finally:
            driver.close()
    rate = drain.rate()
    if drain.partial or math.isnan(rate):
        raise RuntimeError(f"{drain.done} of {jobs} jobs timed, too few or too late: use more --jobs")
    return rate


def _enqueue_rate(app: pgtasks.App, calls: int, tenant_handle: bool) -> float:
    task = app.get_task("bench")
    handle = app.tenant("t0001").bind(task)
    handle.delay(NOOP, 0.0) if tenant_handle else task.delay(NOOP, 0.0)  # connect before timing
    started = time.perf_counter()
    for _ in range(calls):
        if tenant_handle:
            handle.delay(NOOP, 0.0)
        else:
            task.apply_async((NOOP, 0.0), tenant="t0001")
    return calls / (time.perf_counter() - started)


def measure_enqueue(server: Server, mode: str, rep: int, *, calls: int, handle: bool) -> float:
    """Calls/s: of a tenant handle by the web role (``handle``), else unscoped by the fleet role."""
    with database(server, mode, rep) as dsn:
        role = server.web if handle else server.fleet
        app = pgtasks.App("bench-enqueue", dsn=as_role(dsn, role), load_entry_points=False)

        @app.task(name="bench", queue="bench")
        def bench(k: str, t: float) -> None:  # never runs: only enqueued
            del k, t

        try:
            return _enqueue_rate(app, calls, handle)
        finally:
            app.close()


# Enqueue settings, interleaved: (mode, through a tenant handle).
ENQUEUE_SETTINGS = [(mode, handle) for mode in MODES for handle in (True, False)]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, measure, print the figures; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rls", description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=JOBS, help="jobs per drain (default %(default)s)")
    parser.add_argument("--tenants", type=int, default=TENANTS, help="tenants (default %(default)s)")
    parser.add_argument("--enqueues", type=int, default=ENQUEUES, help="enqueue calls (default %(default)s)")
    add_common_options(parser)
    args = parser.parse_args(argv)
    if args.reps < 1 or args.tenants < 1 or args.jobs < args.tenants or args.enqueues < 1:
        parser.error("--reps, --tenants and --enqueues must be >= 1, and --jobs at least --tenants")
    compile_project()
    with roles(args.dsn) as (fleet, web):
        server = Server(args.dsn, fleet, web)
        claims = interleaved(
            range(len(MODES)),
            args.reps,
            lambda i, rep: measure_claims(server, MODES[i], rep, jobs=args.jobs, tenants=args.tenants),
        )
        enqueues = interleaved(
            range(len(ENQUEUE_SETTINGS)),
            args.reps,
            lambda i, rep: measure_enqueue(
                server, ENQUEUE_SETTINGS[i][0], rep, calls=args.enqueues, handle=ENQUEUE_SETTINGS[i][1]
            ),
        )
    claim = {MODES[i]: statistics.median(v) for i, v in claims.items()}
    rates = {ENQUEUE_SETTINGS[i]: statistics.median(v) for i, v in enqueues.items()}
    handle = {mode: rates[(mode, True)] for mode in MODES}
    plain = {mode: rates[(mode, False)] for mode in MODES}
    print(
        f"row-level security off vs on: {args.jobs:,} jobs over {args.tenants} tenants, 2 worker processes; "
        f"{args.enqueues:,} enqueues in one thread; {args.reps} repetitions, medians"
    )
    for mode in MODES:
        runs = claims[MODES.index(mode)]
        print(
            f"{mode:>4}: claims {claim[mode]:9,.0f} jobs/s ({min(runs):,.0f}-{max(runs):,.0f}); "
            f"tenant-handle enqueue {handle[mode]:7,.0f}/s; unscoped enqueue {plain[mode]:7,.0f}/s"
        )
    print(
        f"on/off: claims {claim['on'] / claim['off']:.2f}x, tenant-handle enqueue "
        f"{handle['on'] / handle['off']:.2f}x; handle/unscoped with the mode off "
        f"{handle['off'] / plain['off']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
