"""Listing jobs by phase: ``pgtasks jobs list --status claimed`` lists the ``running``
jobs a worker holds ahead and has not started, ``--status running`` those whose body
started, as the status column shows them (`pgtasks.Job.phase`, docs/workers.md
"Claimed and running"); in Python ``App.list_jobs(phase=)`` and a tenant handle's.

The jobs are claimed and started through the worker's own statements (``job_claim_batch``,
``job_start``) on a real database.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

import pgtasks
from pgtasks.cli import cli
from pgtasks.db import Database, JobStore, WorkerStore, text_array_literal
from pgtasks.errors import ConfigurationError


def _list(dsn: str, *args: str) -> Result:
    env = {"COLUMNS": "400", "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return CliRunner().invoke(cli, ["--dsn", dsn, "jobs", "list", *args], env=env, catch_exceptions=False)


def _rows(result: Result) -> dict[int, str]:
    """Job id -> the status column of the table ``jobs list`` printed."""
    assert result.exit_code == 0, result.output
    cells = [[c.strip() for c in line.strip().strip("│").split("│")] for line in result.output.splitlines()]
    return {int(r[0]): r[4] for r in cells if r and r[0].isdigit()}


@pytest.fixture
def held(app: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]) -> dict[str, list[int]]:
    """Jobs in every phase of an unfinished job: three claimed by one worker, one of them
    started; one queued. Returns their ids by phase."""
    task = app.task(name="held")(lambda i: None)
    claimed_ids = [task.apply_async((i,), tenant="acme" if i else "").id for i in range(3)]
    queued = task.apply_async((9,), countdown=3600).id  # not due: no claim takes it
    row = conn.execute("SELECT now() + interval '1 second'").fetchone()
    assert row is not None
    t0: dt.datetime = row[0]
    database = Database(dsn, max_size=2)
    try:
        jobs = JobStore(database)
        WorkerStore(database).register(
            id="w1", host="test", pid=1, queues=["default"], concurrency=1, pool="threads",
            lease_timeout=30.0, now=t0,
        )  # fmt: skip
        got = jobs.claim_batch(
            queues=text_array_literal(["default"]),
            worker_id="w1",
            limit=10,
            max_tenants=10,
            fair=True,
            now=t0,
        )
        assert len(got) == 3
        assert jobs.start(id=claimed_ids[1], worker_id="w1", started=t0.timestamp())
    finally:
        database.close()
    return {
        "claimed": [claimed_ids[0], claimed_ids[2]],
        "running": [claimed_ids[1]],
        "queued": [queued],
    }


def test_jobs_list_filters_by_the_phase_it_shows(held: dict[str, list[int]], dsn: str) -> None:
    everything = _rows(_list(dsn))
    assert everything == {i: phase for phase, ids in held.items() for i in ids}
    for phase, ids in held.items():
        assert _rows(_list(dsn, "--status", phase)) == dict.fromkeys(ids, phase), phase
    listed = json.loads(_list(dsn, "--status", "claimed", "--json").output)
    assert sorted(j["id"] for j in listed) == held["claimed"]
    assert {(j["status"], j["phase"]) for j in listed} == {("running", "claimed")}
    assert _rows(_list(dsn, "--status", "claimed", "--tenant", "acme")) == {held["claimed"][1]: "claimed"}
    assert _rows(_list(dsn, "--status", "succeeded")) == {}


def test_list_jobs_takes_a_phase_and_keeps_status_as_stored(
    app: pgtasks.App, held: dict[str, list[int]]
) -> None:
    def ids(jobs: list[pgtasks.Job]) -> list[int]:
        return sorted(j.id for j in jobs)

    assert ids(app.list_jobs(phase="claimed")) == held["claimed"]
    assert ids(app.list_jobs(phase="running")) == held["running"]
    assert ids(app.list_jobs(phase="queued")) == held["queued"]
    # status is the column as stored: a claimed job is running
    assert ids(app.list_jobs(status="running")) == sorted(held["claimed"] + held["running"])
    assert ids(app.tenant("acme").list_jobs(phase="claimed")) == [held["claimed"][1]]
    assert ids(app.tenant("acme").list_jobs(phase="running")) == held["running"]
    with pytest.raises(ConfigurationError, match="give status or phase, not both"):
        app.list_jobs(status="running", phase="claimed")
    with pytest.raises(ConfigurationError, match="phase must be one of"):
        app.list_jobs(phase="started")
