"""How task arguments and results are stored: orjson into jsonb, exact or refused.

Every value either reads back equal and of the same type, or is refused at the
call site with `SerializationError` naming where it sits and why. Nothing is
written in that case.

Stored as plain JSON (and so queryable with jsonb operators):

* ``None``, ``bool``, ``str`` (no NUL character: PostgreSQL's jsonb rejects
  ``\\u0000``; no lone surrogates), ``int`` within signed 64 bits, finite ``float``
  whose JSON form has no exponent (other floats are tagged, see below), ``list``,
  ``dict`` with ``str`` keys.

Stored as a tagged object ``{"$pgtasks": TYPE, "v": VALUE}`` and rebuilt on read:

* ``tuple``, ``set``, ``frozenset``; ``int`` beyond 64 bits (up to Python's
  ``sys.get_int_max_str_digits()``, 4300 digits by default); ``float`` that is
  ``nan``, ``±inf``, ``-0.0`` or would be written with an exponent (jsonb stores
  numbers as ``numeric`` and prints ``1e16`` back as the integer
  ``10000000000000000``, which would read back as ``int``);
* ``datetime`` (naive, ``datetime.timezone`` offset with its name, or an IANA
  ``zoneinfo.ZoneInfo`` zone, whose key is kept), ``date``, ``time`` (likewise),
  ``timedelta``,
  ``uuid.UUID``, ``decimal.Decimal``, ``bytes`` (base64);
* `pgtasks.secret_ref.SecretRef` (``"env:NAME"``): a reference to a secret the
  worker resolves, never the secret.

Refused: ``Enum`` members (pass ``.value``), dataclasses and other objects (pass
``dataclasses.asdict(obj)`` or an id), ``bytearray``/``memoryview`` (pass
``bytes``), subclasses of the types above, dicts with non-``str`` keys or with the
reserved key ``"$pgtasks"``, strings (values or keys) with NUL or lone surrogates,
time zones other than ``ZoneInfo`` (with a key) and ``datetime.timezone``,
nesting deeper than 126 levels (orjson writes at most 254 levels and a tagged
container takes two), and a value larger than PostgreSQL's jsonb holds
(`JSONB_MAX_BYTES`, `jsonb_size`): refused before it is sent, rather than failing
the INSERT (SQLSTATE 54000).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import re
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final
from zoneinfo import ZoneInfo

import orjson

from pgtasks.errors import SerializationError
from pgtasks.secret_ref import SecretRef, secret_from_text

__all__ = [
    "JSONB_MAX_BYTES",
    "TAG",
    "Undecodable",
    "canonical_dumps",
    "decode",
    "dumps",
    "encode",
    "jsonb_size",
    "loads_json",
    "undecodable",
]

TAG: Final = "$pgtasks"
_TAG_BYTES: Final = b'"$pgtasks"'
# 19 digits in a row: the shortest integer orjson may read as a float (below -2**63).
_LONG_DIGITS: Final = re.compile(rb"[0-9]{19}")
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
# orjson refuses to write more than 254 nested arrays/objects; a tagged container
# (tuple, set, timedelta) takes two of them (the tag object and its list), so 126
# levels of Python nesting always fit.
_MAX_DEPTH: Final = 126
#: Most bytes of a jsonb value's data (its container, 4-byte header excluded): PostgreSQL
#: refuses a larger one with SQLSTATE 54000, "total size of jsonb array elements exceeds
#: the maximum of 268435455 bytes" (or of object elements; "string too long to represent
#: as jsonb string" for one string). It is ``JENTRY_OFFLENMASK`` of PostgreSQL's
#: ``src/include/utils/jsonb.h``: a container's length field has 28 bits.
JSONB_MAX_BYTES: Final = 0x0FFFFFFF
# Most elements of one jsonb array, and pairs of one object: PostgreSQL builds a
# container's values in an array it doubles from 4 (32 bytes per element, 72 per pair),
# and one allocation past MaxAllocSize (1 GB - 1) fails ("invalid memory alloc request
# size"), before its own limit of elements (JSONB_MAX_ELEMS) is reached.
_JSONB_MAX_ELEMENTS: Final = 2**24
_JSONB_MAX_PAIRS: Final = 2**23
# JSON text of at most this many bytes makes a jsonb within those limits, so `dumps`
# skips the walk of `jsonb_size` below it. jsonb takes at most 6 bytes per byte of text,
# plus 16: a one-character number and its comma (2 bytes) become a 4-byte entry and an
# aligned 8-byte numeric; any other element takes fewer per byte; the 16 are the header
# and the array a lone scalar is stored in (``5`` takes 20 bytes). 8 leaves a margin. An
# array of more than 2**24 elements takes at least 2 bytes of text each, a pair 5.
_JSONB_SAFE_TEXT_BYTES: Final = min(JSONB_MAX_BYTES // 8, 2 * _JSONB_MAX_ELEMENTS)


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A stored value that could not be read back, in place of the value.

    What the worker's claim reads instead of raising (see
    `pgtasks.db.Database.fetch_tuples` with ``lenient=True``), so that one row
    written by hand with an unknown type tag, an unknown time zone or a number
    beyond a float fails alone (``ErrorCode.UNDECODABLE``) rather than the fetch
    of its whole claim batch.

    Attributes:
        reason: what could not be read, for people (e.g. ``"unknown type tag 'x'"``).
    """

    reason: str


def undecodable(exc: BaseException) -> Undecodable:
    """The `Undecodable` marker for the error ``exc`` raised while reading a value:
    its message and the error's type, e.g. ``"No time zone found with key Mars/Base
    (ZoneInfoNotFoundError)"``."""
    if isinstance(exc, SerializationError):
        text = exc.reason
    elif isinstance(exc, KeyError) and exc.args:  # str() of a KeyError is the repr of its key
        text = f"missing key {exc.args[0]!r}" if type(exc) is KeyError else str(exc.args[0])
    else:
        text = str(exc).strip()
    return Undecodable(f"{text} ({type(exc).__name__})" if text else type(exc).__name__)


def _tag(kind: str, value: Any, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {TAG: kind, "v": value}
    out.update(extra)
    return out


def _encode_tz(tz: dt.tzinfo | None, path: str) -> str | float | list[Any] | None:
    if tz is None:
        return None
    if isinstance(tz, ZoneInfo):
        if tz.key is None:
            raise SerializationError(path, "a zoneinfo.ZoneInfo without a key (from_file) cannot be stored")
        return tz.key
    if type(tz) is dt.timezone:
        offset = tz.utcoffset(None).total_seconds()
        name = tz.tzname(None)
        if name != dt.timezone(dt.timedelta(seconds=offset)).tzname(None):
            _check_str(name, f"{path} time zone name")  # jsonb refuses NUL; UTF-8 lone surrogates
            return [offset, name]  # a named offset, e.g. timezone(timedelta(hours=1), "CET")
        return offset
    raise SerializationError(path, f"time zone {tz!r} is not a zoneinfo.ZoneInfo or datetime.timezone")


def _decode_tz(value: Any) -> dt.tzinfo | None:
    """The time zone `_encode_tz` wrote: None, an IANA key, an offset in seconds, or
    ``[offset, name]``; anything else is refused (`SerializationError`)."""
    kind = type(value)
    if value is None:
        return None
    if kind is str:
        return ZoneInfo(value)
    if kind is int or kind is float:
        return dt.timezone(dt.timedelta(seconds=value))
    if kind is list and len(value) == 2 and type(value[0]) in (int, float) and type(value[1]) is str:
        return dt.timezone(dt.timedelta(seconds=value[0]), value[1])
    raise SerializationError(
        "stored value", f"a time zone is a name, an offset or [offset, name], not {value!r}"
    )


# Floats whose magnitude lies in [PLAIN_FLOAT_MIN, PLAIN_FLOAT_MAX) are stored as they
# are, without asking orjson how it writes them: it writes every one of them in plain
# decimal notation, which jsonb reads back as the same float (tests/test_serialization.py
# checks the range, edges included, against the installed orjson). Outside it, orjson's
# own text decides: an exponent would come back from jsonb as a long integer.
PLAIN_FLOAT_MIN = 1e-4
PLAIN_FLOAT_MAX = 1e15


def _encode_float(value: float) -> Any:
    if PLAIN_FLOAT_MIN <= abs(value) < PLAIN_FLOAT_MAX:  # NaN and inf compare False
        return value
    if math.isfinite(value) and not (value == 0.0 and math.copysign(1.0, value) < 0):
        text = orjson.dumps(value)
        if b"e" not in text and b"E" not in text:
            return value
    return _tag("float", repr(value))


def encode(value: Any, path: str = "value", _depth: int = 0) -> Any:
    """Turn a value into JSON-native data that `decode` turns back into an equal value.

    Args:
        value: the value to store.
        path: where the value sits, for error messages (e.g. ``"args[0]"``).

    Returns:
        Data made of ``None``, ``bool``, ``int``, ``float``, ``str``, ``list`` and ``dict``.

    Raises:
        SerializationError: the value (or something inside it) cannot round-trip exactly.
    """
    if _depth > _MAX_DEPTH:
        raise SerializationError(path, f"nested deeper than {_MAX_DEPTH} levels")
    kind = type(value)
    if value is None or kind is bool:
        return value
    if kind is str:
        _check_str(value, path)
        return value
    if kind is int:
        if _INT64_MIN <= value <= _INT64_MAX:
            return value
        try:
            return _tag("int", str(value))
        except ValueError:  # longer than sys.get_int_max_str_digits() (4300 by default)
            raise SerializationError(path, "int has too many digits to store as decimal text") from None
    if kind is float:
        return _encode_float(value)
    if kind is list:
        return [encode(item, f"{path}[{i}]", _depth + 1) for i, item in enumerate(value)]
    if kind is dict:
        out: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str:
                raise SerializationError(
                    f"{path}[{key!r}]", f"dict key of type {type(key).__name__} would come back as str"
                )
            if key == TAG:
                raise SerializationError(f"{path}[{key!r}]", f"the key {TAG!r} is reserved")
            _check_str(key, f"{path} key {key!r}")
            out[key] = encode(item, f"{path}[{key!r}]", _depth + 1)
        return out
    if kind is tuple:
        return _tag("tuple", [encode(item, f"{path}[{i}]", _depth + 1) for i, item in enumerate(value)])
    if kind is set or kind is frozenset:
        items = [encode(item, f"{path}{{{i}}}", _depth + 1) for i, item in enumerate(value)]
        return _tag(kind.__name__, items)
    if kind is dt.datetime:
        return _tag(
            "datetime",
            value.replace(tzinfo=None).isoformat(),
            tz=_encode_tz(value.tzinfo, path),
            fold=value.fold,
        )
    if kind is dt.date:
        return _tag("date", value.isoformat())
    if kind is dt.time:
        return _tag(
            "time", value.replace(tzinfo=None).isoformat(), tz=_encode_tz(value.tzinfo, path), fold=value.fold
        )
    if kind is dt.timedelta:
        return _tag("timedelta", [value.days, value.seconds, value.microseconds])
    if kind is uuid.UUID:
        return _tag("uuid", str(value))
    if kind is Decimal:
        return _tag("decimal", str(value))
    if kind is bytes:
        return _tag("bytes", base64.b64encode(value).decode("ascii"))
    if kind is SecretRef:
        return _tag("secret", value.text)
    return _refuse(value, path)


def _check_str(value: str, path: str) -> None:
    """Refuse text jsonb cannot hold: NUL, and lone surrogates (not valid UTF-8)."""
    if "\x00" in value:
        raise SerializationError(path, "string contains a NUL character (\\u0000), which jsonb rejects")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise SerializationError(
                path, f"string contains a lone surrogate at index {exc.start}, which is not valid UTF-8"
            ) from None


def _refuse(value: Any, path: str) -> Any:
    import dataclasses
    import enum

    name = type(value).__qualname__
    if isinstance(value, enum.Enum):
        hint = "pass its .value instead"
    elif dataclasses.is_dataclass(value):
        hint = "pass dataclasses.asdict(obj) instead"
    elif isinstance(value, bytearray | memoryview):
        hint = "pass bytes(...) instead"
    elif isinstance(value, str | int | float | list | dict | tuple | dt.date | dt.time | dt.timedelta):
        hint = f"subclasses of {type(value).__mro__[1].__name__} do not round-trip; pass a plain value"
    else:
        hint = "pass JSON-like data or one of the supported types (see pgtasks.serialization)"
    raise SerializationError(path, f"values of type {name} cannot be stored: {hint}")


def decode(data: Any) -> Any:
    """Rebuild values from `encode`'s output (tagged objects become their types again)."""
    kind = type(data)
    if kind is list:
        return [decode(item) for item in data]
    if kind is dict and data.get(TAG) == "secret":  # a reference, resolved by the worker only
        return secret_from_text(data.get("v"))
    if kind is dict:
        if TAG not in data:
            return {key: decode(item) for key, item in data.items()}
        return _decode_tagged(data[TAG], data)
    return data


_ARRAY_TAGS: Final = frozenset({"tuple", "set", "frozenset"})
_TEXT_TAGS: Final = frozenset({"int", "float", "datetime", "date", "time", "uuid", "decimal", "bytes"})
_INT_TEXT: Final = re.compile(r"-?[0-9]+")


def _decode_tagged(tag: object, data: dict[str, Any]) -> Any:
    """The value of a tagged object, which must have the shape `encode` writes.

    Raises:
        SerializationError: an unknown tag, or a value of the wrong shape (a row
            written by SQL: ``{"$pgtasks": "tuple", "v": "abc"}`` is refused, not
            read as ``("a", "b", "c")``).
        KeyError, ValueError, TypeError, OverflowError: a value that does not parse.
    """
    if type(tag) is not str or (tag not in _ARRAY_TAGS and tag not in _TEXT_TAGS and tag != "timedelta"):
        raise SerializationError("stored value", f"unknown type tag {tag!r}")
    value: Any = data["v"]
    _check_shape(tag, value)
    if tag == "tuple":
        return tuple(decode(item) for item in value)
    if tag == "set":
        return {decode(item) for item in value}
    if tag == "frozenset":
        return frozenset(decode(item) for item in value)
    if tag == "int":
        if _INT_TEXT.fullmatch(value) is None:  # int() would take " 1", "1_000" and other scripts' digits
            raise ValueError(f"invalid literal for int() with base 10: {value[:40]!r}")
        return int(value)
    if tag == "float":
        return float(value)
    if tag == "datetime":
        return dt.datetime.fromisoformat(value).replace(tzinfo=_decode_tz(data.get("tz")), fold=_fold(data))
    if tag == "date":
        return dt.date.fromisoformat(value)
    if tag == "time":
        return dt.time.fromisoformat(value).replace(tzinfo=_decode_tz(data.get("tz")), fold=_fold(data))
    if tag == "timedelta":
        if len(value) != 3 or any(type(part) is not int for part in value):
            raise SerializationError(
                "stored value", "a timedelta holds [days, seconds, microseconds] as ints"
            )
        return dt.timedelta(days=value[0], seconds=value[1], microseconds=value[2])
    if tag == "uuid":
        return uuid.UUID(value)
    if tag == "decimal":
        return Decimal(value)
    return base64.b64decode(value, validate=True)  # bytes: base64 only, not skipping stray characters


def _check_shape(tag: str, value: object) -> None:
    """Refuse a tagged value of the wrong JSON type: containers and timedelta hold an array, the rest text."""
    wants_array = tag in _ARRAY_TAGS or tag == "timedelta"
    if type(value) is not (list if wants_array else str):
        shape = "an array" if wants_array else "text"
        raise SerializationError("stored value", f"a {tag} holds {shape}, not {type(value).__name__}")


def _fold(data: dict[str, Any]) -> int:
    fold = data.get("fold", 0)
    if type(fold) is not int or fold not in (0, 1):
        raise SerializationError("stored value", f"fold is 0 or 1, not {fold!r}")
    return fold


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether `encode` would return ``value`` unchanged, so orjson can write it as it is.

    True for JSON-native data (None, bool, str without NUL or lone surrogates, int
    within 64 bits, floats `encode` keeps, lists, dicts with str keys other than the
    tag) less deep than `encode`'s limit; False sends the value through `encode`,
    which converts or refuses it. Scalars inside a container are checked in the
    loop, without a call each: this runs for every argument of every job.
    """
    kind = type(value)
    if kind is list:
        items: Any = value
    elif kind is dict:
        if TAG in value:
            return False
        for key in value:
            if type(key) is not str or "\x00" in key or not (key.isascii() or _encodable_text(key)):
                return False
        items = value.values()
    else:  # a scalar on its own (a task's result) is checked as a list's only item
        return depth == 0 and _plain([value])
    if depth >= _MAX_DEPTH:  # items would sit deeper than encode allows (or an empty
        return False  # container at the limit: encode itself decides)
    for item in items:
        kind = type(item)
        if kind is str:
            if "\x00" in item or not (item.isascii() or _encodable_text(item)):
                return False
        elif kind is int:
            if not _INT64_MIN <= item <= _INT64_MAX:
                return False
        elif kind is float:
            if _encode_float(item) is not item:
                return False
        elif item is not None and kind is not bool and not _plain(item, depth + 1):
            return False
    return True


def _encodable_text(text: str) -> bool:
    """False for strings with lone surrogates (which orjson and jsonb refuse)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def dumps(value: Any, path: str = "value") -> str:
    """Encode a value to JSON text for a jsonb parameter.

    Raises:
        SerializationError: the value cannot round-trip exactly (see module docs), or
            its jsonb would be larger than `JSONB_MAX_BYTES` (the message gives both
            sizes; nothing is sent to PostgreSQL).
    """
    if value is None:
        return "null"  # tasks that return nothing
    # The common case, JSON-native data, as it is; else encode, which raises
    # SerializationError naming the exact path.
    data = value if _plain(value) else encode(value, path)
    try:
        raw = orjson.dumps(data)
    except orjson.JSONEncodeError as exc:  # a safety net; encode refuses what orjson would
        raise SerializationError(path, str(exc)) from None
    if len(raw) > _JSONB_SAFE_TEXT_BYTES:  # large enough to be over: measure it as jsonb
        try:
            size = jsonb_size(data) - 4
        except ValueError as exc:  # too many elements
            raise SerializationError(path, f"{exc}; pass a reference to the data instead") from None
        if size > JSONB_MAX_BYTES:
            raise SerializationError(
                path,
                f"{size:,} bytes as jsonb ({len(raw):,} as JSON text), more than the"
                f" {JSONB_MAX_BYTES:,} bytes PostgreSQL's jsonb holds; pass a reference"
                " to the data (a path, an id) instead",
            )
    return raw.decode("utf-8")


def canonical_dumps(value: Any, path: str = "value") -> str:
    """JSON text of ``value`` that equal values share, whatever order their dicts were
    built in or their sets iterate in: `encode`'s form (a tuple, a set, a datetime ...
    tagged as in a job's arguments) with every object's keys sorted and the members
    of every set and frozenset sorted by their own canonical text, written compactly
    (``{"a":1,"b":[2,3]}``). For keys derived from values, not for storing them.

    Raises:
        SerializationError: as `encode`.
    """
    data = _sorted_sets(encode(value, path))
    return orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode("utf-8")


def _sorted_sets(data: Any) -> Any:
    """`encode`'s output with the members of each tagged set in canonical order."""
    kind = type(data)
    if kind is list:
        return [_sorted_sets(item) for item in data]
    if kind is not dict:
        return data
    out = {key: _sorted_sets(item) for key, item in data.items()}
    if out.get(TAG) in ("set", "frozenset"):
        out["v"] = sorted(out["v"], key=lambda item: orjson.dumps(item, option=orjson.OPT_SORT_KEYS))
    return out


def jsonb_size(data: Any) -> int:
    """The bytes PostgreSQL's jsonb takes for ``data`` (what ``pg_column_size(x::jsonb)``
    says of its JSON text), its 4-byte header included.

    It follows PostgreSQL's layout (``src/backend/utils/adt/jsonb_util.c``,
    ``convertToJsonb``): a container is aligned to 4 bytes and has a 4-byte header and
    a 4-byte entry per element (two per key and value); a string takes its UTF-8
    bytes; a number takes a ``numeric`` aligned to 4 bytes; ``true``, ``false`` and
    ``null`` take their entry only; an object's keys come first, then its values, both
    in jsonb's key order (shorter keys first, then by bytes). A scalar on its own is
    stored as an array of one.

    Args:
        data: JSON-native data (what `encode` returns): None, bool, int, float, str,
            list, dict with str keys.

    Raises:
        ValueError: an array of more than 2**24 elements or an object of more than
            2**23 keys, which PostgreSQL cannot build as jsonb at all.
    """
    if type(data) is not list and type(data) is not dict:
        data = [data]
    return _jsonb_end(data, 4)


def _align4(position: int) -> int:
    return (position + 3) & ~3


def _jsonb_end(value: Any, position: int) -> int:
    """Where the data of ``value`` ends in a jsonb buffer, written from ``position``."""
    kind = type(value)
    if kind is str:
        return position + (len(value) if value.isascii() else len(value.encode("utf-8")))
    if value is None or kind is bool:
        return position
    if kind is int or kind is float:
        return _align4(position) + _numeric_size(value)
    if kind is list:
        if len(value) > _JSONB_MAX_ELEMENTS:
            raise ValueError(
                f"an array of {len(value):,} elements, more than a jsonb array's {_JSONB_MAX_ELEMENTS:,}"
            )
        position = _align4(position) + 4 + 4 * len(value)
        for item in value:
            position = _jsonb_end(item, position)
        return position
    if len(value) > _JSONB_MAX_PAIRS:  # a dict
        raise ValueError(f"an object of {len(value):,} keys, more than a jsonb object's {_JSONB_MAX_PAIRS:,}")
    keys = sorted(value, key=_jsonb_key_order)
    position = _align4(position) + 4 + 8 * len(keys)
    for key in keys:
        position = _jsonb_end(key, position)
    for key in keys:
        position = _jsonb_end(value[key], position)
    return position


def _jsonb_key_order(key: str) -> tuple[int, bytes]:
    encoded = key.encode("utf-8")
    return len(encoded), encoded


def _numeric_size(number: int | float) -> int:
    """The bytes of the ``numeric`` PostgreSQL reads from the JSON text of ``number``
    (``src/backend/utils/adt/numeric.c``, ``make_result``): a 4-byte header, 2 bytes
    of sign, scale and weight (4 when the scale is above 63 or the weight outside
    -64..63), and 2 bytes per base-10000 digit between the first and the last that is
    not zero."""
    exact = Decimal(number if type(number) is int else orjson.dumps(number).decode("ascii"))
    _, digits, exponent = exact.as_tuple()
    assert isinstance(exponent, int)  # a finite number: encode tags the others
    text = "".join(map(str, digits))  # no leading zero but for zero itself
    significant = text.rstrip("0")
    if not significant.strip("0"):
        return 6  # zero: no digit
    lowest = exponent + len(text) - len(significant)  # the power of ten of the last digit not 0
    weight = (lowest + len(significant) - 1) // 4  # the base-10000 digit of the first digit
    ndigits = weight - lowest // 4 + 1
    short = max(0, -exponent) <= 63 and -64 <= weight <= 63  # scale and weight fit 2 bytes
    return (6 if short else 8) + 2 * ndigits


def loads_json(raw: bytes) -> Any:
    """Decode JSON text read from jsonb; tagged values are rebuilt only when present.

    A plain JSON integer beyond 64 bits (written by SQL: pgtasks tags those) is read
    exactly, as an ``int``: orjson alone would read it as a float, changing its type
    and value. A number beyond a float's range, an integer included, stays an error
    (orjson's ``JSONDecodeError``).
    """
    data = orjson.loads(raw)
    if _LONG_DIGITS.search(raw) is not None:  # an integer of 19+ digits may be one: read exactly
        data = json.loads(raw)
    if _TAG_BYTES in raw:
        return decode(data)
    return data
