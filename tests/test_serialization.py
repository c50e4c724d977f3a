"""Arguments round-trip exactly through a real job row, or are refused before anything is written."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
import random
import uuid
from decimal import Decimal
from importlib import resources
from typing import Any
from zoneinfo import ZoneInfo

import orjson
import psycopg
import pytest

import pgtasks
from pgtasks.errors import SerializationError
from pgtasks.serialization import (
    JSONB_MAX_BYTES,
    PLAIN_FLOAT_MAX,
    PLAIN_FLOAT_MIN,
    TAG,
    decode,
    dumps,
    encode,
    jsonb_size,
)

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def echo(*args: Any, **kwargs: Any) -> None:
    """A task body; never run here."""


def _task(app: pgtasks.App) -> pgtasks.Task:
    return app.task(name="echo")(echo)


def _count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgtasks.jobs").fetchone()
    assert row is not None
    return int(row[0])


def assert_same(got: Any, want: Any, path: str = "value") -> None:
    """Equal values of exactly the same types, all the way down (nan equals nan, -0.0 keeps its sign)."""
    assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, float):
        if math.isnan(want):
            assert math.isnan(got), path
        else:
            assert got == want, path
            assert math.copysign(1.0, got) == math.copysign(1.0, want), f"{path}: sign of zero"
        return
    if isinstance(want, list | tuple):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{path}[{i}]")
        return
    if isinstance(want, dict):
        assert set(got) == set(want), path
        for key in want:
            assert_same(got[key], want[key], f"{path}[{key!r}]")
        return
    if isinstance(want, dt.datetime | dt.time):
        assert got == want, path
        assert got.fold == want.fold, f"{path}: fold"
        _assert_same_tz(got.tzinfo, want.tzinfo, path)
        assert got.replace(tzinfo=None) == want.replace(tzinfo=None), f"{path}: wall time"
        return
    if isinstance(want, Decimal):
        assert str(got) == str(want), f"{path}: {got!r} != {want!r}"
        return
    assert got == want, f"{path}: {got!r} != {want!r}"


def _assert_same_tz(got: dt.tzinfo | None, want: dt.tzinfo | None, path: str) -> None:
    assert type(got) is type(want), f"{path}: tz {got!r} != {want!r}"
    if isinstance(want, ZoneInfo):
        assert isinstance(got, ZoneInfo)
        assert got.key == want.key, path
    elif want is not None:
        assert got is not None
        assert got.utcoffset(None) == want.utcoffset(None), path
        assert got.tzname(None) == want.tzname(None), path


ROUND_TRIP: list[tuple[str, Any]] = [
    ("none", None),
    ("true", True),
    ("false", False),
    ("str", "héllo wörld ✓ 🎉"),
    ("empty-str", ""),
    ("tag-lookalike-value", "$pgtasks"),
    ("int", 42),
    ("int-neg", -7),
    ("int64-max", 2**63 - 1),
    ("int64-min", -(2**63)),
    ("int-big", 2**64),
    ("int-huge-neg", -(10**100)),
    ("float", 1.5),
    ("float-whole", 3.0),
    ("float-point-one", 0.1),
    ("float-long", 0.30000000000000004),
    ("float-1e15", 1e15),
    ("float-1e16", 1e16),
    ("float-1e-7", 1e-7),
    # The edges of the range stored without asking orjson (PLAIN_FLOAT_MIN/MAX).
    ("float-plain-min", 1e-4),
    ("float-below-plain-min", math.nextafter(1e-4, 0.0)),
    ("float-below-plain-max", -math.nextafter(1e15, 0.0)),
    ("float-max", 1.7976931348623157e308),
    ("float-tiny", 5e-324),
    ("float-neg-zero", -0.0),
    ("float-zero", 0.0),
    ("float-nan", math.nan),
    ("float-inf", math.inf),
    ("float-neg-inf", -math.inf),
    ("list", [1, "two", 3.0, None]),
    ("dict", {"a": 1, "b": [1, 2], "": "empty key"}),
    ("tuple", (1, "a", 2.5)),
    ("empty-tuple", ()),
    ("set", {1, 2, 3}),
    ("frozenset", frozenset({"x", "y"})),
    ("set-of-tuples", {(1, 2), (3, 4)}),
    ("datetime-naive", dt.datetime(2024, 3, 31, 2, 30, 15, 123456)),
    ("datetime-utc", dt.datetime(2024, 1, 1, 12, 0, tzinfo=dt.UTC)),
    (
        "datetime-offset",
        dt.datetime(2024, 1, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=-3, minutes=-30))),
    ),
    (
        "datetime-named-offset",
        dt.datetime(2024, 1, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=1), "CET")),
    ),
    ("datetime-zoneinfo", dt.datetime(2024, 7, 1, 9, 15, tzinfo=BERLIN)),
    # 2024-11-03 01:30 happens twice in New York; fold=1 is the second (EST) one.
    ("datetime-zoneinfo-fold", dt.datetime(2024, 11, 3, 1, 30, fold=1, tzinfo=NEW_YORK)),
    ("date", dt.date(1999, 12, 31)),
    ("time", dt.time(23, 59, 59, 999999)),
    ("time-offset", dt.time(8, 0, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=45)))),
    ("timedelta", dt.timedelta(days=-1, seconds=5, microseconds=7)),
    ("timedelta-big", dt.timedelta(days=999999999)),
    ("uuid", uuid.UUID("12345678-1234-5678-1234-567812345678")),
    ("decimal", Decimal("1.10")),
    ("decimal-precise", Decimal("3.141592653589793238462643383279502884197")),
    ("decimal-exp", Decimal("1E+5")),
    ("decimal-neg-zero", Decimal("-0.00")),
    ("bytes", b"\x00\x01\xfe\xff binary"),
    ("empty-bytes", b""),
    (
        "nested",
        {
            "when": dt.datetime(2030, 5, 5, tzinfo=BERLIN),
            "ids": (uuid.UUID(int=1), uuid.UUID(int=2)),
            "deep": [[{"x": {frozenset({1, 2}), (3, (4, b"5"))}}]],
            "money": [Decimal("0.01"), Decimal("100")],
            "floats": [1e16, -0.0, 2.5],
        },
    ),
]


@pytest.mark.parametrize(("value"), [v for _, v in ROUND_TRIP], ids=[n for n, _ in ROUND_TRIP])
def test_value_round_trips_through_a_job_row(app: pgtasks.App, value: Any) -> None:
    task = _task(app)
    result = task.apply_async(args=(value,), kwargs={"kw": value}, headers={"h": value})
    job = app.get_job(result.id)
    assert type(job.args) is list
    assert len(job.args) == 1
    assert_same(job.args[0], value, "args[0]")
    assert_same(job.kwargs["kw"], value, "kwargs['kw']")
    assert_same(job.headers["h"], value, "headers['h']")


def test_floats_stored_as_they_are_are_the_ones_orjson_writes_without_an_exponent() -> None:
    # jsonb reads an exponent back as a long integer, so a float is stored bare only
    # when orjson writes it in plain notation; encode skips asking inside the range.
    rng = random.Random(20261201)
    inside = [PLAIN_FLOAT_MIN, math.nextafter(PLAIN_FLOAT_MAX, 0.0), 0.1, 123456789012345.6]
    inside += [rng.choice((1, -1)) * 10 ** rng.uniform(-4, 15) for _ in range(20_000)]
    inside = [x for x in inside if PLAIN_FLOAT_MIN <= abs(x) < PLAIN_FLOAT_MAX]
    assert len(inside) > 19_000
    written = [orjson.dumps(x) for x in inside]
    assert [x for x, text in zip(inside, written, strict=True) if b"e" in text.lower()] == []
    assert all(encode(x) is x for x in inside)
    assert encode(1e16) == {TAG: "float", "v": "1e+16"}


def test_many_values_in_one_call_round_trip(app: pgtasks.App) -> None:
    task = _task(app)
    values = tuple(v for _, v in ROUND_TRIP)
    job = app.get_job(task.apply_async(args=values).id)
    assert_same(job.args, list(values), "args")


def test_naive_and_aware_datetimes_stay_distinct(app: pgtasks.App) -> None:
    naive = dt.datetime(2024, 6, 1, 12, 0)
    aware = naive.replace(tzinfo=BERLIN)
    job = app.get_job(_task(app).delay(naive, aware).id)
    assert job.args[0].tzinfo is None
    assert isinstance(job.args[1].tzinfo, ZoneInfo)
    assert job.args[1].tzinfo.key == "Europe/Berlin"
    assert job.args[1].utcoffset() == dt.timedelta(hours=2)


def test_plain_json_is_queryable_with_jsonb_operators(
    app: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    job_id = _task(app).delay({"document_id": 42, "tenant": "acme"}).id
    row = conn.execute(
        "SELECT args -> 0 ->> 'tenant', (args -> 0 ->> 'document_id')::int FROM pgtasks.jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row == ("acme", 42)


def test_dict_key_order_is_not_kept(app: pgtasks.App) -> None:
    """jsonb stores keys sorted (shorter first); equality holds, order does not (documented)."""
    value = {"bbb": 1, "a": 2, "cc": 3}
    got = app.get_job(_task(app).delay(value).id).args[0]
    assert got == value
    assert list(got) == ["a", "cc", "bbb"]


def test_deepest_allowed_nesting_round_trips(app: pgtasks.App) -> None:
    # args list is level 0; 125 tuples below it, each taking two JSON levels, then a timedelta.
    value: Any = dt.timedelta(seconds=1)
    for _ in range(125):
        value = (value,)
    got = app.get_job(_task(app).delay(value).id).args[0]
    assert_same(got, value)


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 1


class Mode(enum.StrEnum):
    FAST = "fast"


@dataclasses.dataclass
class Point:
    x: int
    y: int


class MyStr(str):
    __slots__ = ()


class MyInt(int):
    pass


class MyDict(dict[str, Any]):
    pass


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


class _OddTz(dt.tzinfo):
    def utcoffset(self, d: dt.datetime | None) -> dt.timedelta:
        return dt.timedelta(hours=1)

    def dst(self, d: dt.datetime | None) -> dt.timedelta:
        return dt.timedelta(0)

    def tzname(self, d: dt.datetime | None) -> str:
        return "ODD"


def _keyless_zone() -> ZoneInfo:
    with resources.files("tzdata.zoneinfo").joinpath("Europe/Berlin").open("rb") as fh:
        return ZoneInfo.from_file(fh)


REFUSED: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
    ("nul-in-str", ("a\x00b",), {}, "args[0]"),
    ("nul-deep", ({"k": ["ok", "x\x00"]},), {}, "args[0]['k'][1]"),
    ("nul-in-key", ({"a\x00": 1},), {}, "args[0] key"),
    ("lone-surrogate", ("ok", "\ud800"), {}, "args[1]"),
    ("lone-surrogate-in-key", ({"\udfff": 1},), {}, "args[0] key"),
    ("enum", (Color.RED,), {}, "args[0]"),
    ("int-enum", (Level.HIGH,), {}, "args[0]"),
    ("str-enum", ([Mode.FAST],), {}, "args[0][0]"),
    ("dataclass", (Point(1, 2),), {}, "args[0]"),
    ("bytearray", (bytearray(b"x"),), {}, "args[0]"),
    ("memoryview", (memoryview(b"x"),), {}, "args[0]"),
    ("object", (object(),), {}, "args[0]"),
    ("int-keys", ({1: "a"},), {}, "args[0][1]"),
    ("tuple-keys", ({(1, 2): "a"},), {}, "args[0][(1, 2)]"),
    ("reserved-key", ({"$pgtasks": "tuple", "v": []},), {}, "args[0]['$pgtasks']"),
    ("str-subclass", (MyStr("x"),), {}, "args[0]"),
    ("int-subclass", (MyInt(3),), {}, "args[0]"),
    ("dict-subclass", (MyDict(a=1),), {}, "args[0]"),
    ("too-deep", (_nested(130),), {}, "args[0]" + "[0]" * 125),
    ("int-too-long", (10**5000,), {}, "args[0]"),
    ("keyless-zoneinfo", (dt.datetime(2024, 1, 1, tzinfo=_keyless_zone()),), {}, "args[0]"),
    ("custom-tzinfo", (dt.datetime(2024, 1, 1, tzinfo=_OddTz()),), {}, "args[0]"),
    ("function", (len,), {}, "args[0]"),
    ("kwarg", (), {"when": Color.RED}, "kwargs['when']"),
    ("kwarg-in-set", (), {"s": {Color.RED}}, "kwargs['s']{0}"),
]


@pytest.mark.parametrize(("args", "kwargs", "path"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_refused_value_raises_naming_its_path_and_writes_nothing(
    app: pgtasks.App, conn: psycopg.Connection[Any], args: tuple[Any, ...], kwargs: dict[str, Any], path: str
) -> None:
    task = _task(app)
    task.delay("warm-up")  # the table is reachable and writable
    before = _count(conn)
    with pytest.raises(SerializationError) as info:
        task.apply_async(args=args, kwargs=kwargs)
    assert info.value.path.startswith(path), info.value.path
    assert str(info.value).startswith(info.value.path)
    assert info.value.reason
    assert _count(conn) == before


@pytest.mark.parametrize(
    ("args", "kwargs", "path"), [r[1:] for r in REFUSED[:6]], ids=[r[0] for r in REFUSED[:6]]
)
def test_refused_value_in_bulk_writes_nothing(
    app: pgtasks.App, conn: psycopg.Connection[Any], args: tuple[Any, ...], kwargs: dict[str, Any], path: str
) -> None:
    task = _task(app)
    good = [task.s(i) for i in range(100)]
    with pytest.raises(SerializationError):
        app.bulk_apply([*good, task.s(*args, **kwargs), *good])
    assert _count(conn) == 0


def test_refused_header_names_headers(app: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(SerializationError) as info:
        _task(app).apply_async(args=(1,), headers={"trace": object()})
    assert info.value.path == "headers['trace']"
    assert _count(conn) == 0


def test_refusal_messages_suggest_a_fix() -> None:
    with pytest.raises(SerializationError, match=r"\.value"):
        encode(Color.RED)
    with pytest.raises(SerializationError, match="asdict"):
        encode(Point(1, 2))
    with pytest.raises(SerializationError, match=r"bytes\("):
        encode(bytearray(b"x"))
    with pytest.raises(SerializationError, match="NUL"):
        encode("\x00")
    with pytest.raises(SerializationError, match="reserved"):
        encode({"$pgtasks": 1})


def test_serialization_error_is_a_type_error_and_pgtasks_error() -> None:
    with pytest.raises(TypeError):
        dumps(object())
    with pytest.raises(pgtasks.errors.PgtasksError):
        dumps(object())


def test_encode_decode_without_database() -> None:
    for name, value in ROUND_TRIP:
        assert_same(decode(encode(value)), value, name)


FLAT_DICTS: list[dict[Any, Any]] = [
    {"a": 1, "b": "x", "c": 1.5, "d": None, "e": True},
    {"big": 2**70, "huge_float": 1e16, "nan": math.nan, "neg_zero": -0.0},
    {"": "", "unicode ✓": "wörld"},
    {},
]


NESTED_PLAIN: list[Any] = [
    [{"k": "noop", "t": 1732982400.25}],  # delay({...}): a dict as the only argument
    {"rows": [[1, 2.5, None], {"deep": {"deeper": [True, "ü"]}}]},
    [[], {}, [[]], [{}]],
    _nested(125),  # the deepest plain nesting encode accepts, once inside the args list
]


@pytest.mark.parametrize(
    "value",
    FLAT_DICTS + NESTED_PLAIN + [v for _, v in ROUND_TRIP],
    ids=[f"flat{i}" for i in range(len(FLAT_DICTS))]
    + [f"nested{i}" for i in range(len(NESTED_PLAIN))]
    + [n for n, _ in ROUND_TRIP],
)
def test_plain_data_shortcut_writes_what_the_walk_writes(value: Any) -> None:
    """dumps skips the walk for JSON-native data (any depth): same JSON, same value back."""
    assert dumps(value) == orjson.dumps(encode(value)).decode()
    assert dumps([value]) == orjson.dumps(encode([value])).decode()
    assert_same(decode(orjson.loads(dumps(value))), value)


def test_plain_data_one_level_too_deep_is_still_refused() -> None:
    assert dumps(_nested(126)) == orjson.dumps(encode(_nested(126))).decode()
    with pytest.raises(SerializationError, match="nested deeper than 126 levels"):
        dumps(_nested(127))


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"a": "x\x00"}, "value['a']"),
        ({"\ud800": 1}, "value key"),
        ({"a\x00": 1}, "value key"),
        ({"$pgtasks": "tuple", "v": []}, "value['$pgtasks']"),
        ({1: "a"}, "value[1]"),
    ],
)
def test_flat_dict_shortcut_still_refuses(value: dict[Any, Any], path: str) -> None:
    with pytest.raises(SerializationError) as caught:
        dumps(value)
    assert path in str(caught.value)


def test_none_is_stored_as_json_null() -> None:
    assert dumps(None) == "null"
    assert decode(orjson.loads(dumps(None))) is None


# -- the size jsonb holds ---------------------------------------------------------------

# Shapes where jsonb's layout matters: numbers of every digit count and scale (each a
# numeric aligned to 4 bytes), strings of 0 to 4 bytes before them (the padding), keys
# in jsonb's order (shorter first), nesting, and the densest text jsonb grows from.
JSONB_SHAPES: list[Any] = [
    [],
    {},
    5,
    "x",
    [0, 1, -1, 10, 100, 9999, 10000, 12345, 123456789, 2**63 - 1, -(2**63)],
    [0.5, 0.0001, 0.00012, 123456.789, 1e14 + 0.5, -2.25, 3.0, 1.0e-4, 999999999999999.9],
    ["", 1, "a", 2, "ab", 3, "abc", 4, "abcd", 5, "é", 6.5, "€", 7, "😀", True, None, False],
    {"a": 1, "bb": [1, "x"], "": None, "é": True, "ccc": {"d": 1.5, "c": "x"}, "b": 0},
    [[[]], {}, [None, True, False, 1, "s", [1, [2, {"k": "v", "kk": 2.5}]]]],
    [0] * 1000,
    [1] * 1000,
    [[0]] * 500,
    [{}] * 500,
    [{"a": 0}] * 300,
]


@pytest.mark.parametrize(
    "value",
    JSONB_SHAPES + [v for _, v in ROUND_TRIP],
    ids=[f"shape{i}" for i in range(len(JSONB_SHAPES))] + [n for n, _ in ROUND_TRIP],
)
def test_jsonb_size_is_what_postgresql_stores(conn: psycopg.Connection[Any], value: Any) -> None:
    text = dumps(value)
    row = conn.execute("SELECT pg_column_size(%s::jsonb)", (text,)).fetchone()
    assert row is not None
    assert jsonb_size(orjson.loads(text)) == row[0]
    assert row[0] <= 6 * len(text.encode()) + 16  # what lets dumps skip the walk of small values


def test_an_argument_larger_than_jsonb_holds_is_refused_before_the_insert(
    app: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    """PostgreSQL refuses a jsonb over 268,435,455 bytes (SQLSTATE 54000 from the INSERT);
    every enqueue path refuses it first, as a SerializationError giving both sizes."""
    task = _task(app)
    task.delay("warm-up")
    huge = "x" * (270 * 1024 * 1024)
    in_args = len(huge) + 8  # the array's header and its element's entry
    in_kwargs = len(huge) + 16  # the object's header, two entries and the key
    limit = f"more than the {JSONB_MAX_BYTES:,} bytes PostgreSQL's jsonb holds"
    for call, prefix, size in (
        (lambda: task.delay(huge), "args: ", in_args),
        (lambda: task.apply_async(kwargs={"text": huge}), "kwargs: ", in_kwargs),
        (lambda: task.delay_many(["small", huge]), "item 1: args: ", in_args),
        (lambda: app.bulk_apply([task.s(1), task.s(huge).set(link=task.si(2))]), "item 1: args: ", in_args),
        (lambda: pgtasks.chain(task.si(1), task.si(huge)).apply_async(), "args: ", in_args),
    ):
        with pytest.raises(SerializationError) as caught:
            call()
        message = str(caught.value)
        assert message.startswith(f"{prefix}{size:,} bytes as jsonb") and limit in message, message[:300]
    assert _count(conn) == 1
