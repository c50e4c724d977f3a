"""Enqueueing: transactional atomicity, NOTIFY on commit, bulk paths, options, and bad input."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
from collections.abc import Iterator
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

import pgtasks
from pgtasks.context import CLAIM_COLUMNS
from pgtasks.db import text_array_literal
from pgtasks.enqueue import COPY_THRESHOLD
from pgtasks.errors import AlreadyQueued, ConfigurationError, PgtasksError, SerializationError
from pgtasks.serialization import dumps
from pgtasks.task import MAX_KEY_BYTES

WORKER = "test-worker"


def ocr(document_id: int, *, lang: str = "en") -> None:
    """A task body; never run here."""


def other(x: int) -> None:
    """Another task body."""


@pytest.fixture
def task(app: pgtasks.App) -> pgtasks.Task:
    return app.task(name="ocr", queue="ocr")(ocr)


@pytest.fixture
def listener(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("LISTEN pgtasks_jobs")
        yield conn


def _count(conn: psycopg.Connection[Any], where: str = "true") -> int:
    row = conn.execute(f"SELECT count(*) FROM pgtasks.jobs WHERE {where}").fetchone()
    assert row is not None
    return int(row[0])


def _exists(conn: psycopg.Connection[Any], job_id: int) -> bool:
    return conn.execute("SELECT 1 FROM pgtasks.jobs WHERE id = %s", (job_id,)).fetchone() is not None


def _notifications_until_marker(listener: psycopg.Connection[Any], dsn: str, marker: str) -> list[str]:
    """Payloads of pgtasks_jobs delivered before a marker sent now (commit order makes this exact).

    NOTIFY delivers in commit order, so anything already committed arrives before
    the marker and anything not yet committed cannot: no sleeping needed.
    """
    with psycopg.connect(dsn, autocommit=True) as other_conn:
        other_conn.execute("SELECT pg_notify('pgtasks_jobs', %s)", (marker,))
    payloads: list[str] = []
    for note in listener.notifies(timeout=10.0):
        if note.payload == marker:
            return payloads
        payloads.append(note.payload)
    raise AssertionError(f"marker {marker!r} never arrived; got {payloads}")


def _claim(app: pgtasks.App, queues: list[str], limit: int = 10) -> list[dict[str, Any]]:
    """Claim due jobs the way a worker does, through the real claim statement."""
    rows = app.stores.jobs.claim_batch(
        queues=text_array_literal(queues), worker_id=WORKER, limit=limit, max_tenants=100, fair=True
    )
    return [dict(zip(CLAIM_COLUMNS, row, strict=False)) for row in rows]


def _succeed(app: pgtasks.App, job_id: int, result: Any) -> None:
    done = app.stores.jobs.succeed_batch(worker_id=WORKER, ids=[job_id], results_json=[dumps(result)])
    assert done == [job_id]


# -- transactional enqueue -------------------------------------------------------------


def test_job_enqueued_in_rolled_back_transaction_never_exists(
    app: pgtasks.App, task: pgtasks.Task, conn: psycopg.Connection[Any], dsn: str
) -> None:
    with psycopg.connect(dsn) as caller:  # not autocommit: a transaction opens on first statement
        caller.execute("CREATE TABLE documents (id int PRIMARY KEY)")
        caller.commit()
        caller.execute("INSERT INTO documents VALUES (42)")
        job_id = task.apply_async(args=(42,), connection=caller).id
        assert not _exists(conn, job_id)  # invisible outside the caller's transaction
        caller.rollback()
    assert not _exists(conn, job_id)
    assert _count(conn) == 0
    assert conn.execute("SELECT count(*) FROM documents").fetchone() == (0,)
    with pytest.raises(pgtasks.errors.JobNotFound):
        app.get_job(job_id)


def test_job_enqueued_in_committed_transaction_exists_with_the_callers_rows(
    app: pgtasks.App, task: pgtasks.Task, conn: psycopg.Connection[Any], dsn: str
) -> None:
    conn.execute("CREATE TABLE documents (id int PRIMARY KEY)")
    with psycopg.connect(dsn, autocommit=True) as caller:
        with caller.transaction():
            caller.execute("INSERT INTO documents VALUES (42)")
            job_id = task.apply_async(args=(42,), connection=caller).id
            assert not _exists(conn, job_id)
        assert _exists(conn, job_id)
    job = app.get_job(job_id)
    assert job.args == [42]
    assert job.status == pgtasks.JobStatus.QUEUED
    assert conn.execute("SELECT count(*) FROM documents").fetchone() == (1,)


def test_notify_reaches_listener_only_after_commit(
    task: pgtasks.Task, listener: psycopg.Connection[Any], dsn: str
) -> None:
    with psycopg.connect(dsn, autocommit=True) as caller:
        with caller.transaction():
            job_id = task.apply_async(args=(1,), connection=caller).id
            assert _notifications_until_marker(listener, dsn, "before-commit") == []
        assert _notifications_until_marker(listener, dsn, "after-commit") == [f"ocr:{job_id}"]


def test_rolled_back_enqueue_sends_no_notification(
    task: pgtasks.Task, listener: psycopg.Connection[Any], dsn: str
) -> None:
    with psycopg.connect(dsn) as caller:
        task.apply_async(args=(1,), connection=caller)
        task.delay_many(range(COPY_THRESHOLD), connection=caller)  # COPY
        caller.rollback()
    assert _notifications_until_marker(listener, dsn, "after-rollback") == []


def test_enqueue_without_connection_notifies_at_once(
    task: pgtasks.Task, listener: psycopg.Connection[Any], dsn: str
) -> None:
    first = task.delay(1).id
    second = task.apply_async(args=(2,), queue="urgent").id
    third = task.apply_async(args=(3,), queue="mail:high", countdown=60, unique_key="u3").id
    bulk = task.delay_many([4, 5])
    assert len(bulk) == 2
    # Enqueues amid others leave their wake-up to the app's sender, which sends it
    # just after the commit: wait for it before the marker, and do not expect the
    # order of the enqueues (one in its own commit may overtake one being sent).
    assert task.app.stores.wakeups.flush(10)
    # One job names itself (queue:id, so an idle worker can claim it by id); a bulk
    # enqueue wakes its queue once.
    assert sorted(_notifications_until_marker(listener, dsn, "m")) == sorted(
        [f"ocr:{first}", f"urgent:{second}", f"mail:high:{third}", "ocr"]
    )


def test_connection_of_wrong_type_is_refused(
    task: pgtasks.Task, conn: psycopg.Connection[Any], dsn: str
) -> None:
    async def async_connection() -> None:
        aconn = await psycopg.AsyncConnection.connect(dsn)
        try:
            with pytest.raises(ConfigurationError, match="AsyncConnection"):
                task.apply_async(args=(1,), connection=aconn)
        finally:
            await aconn.close()

    for wrong in (dsn, object(), conn.cursor()):
        with pytest.raises(ConfigurationError, match="psycopg"):
            task.apply_async(args=(1,), connection=wrong)
        with pytest.raises(ConfigurationError, match="psycopg"):
            task.delay_many([1, 2], connection=wrong)
    asyncio.run(async_connection())
    assert _count(conn) == 0


# -- bulk --------------------------------------------------------------------------------


def pair(document_id: int, label: str) -> None:
    """A task body of two arguments; never run here."""


def test_delay_many_writes_ten_thousand_jobs_in_one_call(
    app: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    task = app.task(name="pair", queue="ocr")(pair)
    n = 10_000
    items = [(i, f"doc-{i}") for i in range(n)]
    results = task.delay_many(items)
    assert len(results) == n
    ids = [r.id for r in results]
    assert len(set(ids)) == n
    assert _count(conn) == n
    stored = {
        job_id: (first, second)
        for job_id, first, second in conn.execute(
            "SELECT id, (args ->> 0)::int, args ->> 1 FROM pgtasks.jobs"
        ).fetchall()
    }
    assert set(stored) == set(ids)
    assert all(stored[job_id] == items[i] for i, job_id in enumerate(ids))
    for i in (0, 1, 4999, n - 1):
        job = app.get_job(ids[i])
        assert job.args == [i, f"doc-{i}"]
        assert job.queue == "ocr"
        assert job.task_name == "pair"
        assert job.status == pgtasks.JobStatus.QUEUED
        assert job.max_attempts == 4


def test_delay_many_wraps_non_tuple_items_as_one_argument(app: pgtasks.App, task: pgtasks.Task) -> None:
    results = task.delay_many([1, [2, 3], ((4, 5),)] * 30)
    assert [app.get_job(r.id).args for r in results[:3]] == [[1], [[2, 3]], [(4, 5)]]


def test_bulk_with_unique_keys_skips_held_keys(
    app: pgtasks.App, task: pgtasks.Task, conn: psycopg.Connection[Any]
) -> None:
    held = task.apply_async(args=(0,), unique_key="doc:0").id
    sigs = [task.s(i).set(unique_key=f"doc:{i}") for i in range(200)]
    results = app.bulk_apply(sigs)
    assert len(results) == 199  # doc:0 is held
    assert held not in {r.id for r in results}
    assert _count(conn, "unique_key IS NOT NULL") == 200
    assert app.get_job(results[0].id).unique_key == "doc:1"


def test_bulk_with_countdown_sets_run_at_in_the_future(
    app: pgtasks.App, task: pgtasks.Task, conn: psycopg.Connection[Any]
) -> None:
    results = task.delay_many(range(200), countdown=3600)
    assert len(results) == 200
    assert _count(conn, "run_at > now() + interval '3500 seconds'") == 200
    eta = dt.datetime(2040, 1, 1, tzinfo=dt.UTC)
    late = task.delay_many(range(100), eta=eta)
    assert {app.get_job(r.id).run_at for r in late} == {eta}


def test_bulk_mixing_tasks_and_options(app: pgtasks.App, task: pgtasks.Task) -> None:
    second = app.task(name="other", queue="misc")(other)
    n = COPY_THRESHOLD // 2 + 1  # both together: COPY
    sigs = [task.s(i, lang="de").set(priority=5, tenant="acme") for i in range(n)]
    sigs += [second.s(i) for i in range(n)]
    results = app.bulk_apply(sigs)
    jobs = [app.get_job(r.id) for r in results]
    assert [j.task_name for j in jobs] == ["ocr"] * n + ["other"] * n
    assert jobs[0].kwargs == {"lang": "de"}
    assert (jobs[0].priority, jobs[0].tenant, jobs[0].queue) == (5, "acme", "ocr")
    assert (jobs[-1].priority, jobs[-1].tenant, jobs[-1].queue) == (0, "", "misc")


def test_bulk_from_a_generator_keeps_each_signatures_own_options(
    app: pgtasks.App, task: pgtasks.Task
) -> None:
    """Signatures made and dropped one by one (unhashable headers: options cached by identity)."""
    results = app.bulk_apply(task.s(i).set(headers={"n": i}, priority=i % 3) for i in range(300))
    jobs = [app.get_job(r.id) for r in results]
    assert [(j.args[0], j.headers, j.priority) for j in jobs] == [(i, {"n": i}, i % 3) for i in range(300)]


class _Rollback(Exception):
    pass


@pytest.mark.parametrize("size", [10, 1000], ids=["small-insert", "copy"])
@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "unique"])
@pytest.mark.parametrize("mode", ["implicit-idle", "implicit-started", "explicit-block"])
def test_bulk_in_rolled_back_caller_transaction_leaves_nothing(  # noqa: PLR0917 (fixtures)
    task: pgtasks.Task, conn: psycopg.Connection[Any], dsn: str, size: int, keyed: bool, mode: str
) -> None:
    sigs = [task.s(i).set(unique_key=f"k{i}") if keyed else task.s(i) for i in range(size)]
    if mode == "explicit-block":  # autocommit connection, `with conn.transaction()` block
        with (
            psycopg.connect(dsn, autocommit=True) as caller,
            pytest.raises(_Rollback),
            caller.transaction(),
        ):
            assert len(task.app.bulk_apply(sigs, connection=caller)) == size
            raise _Rollback
    else:  # psycopg's default: a transaction opens with the first statement
        with psycopg.connect(dsn) as caller:
            if mode == "implicit-started":
                caller.execute("SELECT 1")
            assert len(task.app.bulk_apply(sigs, connection=caller)) == size
            assert _count(conn) == 0
            caller.rollback()
    assert _count(conn) == 0


def test_bulk_on_autocommit_connection_outside_a_transaction_is_atomic_and_committed(
    task: pgtasks.Task, conn: psycopg.Connection[Any], dsn: str
) -> None:
    with psycopg.connect(dsn, autocommit=True) as caller:
        assert len(task.delay_many(range(300), connection=caller)) == 300
    assert _count(conn) == 300


def test_bulk_in_committed_caller_transaction_is_visible_after_commit(
    task: pgtasks.Task, conn: psycopg.Connection[Any], dsn: str
) -> None:
    with psycopg.connect(dsn) as caller:
        task.delay_many(range(500), connection=caller)
        assert _count(conn) == 0
        caller.commit()
    assert _count(conn) == 500


def test_empty_bulk_writes_nothing(app: pgtasks.App, task: pgtasks.Task) -> None:
    assert task.delay_many([]) == []
    assert app.bulk_apply([]) == []


def test_bad_item_in_bulk_writes_nothing(task: pgtasks.Task, conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(ConfigurationError):
        task.app.bulk_apply([*(task.s(i) for i in range(COPY_THRESHOLD)), task.s(1).set(priority=10**6)])
    assert _count(conn) == 0


def test_a_refused_item_of_a_bulk_call_is_named_by_its_index_and_nothing_is_written(
    app: pgtasks.App, task: pgtasks.Task, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(SerializationError) as info:
        task.delay_many([*range(COPY_THRESHOLD), object(), 101])  # enough for COPY
    assert str(info.value).startswith(
        f"item {COPY_THRESHOLD}: args[0]: values of type object cannot be stored"
    ), info.value
    assert info.value.path == "args[0]"  # where the value sits inside its call, as before
    good = [task.s(i) for i in range(5)]
    for bad, refused, message in (
        (task.s(1).set(priority=10**6), ConfigurationError, "item 2: priority must be an int"),
        (task.s(1).set(countdown=-1), ConfigurationError, "item 2: countdown must be seconds"),
        (task.s(1, 2, 3), ConfigurationError, "item 2: arguments do not fit task 'ocr'"),
        ("ocr(1)", ConfigurationError, "item 2: bulk_apply takes signatures (task.s(...)), got 'ocr(1)'"),
        (task.s(object()), SerializationError, "item 2: args[0]: values of type object"),
        (task.s(1, lang="a\x00b"), SerializationError, "item 2: kwargs['lang']: string contains a NUL"),
        # A call with a callback goes the other way (one enqueue each, in one transaction).
        (task.s(object()).set(link=task.si(1)), SerializationError, "item 2: args[0]: values of type object"),
        (task.s(1).set(link=task.si(1, 2, 3)), ConfigurationError, "item 2: arguments do not fit task 'ocr'"),
    ):
        items: list[Any] = [*good[:2], bad, *good[2:]]  # bad may be no signature at all
        with pytest.raises(refused) as caught:
            app.bulk_apply(items)
        assert str(caught.value).startswith(message), caught.value
    with pytest.raises(ConfigurationError, match=r"^item 0: priority must be an int"):
        task.delay_many(range(3), priority="high")  # an option of every item: the first is named
    assert _count(conn) == 0


# -- options ----------------------------------------------------------------------------


def test_apply_async_options_land_in_the_row(
    app: pgtasks.App, task: pgtasks.Task, conn: psycopg.Connection[Any]
) -> None:
    r = task.apply_async(
        args=(7,),
        kwargs={"lang": "fr"},
        countdown=60,
        priority=-5,
        queue="slow",
        tenant="acme",
        lock="doc:7",
        unique_key="ocr:7",
        headers={"trace_id": "abc"},
        max_retries=0,
    )
    job = app.get_job(r.id)
    assert (job.args, job.kwargs, job.headers) == ([7], {"lang": "fr"}, {"trace_id": "abc"})
    assert (job.priority, job.queue, job.tenant) == (-5, "slow", "acme")
    assert (job.lock_key, job.unique_key, job.max_attempts, job.attempt) == ("doc:7", "ocr:7", 1, 0)
    assert job.trigger == "api"
    delay = conn.execute("SELECT extract(epoch FROM run_at - created_at) FROM pgtasks.jobs").fetchone()
    assert delay is not None
    assert float(delay[0]) == pytest.approx(60, abs=0.001)


def test_task_defaults_apply_and_calls_override_them(app: pgtasks.App) -> None:
    t = app.task(
        name="defaults", queue="q1", priority=3, max_retries=None, tenant="t1", lock=lambda x: f"lock:{x}"
    )(other)
    job = app.get_job(t.delay(5).id)
    assert (job.queue, job.priority, job.tenant, job.lock_key) == ("q1", 3, "t1", "lock:5")
    assert job.max_attempts == 2**31 - 1
    job = app.get_job(t.apply_async(args=(5,), queue="q2", priority=0, tenant="", lock=None).id)
    assert (job.queue, job.priority, job.tenant, job.lock_key) == ("q2", 0, "", None)


def test_eta_is_stored_exactly(app: pgtasks.App, task: pgtasks.Task) -> None:
    eta = dt.datetime(2031, 7, 1, 9, 15, 30, 123456, tzinfo=ZoneInfo("Europe/Berlin"))
    job = app.get_job(task.apply_async(args=(1,), eta=eta).id)
    assert job.run_at == eta
    assert job.run_at.timestamp() == eta.timestamp()


def test_signature_set_and_delay(app: pgtasks.App, task: pgtasks.Task) -> None:
    sig = task.s(3, lang="nl").set(queue="q", priority=9)
    assert sig.options == {"queue": "q", "priority": 9}
    job = app.get_job(sig.delay().id)
    assert (job.args, job.kwargs, job.queue, job.priority) == ([3], {"lang": "nl"}, "q", 9)
    with pytest.raises(ConfigurationError, match="unknown option"):
        sig.set(retries=3)


def test_async_variants_enqueue(app: pgtasks.App, task: pgtasks.Task) -> None:
    async def main() -> list[int]:
        a = await task.delay_async(1)
        b = await task.apply_async_async(args=(2,), priority=4)
        return [a.id, b.id]

    ids = asyncio.run(main())
    assert [app.get_job(i).args for i in ids] == [[1], [2]]
    assert app.get_job(ids[1]).priority == 4


# -- bad input: typed errors, nothing written ------------------------------------------------


BAD_OPTIONS: list[tuple[str, dict[str, Any], str]] = [
    ("unknown-option", {"retries": 3}, "unknown option"),
    ("celery-only-option", {"expires": 10}, "unknown option"),
    ("negative-countdown", {"countdown": -1}, "countdown"),
    ("nan-countdown", {"countdown": float("nan")}, "countdown"),
    ("string-countdown", {"countdown": "10"}, "countdown"),
    ("huge-countdown", {"countdown": 1e12}, "countdown"),
    (
        "countdown-and-eta",
        {"countdown": 1, "eta": dt.datetime(2030, 1, 1, tzinfo=dt.UTC)},
        "countdown or eta",
    ),
    ("naive-eta", {"eta": dt.datetime(2030, 1, 1)}, "timezone-aware"),
    ("date-eta", {"eta": dt.date(2030, 1, 1)}, "datetime"),
    ("priority-too-high", {"priority": 32768}, "priority"),
    ("priority-too-low", {"priority": -32769}, "priority"),
    ("priority-float", {"priority": 1.5}, "priority"),
    ("priority-bool", {"priority": True}, "priority"),
    ("priority-none", {"priority": None}, "priority"),
    ("empty-queue", {"queue": ""}, "queue"),
    ("queue-not-str", {"queue": 5}, "queue"),
    ("queue-with-nul", {"queue": "a\x00"}, "queue"),
    ("tenant-not-str", {"tenant": 1}, "tenant"),
    ("tenant-with-nul", {"tenant": "a\x00"}, "tenant"),
    ("empty-lock", {"lock": ""}, "lock"),
    ("lock-not-str", {"lock": 5}, "lock"),
    ("unique-key-with-nul", {"unique_key": "a\x00b"}, "unique_key"),
    ("negative-max-retries", {"max_retries": -1}, "max_retries"),
    ("bool-max-retries", {"max_retries": True}, "max_retries"),
    ("headers-not-dict", {"headers": "x=1"}, "headers"),
]


@pytest.mark.parametrize(("options", "match"), [b[1:] for b in BAD_OPTIONS], ids=[b[0] for b in BAD_OPTIONS])
def test_bad_enqueue_option_raises_configuration_error_and_writes_nothing(
    task: pgtasks.Task, conn: psycopg.Connection[Any], options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigurationError, match=match):
        task.apply_async(args=(1,), **options)
    with pytest.raises(ConfigurationError, match=match):
        task.delay_many(range(COPY_THRESHOLD), **options)
    assert _count(conn) == 0


BAD_TASK_OPTIONS: list[tuple[str, dict[str, Any], str]] = [
    ("unknown", {"retries": 3}, "unknown task option"),
    ("bad-rate-limit", {"rate_limit": "10/x"}, "rate_limit must look like"),
    ("empty-queue", {"queue": ""}, "queue"),
    ("bad-priority", {"priority": 10**6}, "priority"),
    ("negative-max-retries", {"max_retries": -2}, "max_retries"),
    ("autoretry-not-exception", {"autoretry_for": (int,)}, "autoretry_for"),
    ("negative-time-limit", {"time_limit": -1}, "time_limit"),
    ("string-time-limit", {"time_limit": "10"}, "time_limit"),
    ("string-backoff", {"retry_backoff": "fast"}, "retry_backoff"),
    ("infinite-backoff-max", {"retry_backoff_max": float("inf")}, "retry_backoff_max"),
    ("negative-retry-delay", {"default_retry_delay": -5}, "default_retry_delay"),
    ("empty-name", {"name": ""}, "name"),
    ("nul-name", {"name": "a\x00b"}, "name"),
]


@pytest.mark.parametrize(
    ("options", "match"), [b[1:] for b in BAD_TASK_OPTIONS], ids=[b[0] for b in BAD_TASK_OPTIONS]
)
def test_bad_task_option_raises_configuration_error(
    app: pgtasks.App, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigurationError, match=match):
        app.task(**options)(other)
    assert app.tasks == {}


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ("42", None, "args must be"),
        (42, None, "args must be"),
        ({"a": 1}, None, "args must be"),
        ((1,), [("lang", "de")], "kwargs must be"),
        ((1,), "lang=de", "kwargs must be"),
    ],
    ids=["str-args", "int-args", "dict-args", "pairs-kwargs", "str-kwargs"],
)
def test_args_and_kwargs_of_the_wrong_shape_are_refused(
    task: pgtasks.Task, conn: psycopg.Connection[Any], args: Any, kwargs: Any, match: str
) -> None:
    with pytest.raises(ConfigurationError, match=match):
        task.apply_async(args, kwargs)
    assert _count(conn) == 0


def test_args_may_be_any_sequence(app: pgtasks.App, task: pgtasks.Task) -> None:
    assert app.get_job(task.apply_async([1], {"lang": "de"}).id).args == [1]
    assert app.get_job(task.apply_async(x for x in (2,)).id).args == [2]


def test_task_name_collision_raises_configuration_error(app: pgtasks.App) -> None:
    app.task(name="same")(ocr)
    with pytest.raises(ConfigurationError, match="already registered"):
        app.task(name="same")(other)
    assert app.tasks["same"].fn is ocr


def test_default_names_collide_when_a_function_is_registered_twice(app: pgtasks.App) -> None:
    app.task(other)
    with pytest.raises(ConfigurationError, match=r"test_enqueue\.other"):
        app.task(other)


def test_unique_key_conflict_raises_already_queued_with_the_holder(
    app: pgtasks.App, task: pgtasks.Task, conn: psycopg.Connection[Any]
) -> None:
    first = task.apply_async(args=(42,), unique_key="ocr:42")
    with pytest.raises(AlreadyQueued) as info:
        task.apply_async(args=(43,), unique_key="ocr:42")
    assert info.value.job_id == first.id
    assert info.value.unique_key == "ocr:42"
    assert str(first.id) in str(info.value)
    assert _count(conn) == 1

    # Still held while running.
    assert [r["id"] for r in _claim(app, ["ocr"])] == [first.id]
    with pytest.raises(AlreadyQueued) as info:
        task.apply_async(args=(44,), unique_key="ocr:42")
    assert info.value.job_id == first.id

    # Free again once the holder finished.
    _succeed(app, first.id, {"pages": 3})
    second = task.apply_async(args=(45,), unique_key="ocr:42")
    assert second.id != first.id
    assert app.get_job(second.id).status == pgtasks.JobStatus.QUEUED


def test_unique_key_conflict_inside_caller_transaction(
    app: pgtasks.App, task: pgtasks.Task, conn: psycopg.Connection[Any], dsn: str
) -> None:
    first = task.apply_async(args=(1,), unique_key="k")
    with psycopg.connect(dsn) as caller:
        with pytest.raises(AlreadyQueued) as info:
            task.apply_async(args=(2,), unique_key="k", connection=caller)
        assert info.value.job_id == first.id
        caller.rollback()
    assert _count(conn) == 1


def test_unique_key_from_a_task_rule(app: pgtasks.App) -> None:
    t = app.task(name="keyed", unique_key=lambda doc: f"doc:{doc}")(other)
    held = t.delay(1)
    with pytest.raises(AlreadyQueued) as info:
        t.delay(1)
    assert info.value.job_id == held.id
    assert t.delay(2).id != held.id


def test_key_rule_returning_non_string_is_refused(app: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    t = app.task(name="badkey", lock=lambda doc: doc)(other)
    with pytest.raises(ConfigurationError, match="expected str"):
        t.delay(1)
    assert _count(conn) == 0


def test_every_enqueue_error_is_a_pgtasks_error() -> None:
    for cls in (ConfigurationError, AlreadyQueued, pgtasks.errors.SerializationError):
        assert issubclass(cls, PgtasksError)


# -- values that go into an index are bounded at the call site -----------------------------

# 3,000 characters that do not compress (PostgreSQL compresses a long index entry, so a
# repetitive key might fit its index, and the test would prove less than it says).
OVERSIZED = "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(47))[:3000]
INDEXED_OPTIONS = ["lock", "unique_key", "queue", "tenant"]


def _opt(option: str, value: str) -> dict[str, Any]:
    """One enqueue option, as ``**`` keyword arguments."""
    return {option: value}


@pytest.mark.parametrize("option", INDEXED_OPTIONS)
def test_oversized_indexed_value_is_refused_at_apply_async_and_in_bulk(
    task: pgtasks.Task, conn: psycopg.Connection[Any], option: str
) -> None:
    assert len(OVERSIZED) == 3000
    match = rf"{option} .*3000 bytes in UTF-8; at most {MAX_KEY_BYTES} "
    with pytest.raises(ConfigurationError, match=match):
        task.apply_async(args=(1,), **_opt(option, OVERSIZED))
    with pytest.raises(ConfigurationError, match=match):
        # COPY (unique keys: the multi-row INSERT)
        task.delay_many(range(COPY_THRESHOLD), **_opt(option, OVERSIZED))
    with pytest.raises(ConfigurationError, match=match):
        task.delay_many(range(3), **_opt(option, OVERSIZED))  # multi-row INSERT
    good, bad = task.s(1), task.s(2).set(**_opt(option, OVERSIZED))
    with pytest.raises(ConfigurationError, match=match):
        task.app.bulk_apply([good, bad])
    assert _count(conn) == 0


@pytest.mark.parametrize("option", INDEXED_OPTIONS)
def test_indexed_value_at_the_bound_is_accepted_and_the_bound_counts_bytes(
    task: pgtasks.Task, conn: psycopg.Connection[Any], option: str
) -> None:
    at_bound = OVERSIZED[:MAX_KEY_BYTES]
    two_byte = "é" * (MAX_KEY_BYTES // 2)  # 500 characters, 1,000 bytes
    job = task.apply_async(args=(1,), **_opt(option, at_bound))
    other_job = task.apply_async(args=(2,), **_opt(option, two_byte))
    column = {"lock": "lock_key"}.get(option, option)
    stored = conn.execute(
        f"SELECT {column} FROM pgtasks.jobs WHERE id = ANY(%s) ORDER BY id", ([job.id, other_job.id],)
    ).fetchall()
    assert stored == [(at_bound,), (two_byte,)]
    with pytest.raises(ConfigurationError, match="1002 bytes in UTF-8"):
        task.apply_async(args=(3,), **_opt(option, "é" * 501))  # 501 characters, 1,002 bytes
    assert _count(conn) == 2


def test_lone_surrogate_in_an_indexed_value_is_refused(
    task: pgtasks.Task, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(ConfigurationError, match="lone surrogate at index 3"):
        task.apply_async(args=(1,), lock="doc\ud800")
    assert _count(conn) == 0


def test_task_level_keys_are_bounded(app: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    for option in ("lock", "unique_key", "queue", "tenant"):
        with pytest.raises(ConfigurationError, match=f"{option} .*3000 bytes"):
            app.task(name=f"fixed-{option}", **_opt(option, OVERSIZED))(other)
    assert app.tasks == {}
    ruled = app.task(name="ruled", lock=lambda x: OVERSIZED, unique_key=lambda x: OVERSIZED)(other)
    with pytest.raises(ConfigurationError, match=r"lock .*3000 bytes"):
        ruled.delay(1)
    with pytest.raises(ConfigurationError, match=r"lock .*3000 bytes"):
        ruled.delay_many(range(COPY_THRESHOLD))
    assert _count(conn) == 0


@pytest.mark.parametrize("option", ["lock", "queue", "tenant"])
def test_schedule_with_an_oversized_indexed_value_is_refused_and_not_written(
    app: pgtasks.App, conn: psycopg.Connection[Any], option: str
) -> None:
    if option == "lock":  # a schedule's lock key is its task's rule, resolved with its arguments
        target = app.task(name="nightly", lock=lambda: OVERSIZED)(lambda: None)
        overrides: dict[str, Any] = {}
    else:
        target = app.task(name="nightly")(lambda: None)
        overrides = {option: OVERSIZED}
    match = f"{'lock key' if option == 'lock' else option} .*3000 bytes"
    with pytest.raises(ConfigurationError, match=match):
        app.schedules.create("nightly", target, "0 2 * * *", **overrides)
    with pytest.raises(ConfigurationError, match=match):
        app.add_periodic_task("0 2 * * *", target, name="nightly-code", **overrides)
    decorator_options = {"lock": lambda: OVERSIZED} if option == "lock" else overrides
    with pytest.raises(ConfigurationError, match=match):
        app.periodic_task("0 3 * * *", name="decorated", **decorator_options)(lambda: None)
    assert app.schedules.sync() is not None
    assert conn.execute("SELECT count(*) FROM pgtasks.schedules").fetchone() == (0,)
    at_bound = app.schedules.create(
        "at-bound", app.task(name="plain")(lambda: None), "0 2 * * *", queue=OVERSIZED[:MAX_KEY_BYTES]
    )
    assert at_bound.name == "at-bound"
