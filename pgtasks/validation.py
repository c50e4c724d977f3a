"""The checks of what callers hand pgtasks, in one place, each with its limit.

Every public entry point (`pgtasks.Task.apply_async` and its relatives, the task
options of ``@app.task``, ``App.list_jobs``/``get_job``/``cancel``/``requeue``/
``purge``, `pgtasks.AsyncResult`, schedule definitions and the ``app.schedules``
API, `pgtasks.Settings`) refuses bad input here, before anything is written, with a
`pgtasks.errors.ConfigurationError` (a ``ValueError``) whose message names the
parameter and the limit. The limits exist because of what sits behind the call:

* text that goes into an index of ``pgtasks.jobs`` or ``pgtasks.schedules`` (queue,
  tenant, lock key, unique key, task name) must fit a B-tree entry: at most
  `MAX_KEY_BYTES` bytes of valid UTF-8 (PostgreSQL refuses an index entry larger
  than about a third of a page, "64.1.2. B-Tree Structure"; a lone surrogate such
  as ``"\\ud800"`` has no UTF-8 form at all); a queue, tenant, lock, unique,
  concurrency or rate key also holds no control character and no mark that reorders
  or hides text (`check_name`): it names a series of the metrics and a row of the
  command line's tables, where such a character acts on the terminal or is shown as
  an escape that another name may hold as plain text;
* an instant must be one both PostgreSQL's ``timestamptz`` and Python's
  `datetime.datetime` can hold, read back in any session time zone: between
  `MIN_INSTANT` and `MAX_INSTANT` (Python stops at year 9999, and psycopg reads a
  ``timestamptz`` in the session's zone, up to a day away from UTC);
* a delay or age in seconds is finite, not negative and at most `MAX_DELAY`
  (10 years), so that ``now() + delay`` stays inside those instants;
* an id is a PostgreSQL ``bigint``; a page or batch size is bounded, so that no
  call loops or waits forever.

This module is vocabulary: it imports only `pgtasks.errors` and the standard
library, so settings, tasks, the enqueue path, results, the scheduler's definitions
and the application all use the same checks.
"""

from __future__ import annotations

import datetime as dt
import inspect
import math
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final

from pgtasks.errors import ConfigurationError

__all__ = [
    "BIGINT_MAX",
    "HIDDEN_MARKS",
    "MAX_BATCH",
    "MAX_DELAY",
    "MAX_HEADERS_BYTES",
    "MAX_INSTANT",
    "MAX_KEY_BYTES",
    "MAX_PAGE_SIZE",
    "MIN_INSTANT",
    "CallCheck",
    "check_bool",
    "check_headers_size",
    "check_instant",
    "check_int",
    "check_job_id",
    "check_name",
    "check_retry_countdown",
    "check_seconds",
    "check_text",
    "check_timeout",
    "check_utf8",
    "short",
]

#: Most UTF-8 bytes of a text that goes into an index of ``pgtasks.jobs`` or
#: ``pgtasks.schedules``: queue, tenant, lock key, unique key, task name. PostgreSQL's
#: B-tree refuses an index entry larger than about a third of a page (2,704 bytes
#: with 8 kB pages; "64.1.2. B-Tree Structure" and the ``index row size`` error), and
#: a lock key enters its index only when its job starts: without a bound at the call
#: site, one such key is accepted at enqueue and then fails every claim on its queue.
#: 1,000 bytes leaves room for the other columns of the entry.
MAX_KEY_BYTES: Final = 1000
#: Most UTF-8 bytes of a job's headers as stored (JSON): they are shown with the job
#: (``pgtasks jobs show``) and read back with every claim.
MAX_HEADERS_BYTES: Final = 65536
#: Longest delay or age in seconds (10 years): keeps every run-at representable in
#: both PostgreSQL's timestamptz and Python's datetime.
MAX_DELAY: Final = 10 * 365.25 * 86400.0
#: The earliest and latest instants accepted (``eta``, pinned ``now``, ``after``):
#: a day inside Python's years 1..9999, so that the instant read back in any session
#: time zone (offsets are below a day) is still a `datetime.datetime`.
MIN_INSTANT: Final = dt.datetime(1, 1, 2, tzinfo=dt.UTC)
MAX_INSTANT: Final = dt.datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=dt.UTC)
#: PostgreSQL's bigint, the type of job ids.
BIGINT_MIN: Final = -(2**63)
BIGINT_MAX: Final = 2**63 - 1
#: Most rows one listing call returns (``App.list_jobs(limit=)``, as ``pgtasks jobs list --limit``).
MAX_PAGE_SIZE: Final = 1000
#: Most rows one statement of a batched maintenance call touches (``App.purge(batch=)``).
MAX_BATCH: Final = 1_000_000
#: The Unicode marks that reorder or hide text, besides the control characters: the
#: Arabic letter mark, the left-to-right and right-to-left marks, the bidirectional
#: embeddings, overrides and isolates (Unicode Standard Annex #9, "Explicit Directional
#: Formatting Characters"), and the line and paragraph separators. `pgtasks.loader.shown`
#: prints them as escapes; `check_name` refuses them.
HIDDEN_MARKS: Final = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029)
# A control character (Unicode category Cc: C0, DEL, C1) or one of HIDDEN_MARKS.
_UNSHOWABLE: Final = re.compile("[\x00-\x1f\x7f-\x9f" + "".join(chr(c) for c in HIDDEN_MARKS) + "]")


def short(value: object, keep: int = 40) -> str:
    """``repr(value)``, cut to about ``keep`` characters (a refused value may be huge).

    The result is ASCII (`ascii`), so it can be printed and logged whatever the value holds.
    """
    if isinstance(value, str) and len(value) > keep:
        return f"{value[:keep]!a}... ({len(value)} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        # str() of an int past sys.get_int_max_str_digits() (4,300 digits) raises.
        return f"an int of {value.bit_length()} bits"
    text = ascii(value)
    return text if len(text) <= keep * 2 else f"{text[: keep * 2]}..."


def check_utf8(label: str, value: str) -> int:
    """The size of ``value`` in UTF-8 bytes.

    Raises:
        ConfigurationError: ``value`` holds a lone surrogate (no UTF-8 form), naming
            ``label`` and the index.
    """
    if value.isascii():
        return len(value)
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ConfigurationError(
            f"{label} {short(value)} contains a lone surrogate at index {exc.start}, which is not valid UTF-8"
        ) from None


def check_text(label: str, value: object, *, max_bytes: int = MAX_KEY_BYTES, empty: bool = False) -> str:
    """A text parameter: a str without NUL, valid UTF-8, of at most ``max_bytes`` bytes.

    Args:
        label: the parameter's name, for the message.
        value: what the caller passed.
        max_bytes: most UTF-8 bytes (default `MAX_KEY_BYTES`, the bound of an index entry).
        empty: whether ``""`` is allowed.

    Returns:
        ``value``.

    Raises:
        ConfigurationError: naming ``label``, the problem and the bound.
    """
    if not isinstance(value, str) or (not value and not empty) or "\x00" in value:
        what = "a string" if empty else "a non-empty string"
        raise ConfigurationError(f"{label} must be {what} without NUL, got {short(value)}")
    size = check_utf8(label, value)
    if size > max_bytes:
        raise ConfigurationError(
            f"{label} {short(value)} is {size} bytes in UTF-8; at most {max_bytes} are allowed"
            + (" (it goes into an index)" if max_bytes == MAX_KEY_BYTES else "")
        )
    return value


def check_name(label: str, value: object, *, empty: bool = False) -> str:
    """A name that goes into an index and is shown to operators (queue, tenant, lock,
    unique, concurrency and rate key): `check_text`, and no control character (Unicode
    category Cc: ``\\x00``-``\\x1f``, DEL, ``\\x80``-``\\x9f``, ANSI escapes among them)
    nor any of `HIDDEN_MARKS` (a right-to-left override ``\\u202e``).

    Such a character acts on a terminal or hides, so the command line shows it as an
    escape: ``"mail\\x1b[31m"`` would look like a queue named with a backslash, and a
    tool that drops ANSI sequences would show it as ``"mail"``.

    Raises:
        ConfigurationError: naming ``label``, the character and its index.
    """
    text = check_text(label, value, empty=empty)
    if text.isprintable():  # every refused character is unprintable: the common case stops here
        return text
    found = _UNSHOWABLE.search(text)
    if found is not None:
        raise ConfigurationError(
            f"{label} {short(text)} contains U+{ord(found.group()):04X} at index {found.start()}; "
            "control characters and marks that reorder text are refused in names"
        )
    return text


def check_int(label: str, value: object, low: int, high: int) -> int:
    """An int (not a bool) in ``low..high``.

    Raises:
        ConfigurationError: naming ``label`` and the range.
    """
    if type(value) is not int or not low <= value <= high:
        raise ConfigurationError(f"{label} must be an int in {low}..{high}, got {short(value)}")
    return value


def check_bool(label: str, value: object) -> bool:
    """A bool (``True``/``False``, not 1 or ``"yes"``).

    Raises:
        ConfigurationError: naming ``label``.
    """
    if not isinstance(value, bool):
        raise ConfigurationError(f"{label} must be True or False, got {short(value)}")
    return value


def check_seconds(label: str, value: object, *, high: float = MAX_DELAY, positive: bool = False) -> float:
    """A number of seconds: an int or float (not a bool), finite, ``>= 0`` (``> 0`` when
    ``positive``) and at most ``high`` (default `MAX_DELAY`).

    Returns:
        The seconds as a float.

    Raises:
        ConfigurationError: naming ``label`` and the range; an int too large for a
            float (``10**400``) is refused the same way, not with ``OverflowError``.
    """
    low = "0 (exclusive)" if positive else "0"
    refused = ConfigurationError(f"{label} must be seconds in {low}..{high:.0f}, got {short(value)}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise refused
    try:
        seconds = float(value)
    except OverflowError:
        raise refused from None
    if not math.isfinite(seconds) or seconds < 0 or seconds > high or (positive and seconds == 0):
        raise refused
    return seconds


def check_retry_countdown(countdown: object) -> float | None:
    """The seconds a retry asks to wait (``self.retry(countdown=)``, ``Retry(countdown=)``):
    None (the task's backoff), a negative number as 0 (at once), else `check_seconds`.

    Raises:
        ConfigurationError: not a number, ``nan``, infinite, or past `MAX_DELAY`
            (``10**400`` too): no run-at could be computed from it.
    """
    if countdown is None:
        return None
    if isinstance(countdown, int | float) and not isinstance(countdown, bool) and countdown < 0:
        return 0.0
    return check_seconds("retry countdown", countdown)


def check_timeout(label: str, value: object) -> float | None:
    """A wait in seconds: None (no limit) or `check_seconds` (``0`` means "do not wait").

    Raises:
        ConfigurationError: ``nan``, ``inf`` (use None), a negative or too large value.
    """
    return None if value is None else check_seconds(label, value)


def check_instant(label: str, value: object) -> dt.datetime:
    """An aware datetime whose instant lies between `MIN_INSTANT` and `MAX_INSTANT`.

    Naive datetimes are refused, not guessed as UTC.

    Raises:
        ConfigurationError: naming ``label``, the problem and the range.
    """
    if not isinstance(value, dt.datetime):
        raise ConfigurationError(f"{label} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ConfigurationError(
            f"{label} must be timezone-aware (e.g. datetime.now(timezone.utc)); naive is refused"
        )
    try:
        inside = MIN_INSTANT <= value <= MAX_INSTANT
    except OverflowError:  # the zone's offset takes it past year 1 or 9999
        inside = False
    if not inside:
        raise ConfigurationError(
            f"{label} {value.isoformat()} is outside {MIN_INSTANT.isoformat()}..{MAX_INSTANT.isoformat()} "
            "(UTC), the instants both PostgreSQL and Python can hold"
        )
    return value


def check_job_id(label: str, value: object) -> int:
    """A job id: an int (or a str of digits, as a command line gives it) in PostgreSQL's
    ``bigint`` range.

    Raises:
        ConfigurationError: naming ``label`` and the range.
    """
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and value.isascii():
        value = int(value)
    return check_int(label, value, BIGINT_MIN, BIGINT_MAX)


def check_choice(label: str, value: object, allowed: Collection[str]) -> str:
    """One of ``allowed``.

    Raises:
        ConfigurationError: naming ``label`` and the allowed values.
    """
    if not isinstance(value, str) or value not in allowed:
        raise ConfigurationError(f"{label} must be one of {', '.join(sorted(allowed))}, got {short(value)}")
    return value


def check_headers_size(label: str, encoded: str) -> str:
    """Headers as stored (JSON text) of at most `MAX_HEADERS_BYTES` UTF-8 bytes.

    Raises:
        ConfigurationError: naming ``label``, the size and the bound.
    """
    size = len(encoded) if encoded.isascii() else len(encoded.encode("utf-8"))
    if size > MAX_HEADERS_BYTES:
        raise ConfigurationError(f"{label} are {size} bytes as JSON; at most {MAX_HEADERS_BYTES} are allowed")
    return encoded


class CallCheck:
    """Whether a call's arguments fit a task function's signature, checked when it is
    enqueued rather than when a worker runs it (Celery's ``Task.typing``, which binds
    ``inspect.signature(fun)`` at call time).

    The plain case (positional arguments only, their count within the function's
    range) costs a comparison; anything else is judged by `inspect.Signature.bind`,
    whose message says what is wrong.

    Args:
        name: the task's name, for the message.
        fn: the task's function.
        bind: the function takes the task context as its first parameter (``bind=True``);
            that parameter is not the caller's to fill.
    """

    __slots__ = ("_fast_max", "_fast_min", "_signature", "name")

    def __init__(self, name: str, fn: Callable[..., Any], *, bind: bool) -> None:
        self.name = name
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # no signature to read (some builtins): nothing to check
            self._signature: inspect.Signature | None = None
            self._fast_min = self._fast_max = -1
            return
        params = list(signature.parameters.values())
        if bind and params and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
            params = params[1:]
        elif bind and params and params[0].kind is params[0].VAR_POSITIONAL:
            pass  # def task(*args): the context is args[0], the rest the caller's
        self._signature = signature.replace(parameters=params)
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required_keywords = any(p.kind is p.KEYWORD_ONLY and p.default is p.empty for p in params)
        if required_keywords:
            self._fast_min = self._fast_max = -1
        else:
            self._fast_min = sum(1 for p in positional if p.default is p.empty)
            varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
            self._fast_max = BIGINT_MAX if varargs else len(positional)

    def __call__(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        """Check one call.

        Raises:
            ConfigurationError: the arguments do not bind to the function's
                parameters (too many or too few, an unknown or repeated keyword).
        """
        if self._signature is None or (not kwargs and self._fast_min <= len(args) <= self._fast_max):
            return
        try:
            self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            reason = str(exc).encode("utf-8", "backslashreplace").decode("utf-8")  # a keyword may be invalid
            raise ConfigurationError(
                f"arguments do not fit task {self.name!r}{self._signature}: {reason} "
                "(task option typing=False turns this check off)"
            ) from None
