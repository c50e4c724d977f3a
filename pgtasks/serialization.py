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
time zones other than ``ZoneInfo`` (with a key) and ``datetime.timezone``, and
nesting deeper than 126 levels (orjson writes at most 254 levels and a tagged
container takes two).
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

__all__ = ["TAG", "Undecodable", "decode", "dumps", "encode", "loads_json", "undecodable"]

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
        SerializationError: the value cannot round-trip exactly (see module docs).
    """
    if value is None:
        return "null"  # tasks that return nothing
    if _plain(value):
        return orjson.dumps(value).decode("utf-8")  # the common case: nothing to convert
    data = encode(value, path)  # raises SerializationError naming the exact path
    try:
        return orjson.dumps(data).decode("utf-8")
    except orjson.JSONEncodeError as exc:  # a safety net; encode refuses what orjson would
        raise SerializationError(path, str(exc)) from None


def loads_json(raw: bytes) -> Any:
    """Decode JSON text read from jsonb; tagged values are rebuilt only when present.

    A plain JSON integer beyond 64 bits (written by SQL: pgtasks tags those) is read
    exactly, as an ``int``: orjson alone would read it as a float, changing its type
    and value. A number beyond a float stays an error (orjson's).
    """
    data = orjson.loads(raw)
    if _LONG_DIGITS.search(raw) is not None:  # an integer of 19+ digits may be one: read exactly
        data = json.loads(raw)
    if _TAG_BYTES in raw:
        return decode(data)
    return data
