"""asyncio callers: the enqueue joins the caller's ``psycopg.AsyncConnection`` transaction in
the event loop's thread; ``AsyncResult.get_async`` waits without blocking the loop.

Everything runs against the real test database: the caller's transaction is a real
asyncio connection, side checks read from another connection, and the jobs waited
on are run by a real in-process worker.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import psycopg
import pytest
from fastapi import Depends, FastAPI, Request
from helpers import eventually
from starlette.testclient import TestClient

import pgtasks
import pgtasks.asgi
from pgtasks import hookimpl
from pgtasks.errors import (
    AlreadyQueued,
    ConfigurationError,
    ConnectionFailed,
    DatabaseError,
    JobNotFound,
    PgtasksError,
    ResultTimeout,
    SerializationError,
    TaskFailed,
)
from pgtasks.worker import Worker, WorkerConfig

TENANT, OTHER = "acme", "globex"
#: An endpoint's parameter: the app of the ASGI lifespan.
CurrentApp = Annotated[pgtasks.App, Depends(pgtasks.asgi.current_app)]


class ThreadOfEnqueue:
    """Records the thread each enqueue's ``pgtasks_before_enqueue`` ran in."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    @hookimpl
    def pgtasks_before_enqueue(
        self, task_name: str, options: dict[str, Any], headers: dict[str, Any]
    ) -> None:
        self.threads.append(threading.get_ident())


@pytest.fixture
def recorder() -> ThreadOfEnqueue:
    return ThreadOfEnqueue()


@pytest.fixture
def aapp(dsn: str, recorder: ThreadOfEnqueue) -> Iterator[pgtasks.App]:
    application = pgtasks.App("asyncio", dsn=dsn, load_entry_points=False, plugins=[recorder])

    @application.task(name="t.ocr", queue="ocr")
    def ocr(document_id: int, *, lang: str = "en") -> dict[str, Any]:
        return {"document_id": document_id, "lang": lang}

    @application.task(name="t.unique", queue="ocr", unique_key=lambda n: f"u:{n}")
    def unique(n: int) -> int:
        return n

    @application.task(name="t.boom", queue="ocr", max_retries=0)
    def boom() -> None:
        raise ValueError("no text layer")

    yield application
    application.close()


def _count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgtasks.jobs").fetchone()
    assert row is not None
    return int(row[0])


def _run_worker(application: pgtasks.App) -> int:
    """A burst worker on queue ``ocr`` in this thread, until no job is left; its exit code."""
    config = WorkerConfig(queues=("ocr",), concurrency=1, burst=True, poll_interval=0.1, lease_timeout=30)
    return Worker(application, config).run()


# -- enqueue in the caller's asyncio transaction -------------------------------------------


def test_the_job_commits_and_rolls_back_with_the_callers_transaction(
    aapp: pgtasks.App, dsn: str, conn: psycopg.Connection[Any], recorder: ThreadOfEnqueue
) -> None:
    ocr = aapp.get_task("t.ocr")
    listener = psycopg.connect(dsn, autocommit=True)
    listener.execute("LISTEN pgtasks_jobs")

    async def main() -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            gone = await ocr.apply_async_async((1,), {"lang": "de"}, connection=aconn)
            assert _count(conn) == 0  # not visible outside the transaction
            await aconn.rollback()
            async with aconn.transaction():
                kept = await ocr.apply_async_async((2,), connection=aconn, priority=7)
                assert _count(conn) == 0
                assert list(listener.notifies(timeout=0.2)) == []  # woken on commit, not before
            return gone.id, kept.id

    gone_id, kept_id = asyncio.run(main())
    assert recorder.threads == [threading.get_ident()] * 2  # built and written in the loop's thread
    with pytest.raises(JobNotFound):
        aapp.get_job(gone_id)
    job = aapp.get_job(kept_id)
    assert (job.task_name, job.args, job.kwargs, job.priority, job.status) == ("t.ocr", [2], {}, 7, "queued")
    payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    listener.close()
    assert payloads == [f"ocr:{kept_id}"]  # the rolled-back job never woke anyone


def test_an_autocommit_async_connection_writes_at_once(aapp: pgtasks.App, dsn: str) -> None:
    async def main() -> int:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            r = await aapp.get_task("t.ocr").apply_async_async((3,), connection=aconn, countdown=60)
            return r.id

    job = aapp.get_job(asyncio.run(main()))
    assert job.args == [3]
    assert job.run_at > job.created_at


def test_without_a_connection_the_enqueue_runs_in_a_thread(
    aapp: pgtasks.App, recorder: ThreadOfEnqueue
) -> None:
    async def main() -> list[int]:
        a = await aapp.get_task("t.ocr").delay_async(4)
        b = await aapp.get_task("t.ocr").apply_async_async((5,), queue="other")
        return [a.id, b.id]

    ids = asyncio.run(main())
    assert [aapp.get_job(i).args for i in ids] == [[4], [5]]
    assert aapp.get_job(ids[1]).queue == "other"
    assert threading.get_ident() not in recorder.threads


BAD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any], dict[str, Any]]] = [
    ("unknown-option", (1,), {}, {"retries": 3}),
    ("negative-countdown", (1,), {}, {"countdown": -1}),
    ("priority-out-of-range", (1,), {}, {"priority": 40_000}),
    ("nul-in-queue", (1,), {}, {"queue": "o\x00cr"}),
    ("missing-argument", (), {}, {}),
    ("unknown-keyword", (1,), {"colour": "red"}, {}),
    ("unserialisable-argument", (object(),), {}, {}),
    ("nul-in-argument", ("a\x00b",), {}, {}),
    ("lock-key-too-long", (1,), {}, {"lock": "k" * 10_000}),
    ("naive-eta", (1,), {}, {"eta": dt.datetime(2030, 1, 1)}),
]


@pytest.mark.parametrize("case", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_is_refused_as_the_sync_path_refuses_it_and_nothing_is_written(
    aapp: pgtasks.App, dsn: str, conn: psycopg.Connection[Any], case: tuple[str, Any, Any, Any]
) -> None:
    _, args, kwargs, options = case
    ocr = aapp.get_task("t.ocr")
    with psycopg.connect(dsn) as sync_conn, pytest.raises(PgtasksError) as sync_error:
        ocr.apply_async(args, kwargs, connection=sync_conn, **options)

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            with pytest.raises(PgtasksError) as async_error:
                await ocr.apply_async_async(args, kwargs, connection=aconn, **options)
            assert type(async_error.value) is type(sync_error.value)
            assert str(async_error.value) == str(sync_error.value)
            # Refused before any statement: the caller's transaction goes on unharmed.
            cur = await aconn.execute("SELECT 1")
            assert await cur.fetchone() == (1,)
            await aconn.commit()

    asyncio.run(main())
    assert isinstance(sync_error.value, ConfigurationError | SerializationError)
    assert _count(conn) == 0


def test_a_held_unique_key_raises_already_queued_and_the_transaction_goes_on(
    aapp: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    unique = aapp.get_task("t.unique")
    holder = unique.delay(1)

    async def main() -> int:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            with pytest.raises(AlreadyQueued) as exc:
                await unique.apply_async_async((1,), connection=aconn)
            assert (exc.value.unique_key, exc.value.job_id) == ("u:1", holder.id)
            other = await unique.apply_async_async((2,), connection=aconn)  # same transaction, still fine
            await aconn.commit()
            return other.id

    other_id = asyncio.run(main())
    assert _count(conn) == 2
    assert aapp.get_job(other_id).unique_key == "u:2"


def test_a_sync_connection_still_works_and_other_objects_are_refused(
    aapp: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    ocr = aapp.get_task("t.ocr")

    async def main() -> int:
        with psycopg.connect(dsn) as sync_conn:
            r = await ocr.apply_async_async((6,), connection=sync_conn)  # in a thread, as before
            sync_conn.commit()
        for wrong in (dsn, object()):
            with pytest.raises(ConfigurationError, match="psycopg"):
                await ocr.apply_async_async((7,), connection=wrong)
        return r.id

    assert aapp.get_job(asyncio.run(main())).args == [6]
    assert _count(conn) == 1


def test_a_broken_callers_connection_gives_a_database_error(
    aapp: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    ocr = aapp.get_task("t.ocr")

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            with pytest.raises(psycopg.errors.DivisionByZero):
                await aconn.execute("SELECT 1 / 0")
            with pytest.raises(DatabaseError, match="aborted"):  # the caller's transaction had failed
                await ocr.apply_async_async((1,), connection=aconn)
        closed = await psycopg.AsyncConnection.connect(dsn)
        await closed.close()
        with pytest.raises(DatabaseError, match="closed") as lost:
            await ocr.apply_async_async((2,), connection=closed)
        assert lost.value.transient

    asyncio.run(main())
    assert _count(conn) == 0


def test_the_sync_enqueue_refuses_an_async_connection_and_names_the_async_call(
    aapp: pgtasks.App, dsn: str
) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            with pytest.raises(ConfigurationError, match="apply_async_async"):
                aapp.get_task("t.ocr").apply_async((1,), connection=aconn)

    asyncio.run(main())


# -- tenant handles ------------------------------------------------------------------------


@pytest.fixture
def tenant_seen(conn: psycopg.Connection[Any]) -> None:
    """A trigger that records ``pgtasks.tenant`` as each job row is inserted."""
    conn.execute("CREATE TABLE tenant_seen (job_id bigint, tenant text)")
    conn.execute(
        """CREATE FUNCTION record_tenant() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO tenant_seen VALUES (NEW.id, current_setting('pgtasks.tenant', true));
            RETURN NEW;
        END $$"""
    )
    conn.execute(
        "CREATE TRIGGER record_tenant AFTER INSERT ON pgtasks.jobs"
        " FOR EACH ROW EXECUTE FUNCTION record_tenant()"
    )


def test_a_tenant_handle_enqueues_in_the_callers_transaction_as_its_tenant(
    aapp: pgtasks.App, dsn: str, conn: psycopg.Connection[Any], tenant_seen: None, recorder: ThreadOfEnqueue
) -> None:
    handle = aapp.tenant(TENANT)

    async def main() -> tuple[list[int], str | None]:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            # The caller's transaction says it is another tenant's: each enqueue's statement is
            # the handle's, and the transaction gets its own setting back after it.
            await aconn.execute("SELECT set_config('pgtasks.tenant', %s, true)", (OTHER,))
            a = await handle.apply_async_async("t.ocr", (1,), connection=aconn)
            b = await handle.bind(aapp.get_task("t.ocr")).apply_async_async((2,), connection=aconn)
            c = await handle.send_task_async("t.ocr", (3,), connection=aconn, tenant=TENANT)
            cur = await aconn.execute("SELECT current_setting('pgtasks.tenant', true)")
            row = await cur.fetchone()
            await aconn.commit()
            assert all(r.app is handle for r in (a, b, c))  # results read through the handle
            return [a.id, b.id, c.id], None if row is None else row[0]

    ids, after = asyncio.run(main())
    assert after == OTHER
    assert recorder.threads == [threading.get_ident()] * 3
    seen = conn.execute("SELECT job_id, tenant FROM tenant_seen ORDER BY job_id").fetchall()
    assert seen == [(i, TENANT) for i in ids]
    assert {aapp.get_job(i).tenant for i in ids} == {TENANT}


def test_a_tenant_handle_refuses_another_tenant_and_hides_another_tenants_holder(
    aapp: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    handle = aapp.tenant(TENANT)
    theirs = aapp.tenant(OTHER).apply_async("t.unique", (1,))
    mine = handle.apply_async("t.unique", (2,))

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            with pytest.raises(ConfigurationError, match="not this handle's tenant"):
                await handle.apply_async_async("t.ocr", (1,), connection=aconn, tenant=OTHER)
            with pytest.raises(AlreadyQueued) as hidden:
                await handle.apply_async_async("t.unique", (1,), connection=aconn)
            assert hidden.value.job_id == -1  # another tenant's job: its id is not shown
            with pytest.raises(AlreadyQueued) as shown:
                await handle.apply_async_async("t.unique", (2,), connection=aconn)
            assert shown.value.job_id == mine.id
            await aconn.commit()

    asyncio.run(main())
    assert theirs.id != mine.id
    assert _count(conn) == 2


# -- results -------------------------------------------------------------------------------


def test_get_async_waits_for_a_real_worker_without_blocking_the_loop(aapp: pgtasks.App) -> None:
    ocr, boom = aapp.get_task("t.ocr"), aapp.get_task("t.boom")
    good, bad = ocr.apply_async((8,), {"lang": "fr"}), boom.delay()

    async def main() -> tuple[Any, Any, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick = asyncio.create_task(ticker())
        waiting = asyncio.gather(good.get_async(timeout=60), bad.get_async(timeout=60, propagate=False))
        await asyncio.sleep(0.3)  # both are waiting on their connections by now
        before = ticks
        code = await asyncio.to_thread(_run_worker, aapp)
        value, failure = await waiting
        assert ticks > before  # the loop kept running while the worker did
        tick.cancel()
        return value, failure, code

    value, failure, code = asyncio.run(main())
    assert code == 0
    assert value == {"document_id": 8, "lang": "fr"}
    assert isinstance(failure, TaskFailed) and "no text layer" in str(failure)
    with pytest.raises(TaskFailed, match="no text layer"):
        asyncio.run(bad.get_async(timeout=5))


def test_get_async_times_out_while_the_loop_runs_on(aapp: pgtasks.App) -> None:
    queued = aapp.get_task("t.ocr").delay(9)

    async def main() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick = asyncio.create_task(ticker())
        with pytest.raises(ResultTimeout, match="still queued"):
            await queued.get_async(timeout=0.5)
        tick.cancel()
        return ticks

    assert asyncio.run(main()) >= 20  # 0.5 s of 10 ms ticks, give or take a loaded machine


def test_get_async_refuses_bad_arguments_and_unknown_jobs(aapp: pgtasks.App) -> None:
    r = aapp.get_task("t.ocr").delay(10)
    for bad in (float("nan"), -1, "5"):
        with pytest.raises(ConfigurationError, match="timeout"):
            asyncio.run(r.get_async(timeout=bad))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="propagate"):
        asyncio.run(r.get_async(timeout=1, propagate=1))  # type: ignore[arg-type]
    with pytest.raises(JobNotFound):
        asyncio.run(aapp.AsyncResult(r.id + 1000).get_async(timeout=1))


def test_get_async_is_scoped_by_a_tenant_handle(aapp: pgtasks.App) -> None:
    theirs = aapp.tenant(OTHER).delay("t.ocr", 11)
    with pytest.raises(JobNotFound):
        asyncio.run(aapp.tenant(TENANT).AsyncResult(theirs.id).get_async(timeout=1))


def test_job_async_reads_on_the_callers_connection_or_the_pool(aapp: pgtasks.App, dsn: str) -> None:
    handle = aapp.tenant(TENANT)
    mine = handle.delay("t.ocr", 12)
    theirs = aapp.tenant(OTHER).delay("t.ocr", 13)

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            job = await mine.job_async(connection=aconn)
            assert (job.id, job.args, job.tenant, job.status) == (mine.id, [12], TENANT, "queued")
            with pytest.raises(JobNotFound):
                await handle.AsyncResult(theirs.id).job_async(connection=aconn)
            assert (await mine.job_async()).args == [12]
            with pytest.raises(ConfigurationError, match="AsyncConnection"):
                await mine.job_async(connection=dsn)  # type: ignore[arg-type]

    asyncio.run(main())


# -- the ASGI lifespan ---------------------------------------------------------------------


def test_the_lifespan_opens_the_app_provides_it_and_closes_it(dsn: str, empty_dsn: str) -> None:
    application = pgtasks.App("asgi", dsn=empty_dsn, load_entry_points=False)

    @application.task(name="t.add")
    def add(a: int, b: int) -> int:
        return a + b

    inner_state: list[str] = []

    @asynccontextmanager
    async def inner(api: Any) -> AsyncIterator[dict[str, Any]]:
        inner_state.append("started")  # the app is open by now: its DSN resolved, its pool too
        assert application.database.dsn == empty_dsn
        yield {"greeting": "hello"}
        inner_state.append("stopped")

    api = FastAPI(lifespan=pgtasks.asgi.lifespan(application, migrate=True, inner=inner))

    @api.post("/add")
    async def enqueue(request: Request, app: CurrentApp) -> dict[str, Any]:
        r = await app.get_task("t.add").apply_async_async((1, 2))
        return {"job_id": r.id, "greeting": request.state.greeting, "same": app is application}

    with TestClient(api) as client:
        assert inner_state == ["started"]
        body = client.post("/add").json()
        assert body["greeting"] == "hello" and body["same"] is True
        assert application.get_job(body["job_id"]).args == [1, 2]  # migrated on startup
    assert inner_state == ["started", "stopped"]
    with psycopg.connect(empty_dsn, autocommit=True) as check:  # closed on shutdown: no connection left

        def others() -> int:
            row = check.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
            assert row is not None
            return int(row[0])

        eventually(lambda: others() == 0, message="the app's connections closed")


def test_the_lifespan_refuses_bad_input_and_an_unreachable_server(dsn: str) -> None:
    with pytest.raises(ConfigurationError, match=r"pgtasks\.App"):
        pgtasks.asgi.lifespan(object())  # type: ignore[arg-type]
    application = pgtasks.App("asgi", dsn=dsn, load_entry_points=False)
    with pytest.raises(ConfigurationError, match="migrate"):
        pgtasks.asgi.lifespan(application, migrate="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="inner"):
        pgtasks.asgi.lifespan(application, inner=42)  # type: ignore[arg-type]

    nowhere = pgtasks.App(
        "asgi", dsn="postgresql://postgres@127.0.0.1:1/none?connect_timeout=1", load_entry_points=False
    )
    with (
        pytest.raises(ConnectionFailed, match=r"127\.0\.0\.1:1/"),
        TestClient(FastAPI(lifespan=pgtasks.asgi.lifespan(nowhere))),
    ):
        pass
    # Nothing is left open: the no_leaks fixture fails the test on a pool thread left behind.

    bare = FastAPI()  # no lifespan: the dependency says what is missing

    @bare.get("/")
    async def index(app: CurrentApp) -> str:
        return app.name

    with TestClient(bare) as client, pytest.raises(ConfigurationError, match="lifespan"):
        client.get("/")
