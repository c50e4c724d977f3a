"""The run: every available system, every figure, repetitions interleaved.

Order: for each repetition, each system in turn (A B C D A B C D ...), and within a
system every figure. Each system gets a fresh template database per repetition
(``bench_<pid>_<system>_<rep>``, migrated by its driver; ``<pid>`` keeps concurrent
runs apart), each figure a clone of it (``..._<figure>``); all are dropped afterwards.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import pg
from benchmarks.environments import (
    EnvironmentUnavailable,
    check_services,
    compile_project,
    interpreter_for,
    redis_version,
)
from benchmarks.figures import BASE_DEADLINE, RUNS, MissingInput
from benchmarks.invoke import run_op
from benchmarks.machine import machine_info
from benchmarks.registry import Adapter, load
from benchmarks.sizes import Sizes


@dataclass(frozen=True, slots=True)
class RunConfig:
    """Everything a run needs; built by the CLI.

    ``dsn`` is an admin DSN (its database is used for CREATE/DROP DATABASE only);
    ``redis_url`` names the Redis database the Celery peer may flush.
    """

    dsn: str
    redis_url: str
    systems: tuple[str, ...]
    sizes: Sizes
    mode: str
    reps: int
    command: str
    install: bool = True


@dataclass(slots=True)
class _Active:
    adapter: Adapter
    python: Path


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _prepare(config: RunConfig, results: dict[str, Any]) -> dict[str, _Active]:
    active: dict[str, _Active] = {}
    for name in config.systems:
        entry: dict[str, Any] = {"status": "skipped", "note": "", "runs": {}}
        results["systems"][name] = entry
        adapter = load(name)
        if adapter is None:
            entry["note"] = "adapter not present"
            _log(f"{name}: skipped (adapter not present)")
            continue
        entry["settings"] = adapter.spec.settings
        entry["notes"] = adapter.spec.notes
        entry["has_tables"] = adapter.spec.has_tables
        try:
            check_services(adapter.spec, config.redis_url)
            _log(f"{name}: preparing environment")
            python = interpreter_for(adapter.spec, install=config.install)
        except EnvironmentUnavailable as exc:
            entry["note"] = str(exc)
            _log(f"{name}: skipped ({exc})")
            continue
        versions = run_op(python, adapter.module, "versions", dsn="", redis_url="", deadline=60)
        if not versions.ok:
            entry["note"] = f"driver does not start: {versions.error}"
            _log(f"{name}: skipped ({entry['note']})")
            continue
        entry["versions"] = versions.result
        entry["status"] = "ok"
        active[name] = _Active(adapter, python)
    return active


def _run_system_rep(config: RunConfig, name: str, system: _Active, rep: int, entry: dict[str, Any]) -> None:
    template = f"bench_{os.getpid()}_{name}_{rep}"
    try:
        template_dsn = pg.create_database(config.dsn, template)
        setup = run_op(
            system.python,
            system.adapter.module,
            "setup",
            dsn=template_dsn,
            redis_url=config.redis_url,
            deadline=BASE_DEADLINE,
        )
    except Exception as exc:
        setup_error = f"{type(exc).__name__}: {exc}"
    else:
        setup_error = "" if setup.ok else f"setup failed: {setup.error}"
    if setup_error:
        _log(f"rep {rep} {name}: every figure n/a ({setup_error[:300]})")
    earlier: dict[str, dict[str, Any]] = {}  # this repetition's results so far, by run key
    try:
        for run in RUNS:
            record: dict[str, Any] = {"rep": rep, "ok": False, "result": {}, "error": setup_error}
            entry["runs"].setdefault(run.key, []).append(record)
            if setup_error:
                continue
            args = run.args(config.sizes)
            if run.derive is not None:
                try:
                    args.update(run.derive(earlier))
                except MissingInput as exc:
                    record["error"] = str(exc)
                    _log(f"rep {rep} {name} {run.key}: n/a ({exc})")
                    continue
            database = f"{template}_{run.key}"
            deadline = run.deadline(config.sizes)
            try:
                dsn = pg.create_database(config.dsn, database, template=template)
                outcome = run_op(
                    system.python,
                    system.adapter.module,
                    run.op,
                    dsn=dsn,
                    redis_url=config.redis_url,
                    deadline=deadline,
                    args=args,
                )
                record.update(ok=outcome.ok, result=outcome.result, error=outcome.error)
                if outcome.ok:
                    earlier[run.key] = outcome.result
                if outcome.ok and run.table_size and system.adapter.spec.has_tables:
                    record["result"]["table_bytes"] = pg.user_tables_bytes(dsn)
                state = "ok" if outcome.ok else f"n/a ({outcome.error[:200]})"
                _log(f"rep {rep} {name} {run.key}: {state} [{outcome.seconds:.1f} s]")
            except Exception as exc:
                record.update(ok=False, error=f"{type(exc).__name__}: {exc}")
                _log(f"rep {rep} {name} {run.key}: n/a ({record['error']})")
            finally:
                pg.drop_database(config.dsn, database)
    finally:
        pg.drop_database(config.dsn, template)


def run(config: RunConfig) -> dict[str, Any]:
    """Measure every figure of every available system; return the raw results.

    Raises psycopg.OperationalError when PostgreSQL at ``config.dsn`` is unreachable.
    """
    pg.check_reachable(config.dsn)
    compile_project()  # every driver runs the project's modules from the source tree
    started = time.time()
    results: dict[str, Any] = {
        "command": config.command,
        "mode": config.mode,
        "reps": config.reps,
        "sizes": {k: getattr(config.sizes, k) for k in config.sizes.__slots__},
        "started": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "postgres": pg.server_settings(config.dsn),
        "redis_url": config.redis_url,
        "systems": {},
    }
    try:
        results["redis"] = redis_version(config.redis_url)
    except EnvironmentUnavailable as exc:
        results["redis"] = f"absent ({exc})"
    active = _prepare(config, results)
    for rep in range(1, config.reps + 1):
        for name, system in active.items():
            _run_system_rep(config, name, system, rep, results["systems"][name])
    results["duration_s"] = time.time() - started
    return results
