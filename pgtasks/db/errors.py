"""Error records: the stored form of how an attempt failed (the jobs' ``error`` column).

An error record is a plain dict of JSON text values, so that `pgtasks.serialization.dumps`
writes it as it is: ``type`` (the exception's class name), ``module``, ``message``,
``code`` (an `ErrorCode`, or the exception's own code), ``class`` (a `FailureClass`)
and, for exceptions, ``traceback``. Every text is made storable first: jsonb
refuses NUL characters and lone surrogates, and an exception about binary data must
not make its own failure unrecordable.

Secrets are masked in every record (`pgtasks.redaction.redact_text`): a URL's
password, and the value of a sensitive name written ``name=value`` or ``'name':
'value'``, in the message and the traceback. The worker then masks the literal values
of the job's own sensitive arguments (`masked_record`), which only it knows.
"""

from __future__ import annotations

import traceback
from collections.abc import Collection, Iterable
from typing import Any

from pgtasks.redaction import redact_text
from pgtasks.states import ErrorCode, FailureClass

__all__ = ["error_record", "first_line", "masked_record", "plain_error", "storable_text"]

TRACEBACK_LIMIT = 16_000  # characters kept of a traceback (its end: the innermost frames)


def storable_text(text: str) -> str:
    """``text`` with what jsonb refuses escaped: NUL as ``\\x00``, lone surrogates as ``\\udXXX``."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def plain_error(
    type_name: str, code: ErrorCode | str, message: str, klass: FailureClass = FailureClass.PERMANENT
) -> dict[str, Any]:
    """An error record without an exception: ``{"type", "code", "class", "message"}``.

    Args:
        type_name: what ended the attempt (``"Cancelled"``, ``"UnknownTask"`` ...).
        code: the record's code. klass: transient or permanent (default permanent).
        message: for people; made storable, and its secrets masked, here.
    """
    return {
        "type": type_name,
        "code": str(code),
        "class": str(klass),
        "message": storable_text(redact_text(message)),
    }


def error_record(
    exc: BaseException,
    *,
    code: ErrorCode | str | None = None,
    klass: FailureClass | str = FailureClass.PERMANENT,
) -> dict[str, Any]:
    """The stored form of an exception: type, module, message, code, class and traceback.

    Args:
        exc: the exception.
        code: the record's code; default the exception's ``code`` attribute, else its
            class name in upper case.
        klass: the failure class (`FailureClass` or its value).

    Returns:
        The record; enum members are turned into their plain values (the
        serializer writes exact ``str`` only), the traceback is cut to its last
        ``TRACEBACK_LIMIT`` characters; secrets in the message and the traceback
        are masked (see the module docs).
    """
    text = format_traceback(exc)
    code = code or getattr(exc, "code", None) or type(exc).__name__.upper()
    return {
        "type": type(exc).__qualname__,
        "module": type(exc).__module__,
        "message": storable_text(redact_text(str(exc))),
        "code": str(code) if isinstance(code, str) else code,  # an enum member: its plain value
        "class": str(klass),
        "traceback": storable_text(redact_text(text)[-TRACEBACK_LIMIT:]),
    }


def format_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` as Python prints it, with its chained exceptions
    (``__cause__``, ``__context__``, the members of an exception group), without the
    column markers (``^^^^``) Python 3.11 adds under a frame's line.

    Placing those markers costs most of the formatting time (each frame's code is
    walked for its positions: about 8 in 10 of it for an ordinary traceback), and a
    stored record, read later beside the source, does not need them; retried attempts
    format one traceback each, on the worker's hot path. So each exception of the chain
    is formatted from a stack summary that has no positions (`traceback.StackSummary.extract`)
    and its `traceback.format_exception_only` lines, joined by the sentences Python
    prints between them. A chain holding an exception group is formatted by
    `traceback.TracebackException` (with the positions taken, then dropped).
    """
    chain: list[tuple[BaseException, str]] = []  # outermost first, with what leads to it
    seen: set[int] = set()
    current: BaseException | None = exc
    joint = ""
    while current is not None and id(current) not in seen:
        if isinstance(current, BaseExceptionGroup):
            return _format_with_positions_dropped(exc)
        seen.add(id(current))
        chain.append((current, joint))
        if current.__cause__ is not None:
            current, joint = current.__cause__, _CAUSE_JOINT
        elif current.__context__ is not None and not current.__suppress_context__:
            current, joint = current.__context__, _CONTEXT_JOINT
        else:
            current = None
    lines: list[str] = []
    for part, joint in reversed(chain):
        if part.__traceback__ is not None:
            lines.append("Traceback (most recent call last):\n")
            lines.extend(traceback.StackSummary.extract(traceback.walk_tb(part.__traceback__)).format())
        lines.extend(traceback.format_exception_only(type(part), part))
        lines.append(joint)
    return "".join(lines)


# What Python prints between a chained exception and the one it led to (the traceback
# module's own sentences).
_CAUSE_JOINT = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT_JOINT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def _format_with_positions_dropped(exc: BaseException) -> str:
    """`format_traceback` for a chain holding an exception group: the stdlib's own
    formatting of groups, with the column markers dropped after the positions were taken."""
    te = traceback.TracebackException.from_exception(exc)
    pending, seen = [te], set()
    while pending:
        part = pending.pop()
        if id(part) in seen:
            continue
        seen.add(id(part))
        for frame in part.stack:
            frame.colno = frame.end_colno = None
        pending += [p for p in (part.__cause__, part.__context__) if p is not None]
        pending += getattr(part, "exceptions", None) or []
    return "".join(te.format())


def masked_record(
    record: dict[str, Any], *, names: Collection[str] = (), values: Iterable[str] = ()
) -> dict[str, Any]:
    """A copy of an error record with more secrets masked in its message and traceback.

    Args:
        record: an error record (`error_record`, `plain_error`).
        names: more sensitive names (a task's ``redact`` entries).
        values: literal secrets (a job's sensitive argument values, resolved secret
            references); those shorter than `pgtasks.redaction.MIN_SECRET_CHARS` are
            left alone.
    """
    values = list(values)
    if not names and not values:
        return record
    out = dict(record)
    for field in ("message", "traceback"):
        text = out.get(field)
        if isinstance(text, str):
            out[field] = storable_text(redact_text(text, names=names, values=values))
    return out


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (PostgreSQL adds DETAIL and HINT lines), with
    its SQLSTATE when it has one."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    sqlstate = getattr(exc, "sqlstate", None)
    return f"{text} (SQLSTATE {sqlstate})" if sqlstate else text
