"""Tenant handles (``app.tenant("a")``): a tenant sees, changes and finds only its own jobs.

Two tenants with 100 jobs each share one database. Every operation of tenant a's
handle on b's job ids behaves exactly as on an id no job has (same exception, same
message), and b's rows are byte for byte what they were. Listing and search return
only a's rows; the built-in index, delete and OCR tasks take the tenant from the job,
never from an argument (a real worker runs them); ``pgtasks jobs ... --tenant``
scopes the command line the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from apps.pipeline_app import run_worker
from click.testing import CliRunner, Result

import pgtasks
import pgtasks_delete.plugin
import pgtasks_index
import pgtasks_index.plugin
import pgtasks_ocr.plugin
from pgtasks.cli import cli
from pgtasks.errors import AlreadyQueued, ConfigurationError, JobNotFound
from pgtasks.plugin_api import TENANT_MISMATCH
from pgtasks.sql import QUERIES
from pgtasks.states import JobStatus

A, B = "tenant-a", "tenant-b"
NEVER = 9_000_000_000  # an id no job has
JOBS_PER_TENANT = 100


def _app(dsn: str) -> pgtasks.App:
    app = pgtasks.App(
        "tenancy",
        dsn=dsn,
        load_entry_points=False,
        plugins=[pgtasks_index.plugin, pgtasks_delete.plugin, pgtasks_ocr.plugin],
    )

    @app.task(name="t.work", queue="work")
    def work(n: int) -> int:
        return n

    @app.task(name="t.whose", queue="index", bind=True)
    def whose(self: pgtasks.TaskContext) -> str:
        return self.request.tenant

    app.migrate()
    return app


@pytest.fixture
def tapp(dsn: str) -> Iterator[pgtasks.App]:
    """An app with the built-in plugins and 100 jobs of each tenant; in each, the
    first 30 are cancelled (requeueable), the rest queued (cancellable)."""
    app = _app(dsn)
    for tenant in (A, B):
        handle = app.tenant(tenant)
        results = handle.bind("t.work").delay_many(range(JOBS_PER_TENANT))
        for r in results[:30]:
            assert handle.cancel(r.id)
    yield app
    app.close()


def _ids(conn: psycopg.Connection[Any], tenant: str) -> list[int]:
    return [
        r[0] for r in conn.execute("SELECT id FROM pgtasks.jobs WHERE tenant = %s ORDER BY id", (tenant,))
    ]


def _rows(conn: psycopg.Connection[Any], tenant: str) -> list[tuple[Any, ...]]:
    """Every column of every job of ``tenant``, as text, by id."""
    return conn.execute(
        "SELECT j.id, j::text FROM pgtasks.jobs j WHERE tenant = %s ORDER BY id", (tenant,)
    ).fetchall()


def _failure(call: Callable[[], object]) -> tuple[type[BaseException], str]:
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


def _operations(handle: pgtasks.TenantScope, job_id: int) -> dict[str, Callable[[], object]]:
    """Every operation of a handle that names one job."""
    return {
        "get_job": lambda: handle.get_job(job_id),
        "cancel": lambda: handle.cancel(job_id),
        "cancel terminate": lambda: handle.cancel(job_id, terminate=True),
        "cancel_job": lambda: handle.cancel_job(job_id),
        "requeue": lambda: handle.requeue(job_id, by="attacker"),
        "result.status": lambda: handle.AsyncResult(job_id).status,
        "result.result": lambda: handle.AsyncResult(job_id).result,
        "result.ready": lambda: handle.AsyncResult(job_id).ready(),
        "result.job": lambda: handle.AsyncResult(job_id).job(),
        "result.phase": lambda: handle.AsyncResult(job_id).phase,
        "result.traceback": lambda: handle.AsyncResult(job_id).traceback,
        "result.get": lambda: handle.AsyncResult(job_id).get(timeout=0.5),
        "result.revoke": lambda: handle.AsyncResult(job_id).revoke(),
    }


# -- one job: another tenant's id is an id no job has ---------------------------------------


def test_another_tenants_ids_behave_as_nonexistent_and_stay_unchanged(
    tapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    handle = tapp.tenant(A)
    b_ids = _ids(conn, B)
    assert len(b_ids) == JOBS_PER_TENANT
    before = _rows(conn, B)
    expected = {
        name: (kind, message.replace(str(NEVER), "{id}"))
        for name, call in _operations(handle, NEVER).items()
        for kind, message in [_failure(call)]
    }
    assert all(kind is JobNotFound for kind, _ in expected.values()), expected
    for job_id in b_ids:
        for name, call in _operations(handle, job_id).items():
            kind, message = _failure(call)
            assert (kind, message.replace(str(job_id), "{id}")) == expected[name], (name, job_id)
    assert _rows(conn, B) == before  # every column of every row of b as it was


def test_the_handle_acts_on_its_own_tenants_jobs(tapp: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    handle = tapp.tenant(A)
    a_ids = _ids(conn, A)
    cancelled, queued = a_ids[0], a_ids[-1]
    assert handle.get_job(queued).tenant == A
    assert handle.AsyncResult(queued).status == JobStatus.QUEUED
    assert handle.requeue(cancelled, by="admin:alice")
    assert handle.get_job(cancelled).status == JobStatus.QUEUED
    assert handle.cancel_job(queued) == "cancelled"
    assert handle.cancel_job(queued) == "finished"
    assert isinstance(handle.AsyncResult(queued).result, pgtasks.errors.TaskRevoked)


def test_by_id_lookups_are_primary_key_lookups_with_the_tenant_in_the_statement(
    tapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    """A tenant's lookup and the operator's are one statement, one primary-key probe:
    another tenant's id costs what a missing id costs (no second query, no read of the row
    into Python), also with the generic plan a prepared statement settles on."""
    conn.execute("SET plan_cache_mode = force_generic_plan")
    for name in ("job_get", "job_status", "job_cancel", "job_requeue"):
        names: list[str] = []

        def number(match: re.Match[str], names: list[str] = names) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        text = re.sub(r"%\((\w+)\)s", number, QUERIES[name]).rstrip().rstrip(";")
        assert "tenant" in names, name
        conn.execute(f"PREPARE p_{name} AS {text}")
        values = {"id": "1", "tenant": "'tenant-a'", "by": "'x'", "error": "'{}'", "terminate": "false"}
        args = ", ".join(values.get(n, "NULL") for n in names)
        plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN EXECUTE p_{name}({args})"))
        first_scan = re.search(
            r"(\w+ Scan)[^\n]*\n\s*Index Cond: \((\w+) = \$\d\)\n\s*Filter: ([^\n]*)", plan
        )
        assert first_scan, plan
        assert first_scan.group(1) == "Index Scan" and "jobs_pkey" in plan and first_scan.group(2) == "id"
        assert "tenant = $" in first_scan.group(3), plan


# -- listing and search -----------------------------------------------------------------------


def test_listing_returns_only_the_handles_tenant(tapp: pgtasks.App) -> None:
    handle = tapp.tenant(A)
    everything = handle.list_jobs(limit=1000)
    assert len(everything) == JOBS_PER_TENANT
    assert {j.tenant for j in everything} == {A}
    assert {j.tenant for j in handle.list_jobs(status="cancelled", limit=1000)} == {A}
    assert len(handle.list_jobs(status="cancelled", limit=1000)) == 30
    page = handle.list_jobs(limit=10)
    assert {j.tenant for j in handle.list_jobs(before_id=page[-1].id, limit=1000)} == {A}
    assert len(tapp.list_jobs(limit=1000)) == 2 * JOBS_PER_TENANT  # the operator's view spans tenants


def test_search_returns_only_the_handles_tenant(tapp: pgtasks.App) -> None:
    for tenant in (A, B):
        for n in range(5):
            pgtasks_index.upsert(
                tapp, tenant=tenant, kind="document", key=f"{tenant}-{n}", text="quarterly invoice"
            )
    hits = tapp.tenant(A).search("invoice", limit=50)
    assert sorted(h.key for h in hits) == [f"{A}-{n}" for n in range(5)]
    assert {h.tenant for h in hits} == {A}


# -- enqueue --------------------------------------------------------------------------------


def test_enqueue_sets_the_tenant_and_refuses_another(
    tapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    handle = tapp.tenant(A)
    work = tapp.get_task("t.work")
    made = [
        handle.send_task("t.work", args=(1,)),
        handle.apply_async(work, (2,)),
        handle.apply_async("t.work", (3,), tenant=A),  # the same tenant: accepted
        handle.delay(work, 4),
        handle.bind(work).delay(5),
        handle.bind("t.work").apply_async((6,), countdown=5),
    ]
    assert {tapp.get_job(r.id).tenant for r in made} == {A}
    assert all(r.app is handle for r in made)  # results read through the handle
    count = conn.execute("SELECT count(*) FROM pgtasks.jobs").fetchone()
    for call in (
        lambda: handle.send_task("t.work", args=(1,), tenant=B),
        lambda: handle.apply_async(work, (1,), tenant=""),
        lambda: handle.bind(work).apply_async((1,), tenant=B),
        lambda: handle.bind(work).delay_many([1, 2], tenant=B),
    ):
        with pytest.raises(ConfigurationError, match=r"tenant 'tenant-b'|tenant ''") as info:
            call()
        assert "handle's tenant" in str(info.value)
    assert conn.execute("SELECT count(*) FROM pgtasks.jobs").fetchone() == count  # nothing written
    with pytest.raises(ConfigurationError, match="tenant must be a non-empty string"):
        tapp.tenant("")
    with pytest.raises(ConfigurationError, match="tenant"):
        tapp.tenant("x\x00y")


def test_a_callback_naming_another_tenant_is_refused_as_the_option_is(
    tapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    """A ``link`` / ``link_error`` callback is its job's tenant's: one naming another was
    silently made the job's; it is refused at the call, as ``tenant=`` is."""
    handle = tapp.tenant(A)
    work = tapp.get_task("t.work")
    theirs = work.s().set(tenant=B)
    count = conn.execute("SELECT count(*) FROM pgtasks.jobs").fetchone()
    for call in (
        lambda: handle.apply_async(work, (1,), link=theirs),
        lambda: handle.bind(work).apply_async((1,), link_error=[work.si(2), theirs]),
        lambda: handle.apply_async(work, (1,), link=work.s().set(link=theirs)),  # a callback's callback
        lambda: handle.bind(work).delay_many([1, 2], link=theirs),
        lambda: work.apply_async((1,), tenant=A, link=theirs),  # the app's own API: the same rule
        lambda: work.s(1).set(tenant=A).link(theirs).delay(),
    ):
        with pytest.raises(ConfigurationError, match=f"names tenant '{B}', not its job's tenant '{A}'"):
            call()
    assert conn.execute("SELECT count(*) FROM pgtasks.jobs").fetchone() == count  # nothing written
    made = handle.apply_async(work, (1,), link=[work.s().set(tenant=A), work.si(3)])  # its own, or none
    written = conn.execute("SELECT tenant FROM pgtasks.jobs WHERE id >= %s ORDER BY id", (made.id,))
    assert written.fetchall() == [(A,), (A,), (A,)]


def test_a_unique_key_held_by_another_tenant_does_not_show_its_job(tapp: pgtasks.App) -> None:
    held = tapp.tenant(B).apply_async("t.work", (1,), unique_key="report:2026")
    with pytest.raises(AlreadyQueued) as info:
        tapp.tenant(A).apply_async("t.work", (1,), unique_key="report:2026")
    assert info.value.job_id == -1 and str(held.id) not in str(info.value)
    mine = tapp.tenant(A).apply_async("t.work", (1,), unique_key="mine")
    with pytest.raises(AlreadyQueued) as again:
        tapp.tenant(A).apply_async("t.work", (1,), unique_key="mine")
    assert again.value.job_id == mine.id  # its own holder is shown


# -- tasks: the job's tenant, never an argument's ---------------------------------------------


def test_a_task_sees_its_jobs_tenant_and_plugins_refuse_another(
    tapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    pgtasks_index.upsert(tapp, tenant=B, kind="document", key="contract", text="original text of b")
    before = conn.execute("SELECT e::text FROM pgtasks_index.entries e WHERE tenant = %s", (B,)).fetchall()
    handle = tapp.tenant(A)
    index, delete, ocr = (
        tapp.get_task("pgtasks.index"),
        tapp.get_task("pgtasks.delete"),
        tapp.get_task("pgtasks.ocr"),
    )
    whose = handle.delay("t.whose")
    overwrite = handle.apply_async(index, ("document", "contract", "overwritten by a"), {"tenant": B})
    remove = handle.apply_async(delete, ("document", "contract"), {"tenant": B})
    relay = handle.apply_async(ocr, ("/nowhere/x.pdf",), {"key": "contract", "tenant": B}, queue="index")
    own = handle.apply_async(index, ("document", "contract", "a's own text"), {"tenant": A})  # compatible
    plain = handle.apply_async(index, ("document", "memo", "a's memo"))
    assert run_worker(tapp, timeout=60) == 0
    assert whose.get(timeout=10) == A
    for rejected in (overwrite, remove, relay):
        job = tapp.get_job(rejected.id)
        assert job.status == JobStatus.FAILED and job.attempt == 1, job
        assert job.error is not None and job.error["code"] == TENANT_MISMATCH
        assert "'tenant-b'" in job.error["message"] and "'tenant-a'" in job.error["message"]
    assert own.get(timeout=10)["tenant"] == A and plain.get(timeout=10)["tenant"] == A
    after = conn.execute("SELECT e::text FROM pgtasks_index.entries e WHERE tenant = %s", (B,)).fetchall()
    assert after == before  # b's entry neither overwritten nor deleted
    assert {h.key for h in handle.search("text memo", limit=10)} <= {"contract", "memo"}
    assert pgtasks_index.get_entry(tapp, tenant=A, kind="document", key="contract") is not None


# -- the command line ---------------------------------------------------------------------------


def _cli(dsn: str, *args: str) -> Result:
    env = {"COLUMNS": "400", "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return CliRunner().invoke(cli, ["--dsn", dsn, *args], env=env, catch_exceptions=False)


def test_cli_tenant_option_scopes_list_show_retry_cancel(
    tapp: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    a_ids, b_ids = _ids(conn, A), _ids(conn, B)
    before = _rows(conn, B)
    listed = _cli(dsn, "jobs", "list", "--tenant", A, "--limit", "1000")
    assert listed.exit_code == 0
    shown_ids = {int(m) for m in re.findall(r"^\S*\s*(\d+)\s", listed.output, re.MULTILINE)}
    assert shown_ids == set(a_ids)
    b_cancelled, b_queued = b_ids[0], b_ids[-1]
    for args, job_id in (
        (("jobs", "show"), b_queued),
        (("jobs", "retry"), b_cancelled),
        (("jobs", "cancel"), b_queued),
        (("jobs", "retry", "--dry-run"), b_cancelled),
    ):
        other = _cli(dsn, *args, str(job_id), "--tenant", A)
        missing = _cli(dsn, *args, str(NEVER), "--tenant", A)
        assert other.exit_code == missing.exit_code == 1, other.output
        assert other.output.replace(str(job_id), "{id}") == missing.output.replace(str(NEVER), "{id}")
        assert f"no job with id {job_id}" in other.output
    assert _rows(conn, B) == before
    assert "tenant-a" in _cli(dsn, "jobs", "show", str(a_ids[-1]), "--tenant", A).output
    assert _cli(dsn, "jobs", "retry", str(a_ids[0]), "--tenant", A).output.strip().endswith("requeued")
    assert "cancelled" in _cli(dsn, "jobs", "cancel", str(a_ids[-1]), "--tenant", A).output
    assert tapp.get_job(a_ids[-1]).status == JobStatus.CANCELLED
    unscoped = _cli(dsn, "jobs", "show", str(b_queued))  # the operator's view
    assert unscoped.exit_code == 0 and "tenant-b" in unscoped.output
