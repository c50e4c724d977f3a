"""Migrations: idempotent, safe to run concurrently, and the same schema as the DBA script."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from helpers import eventually, scratch_database
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgtasks
from pgtasks.errors import DatabaseError
from pgtasks.migrate import migration_sql, migrations, pending
from pgtasks.states import TRANSITIONS, UNFINISHED, JobStatus, Trigger

ALL = [f"{m.version:04d}_{m.name}" for m in migrations()]
LOCK_KEY = "hashtext('pgtasks.migrate')"


def _app(dsn: str) -> pgtasks.App:
    return pgtasks.App("migrate-test", dsn=dsn, load_entry_points=False)


@pytest.fixture
def second_empty_dsn(admin_dsn: str) -> Iterator[str]:
    """Another fresh database without the pgtasks schema."""
    with scratch_database(admin_dsn, prefix="pgtasks_e2") as url:
        yield url


def _applied_rows(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        return [
            (int(v), str(n))
            for v, n in conn.execute(
                "SELECT version, name FROM pgtasks.migrations ORDER BY version"
            ).fetchall()
        ]


# -- the files themselves ------------------------------------------------------------------


def test_migrations_are_numbered_from_one_without_gaps() -> None:
    versions = [m.version for m in migrations()]
    assert versions == list(range(1, len(versions) + 1))
    for m in migrations():
        assert re.fullmatch(r"[a-z0-9_]+", m.name)
        assert m.sql.strip()


# -- idempotence -------------------------------------------------------------------------------


def test_migrate_on_an_empty_database_applies_everything_once(empty_dsn: str) -> None:
    app = _app(empty_dsn)
    try:
        assert [f"{m.version:04d}_{m.name}" for m in pending(app.stores)] == ALL
        assert app.migrate() == ALL
        assert app.migrate() == []
        assert app.migrate() == []
        assert pending(app.stores) == []
    finally:
        app.close()
    assert _applied_rows(empty_dsn) == [(m.version, m.name) for m in migrations()]


def test_migrate_on_a_current_database_does_nothing(app: pgtasks.App, dsn: str) -> None:
    before = _applied_rows(dsn)
    assert app.migrate() == []
    assert _applied_rows(dsn) == before


def test_migrate_by_a_role_that_may_not_create_schemas_passes_on_a_current_database(
    app: pgtasks.App, dsn: str, admin_dsn: str
) -> None:
    """A fleet role other than the owner (it may use the tables, not create schemas)
    runs `pgtasks migrate` at deploy: with nothing pending it must not fail on the
    bootstrap, which PostgreSQL refuses to that role even when the schema exists."""
    role = f"pgtasks_user_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER").format(sql.Identifier(role)))
    try:
        who = sql.Identifier(role)
        with psycopg.connect(dsn, autocommit=True) as conn:
            database = sql.Identifier(str(conninfo_to_dict(dsn)["dbname"]))
            conn.execute(sql.SQL("REVOKE CREATE ON DATABASE {} FROM PUBLIC").format(database))
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA pgtasks TO {}").format(who))
            conn.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA pgtasks TO {}").format(who))
        with (
            pytest.raises(psycopg.errors.InsufficientPrivilege),  # what the bootstrap met before
            psycopg.connect(make_conninfo(dsn, user=role)) as user_conn,
        ):
            user_conn.execute("CREATE SCHEMA IF NOT EXISTS pgtasks")
        user_app = _app(make_conninfo(dsn, user=role))
        try:
            assert user_app.migrate() == []
        finally:
            user_app.close()
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_migrated_schema_accepts_a_job(empty_dsn: str) -> None:
    app = _app(empty_dsn)
    try:
        app.migrate()
        t = app.task(name="t")(len)
        assert app.get_job(t.delay("x").id).args == ["x"]
    finally:
        app.close()


# -- concurrency -------------------------------------------------------------------------------


def _waiting_on_migration_lock(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_concurrent_migrate_from_threads_applies_once(empty_dsn: str) -> None:
    n = 6
    results: list[list[str]] = []
    errors: list[BaseException] = []
    apps = [_app(empty_dsn) for _ in range(n)]

    def run(app: pgtasks.App) -> None:
        try:
            results.append(app.migrate())
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    # Hold the migration lock so every thread is provably waiting at the same time.
    with psycopg.connect(empty_dsn, autocommit=True) as holder:
        holder.execute(f"SELECT pg_advisory_lock({LOCK_KEY})")
        threads = [threading.Thread(target=run, args=(a,), name=f"migrate-{i}") for i, a in enumerate(apps)]
        for t in threads:
            t.start()
        eventually(lambda: _waiting_on_migration_lock(empty_dsn) == n, message="all threads waiting")
        holder.execute(f"SELECT pg_advisory_unlock({LOCK_KEY})")
        for t in threads:
            t.join(timeout=60)
    for a in apps:
        a.close()
    assert errors == []
    assert len(results) == n
    assert sorted(name for r in results for name in r) == ALL  # each applied by exactly one caller
    assert _applied_rows(empty_dsn) == [(m.version, m.name) for m in migrations()]


_CHILD = """
import json, sys
import pgtasks
app = pgtasks.App("child", dsn=sys.argv[1], load_entry_points=False)
try:
    print(json.dumps(app.migrate()))
finally:
    app.close()
"""


def test_concurrent_migrate_from_processes_applies_once(empty_dsn: str) -> None:
    n = 4
    env = {**os.environ, "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    with psycopg.connect(empty_dsn, autocommit=True) as holder:
        holder.execute(f"SELECT pg_advisory_lock({LOCK_KEY})")
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _CHILD, empty_dsn],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(n)
        ]
        try:
            eventually(
                lambda: _waiting_on_migration_lock(empty_dsn) == n,
                timeout=60,
                message="all processes waiting",
            )
        finally:
            holder.execute(f"SELECT pg_advisory_unlock({LOCK_KEY})")
        outputs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    # Each migration runs in its own locked transaction, so callers may share the work,
    # but every migration is applied by exactly one of them.
    applied = [name for out, _ in outputs for name in json.loads(out)]
    assert sorted(applied) == ALL
    assert _applied_rows(empty_dsn) == [(m.version, m.name) for m in migrations()]


# -- the DBA script builds the same schema ----------------------------------------------------

CATALOG_QUERIES: dict[str, str] = {
    "schemas": "SELECT nspname FROM pg_namespace WHERE nspname = 'pgtasks'",
    "tables": """
        SELECT table_name, table_type FROM information_schema.tables
        WHERE table_schema = 'pgtasks' ORDER BY table_name""",
    "columns": """
        SELECT table_name, column_name, ordinal_position, data_type, udt_name, column_default,
               is_nullable, is_identity, identity_generation, identity_start, identity_increment,
               character_maximum_length, numeric_precision, collation_name, is_generated,
               generation_expression
        FROM information_schema.columns
        WHERE table_schema = 'pgtasks' ORDER BY table_name, ordinal_position""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = 'pgtasks' ORDER BY tablename, indexname""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid), condeferrable,
               condeferred, convalidated
        FROM pg_constraint WHERE connamespace = 'pgtasks'::regnamespace ORDER BY 1, 2""",
    "sequences": """
        SELECT sequencename, data_type::text, start_value, increment_by, min_value, max_value, cycle
        FROM pg_sequences WHERE schemaname = 'pgtasks' ORDER BY sequencename""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
        FROM pg_proc p WHERE p.pronamespace = 'pgtasks'::regnamespace ORDER BY 1, 2""",
    "triggers": """
        SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger
        WHERE NOT tgisinternal AND tgrelid IN (
            SELECT oid FROM pg_class WHERE relnamespace = 'pgtasks'::regnamespace)
        ORDER BY 1, 2""",
    "views": "SELECT viewname, definition FROM pg_views WHERE schemaname = 'pgtasks' ORDER BY 1",
    "types": """
        SELECT t.typname, t.typtype FROM pg_type t
        WHERE t.typnamespace = 'pgtasks'::regnamespace AND t.typtype IN ('e', 'd', 'c')
          AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.reltype = t.oid)
        ORDER BY 1""",
    "migrations": "SELECT version, name FROM pgtasks.migrations ORDER BY version",
}


def _catalog(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(dsn) as conn:
        return {name: conn.execute(query).fetchall() for name, query in CATALOG_QUERIES.items()}


def test_dba_script_builds_the_same_catalog_as_migrate(empty_dsn: str, second_empty_dsn: str) -> None:
    app = _app(empty_dsn)
    try:
        assert app.migrate() == ALL  # one transaction per migration, step by step
    finally:
        app.close()
    script = migration_sql()
    with psycopg.connect(second_empty_dsn, autocommit=True) as conn:
        conn.execute(script.encode())  # what `pgtasks migrate --sql | psql` runs
    stepwise, scripted = _catalog(empty_dsn), _catalog(second_empty_dsn)
    assert stepwise["tables"], "the catalog queries see the schema"
    assert stepwise["columns"] and stepwise["indexes"] and stepwise["constraints"]
    for name in CATALOG_QUERIES:
        assert scripted[name] == stepwise[name], name

    # A database built from the script counts as current.
    app = _app(second_empty_dsn)
    try:
        assert app.migrate() == []
    finally:
        app.close()


def test_dba_script_is_one_transaction(second_empty_dsn: str) -> None:
    script = migration_sql()
    assert script.startswith("BEGIN;")
    assert script.rstrip().endswith("COMMIT;")
    for m in migrations():
        assert f"-- {m.version:04d}_{m.name}" in script
    # A failure anywhere leaves nothing behind.
    broken = script.replace("COMMIT;", "SELECT 1/0;\nCOMMIT;")
    with psycopg.connect(second_empty_dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute(broken.encode())
        conn.execute("ROLLBACK")
        row = conn.execute("SELECT to_regnamespace('pgtasks') IS NULL").fetchone()
    assert row == (True,)


# -- states are enforced by the database -------------------------------------------------------


def _check_values(dsn: str, constraint: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = %s "
            "AND conrelid = 'pgtasks.jobs'::regclass",
            (constraint,),
        ).fetchone()
    assert row is not None, constraint
    return set(re.findall(r"'([a-z_]+)'::text", row[0]))


def test_transition_table_matches_the_status_check(dsn: str) -> None:
    db_statuses = _check_values(dsn, "jobs_status_known")
    assert db_statuses == {s.value for s in JobStatus}
    assert set(TRANSITIONS) == set(JobStatus)
    for targets in TRANSITIONS.values():
        assert targets <= set(JobStatus)


def test_trigger_enum_matches_the_trigger_check(dsn: str) -> None:
    assert _check_values(dsn, "jobs_trigger_known") == {t.value for t in Trigger}


def test_database_rejects_an_unknown_status(app: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    job_id = app.task(name="t")(len).delay("x").id
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_status_known"):
        conn.execute(
            "UPDATE pgtasks.jobs SET status = 'exploded', finished_at = now() WHERE id = %s", (job_id,)
        )
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_status_known"):
        conn.execute(
            "UPDATE pgtasks.jobs SET status = 'QUEUED', finished_at = now() WHERE id = %s", (job_id,)
        )
    # Every other status the database accepts is one the code knows.
    for status in JobStatus:
        finished = "NULL" if status in UNFINISHED else "now()"
        worker = "'w'" if status == JobStatus.RUNNING else "NULL"
        conn.execute(
            f"UPDATE pgtasks.jobs SET status = %s, finished_at = {finished}, worker_id = {worker}, "
            "started_at = now() WHERE id = %s",
            (status.value, job_id),
        )


def test_database_rejects_inconsistent_rows(app: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    job_id = app.task(name="t")(len).delay("x").id
    # running without a worker
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_running_has_worker"):
        conn.execute("UPDATE pgtasks.jobs SET status = 'running' WHERE id = %s", (job_id,))
    # finished without a finish time
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_finished_iff_terminal"):
        conn.execute("UPDATE pgtasks.jobs SET status = 'succeeded' WHERE id = %s", (job_id,))
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_trigger_known"):
        conn.execute("UPDATE pgtasks.jobs SET trigger = 'cron' WHERE id = %s", (job_id,))


def test_store_wraps_database_errors(app: pgtasks.App) -> None:
    with pytest.raises(DatabaseError) as info:
        app.stores.jobs.get(id="not a number")  # type: ignore[arg-type]
    assert info.value.sqlstate == "22P02"
    assert info.value.transient is False
