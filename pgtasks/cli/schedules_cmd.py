"""``pgtasks scheduler`` (the service) and ``pgtasks schedules ...`` (operator commands).

Exit codes: 0 success; 1 a pgtasks error (unknown schedule, a run already active,
a refused cron expression ...), message on stderr; 2 a usage error.
``schedules list|show|history|next`` take ``--json`` (`pgtasks.cli.jsonout`): one JSON
document on stdout, with the values the tables mask masked the same way.
"""

from __future__ import annotations

import datetime as dt
import logging
import signal
import threading
from types import FrameType
from typing import Any

import click

from pgtasks.cli.common import (
    AppLoader,
    confirm,
    confirm_options,
    fail,
    new_console,
    new_table,
    shown,
    task_redactor,
)
from pgtasks.cli.jsonout import echo_json, json_option, run_object, schedule_object, schedule_state, time_text
from pgtasks.cron import load_zone
from pgtasks.errors import ConfigurationError, PgtasksError
from pgtasks.maintenance import ReaperConfig
from pgtasks.redaction import redact_data
from pgtasks.scheduler import Scheduler, SchedulerConfig, SimulatedClock
from pgtasks.serialization import dumps

__all__ = ["run_scheduler", "scheduler_command", "schedules_group"]

log = logging.getLogger("pgtasks.scheduler")


def _local(value: dt.datetime | None, zone_name: str) -> str:
    """``2025-03-30 03:00:00 CEST (01:00:00 UTC)``, or an empty string."""
    if value is None:
        return ""
    try:
        zone = load_zone(zone_name)
    except PgtasksError:
        return f"{value.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC"
    local = value.astimezone(zone)
    if local.utcoffset() == dt.timedelta(0) and zone_name in ("UTC", "Etc/UTC"):
        return f"{local:%Y-%m-%d %H:%M:%S} UTC"
    return f"{local:%Y-%m-%d %H:%M:%S %Z} ({value.astimezone(dt.UTC):%H:%M:%S} UTC)"


def _local_iso(value: dt.datetime, zone_name: str) -> str:
    """ISO 8601 in the schedule's zone, with that zone's offset then (UTC if the zone is unknown)."""
    zone: dt.tzinfo
    try:
        zone = load_zone(zone_name)
    except PgtasksError:
        zone = dt.UTC
    return value.astimezone(zone).isoformat()


def _utc(value: dt.datetime | None) -> str:
    return "" if value is None else f"{value.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S}"


_state = schedule_state


# -- the service ---------------------------------------------------------------------------


def run_scheduler(
    scheduler: Scheduler, stop: threading.Event, *, install_signal_handlers: bool = True
) -> int:
    """Run ``scheduler`` until ``stop`` is set (or SIGTERM/SIGINT); returns the exit code 0."""
    if install_signal_handlers:

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("scheduler: %s received, stopping", signal.Signals(signum).name)
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    scheduler.start()
    log.info("scheduler ready: tick every %.2f s", scheduler.interval)
    try:
        stop.wait()
    finally:
        scheduler.stop()
    log.info("scheduler stopped after %d tick(s)", scheduler.ticks)
    return 0


@click.command("scheduler")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.01),
    default=1.0,
    show_default=True,
    help="Seconds between ticks (a run is created at most this late).",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Most schedules fired per tick.",
)
@click.option("--no-reap", is_flag=True, help="Leave recovery of lost workers' runs to the workers.")
@click.option(
    "--lease-timeout",
    type=click.FloatRange(min=1.0),
    default=30.0,
    show_default=True,
    help="Lease assumed for running jobs whose worker row is gone (reaper).",
)
@click.option("--once", is_flag=True, help="Run one tick, print its counts and exit.")
@click.option("--simulate-clock", default=None, hidden=True, help="Tests only: START,SPEED,ANCHOR[,UNTIL].")
@click.pass_obj
def scheduler_command(
    loader: AppLoader,
    interval: float,
    batch: int,
    no_reap: bool,
    lease_timeout: float,
    once: bool,
    simulate_clock: str | None,
) -> None:
    """Create the runs of due schedules; any number may run against one database."""
    try:
        clock = SimulatedClock.parse(simulate_clock) if simulate_clock else None
        config = SchedulerConfig(
            interval=interval,
            batch=batch,
            reap=not no_reap,
            reaper=ReaperConfig(lease_timeout=lease_timeout),
        )
    except ConfigurationError as exc:
        raise click.UsageError(shown(exc)) from None
    app = loader.get()
    scheduler = Scheduler(app, config, clock=clock)
    if once:
        try:
            result = scheduler.run_once()
        except PgtasksError as exc:
            fail(exc)
            return
        click.echo(" ".join(f"{k}={v}" for k, v in _counts(result).items()))
        return
    raise SystemExit(run_scheduler(scheduler, threading.Event()))


def _counts(result: Any) -> dict[str, int]:
    return {name: getattr(result, name) for name in result.__dataclass_fields__}


# -- operator commands ----------------------------------------------------------------------


@click.group("schedules")
def schedules_group() -> None:
    """List, inspect, trigger, pause and resume schedules."""


@schedules_group.command("list")
@json_option
@click.pass_obj
def schedules_list(loader: AppLoader, as_json: bool) -> None:
    """Every schedule with its next run, last run and last outcome
    (``--json``: an array of schedule objects, as ``schedules show --json`` gives each)."""
    try:
        found = loader.get().schedules.all()
    except PgtasksError as exc:
        fail(exc)
        return
    if as_json:
        app = loader.get()
        echo_json([schedule_object(s, task_redactor(app, s.task_name)) for s in found])
        return
    table = new_table("name", "cron", "timezone", "task", "state", "next run", "last run", "last outcome")
    for s in found:
        last = f"#{s.last_run_id} {s.last_run_trigger} {s.last_run_status}" if s.last_run_id else ""
        table.add_row(
            s.name,
            s.cron or f"after {', '.join(s.after)}",
            s.timezone,
            s.task_name,
            _state(s),
            _local(s.next_fire_at, s.timezone),
            last,
            s.last_outcome or "",
        )
    new_console().print(table)


@schedules_group.command("show")
@click.argument("name")
@json_option
@click.pass_obj
def schedules_show(loader: AppLoader, name: str, as_json: bool) -> None:
    """Everything about one schedule; the values of sensitive arguments are masked
    (`pgtasks.redaction`), as ``jobs show`` does (``--json``: one schedule object)."""
    try:
        s = loader.get().schedules.get(name)
    except PgtasksError as exc:
        fail(exc)
        return
    if as_json:
        echo_json(schedule_object(s, task_redactor(loader.get(), s.task_name)))
        return
    args, kwargs = task_redactor(loader.get(), s.task_name).call(s.args, s.kwargs)
    table = new_table(show_header=False)
    rows: list[tuple[str, str]] = [
        ("name", s.name),
        ("task", s.task_name),
        ("cron", s.cron or "(none: runs only when triggered)"),
        ("timezone", s.timezone),
        ("after", ", ".join(s.after)),
        ("args", dumps(args)),
        ("kwargs", dumps(kwargs)),
        ("queue", s.queue),
        ("tenant", s.tenant),
        ("lock key", s.lock_key or ""),
        ("overlap", s.overlap),
        ("misfire", s.misfire + (f" (limit {s.catch_up_limit})" if s.misfire == "catch_up" else "")),
        ("max retries", "unlimited" if s.max_retries is None else str(s.max_retries)),
        ("source", s.source),
        ("state", _state(s)),
        ("paused by", f"{s.paused_by} at {_utc(s.paused_at)} UTC" if s.paused else ""),
        ("invalid", s.invalid_reason or ""),
        ("next run", _local(s.next_fire_at, s.timezone)),
        ("last fire time", _local(s.last_fire_at, s.timezone)),
        ("last run", f"#{s.last_run_id} {s.last_run_trigger} {s.last_run_status}" if s.last_run_id else ""),
        ("last outcome", f"{s.last_outcome} (run #{s.last_outcome_run_id})" if s.last_outcome else ""),
    ]
    for key, value in rows:
        if value:
            table.add_row(key, value)
    new_console().print(table)


@schedules_group.command("trigger")
@click.argument("name")
@click.option("--by", "requested_by", default=None, help="Who asks (default: user@host).")
@click.pass_obj
def schedules_trigger(loader: AppLoader, name: str, requested_by: str | None) -> None:
    """Run a schedule now (trigger manual); the next scheduled run is not moved."""
    try:
        result = loader.get().schedules.trigger(name, requested_by=requested_by)
    except PgtasksError as exc:
        fail(exc)
        return
    click.echo(f"schedule {shown(name)}: manual run {result.id} queued")


@schedules_group.command("pause")
@click.argument("name")
@click.option("--by", "paused_by", default=None, help="Who pauses it (default: user@host).")
@click.pass_obj
def schedules_pause(loader: AppLoader, name: str, paused_by: str | None) -> None:
    """Stop a schedule's cron, retry and dependency runs until resumed."""
    try:
        done = loader.get().schedules.pause(name, by=paused_by)
    except PgtasksError as exc:
        fail(exc)
        return
    click.echo(f"schedule {shown(name)}: {'paused' if done else 'already paused'}")


@schedules_group.command("resume")
@click.argument("name")
@click.pass_obj
def schedules_resume(loader: AppLoader, name: str) -> None:
    """Resume a paused schedule from its next fire time after now."""
    try:
        app = loader.get()
        done = app.schedules.resume(name)
        s = app.schedules.get(name)
    except PgtasksError as exc:
        fail(exc)
        return
    state = f"resumed, next run {_local(s.next_fire_at, s.timezone)}" if done else "was not paused"
    click.echo(f"schedule {shown(name)}: {shown(state)}")


@schedules_group.command("delete")
@click.argument("name")
@confirm_options
@click.pass_obj
def schedules_delete(loader: AppLoader, name: str, yes: bool, dry_run: bool) -> None:
    """Delete a schedule (its runs stay; a code-defined one returns at the next sync).

    Asks first at a terminal; refuses when stdin is not a terminal unless ``--yes``
    is given. ``--dry-run`` names the schedule it would delete and deletes nothing.
    """
    try:
        schedules = loader.get().schedules
        s = schedules.get(name)  # an unknown name fails here, before any question
    except PgtasksError as exc:
        fail(exc)
    when = f"cron {s.cron} in {s.timezone}" if s.cron else "no cron"
    what = f"schedule {s.name} (task {s.task_name}, {when})"
    note = "its runs stay" + (
        "; defined in code, the app's next sync creates it again" if s.source == "code" else ""
    )
    if dry_run:
        click.echo(f"would delete {shown(what)}: {note}")
        return
    confirm(f"Delete {what} ({note})?", yes=yes)
    try:
        schedules.delete(name)
    except PgtasksError as exc:
        fail(exc)
    click.echo(f"schedule {shown(name)}: deleted")


@schedules_group.command("history")
@click.argument("name")
@click.option("--page", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--per-page", type=click.IntRange(1, 1000), default=20, show_default=True)
@json_option
@click.pass_obj
def schedules_history(loader: AppLoader, name: str, page: int, per_page: int, as_json: bool) -> None:
    """A schedule's runs, newest first: trigger, attempt, times, outcome, error, progress.

    Error messages and progress are masked (`pgtasks.redaction`: secrets in text,
    sensitive keys and the task's ``redact`` names). ``--json``: an array of run objects.
    """
    try:
        app = loader.get()
        runs = app.schedules.history(name, page=page, per_page=per_page)
        schedule = app.schedules.get(name)
    except PgtasksError as exc:
        fail(exc)
        return
    redactor = task_redactor(app, schedule.task_name)
    if as_json:
        echo_json([run_object(r, redactor) for r in runs])
        return
    table = new_table(
        "run",
        "trigger",
        "attempt",
        "scheduled for",
        "started",
        "duration",
        "status",
        "error",
        "worker",
        "progress",
        "cause",
    )
    for r in runs:
        message = redactor.text(r.error_message or "")
        error = f"{r.error_code} ({r.failure_class}): {message}" if r.error_code else ""
        table.add_row(
            str(r.id),
            r.trigger + (f" by {r.requested_by}" if r.requested_by else ""),
            str(r.attempt),
            _utc(r.scheduled_for),
            _utc(r.started_at),
            "" if r.duration is None else f"{r.duration:.1f}s",
            r.status,
            error[:80],
            r.worker_id or "",
            dumps(redact_data(r.progress, redactor.redact)) if r.progress else "",
            f"#{r.parent_id}" if r.parent_id else "",
        )
    new_console().print(table)
    if len(runs) == per_page:
        click.echo(f"next page: --page {page + 1}")


@schedules_group.command("next")
@click.argument("name")
@click.option("-n", "count", type=click.IntRange(0, 10_000), default=10, show_default=True)
@click.option(
    "--from",
    "start",
    default=None,
    help="ISO time to start from (default now); without an offset it is read in the schedule's zone.",
)
@json_option
@click.pass_obj
def schedules_next(loader: AppLoader, name: str, count: int, start: str | None, as_json: bool) -> None:
    """The next fire times, in the schedule's zone and UTC (check cron and DST before trusting it).

    ``--json``: an array of ``{"fire_at", "local"}`` objects (``[]`` for a schedule
    without cron, which runs only when triggered or after others).
    """
    try:
        app = loader.get()
        s = app.schedules.get(name)
        after = None
        if start is not None:
            try:
                after = dt.datetime.fromisoformat(start)
            except ValueError:
                raise click.BadParameter(f"not an ISO time: {start!r}", param_hint="--from") from None
            if after.tzinfo is None:
                after = after.replace(tzinfo=load_zone(s.timezone))
        times = app.schedules.next_fire_times(name, count, after=after)
    except PgtasksError as exc:
        fail(exc)
        return
    if as_json:
        echo_json([{"fire_at": time_text(t), "local": _local_iso(t, s.timezone)} for t in times])
        return
    if s.cron is None:
        click.echo(
            f"schedule {shown(name)} has no cron expression: it runs after {shown(', '.join(s.after))}"
        )
        return
    for t in times:
        click.echo(shown(_local(t, s.timezone)))
