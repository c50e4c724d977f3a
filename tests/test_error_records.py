"""The stored form of a task's exception: its traceback, chained exceptions and groups kept."""

from __future__ import annotations

import traceback

import pytest

import pgtasks
from pgtasks.db.errors import TRACEBACK_LIMIT, error_record, format_traceback
from pgtasks.redaction import redact_text


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


def test_a_traceback_formatted_again_is_masked_again() -> None:
    """Masking a long text twice gives the same masked text (the second from the cache
    of texts masked before); a text that differs in one secret is masked on its own."""
    first = error_record(_caught(_outer, "postgresql://app:hunter2-secret@db/prod"))
    again = error_record(_caught(_outer, "postgresql://app:hunter2-secret@db/prod"))
    other = error_record(_caught(_outer, "postgresql://app:other-secret-9@db/prod"))
    assert len(first["traceback"]) >= 32  # long enough to be cached
    assert again["traceback"] == first["traceback"]
    assert "hunter2-secret" not in again["traceback"]
    assert "other-secret-9" not in other["traceback"]
    # Same masked text: the password was the only difference.
    assert other["traceback"] == first["traceback"]
    # A text given its own names or values is masked with them, never from the cache.
    text = format_traceback(_caught(_inner, "mailbox-owner-id-4711"))
    assert "mailbox-owner-id-4711" in redact_text(text)
    assert "mailbox-owner-id-4711" not in redact_text(text, values=["mailbox-owner-id-4711"])


def test_a_retry_batch_stores_each_jobs_own_error(app: pgtasks.App) -> None:
    """The retry batch sends its error records as one JSON array beside the ids: each
    job gets its own record, in order, in its error and its attempt history."""

    @app.task(name="errors.flaky")
    def flaky(i: int) -> int:
        return i

    flaky.delay_many(range(3))
    rows = app.store.fetch_all(
        "job_claim_batch",
        {"queues": "{default}", "start_tenant": "", "max_tenants": 100, "limit": 3, "now": None,
         "fair": False, "worker_id": "w-errors", "tasks": None},
    )  # fmt: skip
    ids = [r["id"] for r in rows]
    records = [error_record(_caught(_inner, f"host-{i}")) for i in range(3)]
    retried = app.stores.jobs.retry_batch(
        worker_id="w-errors", ids=ids, delays=[0.0, 5.0, 10.0], max_attempts=[3, 3, 3], errors=records,
        starts=[None, None, None],
    )  # fmt: skip
    assert sorted(retried) == sorted(ids)
    for i, job_id in enumerate(ids):
        job = app.store.fetch_one("job_get", {"id": job_id, "tenant": None})
        assert job is not None and job["status"] == "queued"
        assert job["error"]["message"] == f"cannot reach host-{i}"
        assert [a["error"]["message"] for a in job["attempts"]] == [f"cannot reach host-{i}"]


def _context() -> None:
    try:
        _inner("db")
    except ValueError:
        raise RuntimeError("while handling")  # noqa: B904 (the implicit context is the case)


def _suppressed() -> None:
    try:
        _inner("db")
    except ValueError:
        raise RuntimeError("context hidden") from None


def _recursive(n: int) -> int:
    return _recursive(n + 1)


def _noted() -> None:
    exc = LookupError("with a note")
    exc.add_note("the note")
    raise exc


def _cyclic() -> None:
    try:
        _inner("db")
    except ValueError as first:
        try:
            raise KeyError("second") from first
        except KeyError as second:
            first.__context__ = second
            raise


@pytest.mark.parametrize(
    ("fn", "args"),
    [(_inner, ("db",)), (_outer, ("db",)), (_context, ()), (_suppressed, ()), (_recursive, (0,)),
     (_noted, ()), (_cyclic, ())],
)  # fmt: skip
def test_the_traceback_reads_as_the_standard_library_prints_it_without_markers(
    fn: object, args: tuple[object, ...]
) -> None:
    """Formatted from stack summaries without positions, the text equals the traceback
    module's own (`TracebackException`, its column markers dropped), chain and all."""
    exc = _caught(fn, *args)
    te = traceback.TracebackException.from_exception(exc)
    pending = [te]
    while pending:
        part = pending.pop()
        for frame in part.stack:
            frame.colno = frame.end_colno = None
        pending += [p for p in (part.__cause__, part.__context__) if p is not None and p is not te]
    assert format_traceback(exc) == "".join(te.format())
