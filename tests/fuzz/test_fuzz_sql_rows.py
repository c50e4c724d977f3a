"""Fuzz job rows written straight into ``pgtasks.jobs`` by SQL, then run by a real worker.

The docs allow writing jobs by SQL, which skips every check of the enqueue path
(docs/workers.md, "Rows written by SQL that cannot be run"; docs/serialization.md).
What they promise, and what each generated row is held to:

* a row PostgreSQL refuses (``\\u0000`` in jsonb, an index entry too large) is not
  written: nothing to run;
* a row whose ``args``, ``kwargs`` or ``headers`` cannot be read (not an array / an
  object, an unknown type tag, a malformed tagged value, a time zone this host does
  not know, a number beyond a float) fails alone: ``failed``, error code
  ``UNDECODABLE``, attempt 1, its task not called;
* a row of a task nobody registered fails with ``UNKNOWN_TASK``;
* a row with a lock key over the index bound may fail ``UNCLAIMABLE``;
* any other row runs once and its task receives exactly what the stored JSON says.

What "exactly" means comes from `reference_decode` below, written from
docs/serialization.md without pgtasks' own decoder: JSON as PostgreSQL prints it,
read by the standard library's ``json`` (integers of any size stay exact), and each
documented tagged form checked for the shape the docs give it.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
import time
import uuid
import zoneinfo
from decimal import Decimal, InvalidOperation
from typing import Any

import psycopg
from hypothesis import given
from hypothesis import strategies as st

from pgtasks.serialization import encode

from .conftest import QUEUE, Harness, count_cases, fuzz_settings, same
from .strategies import odd_text, plain_values, scalars, values


class Unreadable(Exception):
    """The reference cannot read this value: the worker must fail the job UNDECODABLE."""


TAG = "$pgtasks"
_INT_TEXT = re.compile(r"-?[0-9]+")
_FLOAT_MAX = 1.7976931348623157e308


def _number(value: Any) -> bool:
    return type(value) in (int, float)


def _tz(value: Any) -> dt.tzinfo | None:
    if value is None:
        return None
    if type(value) is str:
        try:
            return zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
            raise Unreadable(f"time zone {value!r}") from exc
    if _number(value):
        return _offset(value, None)
    if type(value) is list and len(value) == 2 and _number(value[0]) and type(value[1]) is str:
        return _offset(value[0], value[1])
    raise Unreadable(f"time zone {value!r}")


def _offset(seconds: float, name: str | None) -> dt.timezone:
    try:
        delta = dt.timedelta(seconds=seconds)
        return dt.timezone(delta) if name is None else dt.timezone(delta, name)
    except (ValueError, OverflowError) as exc:
        raise Unreadable(f"offset {seconds!r}") from exc


def _fold(data: dict[str, Any]) -> int:
    fold = data.get("fold", 0)
    if type(fold) is not int or fold not in (0, 1):
        raise Unreadable(f"fold {fold!r}")
    return fold


def _tagged(data: dict[str, Any]) -> Any:
    tag = data[TAG]
    if "v" not in data:
        raise Unreadable("no v")
    v = data["v"]
    try:
        if tag in ("tuple", "set", "frozenset"):
            if type(v) is not list:
                raise Unreadable(f"{tag} of {type(v).__name__}")
            items = [reference_decode(item) for item in v]
            return tuple(items) if tag == "tuple" else set(items) if tag == "set" else frozenset(items)
        if tag == "timedelta":
            if type(v) is not list or len(v) != 3 or any(type(x) is not int for x in v):
                raise Unreadable(f"timedelta {v!r}")
            return dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2])
        if type(v) is not str:
            raise Unreadable(f"{tag} of {type(v).__name__}")
        if tag == "int":
            if not _INT_TEXT.fullmatch(v):
                raise Unreadable(f"int text {v!r}")
            return int(v)
        if tag == "float":
            return float(v)
        if tag == "datetime":
            return dt.datetime.fromisoformat(v).replace(tzinfo=_tz(data.get("tz")), fold=_fold(data))
        if tag == "date":
            return dt.date.fromisoformat(v)
        if tag == "time":
            return dt.time.fromisoformat(v).replace(tzinfo=_tz(data.get("tz")), fold=_fold(data))
        if tag == "uuid":
            return uuid.UUID(v)
        if tag == "decimal":
            return Decimal(v)
        if tag == "bytes":
            return base64.b64decode(v, validate=True)
    except (ValueError, TypeError, OverflowError, InvalidOperation, binascii.Error) as exc:
        raise Unreadable(f"{tag}: {exc}") from exc
    raise Unreadable(f"unknown tag {tag!r}")


def reference_decode(data: Any) -> Any:
    """What a task must receive for JSON ``data`` (stdlib-parsed), per docs/serialization.md.

    Raises:
        Unreadable: the docs call this value unreadable (the job must fail UNDECODABLE).
    """
    if type(data) is list:
        return [reference_decode(item) for item in data]
    if type(data) is dict:
        if TAG in data:
            return _tagged(data)
        return {key: reference_decode(item) for key, item in data.items()}
    if type(data) is int and abs(data) > _FLOAT_MAX:
        raise Unreadable("a number beyond a float")
    return data


# -- generated JSON --------------------------------------------------------------------------

KNOWN_TAGS = [
    "tuple",
    "set",
    "frozenset",
    "int",
    "float",
    "datetime",
    "date",
    "time",
    "timedelta",
    "uuid",
    "decimal",
    "bytes",
]

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, 10**308, 10**309, 10**400]),
    st.floats(allow_nan=False, allow_infinity=False),
    odd_text,
)


def _json_containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    tagged = st.fixed_dictionaries(
        {TAG: st.one_of(st.sampled_from(KNOWN_TAGS), odd_text, st.integers(), st.none())},
        optional={"v": children, "tz": children, "fold": children, "x": children},
    )
    return st.one_of(st.lists(children, max_size=4), st.dictionaries(odd_text, children, max_size=4), tagged)


raw_json = st.recursive(json_scalars, _json_containers, max_leaves=10)


def _encoded(value: Any) -> Any:
    try:
        return encode(value)
    except Exception:
        return None


#: JSON as pgtasks would write it (well-formed tagged values) mixed with JSON of any shape.
json_values = st.one_of(raw_json, st.one_of(values, scalars).map(_encoded))
args_json = st.one_of(st.lists(json_values, max_size=4), st.lists(json_values, max_size=4), json_values)
kwargs_json = st.one_of(st.dictionaries(odd_text, json_values, max_size=3), json_values)
headers_json = st.one_of(st.just({}), st.dictionaries(odd_text, json_values, max_size=2), json_values)

rows = st.fixed_dictionaries(
    {"args": args_json},
    optional={
        "kwargs": kwargs_json,
        "headers": headers_json,
        "tenant": st.one_of(odd_text, st.builds(lambda n: "t" * n, st.integers(900, 3000))),
        "priority": st.integers(-32768, 32767),
        "lock_key": st.one_of(odd_text, st.builds(lambda n: "L" * n, st.integers(900, 3000))),
        "task_name": st.one_of(st.just("fuzz.echo"), st.just("fuzz.nobody"), odd_text),
        "scheduled_for": st.sampled_from(
            [
                "infinity",
                "-infinity",
                "2030-01-01 00:00+00",
                "0001-01-01 00:00:00+00",
                "294276-12-31 00:00+00",
            ]
        ),
    },
)

JSON_COLUMNS = ("args", "kwargs", "headers")


def _insert(h: Harness, row: dict[str, Any]) -> int | None:
    """Write the row by SQL; None when PostgreSQL refuses it (then nothing was written)."""
    columns = {"task_name": "fuzz.echo", "queue": QUEUE, **row}
    params = [json.dumps(v) if k in JSON_COLUMNS else v for k, v in columns.items()]
    casts = ["%s::jsonb" if k in JSON_COLUMNS else "%s" for k in columns]
    query = f"INSERT INTO pgtasks.jobs ({', '.join(columns)}) VALUES ({', '.join(casts)}) RETURNING id"
    before = h.count()
    try:
        for value in params:
            if isinstance(value, str):
                value.encode("utf-8")  # psycopg cannot send a lone surrogate: nothing to write
        with h.conn.transaction():
            found = h.conn.execute(query, params).fetchone()
    except (
        UnicodeEncodeError,
        psycopg.DataError,
        psycopg.errors.ProgramLimitExceeded,
        psycopg.errors.CheckViolation,
    ) as exc:
        assert h.count() == before, exc
        return None
    assert found is not None
    return int(found[0])


def _expected(h: Harness, job_id: int) -> tuple[set[str], Any]:
    """For a written row, by the reference: the error codes it may fail with, and the
    ``(args, kwargs, headers)`` its task must receive if it may run (else None)."""
    text_row = h.conn.execute(
        "SELECT task_name, args::text, kwargs::text, headers::text, octet_length(lock_key),"
        " scheduled_for::text FROM pgtasks.jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert text_row is not None
    task_name, args, kwargs, headers, lock_bytes, scheduled_for = text_row
    # A lock key over the API's bound may be too large for the running-lock index.
    may_fail = {"UNCLAIMABLE"} if lock_bytes is not None and lock_bytes > 1000 else set()
    try:
        decoded = [reference_decode(json.loads(text)) for text in (args, kwargs, headers)]
    except (Unreadable, RecursionError):
        return may_fail | {"UNDECODABLE"}, None
    if type(decoded[0]) is not list or type(decoded[1]) is not dict or type(decoded[2]) is not dict:
        return may_fail | {"UNDECODABLE"}, None
    if scheduled_for is not None and not _representable(scheduled_for):
        return may_fail | {"UNDECODABLE"}, None
    if task_name != "fuzz.echo":
        return may_fail | {"UNKNOWN_TASK"}, None
    return may_fail, (tuple(decoded[0]), decoded[1], decoded[2])


def _representable(text: str) -> bool:
    """Whether a timestamptz's text names an instant Python's datetime holds."""
    if "infinity" in text or text.endswith(" BC"):
        return False
    year = int(text.split("-", 1)[0])
    return 1 < year < 9999 or (year in (1, 9999) and "+00" in text)


@fuzz_settings(ci=25, long=2500)
@given(batch=st.lists(rows, min_size=1, max_size=6), good=plain_values)
def test_rows_written_by_sql_fail_alone_or_round_trip(
    harness: Harness, batch: list[dict[str, Any]], good: Any
) -> None:
    h = harness
    echo = h.app.tasks["fuzz.echo"]
    good_ids = [echo.delay(good).id]
    written: dict[int, tuple[set[str], Any]] = {}
    for row in batch:
        count_cases("sql rows")
        job_id = _insert(h, row)
        if job_id is not None:
            written[job_id] = _expected(h, job_id)
    good_ids += [echo.delay(good).id, h.sentinel()]
    ids = [*written, *good_ids]
    deadline = time.monotonic() + 60
    while h.conn.execute(
        "SELECT count(*) FROM pgtasks.jobs WHERE id = ANY(%s) AND status IN ('queued', 'running')", (ids,)
    ).fetchone() != (0,):
        assert h.thread.is_alive(), "the worker died"
        assert time.monotonic() < deadline, "rows not finished within 60 s"
        time.sleep(0.005)
    outcomes = {
        i: (s, a, code)
        for i, s, a, code in h.conn.execute(
            "SELECT id, status, attempt, error->>'code' FROM pgtasks.jobs WHERE id = ANY(%s)", (ids,)
        ).fetchall()
    }
    for job_id in good_ids:
        assert outcomes[job_id] == ("succeeded", 1, None), (job_id, outcomes[job_id])
        h.received.pop(job_id, None)
    for job_id, (may_fail, want) in written.items():
        status, attempt, code = outcomes[job_id]
        got = h.received.pop(job_id, None)
        if status == "failed" and code in may_fail:
            assert got is None, f"job {job_id} failed {code} but its task ran with {got!r}"
            continue
        assert want is not None, f"job {job_id} should have failed with one of {may_fail}: {outcomes[job_id]}"
        assert (status, attempt) == ("succeeded", 1), (job_id, outcomes[job_id])
        assert got is not None
        for name, a, b in zip(("args", "kwargs", "headers"), want, got, strict=True):
            assert same(a, b), f"job {job_id}: {name} should be {a!r}, the task received {b!r}"
    assert h.thread.is_alive()
