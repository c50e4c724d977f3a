"""Fuzz the enqueue boundary: ``apply_async``, ``delay`` and ``delay_many`` with generated
arguments and options, against the real database and a real worker.

For every call: either a typed error under `pgtasks.errors.PgtasksError` at the call
site with no row written, or the job runs on its first attempt and its task receives
exactly the values given (type-exact, see `tests.fuzz.conftest.same`). Good jobs
enqueued before and after each batch succeed with attempt 1, and the worker lives on.
"""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pgtasks.errors import PgtasksError

from .conftest import Harness, count_cases, fuzz_settings
from .strategies import args_values, kwargs_values, options, plain_values, values

Expected = dict[int, tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]]
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _epoch(value: dt.datetime) -> Decimal:
    """Seconds since 1970 of an aware datetime, exact to the microsecond."""
    delta = value - EPOCH
    return Decimal(delta.days * 86400 + delta.seconds) + Decimal(delta.microseconds) / Decimal(10**6)


def check_row(h: Harness, job_id: int, opts: Mapping[str, Any]) -> None:
    """The accepted job's row holds the options as given (or the task's defaults)."""
    row = h.conn.execute(
        "SELECT status, queue, tenant, priority, lock_key, unique_key, max_attempts,"
        " extract(epoch FROM run_at), extract(epoch FROM run_at - created_at)"
        " FROM pgtasks.jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    status, queue, tenant, priority, lock_key, unique_key, max_attempts, run_at, delay = row
    assert status in ("queued", "running", "succeeded")  # the worker serves queue "fuzz"
    assert queue == (opts.get("queue") or "fuzz")
    assert tenant == opts.get("tenant", "")
    assert priority == opts.get("priority", 0)
    assert lock_key == opts.get("lock")
    assert unique_key == opts.get("unique_key")
    retries = opts.get("max_retries", 0)
    assert max_attempts == (2**31 - 1 if retries is None else min(retries + 1, 2**31 - 1))
    if opts.get("eta") is not None:
        assert run_at == _epoch(opts["eta"]), (run_at, opts["eta"])
    elif opts.get("countdown") is not None:
        assert abs(float(delay) - float(opts["countdown"])) <= 1e-6 + 1e-12 * float(opts["countdown"])
    else:
        assert delay == 0
    h.app.AsyncResult(job_id).job()  # the public read of the row works too


@fuzz_settings(ci=25, long=1500)
@given(
    calls=st.lists(st.tuples(args_values, kwargs_values, options), min_size=1, max_size=5),
    good=plain_values,
)
def test_apply_async_either_refuses_or_round_trips(
    harness: Harness, calls: list[tuple[Any, Any, dict[str, Any]]], good: Any
) -> None:
    h = harness
    echo = h.app.tasks["fuzz.echo"]
    before_batch = [echo.delay(good).id, h.sentinel()]
    expected: Expected = {}
    for args, kwargs, opts in calls:
        count_cases("apply_async")
        before = h.count()
        try:
            r = echo.apply_async(args, kwargs, **opts)
        except PgtasksError as exc:
            h.refused(exc, before)
            count_cases("apply_async (refused)")
            continue
        assert h.count() == before + 1
        check_row(h, r.id, opts)
        headers = dict(opts.get("headers") or {})
        expected[r.id] = (tuple(args or ()), dict(kwargs or {}), headers)
    h.run_and_check(expected, before_batch)


@fuzz_settings(ci=25, long=1500)
@given(
    calls=st.lists(
        st.tuples(st.lists(values, max_size=4), st.dictionaries(st.text(max_size=8), values, max_size=3)),
        min_size=1,
        max_size=5,
    )
)
def test_delay_either_refuses_or_round_trips(
    harness: Harness, calls: list[tuple[list[Any], dict[str, Any]]]
) -> None:
    h = harness
    echo = h.app.tasks["fuzz.echo"]
    expected: Expected = {}
    for args, kwargs in calls:
        count_cases("delay")
        before = h.count()
        try:
            r = echo.delay(*args, **kwargs)
        except PgtasksError as exc:
            h.refused(exc, before)
            continue
        expected[r.id] = (tuple(args), kwargs, {})
    h.run_and_check(expected)


@fuzz_settings(ci=20, long=1000)
@given(items=st.lists(st.one_of(values, st.lists(values, max_size=3).map(tuple)), max_size=80), opts=options)
def test_delay_many_refuses_all_or_round_trips_all(
    harness: Harness, items: list[Any], opts: dict[str, Any]
) -> None:
    """A bulk call is one unit: one bad item refuses the whole batch, nothing written.
    Up to 80 items: batches of 64 and more go through COPY, smaller ones through INSERT."""
    h = harness
    echo = h.app.tasks["fuzz.echo"]
    count_cases("delay_many", max(1, len(items)))
    before = h.count()
    try:
        results = echo.delay_many(items, **opts)
    except PgtasksError as exc:
        h.refused(exc, before)
        h.run_and_check({})
        return
    assert len(results) <= len(items)
    if opts.get("unique_key") is None:
        assert len(results) == len(items)
    assert h.count() == before + len(results)
    expected: Expected = {}
    for item, r in zip(items, results, strict=False):
        if opts.get("unique_key") is None:  # with a unique key, the held ones are skipped
            check_row(h, r.id, opts)
            expected[r.id] = (item if type(item) is tuple else (item,), {}, dict(opts.get("headers") or {}))
    h.run_and_check(expected, [r.id for r in results if r.id not in expected])


@fuzz_settings(ci=20, long=1000)
@given(
    args=st.lists(plain_values, max_size=3),
    kwargs=st.dictionaries(st.sampled_from(["x", "y", "z", "self", "ctx", "args"]), plain_values, max_size=3),
)
def test_arguments_that_do_not_fit_the_signature_are_refused_at_the_call(
    harness: Harness, args: list[Any], kwargs: dict[str, Any]
) -> None:
    """``fuzz.add(x, y=0)``: a call that cannot bind would fail in the worker, so it is
    refused at the call site; one that binds runs with exactly those values."""
    h = harness
    add = h.app.tasks["fuzz.add"]
    count_cases("signature binding")
    before = h.count()
    try:
        r = add.apply_async(args, kwargs)
    except PgtasksError as exc:
        h.refused(exc, before)
        h.run_and_check({})
        return
    bound = inspect.signature(lambda x, y=0: None).bind(*args, **kwargs)  # raises if it cannot bind
    bound.apply_defaults()
    h.run_and_check({r.id: ((bound.arguments["x"], bound.arguments["y"]), {}, {})})
