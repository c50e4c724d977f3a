"""Fuzz definitions: task options (``app.task(...)``) and schedules (cron strings, time
zones, names, arguments), against the real database and a real worker.

Invariant: a definition is either refused with a typed error under
`pgtasks.errors.PgtasksError` (not a `DatabaseError`) and leaves nothing behind (no
task registered, no schedule row), or it works: a job of the new task, or a manual run
of the new schedule, runs on its first attempt and receives exactly its arguments.
"""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pgtasks.context import TaskContext
from pgtasks.errors import PgtasksError

from .conftest import QUEUE, Harness, count_cases, fuzz_settings, same
from .strategies import anything, odd_text, rarely, text, values

_names = itertools.count()
# What tasks made in this module received, by the token passed as their first argument.
RECEIVED: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}

seconds = rarely(anything, st.one_of(st.none(), st.floats(0, 1e9), st.integers(0, 10**9), st.floats()))
task_options = st.fixed_dictionaries(
    {},
    optional={
        "name": rarely(anything, text),
        "queue": rarely(anything, text),
        "priority": rarely(anything, st.integers(-40000, 40000)),
        "max_retries": rarely(anything, st.one_of(st.none(), st.integers(-2, 2**40))),
        "autoretry_for": rarely(
            st.lists(anything, max_size=2), st.sampled_from([(), (OSError,), [ValueError]])
        ),
        "retry_backoff": rarely(anything, st.one_of(st.booleans(), st.floats(0, 1e4))),
        "retry_backoff_max": seconds,
        "retry_jitter": rarely(anything, st.booleans()),
        "default_retry_delay": seconds,
        "time_limit": seconds,
        "soft_time_limit": seconds,
        "bind": st.booleans(),
        "acks_late": rarely(anything, st.booleans()),
        "lock": rarely(anything, st.one_of(st.none(), text)),
        "unique_key": rarely(anything, st.one_of(st.none(), text)),
        "tenant": rarely(anything, text),
        "retry_on_worker_lost": rarely(anything, st.booleans()),
        "rate": anything,  # not an option of pgtasks
    },
)


def _make_fn(bind: bool) -> Any:
    if bind:

        def bound(ctx: TaskContext, /, token: str, *args: Any, **kwargs: Any) -> list[Any]:
            RECEIVED[token] = (args, kwargs)
            return list(args)

        return bound

    def plain(token: str, *args: Any, **kwargs: Any) -> list[Any]:
        RECEIVED[token] = (args, kwargs)
        return list(args)

    return plain


def _short_limit(opts: dict[str, Any]) -> bool:
    """A time limit so short the job may end TIME_LIMIT instead of running to the end."""
    return any(
        isinstance(opts.get(k), int | float) and opts[k] < 5 for k in ("time_limit", "soft_time_limit")
    )


@fuzz_settings(ci=25, long=1500)
@given(opts=task_options, args=st.lists(values, max_size=3), kwargs=st.dictionaries(text, values, max_size=2))
def test_task_options_refused_or_working(
    harness: Harness, opts: dict[str, Any], args: list[Any], kwargs: dict[str, Any]
) -> None:
    h = harness
    count_cases("app.task options")
    opts = dict(opts)
    opts.setdefault("name", f"fuzz.made.{next(_names)}")
    tasks_before = dict(h.app.tasks)
    try:
        task = h.app.task(**opts)(_make_fn(bool(opts.get("bind"))))
    except PgtasksError as exc:
        h.refused(exc, h.count())
        assert h.app.tasks == tasks_before, f"{exc!r} was raised but the task was registered"
        return
    assert h.app.tasks[task.name] is task
    token = uuid.uuid4().hex
    before = h.count()
    try:
        r = task.apply_async([token, *args], kwargs)
    except PgtasksError as exc:  # e.g. the task's own lock or unique key is held, or an argument refused
        h.refused(exc, before)
        return
    if _short_limit(opts):
        return  # may rightly end TIME_LIMIT; registration and enqueue were checked
    h.conn.execute("UPDATE pgtasks.jobs SET queue = %s WHERE id = %s AND status = 'queued'", (QUEUE, r.id))
    h.run_and_check({}, [r.id])
    got = RECEIVED.pop(token)
    assert same(tuple(args), got[0]) and same(kwargs, got[1]), (args, kwargs, got)


# -- schedules -----------------------------------------------------------------------------------

CRON_FIELDS = [
    "*",
    "*/5",
    "*/0",
    "0",
    "59",
    "60",
    "1-5",
    "5-1",
    "1,2,3",
    "MON",
    "mon-fri",
    "JAN",
    "L",
    "5L",
    "1#2",
    "?",
    "-1",
    "99999999999999999999",
    "*/99999999999",
    "H",
    "",
    "1-",
    ",",
    "0/5",
]
crons = st.one_of(
    st.lists(st.sampled_from(CRON_FIELDS), min_size=4, max_size=7).map(" ".join),
    st.sampled_from(
        [
            "@daily",
            "@hourly",
            "@weekly",
            "@monthly",
            "@yearly",
            "@annually",
            "@midnight",
            "@reboot",
            "@every 5m",
            "0 2 * * *",
            "0 0 29 2 *",
            "0 0 31 2 *",
            "0 0 30 2 *",
            "* * * * * *",
            "0 0 1 1 * 2099",
        ]
    ),
    odd_text,
    anything,
)
zones = st.one_of(
    st.timezone_keys(),
    st.sampled_from(
        ["UTC", "utc", "Mars/Base", "", "../etc/passwd", "EST5EDT", "Etc/GMT+14", "Europe/Berlin\x00"]
    ),
    odd_text,
    anything,
)
schedule_options = st.fixed_dictionaries(
    {},
    optional={
        "timezone": zones,
        "kwargs": rarely(anything, st.dictionaries(text, values, max_size=2)),
        "queue": rarely(anything, st.one_of(st.none(), text)),
        "tenant": rarely(anything, st.one_of(st.none(), text)),
        "priority": rarely(anything, st.one_of(st.none(), st.integers(-40000, 40000))),
        "overlap": st.sampled_from(["skip", "queue", "allow", "never", ""]),
        "misfire": st.sampled_from(["skip", "catch_up", "all", ""]),
        "catch_up_limit": rarely(anything, st.integers(-1, 2000)),
        "max_retries": rarely(anything, st.one_of(st.none(), st.integers(-1, 10))),
        "after": rarely(anything, st.lists(text, max_size=2)),
    },
)
schedule_names = st.one_of(text, st.builds(lambda n: "s" * n, st.integers(195, 205)), anything)


@fuzz_settings(ci=25, long=1500)
@given(name=schedule_names, cron=crons, args=st.lists(values, max_size=3), opts=schedule_options)
def test_schedule_definitions_refused_or_working(
    harness: Harness, name: Any, cron: Any, args: list[Any], opts: dict[str, Any]
) -> None:
    h = harness
    count_cases("schedules.create")
    if isinstance(name, str) and name.strip():
        name = f"{name}#{next(_names)}" if len(name) < 190 else name  # mostly fresh names
    before = h.count("schedules")
    try:
        h.app.schedules.create(name, "fuzz.echo", cron, args=args, **opts)
    except PgtasksError as exc:
        h.refused(exc, before, "schedules")
        return
    assert h.count("schedules") == before + 1
    schedule = h.app.schedules.get(name)
    assert schedule.name == name
    fires = h.app.schedules.next_fire_times(name, 3)
    assert all(f.tzinfo is not None for f in fires) and fires == sorted(fires)
    assert all(f > dt.datetime(2000, 1, 1, tzinfo=dt.UTC) for f in fires)
    jobs_before = h.count()
    try:
        run = h.app.schedules.trigger(name)
    except PgtasksError as exc:
        h.refused(exc, jobs_before)
        return
    h.run_and_check(
        {run.id: (tuple(args), dict(opts.get("kwargs") or {}), h.app.AsyncResult(run.id).job().headers)}
    )
