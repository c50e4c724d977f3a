"""Read-only views on a streaming standby: ``--read-dsn`` / ``PGTASKS_READ_DSN``.

A private primary and a hot standby streaming from it (`cluster.primary_and_standby`).
The read-only commands (``jobs list``, ``jobs show``, ``queues``, ``workers``) and the
dashboard's pages read on the standby; commands that write (``jobs cancel``) still
go to the primary. With the standby's replay paused, a job enqueued on the primary
is absent from the views (they do read the standby), and present once replay
resumes (they see rows written on the primary, after replay).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from apps.ha_app import make_app
from click.testing import CliRunner, Result
from cluster import Server, primary_and_standby, wait_replayed
from helpers import eventually

import pgtasks
from pgtasks.cli import cli
from pgtasks.errors import ConfigurationError
from pgtasks.loader import AppLoader

APP_SPEC = "tests.apps.ha_app:app"
SECRET = "s3cret-pw"


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Server, Server]]:
    with primary_and_standby(synchronous=False) as servers:
        yield servers


@pytest.fixture
def databases(pair: tuple[Server, Server]) -> Iterator[tuple[str, str]]:
    """A fresh migrated database on the primary: (its DSN, the standby's DSN of it),
    replayed on the standby."""
    primary, standby = pair
    name = f"r_{abs(hash(object()))}"
    with psycopg.connect(primary.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    app = make_app(primary.dsn(name))
    app.migrate()
    app.close()
    wait_replayed(primary.dsn(), standby.dsn())
    yield primary.dsn(name), standby.dsn(name)
    with psycopg.connect(standby.dsn(), autocommit=True) as replica:
        replica.execute("SELECT pg_wal_replay_resume()")
    with psycopg.connect(primary.dsn(), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


def run(dsn: str, *args: str, read_dsn: str | None = None, env_read_dsn: str | None = None) -> Result:
    """``pgtasks -A ha_app --dsn DSN [--read-dsn R] ARGS`` in process."""
    sys.modules.pop(APP_SPEC.partition(":")[0], None)  # a module's app keeps its first database
    prefix = ["-A", APP_SPEC, "--dsn", dsn] + (["--read-dsn", read_dsn] if read_dsn else [])
    env = {"COLUMNS": "400", "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1", "PGTASKS_READ_DSN": env_read_dsn}
    return CliRunner().invoke(cli, [*prefix, *args], env=env, catch_exceptions=False)


def run_json(dsn: str, *args: str, **options: Any) -> Any:
    result = run(dsn, *args, "--json", **options)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def replay(standby_dsn: str, *, paused: bool) -> None:
    with psycopg.connect(standby_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_pause()" if paused else "SELECT pg_wal_replay_resume()")
        if paused:
            eventually(
                lambda: conn.execute("SELECT pg_get_wal_replay_pause_state()").fetchone() == ("paused",),
                message="replay paused",
            )


def test_read_only_commands_read_the_standby_and_writes_go_to_the_primary(
    databases: tuple[str, str], pair: tuple[Server, Server]
) -> None:
    primary_dsn, standby_dsn = databases
    primary, standby = pair
    app = make_app(primary_dsn)
    try:
        early = app.tasks["ha.record"].apply_async(args=(1,), queue="replicated").id
        wait_replayed(primary.dsn(), standby.dsn())
        replay(standby_dsn, paused=True)
        late = app.tasks["ha.record"].apply_async(args=(2,), queue="replicated").id
        # The primary has both; the standby, replay paused, only the first.
        assert [j["id"] for j in run_json(primary_dsn, "jobs", "list")] == [late, early]
        on_standby = run_json(primary_dsn, "jobs", "list", read_dsn=standby_dsn)
        assert [j["id"] for j in on_standby] == [early]
        assert [j["id"] for j in run_json(primary_dsn, "jobs", "list", env_read_dsn=standby_dsn)] == [early]
        assert run(primary_dsn, "jobs", "show", str(late), read_dsn=standby_dsn).exit_code == 1
        assert run_json(primary_dsn, "jobs", "show", str(early), read_dsn=standby_dsn)["id"] == early
        queues = {q["queue"]: q["counts"] for q in run_json(primary_dsn, "queues", read_dsn=standby_dsn)}
        assert queues["replicated"]["queued"] == 1
        assert run_json(primary_dsn, "workers", read_dsn=standby_dsn) == []
        metrics = run(primary_dsn, "--plugin", "pgtasks_metrics.plugin", "metrics", read_dsn=standby_dsn)
        assert metrics.exit_code == 0, metrics.output
        queued = re.findall(
            r'^pgtasks_jobs\{queue="replicated",status="queued"\} ([0-9.]+)$', metrics.output, re.M
        )
        assert queued == ["1.0"], metrics.output
        # A command that writes goes to the primary, whatever the read DSN.
        cancelled = run(primary_dsn, "jobs", "cancel", str(late), read_dsn=standby_dsn)
        assert cancelled.exit_code == 0, cancelled.output
        assert app.get_job(late).status == "cancelled"
        # Replay resumed: the standby shows what the primary wrote.
        replay(standby_dsn, paused=False)
        wait_replayed(primary.dsn(), standby.dsn())
        shown = run_json(primary_dsn, "jobs", "show", str(late), read_dsn=standby_dsn)
        assert (shown["id"], shown["status"]) == (late, "cancelled")
        assert [j["id"] for j in run_json(primary_dsn, "jobs", "list", read_dsn=standby_dsn)] == [late, early]
    finally:
        app.close()


def test_the_dashboard_reads_the_standby(databases: tuple[str, str], pair: tuple[Server, Server]) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from pgtasks.dashboard import create_app

    primary_dsn, standby_dsn = databases
    primary, standby = pair
    loader = AppLoader(app_spec=None, dsn=primary_dsn, plugins=(), read_dsn=standby_dsn)
    app = loader.get()
    try:
        shown = make_app(primary_dsn)
        job = shown.tasks["ha.record"].delay(7).id
        shown.close()
        replay(standby_dsn, paused=True)
        hidden = make_app(primary_dsn)
        unseen = hidden.tasks["ha.record"].delay(8).id
        hidden.close()
        reader = loader.reader()
        assert reader is not app and reader.settings.dsn == standby_dsn
        with TestClient(create_app(app, read_app=reader)) as tc:
            page = tc.get("/jobs")
            assert re.findall(r'<tr data-job="(\d+)">', page.text) == [str(job)]
            assert "reading from a replica" in page.text
            replay(standby_dsn, paused=False)
            wait_replayed(primary.dsn(), standby.dsn())
            page = tc.get("/jobs")
            assert re.findall(r'<tr data-job="(\d+)">', page.text) == [str(unseen), str(job)]
    finally:
        loader.close()


def test_the_settings_past_one_server_come_from_the_environment_and_no_dsn_is_shown(tmp_path: Any) -> None:
    read = f"postgresql://reader:{SECRET}@replica.example:5432/app"
    settings = pgtasks.Settings.from_env(
        "postgresql:///app", environ={"PGTASKS_READ_DSN": read, "PGTASKS_PREPARE_THRESHOLD": "off"}
    )
    assert settings.read_dsn == read and settings.prepare_threshold is None
    assert settings.resolve_read_dsn() == read
    assert SECRET not in repr(settings)
    assert (
        pgtasks.Settings.from_env("postgresql:///app", environ={}).resolve_read_dsn() == "postgresql:///app"
    )
    assert (
        pgtasks.Settings.from_env(
            "postgresql:///a", environ={"PGTASKS_PREPARE_THRESHOLD": "0"}
        ).prepare_threshold
        == 0
    )
    assert pgtasks.Settings.from_env("postgresql:///a", environ={"PGTASKS_LISTEN": "off"}).listen is False
    assert pgtasks.Settings.from_env("postgresql:///a", environ={}).listen is True
    with pytest.raises(ConfigurationError, match="PGTASKS_LISTEN must be on or off"):
        pgtasks.Settings.from_env("postgresql:///a", environ={"PGTASKS_LISTEN": "sometimes"})
    for bad in ("-1", "soon", "1.5"):
        with pytest.raises(ConfigurationError, match="PGTASKS_PREPARE_THRESHOLD must be"):
            pgtasks.Settings.from_env("postgresql:///a", environ={"PGTASKS_PREPARE_THRESHOLD": bad})
    with pytest.raises(ConfigurationError, match="read_dsn") as info:
        pgtasks.Settings(dsn="postgresql:///a", read_dsn="x\x00" + SECRET)
    assert SECRET not in str(info.value)
    with pytest.raises(ConfigurationError, match="read_dsn"):
        pgtasks.Settings(dsn="postgresql:///a", read_dsn="  ")
    with pytest.raises(ConfigurationError, match="listen"):
        pgtasks.Settings(dsn="postgresql:///a", listen="no")  # type: ignore[arg-type]
