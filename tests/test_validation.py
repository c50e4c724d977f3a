"""Bad input at the public boundary: a typed error naming the parameter and the limit,
and nothing written (each test counts the rows of the real database).

One test per kind of input a careless or hostile caller hands pgtasks: instants
PostgreSQL and Python cannot both hold, names too long for an index or not valid
UTF-8, numbers too large for a float, calls that do not fit the task's signature,
and parameters that would make a call loop or wait forever.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import pgtasks
from pgtasks.cli import cli
from pgtasks.context import Request, TaskContext
from pgtasks.enqueue import COPY_THRESHOLD
from pgtasks.errors import ConfigurationError, InvalidSchedule, PgtasksError, Retry
from pgtasks.maintenance import ReaperConfig
from pgtasks.scheduler import SchedulerConfig
from pgtasks.settings import Settings
from pgtasks.validation import MAX_HEADERS_BYTES, MAX_INSTANT, MAX_KEY_BYTES, MIN_INSTANT
from pgtasks.worker.config import WorkerConfig
from pgtasks.worker.outcome import decide

LONG = "x" * 10_000
SURROGATE = "bad\ud800name"
END_OF_PYTHON = dt.datetime.max.replace(tzinfo=dt.UTC)


def ocr(document_id: int, *, lang: str = "en") -> None:
    """A task body of one positional argument and an optional keyword; never run here."""


def forward(*args: Any, **kwargs: Any) -> None:
    """A proxy that passes everything on."""


def backup(self: TaskContext, target: str) -> None:
    """A bound task body."""


@pytest.fixture
def task(app: pgtasks.App) -> pgtasks.Task:
    return app.task(name="ocr", queue="ocr")(ocr)


@pytest.fixture
def sapp(dsn: str) -> Iterator[pgtasks.App]:
    application = pgtasks.App("validation", dsn=dsn, load_entry_points=False)
    application.task(name="ocr")(ocr)
    yield application
    application.close()


def _rows(conn: psycopg.Connection[Any], table: str = "jobs") -> int:
    row = conn.execute(f"SELECT count(*) FROM pgtasks.{table}").fetchone()
    assert row is not None
    return int(row[0])


def _refused(
    conn: psycopg.Connection[Any], call: Callable[[], object], *needles: str, error: type = ConfigurationError
) -> str:
    """Run ``call``; it must raise ``error`` whose message holds every needle, and write nothing."""
    jobs, schedules = _rows(conn), _rows(conn, "schedules")
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, PgtasksError)
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    assert (_rows(conn), _rows(conn, "schedules")) == (jobs, schedules)
    return message


# -- instants ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "eta",
    [
        # year 9999 locally, year 10000 in UTC: PostgreSQL stores it, Python cannot read it back
        dt.datetime(9999, 12, 31, 23, 0, tzinfo=dt.timezone(-dt.timedelta(hours=12))),
        dt.datetime(9999, 12, 31, 12, 0, tzinfo=dt.UTC),
        # year 1 locally, year 0 in UTC
        dt.datetime(1, 1, 1, 1, 0, tzinfo=dt.timezone(dt.timedelta(hours=14))),
    ],
    ids=["year-10000-utc", "last-day", "year-0-utc"],
)
def test_eta_outside_the_instants_both_sides_hold_is_refused(
    task: pgtasks.Task, conn: psycopg.Connection[Any], eta: dt.datetime
) -> None:
    _refused(conn, lambda: task.apply_async((1,), eta=eta), "eta", MAX_INSTANT.isoformat())


def test_eta_at_the_bounds_is_accepted_and_reads_back(app: pgtasks.App, task: pgtasks.Task) -> None:
    for eta in (MIN_INSTANT, MAX_INSTANT):
        job = app.get_job(task.apply_async((1,), eta=eta).id)
        assert job.run_at == eta
    assert len(app.list_jobs()) == 2


def test_eta_out_of_range_in_a_bulk_call_writes_no_job(
    app: pgtasks.App, task: pgtasks.Task, conn: psycopg.Connection[Any]
) -> None:
    far = dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(-dt.timedelta(hours=12)))
    _refused(conn, lambda: app.bulk_apply([task.s(1), task.s(2).set(eta=far)]), "eta")
    _refused(conn, lambda: task.delay_many([1, 2], eta=far), "eta")


def test_countdown_too_large_for_a_float_is_refused(
    task: pgtasks.Task, conn: psycopg.Connection[Any]
) -> None:
    _refused(conn, lambda: task.apply_async((1,), countdown=10**400), "countdown", "315576000")


@pytest.mark.parametrize("option", ["countdown", "unique_key", "priority"])
def test_an_int_too_long_to_print_is_refused_with_a_typed_error(
    task: pgtasks.Task, conn: psycopg.Connection[Any], option: str
) -> None:
    """Python refuses str() of an int past 4,300 digits; the refusal must not trip on it."""
    huge: dict[str, Any] = {option: 10**4300}
    _refused(conn, lambda: task.apply_async((1,), **huge), option, "bits")


def test_schedule_args_kwargs_and_after_of_the_wrong_type_are_refused(
    sapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    cases: list[dict[str, Any]] = [{"kwargs": "0"}, {"kwargs": True}, {"args": 5}, {"after": 3}]
    for bad in cases:
        options: dict[str, Any] = {"args": (1,), **bad}
        _refused(
            conn,
            functools.partial(sapp.schedules.create, "nightly", "ocr", "0 3 * * *", **options),
            next(iter(bad)),
            error=InvalidSchedule,
        )
    sapp.schedules.create("nightly", "ocr", "0 3 * * *", args=(1,), after=None)  # None: no prerequisite
    assert _rows(conn, "schedules") == 1


def test_time_limit_beyond_the_longest_delay_is_refused(app: pgtasks.App) -> None:
    for option in ("time_limit", "soft_time_limit"):
        with pytest.raises(
            ConfigurationError, match=f"{option} must be seconds in 0 \\(exclusive\\)..315576000"
        ):
            app.task(name=f"slow-{option}", **{option: 1e12})(ocr)
    assert not {"slow-time_limit", "slow-soft_time_limit"} & set(app.tasks)


def test_schedule_time_past_the_last_instant_is_refused(
    sapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    late = dt.datetime(9999, 12, 30, tzinfo=dt.UTC)
    _refused(
        conn,
        lambda: sapp.schedules.create("yearly", "ocr", "0 0 1 1 *", args=(1,), now=late),
        "no fire time",
        error=InvalidSchedule,
    )
    _refused(
        conn,
        lambda: sapp.schedules.create(
            "far", "ocr", "0 0 1 1 *", args=(1,), now=dt.datetime.max.replace(tzinfo=dt.UTC)
        ),
        "now",
    )
    sapp.schedules.create("yearly", "ocr", "0 0 1 1 *", args=(1,))
    assert sapp.schedules.next_fire_times("yearly", 3, after=dt.datetime(9998, 6, 1, tzinfo=dt.UTC)) == [
        dt.datetime(9999, 1, 1, tzinfo=dt.UTC)
    ]
    with pytest.raises(ConfigurationError, match=re.escape("n must be an int in 0..1000")):
        sapp.schedules.next_fire_times("yearly", -1)


@pytest.mark.parametrize(
    "countdown", [float("inf"), float("nan"), 10**400, "soon"], ids=["inf", "nan", "huge", "str"]
)
def test_a_retry_countdown_no_run_at_can_follow_is_refused(app: pgtasks.App, countdown: Any) -> None:
    bound = app.task(name="backup", bind=True)(backup)
    with pytest.raises(ConfigurationError, match="retry countdown must be seconds"):
        TaskContext.detached(bound, ("/srv",), {}).retry(countdown=countdown)
    # raised by hand instead: the worker fails the job, saying why, instead of crashing
    request = Request(id=1, task_name="backup", attempt=1, max_attempts=4)
    outcome = decide(Retry(countdown=countdown), bound.options, request)
    assert outcome.status == pgtasks.JobStatus.FAILED
    assert outcome.error["type"] == "ConfigurationError"
    assert "retry countdown must be seconds" in outcome.error["message"]
    assert decide(Retry(countdown=-3), bound.options, request).delay == 0.0  # negative: at once, as before


# -- names: size and UTF-8 -------------------------------------------------------------


def test_task_name_too_long_or_not_utf8_is_refused(app: pgtasks.App) -> None:
    with pytest.raises(ConfigurationError, match=f"at most {MAX_KEY_BYTES} are allowed"):
        app.task(name=LONG)(ocr)
    with pytest.raises(ConfigurationError, match="lone surrogate at index 3"):
        app.task(name=SURROGATE)(ocr)
    assert not {LONG, SURROGATE} & set(app.tasks)


def test_schedule_name_not_utf8_is_refused(sapp: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    _refused(
        conn,
        lambda: sapp.schedules.create(SURROGATE, "ocr", "@daily", args=(1,)),
        "lone surrogate",
        error=InvalidSchedule,
    )
    with pytest.raises(InvalidSchedule, match="lone surrogate"):
        sapp.add_periodic_task("@daily", "ocr", name=SURROGATE, args=(1,))
    assert sapp.schedules.code_defined == {}


@pytest.mark.parametrize("operation", ["trigger", "pause", "resume", "delete", "change", "history"])
def test_schedule_operations_refuse_a_name_that_is_not_utf8(sapp: pgtasks.App, operation: str) -> None:
    with pytest.raises(InvalidSchedule, match="lone surrogate"):
        getattr(sapp.schedules, operation)(SURROGATE)


def test_schedule_args_given_as_a_string_are_refused(
    sapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    _refused(
        conn,
        lambda: sapp.schedules.create("daily", "ocr", "@daily", args="7"),
        "args must be a tuple or list, not str",
        error=InvalidSchedule,
    )


def test_a_task_must_wrap_a_function(app: pgtasks.App) -> None:
    with pytest.raises(ConfigurationError, match="must wrap a function, got 42"):
        app.task(name="number")(42)  # type: ignore[arg-type]
    assert "number" not in app.tasks


def test_headers_larger_than_the_bound_are_refused(task: pgtasks.Task, conn: psycopg.Connection[Any]) -> None:
    big = {"note": "y" * MAX_HEADERS_BYTES}
    _refused(conn, lambda: task.apply_async((1,), headers=big), "headers", str(MAX_HEADERS_BYTES))
    _refused(conn, lambda: task.delay_many([1, 2], headers=big), "headers")


@pytest.mark.parametrize("parameter", ["queue", "task_name", "tenant"])
def test_list_jobs_filter_not_utf8_or_too_long_is_refused(app: pgtasks.App, parameter: str) -> None:
    surrogate: dict[str, Any] = {parameter: SURROGATE}
    long: dict[str, Any] = {parameter: LONG}
    with pytest.raises(ConfigurationError, match=f"{parameter} .*lone surrogate"):
        app.list_jobs(**surrogate)
    with pytest.raises(ConfigurationError, match=f"at most {MAX_KEY_BYTES}"):
        app.list_jobs(**long)


def test_schedule_actor_texts_are_checked(sapp: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    sapp.schedules.create("nightly", "ocr", "@daily", args=(1,))
    _refused(conn, lambda: sapp.schedules.trigger("nightly", requested_by=SURROGATE), "requested_by")
    _refused(conn, lambda: sapp.schedules.trigger("nightly", requested_by=LONG), "requested_by", "1000")
    with pytest.raises(ConfigurationError, match=r"by .*lone surrogate"):
        sapp.schedules.pause("nightly", by=SURROGATE)
    assert sapp.schedules.get("nightly").paused is False


# -- names: control characters ------------------------------------------------------------

# Names that would act on a terminal or look like another name: an ANSI colour, a C1
# control, a bell, a newline, a right-to-left override, a directional isolate.
HIDDEN = {
    "esc": "mail\x1b[31m",
    "c1": "mail\x9b31m",
    "bell": "ma\x07il",
    "newline": "mail\n",
    "rtl": "mail\u202e",
    "isolate": "\u2066mail",
}
_NAME_OPTIONS: dict[str, Callable[[str], dict[str, Any]]] = {
    "queue": lambda name: {"queue": name},
    "tenant": lambda name: {"tenant": name},
    "lock": lambda name: {"lock": name},
    "unique_key": lambda name: {"unique_key": name},
    "concurrency_key": lambda name: {"concurrency_key": name, "concurrency_limit": 1},
    "rate_limit_key": lambda name: {"rate_limit_key": name, "rate_limit": "5/s"},
}


@pytest.mark.parametrize("option", sorted(_NAME_OPTIONS))
@pytest.mark.parametrize("name", sorted(HIDDEN))
def test_a_name_with_a_control_character_is_refused_at_every_enqueue(
    app: pgtasks.App, task: pgtasks.Task, conn: psycopg.Connection[Any], option: str, name: str
) -> None:
    options = _NAME_OPTIONS[option](HIDDEN[name])
    needle = f"{option} {HIDDEN[name]!a} contains U+"
    _refused(conn, lambda: task.apply_async((1,), **options), needle)
    _refused(conn, lambda: app.send_task("ocr", (1,), **options), needle)
    _refused(conn, lambda: task.delay_many([1, 2, 3], **options), needle)  # one multi-row INSERT
    _refused(conn, lambda: task.delay_many(list(range(COPY_THRESHOLD)), **options), needle)  # COPY when plain


def test_a_key_a_rule_makes_from_one_call_s_arguments_refuses_the_whole_batch(
    app: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    locked = app.task(name="locked", lock=lambda i: f"doc:{i}")(ocr)
    keyed = app.task(name="keyed", concurrency_key="document_id", concurrency_limit=2)(ocr)
    ids: list[Any] = [*range(99), "7\x1b[2J"]
    _refused(conn, lambda: locked.delay_many(ids), "lock 'doc:7\\x1b[2J' contains U+001B at index 5")
    _refused(conn, lambda: keyed.delay_many(ids), "concurrency_key 'document_id=7\\x1b[2J' contains U+001B")
    assert len(locked.delay_many(range(99))) == 99  # printable keys are written as before


def test_the_asyncio_enqueue_refuses_a_name_with_a_control_character(
    task: pgtasks.Task, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    async def enqueue() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            await task.apply_async_async((1,), connection=aconn, queue=HIDDEN["esc"])

    _refused(conn, lambda: asyncio.run(enqueue()), "queue 'mail\\x1b[31m' contains U+001B at index 4")


def test_task_options_with_a_control_character_are_refused(app: pgtasks.App) -> None:
    for options in ({"queue": HIDDEN["esc"]}, {"tenant": HIDDEN["rtl"]}, {"lock": HIDDEN["bell"]}):
        with pytest.raises(ConfigurationError, match="contains U\\+"):
            app.task(name="refused", **options)(ocr)
    assert "refused" not in app.tasks


def test_printable_names_of_any_script_are_accepted(
    task: pgtasks.Task, conn: psycopg.Connection[Any]
) -> None:
    """Only control characters and the marks that reorder text are refused: spaces,
    non-breaking spaces, accents, emoji and other scripts are names as before."""
    name = "mail é€𝄞 \u00a0 \u05d0\u05d1 👩\u200d💻"
    job = task.apply_async((1,), queue=name, tenant=name, lock=name, unique_key=name)
    row = conn.execute(
        "SELECT queue, tenant, lock_key, unique_key FROM pgtasks.jobs WHERE id = %s", (job.id,)
    )
    assert row.fetchone() == (name, name, name, name)


def test_a_worker_refuses_to_serve_a_queue_with_a_control_character(dsn: str) -> None:
    with pytest.raises(ConfigurationError, match="queue 'mail\\\\x1b\\[31m' contains U\\+001B"):
        WorkerConfig(queues=("default", HIDDEN["esc"]))
    with pytest.raises(ConfigurationError, match="worker_id"):
        WorkerConfig(worker_id=HIDDEN["rtl"])
    result = CliRunner().invoke(
        cli,
        [
            "--dsn",
            dsn,
            "-A",
            "tests.apps.worker_app:app",
            "worker",
            "--burst",
            "-Q",
            f"default,{HIDDEN['esc']}",
        ],
        env={"PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    assert result.exit_code == 2, result.output
    assert "contains U+001B" in result.output and "\x1b" not in result.output


# -- the call against the task's signature ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "needle"),
    [
        ((1, 2), {}, "too many positional arguments"),
        ((), {}, "missing a required argument: 'document_id'"),
        ((1,), {"language": "de"}, "unexpected keyword argument 'language'"),
        ((1,), {"document_id": 2}, "multiple values for argument 'document_id'"),
    ],
    ids=["too-many", "missing", "unknown-keyword", "twice"],
)
def test_call_that_does_not_fit_the_signature_is_refused(
    task: pgtasks.Task,
    conn: psycopg.Connection[Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    needle: str,
) -> None:
    _refused(conn, lambda: task.apply_async(args, kwargs), "'ocr'", needle, "typing=False")


def test_fitting_calls_are_accepted(app: pgtasks.App, task: pgtasks.Task) -> None:
    task.delay(1)
    task.delay(1, lang="de")
    task.delay(document_id=3)
    assert len(app.list_jobs()) == 3


def test_bulk_calls_are_checked_against_the_signature(
    app: pgtasks.App, task: pgtasks.Task, conn: psycopg.Connection[Any]
) -> None:
    _refused(conn, lambda: task.delay_many([1, (2, 3)]), "too many positional arguments")
    _refused(conn, lambda: app.bulk_apply([task.s(1), task.s(1, bogus=True)]), "'bogus'")


def test_a_bound_task_is_checked_without_its_context(app: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    bound = app.task(name="backup", bind=True)(backup)
    bound.delay("/srv")
    _refused(conn, bound.delay, "missing a required argument: 'target'")
    _refused(conn, lambda: bound.delay("/srv", "/tmp"), "too many positional arguments")
    assert _rows(conn) == 1


def test_typing_false_lets_any_call_through(app: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    strict = app.task(name="strict")(ocr)
    loose = app.task(name="loose", typing=False)(ocr)
    _refused(conn, lambda: strict.delay(1, 2, 3), "too many")
    loose.delay(1, 2, 3)
    assert _rows(conn) == 1
    with pytest.raises(ConfigurationError, match="typing must be True or False"):
        app.task(name="odd", typing="no")(ocr)


def test_schedule_arguments_are_checked_against_the_signature(
    sapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(ConfigurationError, match="too many positional arguments"):
        sapp.add_periodic_task("@daily", "ocr", name="two", args=(1, 2))
    _refused(conn, lambda: sapp.schedules.create("none", "ocr", "@daily"), "missing a required argument")
    sapp.schedules.create("one", "ocr", "@daily", args=(1,))
    _refused(conn, lambda: sapp.schedules.change("one", args=(1, 2)), "too many positional arguments")
    assert sapp.schedules.get("one").args == [1]


# -- parameters that would loop or wait forever -------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"batch": 0}, "batch must be an int in 1..1000000"),
        ({"batch": -1}, "batch must be an int in 1..1000000"),
        ({"older_than": float("nan")}, "older_than must be seconds"),
        ({"older_than": float("inf")}, "older_than must be seconds"),
        ({"older_than": -5}, "older_than must be seconds"),
        ({"status": "queued"}, "status must be one of cancelled, failed, partial_failure, succeeded"),
    ],
    ids=["batch-0", "batch-negative", "age-nan", "age-inf", "age-negative", "unfinished-status"],
)
def test_purge_refuses_parameters_that_make_no_sense(
    app: pgtasks.App, task: pgtasks.Task, conn: psycopg.Connection[Any], kwargs: dict[str, Any], needle: str
) -> None:
    task.delay(1)
    conn.execute("UPDATE pgtasks.jobs SET status = 'cancelled', finished_at = now() - interval '30 days'")
    _refused(conn, lambda: app.purge(**kwargs), needle)
    assert _rows(conn) == 1


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"limit": 0}, "limit must be an int in 1..1000"),
        ({"limit": 10**6}, "limit must be an int in 1..1000"),
        ({"status": "bogus"}, "status must be one of"),
        ({"before_id": 2**70}, "before_id must be an int in"),
    ],
    ids=["limit-0", "limit-huge", "unknown-status", "id-past-bigint"],
)
def test_list_jobs_refuses_bounds_out_of_range(app: pgtasks.App, kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        app.list_jobs(**kwargs)


@pytest.mark.parametrize("job_id", ["abc", 2**70, 1.5, None])
def test_job_ids_outside_bigint_are_refused(
    app: pgtasks.App, task: pgtasks.Task, conn: psycopg.Connection[Any], job_id: Any
) -> None:
    task.delay(1)
    calls: tuple[Callable[[Any], object], ...] = (app.get_job, app.cancel, app.requeue, app.AsyncResult)
    for call in calls:
        _refused(conn, functools.partial(call, job_id), "job", "9223372036854775807")
    assert app.list_jobs()[0].status == "queued"


def test_schedule_history_refuses_an_id_past_bigint(sapp: pgtasks.App) -> None:
    sapp.schedules.create("nightly", "ocr", "@daily", args=(1,))
    with pytest.raises(ConfigurationError, match="before_id must be an int"):
        sapp.schedules.history("nightly", before_id=2**70)


@pytest.mark.parametrize(
    "timeout", [float("nan"), float("inf"), -1, 10**400], ids=["nan", "inf", "negative", "huge"]
)
def test_result_get_refuses_a_timeout_it_cannot_keep(task: pgtasks.Task, timeout: float) -> None:
    result = task.delay(1)  # stays queued: nobody runs it
    outcome: list[BaseException | None] = []

    def wait() -> None:
        try:
            result.get(timeout=timeout)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(10)
    assert outcome, "get() kept waiting"
    assert isinstance(outcome[0], ConfigurationError), outcome
    assert "timeout must be seconds" in str(outcome[0])


# -- worker configuration --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"queues": ("ocr", LONG)}, "at most 1000"),
        ({"queues": (SURROGATE,)}, "lone surrogate"),
        ({"queues": "ocr"}, "queues must be a non-empty tuple"),
        ({"concurrency": 10**6}, "concurrency must be an int in 1..10000"),
        ({"poll_interval": 1e300}, "poll_interval must be seconds"),
        ({"lease_timeout": "30"}, "lease_timeout must be seconds"),
        ({"completion_delay": float("nan")}, "completion_delay must be seconds"),
        ({"hostname": SURROGATE}, "hostname"),
        ({"worker_id": LONG}, "worker_id"),
        ({"listen": "no"}, "listen must be True or False"),
    ],
    ids=["queue-long", "queue-surrogate", "queues-str", "concurrency", "poll", "lease-str", "delay-nan",
         "hostname", "worker-id", "listen"],
)  # fmt: skip
def test_worker_config_refuses_values_of_the_wrong_type_or_range(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(needle)):
        WorkerConfig(**kwargs)


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: SchedulerConfig(interval=float("inf")), "interval must be seconds"),
        (lambda: SchedulerConfig(batch=0), "batch must be an int in 1..1000000"),
        (lambda: SchedulerConfig(reap="yes"), "reap must be True or False"),  # type: ignore[arg-type]
        (lambda: ReaperConfig(lease_timeout=float("nan")), "lease_timeout must be seconds"),
        (lambda: ReaperConfig(interval=0), "interval must be seconds"),
        (lambda: ReaperConfig(forget_workers_after=1e300), "forget_workers_after must be seconds"),
        (lambda: ReaperConfig(batch=-1), "batch must be an int in 1..1000000"),
    ],
    ids=["tick-inf", "batch-0", "reap-str", "lease-nan", "reap-interval-0", "forget-huge", "reap-batch"],
)
def test_scheduler_and_reaper_configs_refuse_intervals_and_batches_out_of_range(
    make: Callable[[], object], needle: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(needle)):
        make()


# -- settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"pool_size": "8"}, "pool_size must be an int in 1..1000"),
        ({"pool_size": 10**6}, "pool_size must be an int in 1..1000"),
        ({"prepare_threshold": -1}, "prepare_threshold must be an int in 0.."),
        ({"load_entry_points": "no"}, "load_entry_points must be True or False"),
        ({"dsn": "postgresql:///x\x00"}, "NUL"),
        ({"dsn": "postgresql:///x?password=" + "s" * 9000}, "at most 8192"),
    ],
    ids=["pool-str", "pool-huge", "prepare-negative", "autoload-str", "dsn-nul", "dsn-huge"],
)
def test_settings_refuse_values_of_the_wrong_type_or_range(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle) as info:
        Settings(**{"dsn_source": "argument", **kwargs})
    assert "sssss" not in str(info.value)  # a DSN is never echoed: it may hold a password


def test_settings_from_env_refuses_an_unknown_override() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown setting.*poolsize"):
        Settings.from_env("postgresql:///x", environ={}, poolsize=3)


def test_a_schedule_created_without_a_name_is_refused_and_nothing_is_written(
    sapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    """Found by the fuzz suite: create(None, ...) wrote a schedule named after the task,
    then refused the name when reading it back."""
    _refused(
        conn,
        lambda: sapp.schedules.create(None, "ocr", "@annually", args=(1,)),  # type: ignore[arg-type]
        "schedule name must be a str",
        error=InvalidSchedule,
    )
