"""The stored form of a task's exception: its traceback, chained exceptions and groups kept."""

from __future__ import annotations

import pytest

from pgtasks.db.errors import TRACEBACK_LIMIT, error_record, format_traceback


def _inner(dsn: str) -> None:
    raise ValueError(f"cannot reach {dsn}")


def _outer(dsn: str) -> None:
    try:
        _inner(dsn)
    except ValueError as exc:
        raise KeyError("lookup failed") from exc


def _caught(fn: object, *args: object) -> BaseException:
    with pytest.raises(BaseException) as info:
        fn(*args)  # type: ignore[operator]
    return info.value


def test_the_traceback_keeps_every_frame_and_the_chain_without_column_markers() -> None:
    exc = _caught(_outer, "postgresql://app:hunter2-secret@db/prod")
    text = format_traceback(exc)
    assert 'raise ValueError(f"cannot reach {dsn}")' in text
    assert "in _inner" in text and "in _outer" in text
    assert "The above exception was the direct cause of the following exception:" in text
    assert text.rstrip().endswith("KeyError: 'lookup failed'")
    assert not [line for line in text.splitlines() if line.strip() and set(line.strip()) <= {"^", "~"}]


def test_an_exception_group_keeps_its_members() -> None:
    def group() -> None:
        raise ExceptionGroup("two failed", [RuntimeError("first"), TypeError("second")])

    text = format_traceback(_caught(group))
    assert "ExceptionGroup: two failed (2 sub-exceptions)" in text
    assert "RuntimeError: first" in text and "TypeError: second" in text


def test_the_record_masks_secrets_and_keeps_the_innermost_end() -> None:
    record = error_record(_caught(_outer, "postgresql://app:hunter2-secret@db/prod"))
    assert "hunter2-secret" not in record["traceback"]
    assert record["type"] == "KeyError" and record["code"] == "KEYERROR"

    def deep(n: int) -> None:
        if n == 0:
            raise RuntimeError("bottom")
        deep(n - 1)

    long = error_record(_caught(deep, 900))
    assert len(long["traceback"]) <= TRACEBACK_LIMIT
    assert long["traceback"].rstrip().endswith("RuntimeError: bottom")
