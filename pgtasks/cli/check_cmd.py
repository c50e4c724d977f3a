"""``pgtasks check``: the health of a pgtasks deployment as an exit code, for probes and monitoring.

Each check has an exit code of its own (`EXIT_CODES`); the command exits with the
code of the first check that failed, in this order, or 0:

====  =============  ===========================================================
code  check          fails when
====  =============  ===========================================================
0     (all)          every check passed (or was skipped)
10    ``database``   the database cannot be reached, or failed while checking, or
                   hides every job from this role (row-level security, not in the fleet)
11    ``migrations`` migrations of pgtasks are not applied (``pgtasks migrate``)
12    ``workers``    a queue has due jobs and no live worker serves it
13    ``stuck_jobs`` running jobs whose worker's lease expired (or whose worker row is gone)
14    ``max_wait``   with ``--max-wait S``: a queue's oldest due job has waited over S seconds
====  =============  ===========================================================

1 and 2 keep their meaning in every command: a pgtasks error before any check ran
(the app of ``-A`` cannot be loaded) and a usage error (a bad option value).
A check that cannot run because an earlier one failed is ``skipped``. The queries
are the data layer's (``queue_health``, ``job_stuck_past_lease``); nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

from pgtasks.cli.common import AppLoader, FiniteFloatRange, fail, shown
from pgtasks.cli.jsonout import echo_json, json_option, time_text
from pgtasks.db import describe_dsn
from pgtasks.errors import ConfigurationError, PgtasksError
from pgtasks.migrate import migrations, pending
from pgtasks.redaction import redact_text
from pgtasks.validation import check_text

if TYPE_CHECKING:
    import datetime as dt

    from pgtasks.app import App

__all__ = [
    "EXIT_CODES",
    "EXIT_DATABASE",
    "EXIT_MAX_WAIT",
    "EXIT_MIGRATIONS",
    "EXIT_NO_WORKER",
    "EXIT_OK",
    "EXIT_STUCK",
    "CheckResult",
    "check_command",
    "run_checks",
]

EXIT_OK = 0
EXIT_DATABASE = 10
EXIT_MIGRATIONS = 11
EXIT_NO_WORKER = 12
EXIT_STUCK = 13
EXIT_MAX_WAIT = 14

#: Check name -> the exit code of its failure, in the order the checks run.
EXIT_CODES: dict[str, int] = {
    "database": EXIT_DATABASE,
    "migrations": EXIT_MIGRATIONS,
    "workers": EXIT_NO_WORKER,
    "stuck_jobs": EXIT_STUCK,
    "max_wait": EXIT_MAX_WAIT,
}

#: Most stuck jobs listed in the details (the total counts them all).
STUCK_LISTED = 20

#: Longest ``--max-wait``: ten years in seconds, pgtasks' longest delay.
_MAX_WAIT = 10 * 365.25 * 86400.0


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The outcome of one check.

    Attributes:
        name: a key of `EXIT_CODES`.
        status: ``ok``, ``failed`` or ``skipped``.
        summary: one line for people.
        details: what the check found (documented per check in docs/operations.md).
    """

    name: str
    status: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """The exit code this check gives when it fails."""
        return EXIT_CODES[self.name]

    def as_json(self) -> dict[str, Any]:
        """The check as an object of ``pgtasks check --json``."""
        return {
            "name": self.name,
            "status": self.status,
            "exit_code": self.exit_code,
            "summary": self.summary,
            "details": self.details,
        }


def _skipped(name: str, why: str) -> CheckResult:
    return CheckResult(name, "skipped", why, {"reason": why})


def _error_text(exc: PgtasksError) -> str:
    return redact_text(str(exc))


def run_checks(
    app: App, *, queues: tuple[str, ...] | None, max_wait: float | None
) -> tuple[dt.datetime | None, list[CheckResult]]:
    """Run every check against the app's database, in the order of `EXIT_CODES`.

    Args:
        app: the app whose database is checked.
        queues: limit the queue checks (workers, stuck jobs, max wait) to these; None: all.
        max_wait: seconds a due job may wait before ``max_wait`` fails; None skips it.

    Returns:
        The database clock at the check (None when unreachable) and one result per check.
        Database errors are results, never raised.
    """
    stores = app.stores
    results: list[CheckResult] = []
    target = describe_dsn(app.database.dsn)
    try:
        now = stores.database.now()
    except PgtasksError as exc:
        results.append(
            CheckResult(
                "database",
                "failed",
                f"cannot reach the database: {_error_text(exc)}",
                {"server": target, "error": _error_text(exc)},
            )
        )
        why = "the database cannot be reached"
        results.extend(_skipped(name, why) for name in list(EXIT_CODES)[1:])
        return None, results
    results.append(CheckResult("database", "ok", f"connected to {target}", {"server": target}))

    try:
        missing = pending(stores)
        schema = stores.migrations.schema_exists()
    except PgtasksError as exc:
        return now, _database_failed_mid_way(results, exc)
    known = migrations()
    details: dict[str, Any] = {
        "applied": len(known) - len(missing),
        "pending": [{"version": m.version, "name": m.name} for m in missing],
    }
    if missing:
        names = ", ".join(f"{m.version:04d}_{m.name}" for m in missing)
        results.append(CheckResult("migrations", "failed", f"{len(missing)} pending: {names}", details))
        if not schema:
            why = "the pgtasks schema does not exist (pgtasks migrate)"
            results.extend(_skipped(name, why) for name in list(EXIT_CODES)[2:])
            return now, results
    else:
        results.append(CheckResult("migrations", "ok", f"{len(known)} applied, none pending", details))

    try:
        sees_all, role = stores.isolation.sees_every_row()
    except PgtasksError as exc:
        return now, _database_failed_mid_way(results, exc)
    if not sees_all:  # row-level security would hide every job: "no due jobs" would be a lie
        why = (
            f"role {role} sees no tenant's jobs: row-level security mode is on and the role "
            "is not in its fleet (pgtasks rls status); check as a fleet role"
        )
        return now, _database_failed_mid_way(results, PgtasksError(why), prefix="")

    try:
        health = stores.jobs.queue_health(queues=queues, now=now)
        stuck = stores.jobs.stuck_past_lease(queues=queues, limit=STUCK_LISTED, now=now)
    except PgtasksError as exc:
        return now, _database_failed_mid_way(results, exc)

    due = [
        {
            "queue": q.queue,
            "due": q.due,
            "oldest_run_at": time_text(q.oldest_run_at),
            "oldest_wait_seconds": q.oldest_wait_seconds,
            "live_workers": q.live_workers,
        }
        for q in health
    ]
    unserved = [q.queue for q in health if q.live_workers == 0]
    if unserved:
        summary = f"no live worker for queue(s) with due jobs: {', '.join(unserved)}"
        results.append(CheckResult("workers", "failed", summary, {"unserved": unserved, "queues": due}))
    else:
        summary = f"{len(health)} queue(s) with due jobs, each served" if health else "no due jobs"
        results.append(CheckResult("workers", "ok", summary, {"unserved": [], "queues": due}))

    listed = [
        {
            "id": j.id,
            "queue": j.queue,
            "task_name": j.task_name,
            "tenant": j.tenant,
            "worker_id": j.worker_id,
            "started_at": time_text(j.started_at),
            "heartbeat_at": time_text(j.heartbeat_at),
            "lease_expires_at": time_text(j.lease_expires_at),
        }
        for j in stuck.jobs
    ]
    stuck_details = {"total": stuck.total, "jobs": listed}
    if stuck.total:
        ids = ", ".join(str(j.id) for j in stuck.jobs)
        more = f" and {stuck.total - len(stuck.jobs)} more" if stuck.total > len(stuck.jobs) else ""
        summary = f"{stuck.total} running job(s) past their worker's lease: {ids}{more}"
        results.append(CheckResult("stuck_jobs", "failed", summary, stuck_details))
    else:
        summary = "no running job past its worker's lease"
        results.append(CheckResult("stuck_jobs", "ok", summary, stuck_details))

    if max_wait is None:
        results.append(_skipped("max_wait", "no --max-wait given"))
    else:
        late = [q for q in health if q.oldest_wait_seconds > max_wait]
        wait_details = {
            "max_wait_seconds": max_wait,
            "late": [{"queue": q.queue, "oldest_wait_seconds": q.oldest_wait_seconds} for q in late],
        }
        if late:
            worst = ", ".join(f"{q.queue} ({q.oldest_wait_seconds:.1f} s)" for q in late)
            summary = f"oldest due job waited over {max_wait:g} s in: {worst}"
            results.append(CheckResult("max_wait", "failed", summary, wait_details))
        else:
            summary = f"no due job has waited over {max_wait:g} s"
            results.append(CheckResult("max_wait", "ok", summary, wait_details))
    return now, results


def _database_failed_mid_way(
    done: list[CheckResult], exc: PgtasksError, *, prefix: str = "the database failed while checking: "
) -> list[CheckResult]:
    """The database answered the first check and then failed: ``database`` is reported
    failed (exit code 10), the checks done so far stay, the others are skipped."""
    text = _error_text(exc)
    server = done[0].details.get("server")
    failed = CheckResult("database", "failed", f"{prefix}{text}", {"server": server, "error": text})
    rest = list(EXIT_CODES)[len(done) :]
    return [failed, *done[1:], *(_skipped(name, f"the database failed: {text}") for name in rest)]


def exit_code(results: list[CheckResult]) -> int:
    """The exit code of the first failed check, in the order of `EXIT_CODES`; 0 if none failed."""
    failed = [r.exit_code for r in results if r.status == "failed"]
    return min(failed) if failed else EXIT_OK


def _queue_names(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    names: list[str] = []
    for item in value:
        for name in item.split(","):
            try:
                names.append(check_text("queue", name.strip()))
            except ConfigurationError as exc:
                raise click.BadParameter(shown(exc)) from None
    return tuple(dict.fromkeys(names))


_HELP = """Check the deployment's health; the exit code says what is wrong.

\b
Exit codes (the first failed check, in this order):
  0   every check passed
  10  database: cannot be reached, failed while checking, or hides jobs from this role
  11  migrations: pending (run pgtasks migrate)
  12  workers: a queue has due jobs and no live worker
  13  stuck_jobs: running jobs past their worker's lease
  14  max_wait: the oldest due job waited over --max-wait
  1   pgtasks error before checking (e.g. -A cannot be loaded); 2 usage error

\b
A probe (Kubernetes exec, Nagios) fails on any non-zero code; --queue limits the
queue checks to the queues it cares about.
"""


@click.command("check", help=_HELP)
@click.option(
    "-Q",
    "--queue",
    "queues",
    multiple=True,
    callback=_queue_names,
    metavar="QUEUE",
    help="Check only these queues (repeatable, or comma-separated); default: every queue.",
)
@click.option(
    "--max-wait",
    type=FiniteFloatRange(min=0, max=_MAX_WAIT),
    default=None,
    metavar="SECONDS",
    help="Fail (14) when a queue's oldest due job has waited longer than this.",
)
@json_option
@click.pass_context
def check_command(ctx: click.Context, queues: tuple[str, ...], max_wait: float | None, as_json: bool) -> None:
    """``pgtasks check`` (see `_HELP`)."""
    loader: AppLoader = ctx.obj
    try:
        app = loader.get()
    except PgtasksError as exc:
        fail(exc)
    now, results = run_checks(app, queues=queues or None, max_wait=max_wait)
    code = exit_code(results)
    if as_json:
        echo_json(
            {
                "status": "ok" if code == EXIT_OK else "failed",
                "exit_code": code,
                "checked_at": time_text(now),
                "queues": list(queues) if queues else None,
                "checks": [r.as_json() for r in results],
            }
        )
    else:
        width = max(len(name) for name in EXIT_CODES)
        for r in results:
            click.echo(f"{r.name:<{width}}  {r.status:<7}  {shown(r.summary)}")
        click.echo(f"status: {'ok' if code == EXIT_OK else 'failed'} (exit {code})")
    ctx.exit(code)
