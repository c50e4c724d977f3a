"""Row-level security mode (`pgtasks.isolation`): PostgreSQL itself keeps tenants apart.

The tenant-facing code connects as its own role ("web": not a superuser, not in the
fleet), granted with ``pgtasks rls grant``. With the mode on, raw SQL through tenant
a's connection sees, changes and writes none of tenant b's rows; a connection that
names no tenant sees nothing; the tenant handle's API works as without the mode; the
fleet (here a non-superuser role too) sees every row and its workers run every
tenant's jobs. Tables that a migration adds later join the mode.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgtasks
import pgtasks_index
import pgtasks_index.plugin
from pgtasks import isolation
from pgtasks.cli import cli
from pgtasks.enqueue import COPY_THRESHOLD
from pgtasks.errors import ConfigurationError, DatabaseError, JobNotFound
from pgtasks.settings import Settings
from pgtasks.states import JobStatus
from pgtasks.worker import Worker, WorkerConfig

A, B = "tenant-a", "tenant-b"
JOBS = 20


def _as_role(dsn: str, role: str) -> str:
    params = conninfo_to_dict(dsn)
    params["user"] = role
    return make_conninfo("", **params)


def _app(dsn: str, *, index: bool = True, migrate: bool = False) -> pgtasks.App:
    app = pgtasks.App(
        "rls", dsn=dsn, load_entry_points=False, plugins=[pgtasks_index.plugin] if index else []
    )

    @app.task(name="t.work", queue="work")
    def work(n: int) -> int:
        return n

    if migrate:
        app.migrate()
    return app


@pytest.fixture
def roles(admin_dsn: str) -> Iterator[dict[str, str]]:
    """Two login roles of this test alone: ``web`` (tenant-facing) and ``fleet``
    (runs workers), neither a superuser. Dropped after the test's database."""
    suffix = uuid.uuid4().hex[:8]
    names = {"web": f"pgtasks_web_{suffix}", "fleet": f"pgtasks_fleet_{suffix}"}
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for name in names.values():
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOBYPASSRLS").format(sql.Identifier(name)))
    yield names
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for name in names.values():
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


@pytest.fixture
def setup(roles: dict[str, str], dsn: str) -> Iterator[dict[str, Any]]:
    """The owner's app (migrated with the index plugin, mode on, fleet = owner and the
    fleet role), the web role granted, and JOBS jobs of each tenant enqueued through
    the web role's tenant handles."""
    owner = _app(dsn, migrate=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        fleet = sql.Identifier(roles["fleet"])
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA pgtasks, pgtasks_index TO {}").format(fleet))
        conn.execute(sql.SQL("GRANT ALL ON ALL TABLES IN SCHEMA pgtasks, pgtasks_index TO {}").format(fleet))
        conn.execute(
            sql.SQL("GRANT ALL ON ALL SEQUENCES IN SCHEMA pgtasks, pgtasks_index TO {}").format(fleet)
        )
        current = conn.execute("SELECT current_user").fetchone()
        assert current is not None
    tables = isolation.enable(owner.stores, [current[0], roles["fleet"]])
    assert {"pgtasks.jobs", "pgtasks.schedules", "pgtasks_index.entries"} <= set(tables)
    assert tables == _tables_with_a_tenant(dsn)
    assert isolation.grant_tenant_role(owner.stores, roles["web"]) == tables
    web = _app(_as_role(dsn, roles["web"]))
    ids = {t: [r.id for r in web.tenant(t).bind("t.work").delay_many(range(JOBS))] for t in (A, B)}
    yield {"owner": owner, "web": web, "ids": ids, "dsn": dsn, "roles": roles}
    web.close()
    owner.close()


def _tables_with_a_tenant(dsn: str) -> list[str]:
    """The tables of pgtasks' schemas that have a tenant column, as the catalog lists them."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT c.table_schema || '.' || c.table_name FROM information_schema.columns c"
            " JOIN information_schema.tables t USING (table_schema, table_name)"
            " WHERE c.column_name = 'tenant' AND t.table_type = 'BASE TABLE'"
            " AND (c.table_schema = 'pgtasks' OR c.table_schema LIKE 'pgtasks\\_%')"
            " ORDER BY c.table_schema, c.table_name"
        ).fetchall()
    return [str(r[0]) for r in rows]


def _count_by_tenant(conn: psycopg.Connection[Any], table: str = "pgtasks.jobs") -> dict[str, int]:
    query = sql.SQL("SELECT tenant, count(*) FROM {} GROUP BY tenant").format(sql.SQL(table))
    return {str(t): int(n) for t, n in conn.execute(query)}


def _rows(dsn: str, tenant: str) -> list[tuple[Any, ...]]:
    """Every column of every job of ``tenant`` as the owner sees them (a superuser)."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT j::text FROM pgtasks.jobs j WHERE tenant = %s ORDER BY id", (tenant,)
        ).fetchall()


def test_raw_sql_through_a_tenants_connection_sees_and_changes_only_its_rows(setup: dict[str, Any]) -> None:
    web, dsn = setup["web"], setup["dsn"]
    b_before = _rows(dsn, B)
    assert len(b_before) == JOBS
    with web.tenant(A).connection() as conn:
        assert _count_by_tenant(conn) == {A: JOBS}
        assert conn.execute(
            "SELECT count(*) FROM pgtasks.jobs WHERE id = ANY(%s)", (setup["ids"][B],)
        ).fetchone() == (0,)
        touched = conn.execute("UPDATE pgtasks.jobs SET priority = 9 WHERE tenant = %s", (B,)).rowcount
        assert touched == 0
        assert conn.execute("UPDATE pgtasks.jobs SET priority = 9").rowcount == JOBS  # its own rows only
    with pytest.raises(DatabaseError, match="permission denied"), web.tenant(A).connection() as conn:
        conn.execute("DELETE FROM pgtasks.jobs")  # tenant roles get no DELETE at all
    assert _rows(dsn, B) == b_before


def test_a_tenants_connection_cannot_write_a_row_of_another_tenant(setup: dict[str, Any]) -> None:
    web, dsn = setup["web"], setup["dsn"]
    a_id = setup["ids"][A][0]
    with pytest.raises(DatabaseError, match="row-level security"), web.tenant(A).connection() as conn:
        conn.execute("UPDATE pgtasks.jobs SET tenant = %s WHERE id = %s", (B, a_id))
    with pytest.raises(DatabaseError, match="row-level security"), web.tenant(A).connection() as conn:
        conn.execute(
            "INSERT INTO pgtasks.jobs (task_name, queue, tenant) VALUES ('t.work', 'work', %s)", (B,)
        )
    assert len(_rows(dsn, B)) == JOBS
    assert {r[0] for r in _rows(dsn, A) if str(a_id) in r[0]}  # a's row kept its tenant


def test_a_connection_that_names_no_tenant_sees_nothing(setup: dict[str, Any]) -> None:
    web, dsn, roles = setup["web"], setup["dsn"], setup["roles"]
    with psycopg.connect(_as_role(dsn, roles["web"]), autocommit=True) as conn:
        assert _count_by_tenant(conn) == {}
        # After a transaction that named a tenant, PostgreSQL leaves the setting at ''
        # on the session: it must not match the untenanted rows ('').
        with conn.transaction():
            conn.execute("SELECT set_config('pgtasks.tenant', %s, true)", (A,))
            assert _count_by_tenant(conn) == {A: JOBS}
        assert conn.execute("SELECT current_setting('pgtasks.tenant', true)").fetchone() == ("",)
        assert _count_by_tenant(conn) == {}
    setup["owner"].get_task("t.work").delay(1)  # an untenanted job
    assert web.list_jobs(limit=500) == []  # the unscoped API, through the web role: fail closed
    with pytest.raises(JobNotFound):
        web.get_job(setup["ids"][A][0])


def test_the_tenant_handle_works_as_without_the_mode(setup: dict[str, Any]) -> None:
    web = setup["web"]
    a, b_ids = web.tenant(A), setup["ids"][B]
    a_ids = setup["ids"][A]
    assert {j.id for j in a.list_jobs(limit=500)} == set(a_ids)
    assert a.get_job(a_ids[0]).tenant == A
    assert a.AsyncResult(a_ids[0]).status == JobStatus.QUEUED
    # Why a job waits, as its tenant may ask: no worker serves its queue here.
    assert "no_worker" in a.explain(a_ids[1]).codes
    assert a.cancel_job(a_ids[0]) == "cancelled"
    assert a.requeue(a_ids[0], by="admin:alice")
    for call in (a.get_job, a.cancel, a.requeue):
        with pytest.raises(JobNotFound):
            call(b_ids[0])
    # Enqueue in the caller's own transaction of the tenant.
    with a.connection() as conn:
        result = a.apply_async("t.work", (7,), connection=conn)
        assert conn.execute("SELECT tenant FROM pgtasks.jobs WHERE id = %s", (result.id,)).fetchone() == (A,)
    assert a.get_job(result.id).tenant == A
    # A unique key held by b: refused, and b's job does not show through the refusal.
    web.tenant(B).apply_async("t.work", (1,), unique_key="report")
    with pytest.raises(pgtasks.errors.AlreadyQueued) as refused:
        a.apply_async("t.work", (1,), unique_key="report")
    assert refused.value.job_id == -1


def test_an_enqueue_by_a_handle_leaves_the_callers_transaction_to_its_own_tenant(
    setup: dict[str, Any],
) -> None:
    """A handle's statements in the caller's transaction (``connection=``) say their
    tenant for themselves only: afterwards the transaction is again the caller's (a
    transaction of tenant a sees a's rows, not b's; one that named no tenant sees none)."""
    web, dsn, roles = setup["web"], setup["dsn"], setup["roles"]
    a, b = web.tenant(A), web.tenant(B)
    with a.connection() as conn:
        one = b.apply_async("t.work", (1,), connection=conn)  # one INSERT (pipelined)
        assert _count_by_tenant(conn) == {A: JOBS}
        many = b.bind("t.work").delay_many(range(COPY_THRESHOLD * 2), connection=conn)  # a block
        assert _count_by_tenant(conn) == {A: JOBS}
        assert conn.execute("SELECT current_setting('pgtasks.tenant')").fetchone() == (A,)
    with psycopg.connect(_as_role(dsn, roles["web"])) as conn:  # a transaction of no tenant
        b.apply_async("t.work", (2,), connection=conn)
        b.bind("t.work").delay_many(range(3), connection=conn)
        assert _count_by_tenant(conn) == {}
    with psycopg.connect(dsn) as conn:
        assert _count_by_tenant(conn) == {A: JOBS, B: JOBS + 1 + len(many) + 1 + 3}
        assert conn.execute("SELECT tenant FROM pgtasks.jobs WHERE id = %s", (one.id,)).fetchone() == (B,)


def test_a_setting_made_in_a_tenants_connection_does_not_reach_the_pools_next_user(
    setup: dict[str, Any],
) -> None:
    """A session-level ``SET pgtasks.tenant`` in a tenant's connection (a mistake of
    the caller's SQL) ends with the block: the pooled connection's next user that
    names no tenant still sees nothing."""
    web_dsn = _as_role(setup["dsn"], setup["roles"]["web"])
    web = pgtasks.App("rls-pool", settings=Settings.from_env(web_dsn, pool_size=1), load_entry_points=False)
    try:
        with web.tenant(A).connection() as conn:
            conn.execute(sql.SQL("SET pgtasks.tenant = {}").format(sql.Literal(B)))
            pid = conn.info.backend_pid
        with web.database.connection() as conn:
            assert conn.info.backend_pid == pid  # the same pooled connection
            assert _count_by_tenant(conn) == {}
        assert web.list_jobs(limit=500) == []
        with web.tenant(A).connection() as conn:
            assert _count_by_tenant(conn) == {A: JOBS}
        # A failed statement the caller swallowed: the block still ends quietly (PostgreSQL
        # rolls the transaction back, the SET with it), as without the mode.
        with web.tenant(A).connection() as conn:
            conn.execute(sql.SQL("SET pgtasks.tenant = {}").format(sql.Literal(B)))
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute("SELECT 1 / 0")
        with web.database.connection() as conn:
            assert _count_by_tenant(conn) == {}
        # Any other session state the caller's SQL leaves behind ends with the block too.
        with web.tenant(A).connection() as conn:
            conn.execute("SET statement_timeout = 300000")
            conn.execute("SET search_path = nowhere")
            conn.execute("SET jit = on")
            conn.execute("SELECT pg_advisory_lock(4242)")
            conn.execute("CREATE TEMP TABLE leftover (x int)")
            pid = conn.info.backend_pid
        with web.database.connection() as conn:
            assert conn.info.backend_pid == pid
            state = conn.execute(
                "SELECT current_setting('statement_timeout'), current_setting('search_path'),"
                " current_setting('jit'), (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                " AND pid = pg_backend_pid()), to_regclass('pg_temp.leftover')"
            ).fetchone()
        assert state == ("0", '"$user", public', "off", 0, None)
        assert len(web.tenant(A).list_jobs(limit=500)) == JOBS  # pgtasks' own statements run as before
    finally:
        web.close()


def test_the_fleet_sees_every_row_and_its_workers_run_every_tenants_jobs(setup: dict[str, Any]) -> None:
    dsn, roles = setup["dsn"], setup["roles"]
    fleet_dsn = _as_role(dsn, roles["fleet"])
    with psycopg.connect(fleet_dsn, autocommit=True) as conn:
        assert _count_by_tenant(conn) == {A: JOBS, B: JOBS}
    fleet_app = _app(fleet_dsn)
    try:
        worker = Worker(
            fleet_app, WorkerConfig(queues=("work",), concurrency=2, burst=True, poll_interval=0.1)
        )
        assert worker.run() == 0
    finally:
        fleet_app.close()
    with psycopg.connect(dsn) as conn:
        statuses = conn.execute("SELECT tenant, status, count(*) FROM pgtasks.jobs GROUP BY 1, 2").fetchall()
    assert sorted(statuses) == [(A, "succeeded", JOBS), (B, "succeeded", JOBS)]


def test_bulk_enqueue_under_the_mode_takes_the_insert_which_the_policies_check(setup: dict[str, Any]) -> None:
    """PostgreSQL refuses COPY FROM on a table under row-level security: a large
    ``delay_many`` (which takes COPY otherwise) writes through the INSERT instead, for
    a tenant handle and for the fleet, and the policy checks every row."""
    dsn, roles, web = setup["dsn"], setup["roles"], setup["web"]
    bulk = COPY_THRESHOLD * 3
    assert len(web.tenant(A).bind("t.work").delay_many(range(bulk))) == bulk
    fleet_app = _app(_as_role(dsn, roles["fleet"]))
    try:
        assert len(fleet_app.get_task("t.work").delay_many(range(bulk), tenant=B)) == bulk
    finally:
        fleet_app.close()
    with psycopg.connect(dsn) as conn:
        assert _count_by_tenant(conn) == {A: JOBS + bulk, B: JOBS + bulk}
    with pytest.raises(DatabaseError, match="row-level security"):
        web.get_task("t.work").delay_many(range(bulk), tenant=B)  # the web role, naming no tenant


def test_the_index_table_is_isolated_too(setup: dict[str, Any]) -> None:
    owner, web = setup["owner"], setup["web"]
    for tenant in (A, B):
        pgtasks_index.upsert(
            owner, tenant=tenant, kind="document", key=f"{tenant}-1", text="quarterly invoice"
        )
    assert [h.tenant for h in web.tenant(A).search("invoice")] == [A]
    with web.tenant(A).connection() as conn:
        assert _count_by_tenant(conn, "pgtasks_index.entries") == {A: 1}
    # The plugin's own calls (and `pgtasks search --tenant`) name the tenant: through the
    # web role they reach that tenant's entries, and only by its name.
    assert [h.key for h in pgtasks_index.search(web, "invoice", tenant=B)] == [f"{B}-1"]
    assert [h.key for h in web.search("invoice", tenant=A)] == [f"{A}-1"]
    assert pgtasks_index.count_entries(web, A) == {"document": 1}
    assert pgtasks_index.get_entry(web, tenant=B, kind="document", key=f"{A}-1") is None
    pgtasks_index.upsert(web, tenant=A, kind="mail", key="m-1", text="invoice by mail")
    with psycopg.connect(setup["dsn"]) as conn:
        assert _count_by_tenant(conn, "pgtasks_index.entries") == {A: 2, B: 1}


def test_tables_a_later_migration_adds_join_the_mode(roles: dict[str, str], dsn: str) -> None:
    owner = _app(dsn, index=False, migrate=True)
    try:
        core = isolation.enable(owner.stores)
        assert {"pgtasks.jobs", "pgtasks.schedules"} <= set(core) and core == _tables_with_a_tenant(dsn)
    finally:
        owner.close()
    later = _app(dsn, migrate=True)  # installs the index plugin's table
    try:
        states = {s.table: s for s in isolation.status(later.stores)}
        assert set(states) == {*core, "pgtasks_index.entries"}
        assert isolation.is_enabled(states.values())
        assert states["pgtasks_index.entries"].fleet_roles == states["pgtasks.jobs"].fleet_roles
        isolation.disable(later.stores)
        assert not any(s.enabled for s in isolation.status(later.stores))
    finally:
        later.close()


def test_bad_roles_are_refused_and_change_nothing(app: pgtasks.App) -> None:
    for bad in ("", "x" * 64, "a\x00b", 7):
        with pytest.raises(ConfigurationError, match="role"):
            isolation.enable(app.stores, [bad])  # type: ignore[list-item]
        with pytest.raises(ConfigurationError, match="role"):
            isolation.grant_tenant_role(app.stores, bad)  # type: ignore[arg-type]
    with pytest.raises(DatabaseError, match="does not exist"):
        isolation.enable(app.stores, ["postgres", f"no_such_role_{uuid.uuid4().hex[:6]}"])
    assert not any(s.enabled for s in isolation.status(app.stores))  # one transaction: nothing half-done
    with pytest.raises(DatabaseError, match="does not exist") as missing:
        isolation.grant_tenant_role(app.stores, "no such role")
    assert str(missing.value) == 'role "no such role" does not exist'  # no PL/pgSQL context lines


def test_the_mode_on_a_database_without_the_schema_says_to_migrate(empty_dsn: str) -> None:
    bare = _app(empty_dsn, index=False)
    try:
        for call in (isolation.status, isolation.enable, isolation.disable):
            with pytest.raises(DatabaseError, match=r"pgtasks migrate") as refused:
                call(bare.stores)
            assert "LINE" not in str(refused.value)
        result = CliRunner().invoke(cli, ["--dsn", empty_dsn, "rls", "status"])
        assert result.exit_code == 1 and "pgtasks migrate" in str(result.exception)
    finally:
        bare.close()


def test_a_role_that_may_not_grant_is_refused_not_told_it_granted(
    setup: dict[str, Any], admin_dsn: str
) -> None:
    """PostgreSQL only warns when a role without the right to grant runs GRANT
    ("no privileges were granted"): ``grant`` checks what the role got and refuses,
    instead of reporting the tables as granted."""
    other = f"pgtasks_other_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(other)))
    try:
        with pytest.raises(DatabaseError, match=r"may not grant.*pgtasks\.jobs") as refused:
            isolation.grant_tenant_role(setup["web"].stores, other)
        assert refused.value.sqlstate == "42501"
        runner = CliRunner()
        web_dsn = _as_role(setup["dsn"], setup["roles"]["web"])
        result = runner.invoke(cli, ["--dsn", web_dsn, "rls", "grant", other])
        assert result.exit_code == 1 and "granted" not in result.stdout
        with psycopg.connect(setup["dsn"]) as conn:
            rights = conn.execute(
                "SELECT has_table_privilege(%s, 'pgtasks.jobs', 'SELECT'),"
                " has_schema_privilege(%s, 'pgtasks', 'USAGE')",
                (other, other),
            ).fetchone()
        assert rights == (False, False)
        granted = isolation.grant_tenant_role(setup["owner"].stores, other)
        assert granted == _tables_with_a_tenant(setup["dsn"]) and "pgtasks_index.entries" in granted
    finally:
        with psycopg.connect(setup["dsn"], autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(other)))
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(other)))


def test_listings_by_a_role_outside_the_fleet_say_that_rows_are_hidden(setup: dict[str, Any]) -> None:
    dsn, roles = setup["dsn"], setup["roles"]

    def run(role: str, *args: str) -> tuple[str, str]:
        result = CliRunner().invoke(cli, ["--dsn", _as_role(dsn, role), *args])
        assert result.exit_code == 0, result.output
        return result.stdout, result.stderr

    for command in (["jobs", "list", "--json"], ["queues", "--json"]):
        out, err = run(roles["web"], *command)
        assert "row-level security is on" in err and roles["web"] in err and "--tenant" in err
        assert orjson.loads(out) == []  # what it sees: nothing, and now it is told why
        out, err = run(roles["fleet"], *command)
        assert err == ""
    out, err = run(roles["web"], "jobs", "list", "--json", "--tenant", A)
    assert err == "" and len(orjson.loads(out)) == JOBS


def test_check_by_a_role_outside_the_fleet_fails_instead_of_seeing_no_due_job(
    setup: dict[str, Any], admin_dsn: str
) -> None:
    """With the mode on, a role outside the fleet sees no job at all: ``pgtasks check``
    run as one (the tables' owner left out of ``--fleet-role``, say) must not report
    "no due jobs" while a queue without workers holds them; it fails with the database
    check's code and says why. The fleet role sees the jobs and reports them."""
    dsn, roles = setup["dsn"], setup["roles"]
    outsider = f"pgtasks_outsider_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOBYPASSRLS").format(sql.Identifier(outsider)))
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            who = sql.Identifier(outsider)
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA pgtasks, pgtasks_index TO {}").format(who))
            conn.execute(
                sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA pgtasks, pgtasks_index TO {}").format(who)
            )

        def check(role: str) -> tuple[int, dict[str, Any]]:
            result = CliRunner().invoke(cli, ["--dsn", _as_role(dsn, role), "check", "--json"])
            return result.exit_code, orjson.loads(result.stdout)

        code, document = check(roles["fleet"])
        assert code == 12 and document["checks"][2]["details"]["unserved"] == ["work"]
        code, document = check(outsider)
        checks = {c["name"]: c for c in document["checks"]}
        assert code == 10, document
        assert checks["database"]["status"] == "failed"
        assert "row-level security" in checks["database"]["summary"]
        assert outsider in checks["database"]["summary"]
        assert {checks[n]["status"] for n in ("workers", "stuck_jobs", "max_wait")} == {"skipped"}
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(outsider)))
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(outsider)))


def test_cli_status_json_shows_a_role_name_that_could_act_on_a_terminal_as_escapes(
    dsn: str, admin_dsn: str
) -> None:
    """A fleet role's name is any text a superuser chose: ``rls status --json`` writes
    its bidi override and C1 control as ``\\u`` escapes, as every ``--json`` does."""
    role = f"pgtasks_\u202eevil\x9b31m_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
    app = _app(dsn, index=False)
    try:
        isolation.enable(app.stores, [role])
        result = CliRunner().invoke(cli, ["--dsn", dsn, "rls", "status", "--json"])
        assert result.exit_code == 0, result.output
        assert "\u202e" not in result.stdout and "\x9b" not in result.stdout
        assert "\\u202e" in result.stdout and "\\u009b" in result.stdout
        assert {r["table"]: r["fleet_roles"] for r in orjson.loads(result.stdout)}["pgtasks.jobs"] == [role]
    finally:
        isolation.disable(app.stores)
        app.close()
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_cli_status_enable_and_disable(dsn: str) -> None:
    runner = CliRunner()
    base = ["--dsn", dsn]

    def run(*args: str) -> Any:
        return runner.invoke(cli, [*base, "rls", *args], catch_exceptions=False)

    off = run("status", "--json")
    assert off.exit_code == 3
    assert {row["table"]: row["enabled"] for row in orjson.loads(off.stdout)}["pgtasks.jobs"] is False
    on = run("enable")
    assert on.exit_code == 0, on.output
    assert "pgtasks.jobs" in on.stdout
    assert run("status").exit_code == 0
    refused = run("disable")
    assert refused.exit_code == 1 and "--yes" in refused.output
    assert run("status").exit_code == 0  # still on
    assert run("disable", "--dry-run").exit_code == 0
    assert run("status").exit_code == 0
    assert run("disable", "--yes").exit_code == 0
    assert run("status").exit_code == 3
