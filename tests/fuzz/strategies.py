"""Hypothesis strategies for the fuzz suite: values of every type and size, good and bad.

Nothing here decides what pgtasks must accept: a test only checks that each value is
either refused at the call site with a typed error (nothing written) or read back
exactly by the task.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import fractions
import zoneinfo
from decimal import Decimal
from typing import Any

from hypothesis import strategies as st

# pgtasks' longest delay (10 years): countdowns around it are on both sides of the bound.
MAX_DELAY = 10 * 365.25 * 86400.0


# Characters that break naive code: NUL, lone surrogates (not UTF-8), the highest code
# point, line and paragraph separators, BOM, quotes, escapes, markup, format specifiers.
ODD_CHARS = [
    "\x00",
    "\ud800",
    "\udbff",
    "\udc00",
    "\udfff",
    "\U0010ffff",
    "\u2028",
    "\u2029",
    "\ufeff",
    "\x7f",
    "\x1b[31m",
    "'",
    '"',
    "\\",
    "%s",
    "{0}",
    "[bold]",
    "[/]",
    "<b>",
    "$pgtasks",
    "é",
    "𝄞",
    " ",
]

odd_text = st.lists(st.one_of(st.characters(), st.sampled_from(ODD_CHARS)), max_size=12).map("".join)
clean_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)


def rarely(odd: st.SearchStrategy[Any], common: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``odd`` about one time in six, else ``common``: most calls should get far enough to run."""
    return st.integers(0, 5).flatmap(lambda n: odd if n == 0 else common)


#: Long strings, around the 1,000-byte key bound and far beyond (1-4 UTF-8 bytes per character).
long_text = st.builds(
    lambda ch, n: ch * n,
    st.sampled_from(["k", "é", "€", "𝄞"]),
    st.one_of(
        st.integers(240, 260),
        st.integers(330, 340),
        st.integers(495, 505),
        st.integers(990, 1010),
        st.sampled_from([2_000, 3_000, 100_000]),
    ),
)
text = rarely(odd_text, st.one_of(clean_text, long_text))

ints = st.one_of(
    st.integers(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64]),
    # Around Python's int-to-text limit (4,300 digits): built lazily, hypothesis cannot repr them.
    st.builds(
        lambda digits, sign: sign * 10 ** (digits - 1), st.integers(4298, 4302), st.sampled_from([1, -1])
    ),
)
floats = st.one_of(
    st.floats(),
    st.sampled_from([1e15, 1e-4, 9.999999999999998e14, 1e16, 5e-324, 1.7976931348623157e308, -0.0, 0.1]),
)


def fixed_offsets() -> st.SearchStrategy[dt.timezone]:
    """`datetime.timezone` offsets from -24 h to +24 h (exclusive), with and without a name."""
    offset = st.timedeltas(
        min_value=dt.timedelta(hours=-24) + dt.timedelta(microseconds=1),
        max_value=dt.timedelta(hours=24) - dt.timedelta(microseconds=1),
    )
    return st.one_of(
        st.builds(dt.timezone, offset),
        st.builds(dt.timezone, offset, odd_text),
        st.just(dt.UTC),
    )


class OddZone(dt.tzinfo):
    """A tzinfo of its own (neither ZoneInfo nor datetime.timezone): must be refused."""

    def utcoffset(self, d: dt.datetime | None) -> dt.timedelta:
        return dt.timedelta(hours=1)

    def dst(self, d: dt.datetime | None) -> dt.timedelta:
        return dt.timedelta(0)

    def tzname(self, d: dt.datetime | None) -> str:
        return "ODD"


def _keyless_zone() -> dt.tzinfo:
    """A ZoneInfo read from a file: it has no key, so pgtasks cannot store it by name."""
    import importlib.resources

    with importlib.resources.files("tzdata.zoneinfo.Europe").joinpath("Berlin").open("rb") as f:
        return zoneinfo.ZoneInfo.from_file(f)


zones = rarely(st.just(OddZone()), st.one_of(st.none(), st.timezones(), fixed_offsets()))

EDGE_DATETIMES = [dt.datetime.min, dt.datetime.max, dt.datetime(1970, 1, 1), dt.datetime(2000, 2, 29)]
datetimes = st.one_of(
    st.datetimes(timezones=zones),
    st.builds(
        lambda d, z, fold: d.replace(tzinfo=z, fold=fold),
        st.sampled_from(EDGE_DATETIMES),
        zones,
        st.integers(0, 1),
    ),
)
times = st.times(timezones=st.one_of(st.none(), st.timezones(), fixed_offsets()))


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 1


@dataclasses.dataclass
class Point:
    x: int = 1


class StrSub(str):
    pass


class IntSub(int):
    pass


class DictSub(dict[str, Any]):
    pass


def _recursive_list() -> list[Any]:
    a: list[Any] = [1]
    a.append(a)
    return a


def nest(depth: int, kind: str) -> Any:
    """A value nested ``depth`` levels deep in lists, tuples or dicts."""
    value: Any = 0
    for _ in range(depth):
        value = [value] if kind == "list" else (value,) if kind == "tuple" else {"k": value}
    return value


#: Values pgtasks must refuse (or, for the odd ones, store exactly): not plain data.
odd_objects = st.one_of(
    st.sampled_from(
        [
            Color.RED,
            Level.HIGH,
            Point(),
            bytearray(b"x"),
            StrSub("x"),
            IntSub(1),
            DictSub(),
            complex(1, 2),
            fractions.Fraction(1, 3),
            range(3),
            Ellipsis,
            print,
            object,
            ValueError("x"),
            {1: "int key"},
            {(1, 2): "tuple key"},
            {"$pgtasks": "int", "v": "1"},
            {None: 1},
        ]
    ),
    st.builds(lambda: memoryview(b"abc")),
    st.builds(object),
    st.builds(_recursive_list),
    st.builds(lambda: dt.datetime(2030, 1, 1, tzinfo=_keyless_zone())),
    st.builds(
        nest, st.integers(120, 130) | st.integers(250, 300), st.sampled_from(["list", "tuple", "dict"])
    ),
)

hashable_scalars = st.one_of(st.none(), st.booleans(), ints, floats, text, st.binary(max_size=8), st.uuids())
scalars = st.one_of(
    hashable_scalars,
    datetimes,
    st.dates(),
    times,
    st.timedeltas(),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.sampled_from([Decimal("sNaN"), Decimal("-0"), Decimal("1.10"), Decimal("1E+999999")]),
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=5),
        st.lists(children, max_size=5).map(tuple),
        st.dictionaries(text, children, max_size=5),
        st.frozensets(hashable_scalars, max_size=4),
        st.sets(hashable_scalars, max_size=4),
    )


#: Any value: JSON-like data, the tagged types, and objects pgtasks must refuse.
values = st.recursive(rarely(odd_objects, scalars), _containers, max_leaves=12)
#: Values pgtasks can store (no refused objects), for the good jobs around bad ones.
plain_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), clean_text),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(clean_text, c, max_size=3),
    max_leaves=6,
)

#: Anything at all, for options that expect one type.
anything = st.one_of(
    st.none(),
    st.booleans(),
    ints,
    floats,
    text,
    st.binary(max_size=4),
    datetimes,
    st.timedeltas(),
    odd_objects,
    st.lists(st.integers(), max_size=2),
)

keys = rarely(anything, st.one_of(st.none(), st.sampled_from(["k", "same-key"]), text))
countdowns = rarely(
    anything,
    st.one_of(
        st.integers(0, 10**6),
        floats,
        ints,
        st.sampled_from([0, 1, MAX_DELAY, MAX_DELAY + 1, 1e300, float("nan"), float("inf"), -1, True]),
    ),
)
etas = rarely(anything, datetimes)

_options = st.fixed_dictionaries(
    {},
    optional={
        "countdown": countdowns,
        "eta": etas,
        "queue": rarely(anything, st.one_of(st.none(), st.just("fuzz"), text)),
        "priority": rarely(anything, st.integers(-40000, 40000)),
        "tenant": rarely(anything, st.one_of(st.just(""), text)),
        "lock": keys,
        "unique_key": keys,
        "headers": rarely(anything, st.dictionaries(text, values, max_size=3)),
        "max_retries": rarely(anything, st.one_of(st.none(), st.integers(-3, 2**40))),
    },
)

args_values = rarely(
    anything, st.one_of(st.lists(values, max_size=4).map(tuple), st.lists(values, max_size=4))
)
kwargs_values = rarely(
    st.one_of(st.dictionaries(st.one_of(text, ints, st.none()), values, max_size=2), anything),
    st.dictionaries(text, values, max_size=4),
)

_names = st.text(
    st.characters(min_codepoint=33, max_codepoint=0x2FFF, exclude_categories=["Cs"]), max_size=20
)
#: Options in range, so that most calls get as far as the worker (their values still vary).
_good_options = st.fixed_dictionaries(
    {},
    optional={
        "countdown": st.one_of(st.integers(0, 1000), st.floats(0, 1e6)),
        "queue": st.one_of(st.none(), st.just("fuzz"), _names.filter(bool)),
        "priority": st.integers(-32768, 32767),
        "tenant": _names,
        "lock": st.one_of(st.none(), _names.filter(bool)),
        "unique_key": st.one_of(st.none(), _names.filter(bool)),
        "headers": st.dictionaries(clean_text, values, max_size=3),
        "max_retries": st.one_of(st.none(), st.integers(0, 10)),
    },
)
_good_eta = st.datetimes(
    min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2100, 1, 1), timezones=st.timezones()
)

#: Enqueue options: in range about half the time, else each present or not with values of
#: any type and size; sometimes one pgtasks does not have (Celery's ``expires``).
options = st.tuples(
    st.one_of(
        _good_options,
        st.tuples(_good_options, _good_eta).map(lambda t: {**t[0], "countdown": None, "eta": t[1]}),
        _options,
    ),
    st.integers(0, 9),
    anything,
).map(lambda t: {**t[0], "expires": t[2]} if t[1] == 0 else t[0])
