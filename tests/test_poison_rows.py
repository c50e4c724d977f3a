"""No single row stops a queue: rows written by SQL that the claim cannot take, or that
the worker cannot read, fail alone while the jobs around them run.

The docs allow writing jobs by SQL, which bypasses every check of the enqueue path.
Workers are ``pgtasks -A tests.apps.worker_app:app worker`` subprocesses; the good
jobs are ``w.record``, which writes the side ledger of `apps.worker_app`, so what ran
(and with which attempt) is counted independently of pgtasks' bookkeeping.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps.worker_app import WorkerProcess, one, rows, workers
from helpers import eventually

import pgtasks
from pgtasks.errors import DatabaseError
from pgtasks.worker.isolation import distinct_keys, find_unclaimable

FAST = ["--poll-interval", "0.1"]
# A lock key of 3,000 characters that do not compress (PostgreSQL compresses a long index
# entry, so a repetitive key would fit): too large for jobs_lock_running_idx.
OVERSIZED_KEY = "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(47))[:3000]


def _insert(conn: psycopg.Connection[Any], columns: dict[str, Any]) -> int:
    """Write one ``w.record`` job by SQL, bypassing the enqueue path; returns its id."""
    names = ["task_name", *columns]
    placeholders = ", ".join(["%s"] * len(names))
    query = f"INSERT INTO pgtasks.jobs ({', '.join(names)}) VALUES ({placeholders}) RETURNING id"
    return int(one(conn, query, ["w.record", *columns.values()]))


def _good_jobs(conn: psycopg.Connection[Any], n: int, start: int = 0) -> list[int]:
    """``n`` good ``w.record`` jobs written by SQL (arguments ``[start]``, ``[start + 1]``, ...)."""
    return [_insert(conn, {"args": f"[{start + i}]"}) for i in range(n)]


def _done(conn: psycopg.Connection[Any], ids: Sequence[int]) -> bool:
    query = "SELECT count(*) = 0 FROM pgtasks.jobs WHERE id = ANY(%s) AND status IN ('queued', 'running')"
    return bool(one(conn, query, (list(ids),)))


def _assert_ran_once_with_attempt_1(conn: psycopg.Connection[Any], ids: Sequence[int]) -> None:
    """Every job succeeded on its first attempt, and the ledger saw exactly that attempt."""
    jobs = rows(
        conn, "SELECT id, status, attempt FROM pgtasks.jobs WHERE id = ANY(%s) ORDER BY id", (list(ids),)
    )
    assert jobs == [(i, "succeeded", 1) for i in sorted(ids)]
    ledger = rows(
        conn,
        "SELECT job_id, array_agg(attempt ORDER BY id) FROM public.ledger"
        " WHERE job_id = ANY(%s) GROUP BY job_id",
        (list(ids),),
    )
    assert sorted(ledger) == [(i, [1]) for i in sorted(ids)]


def _failed_with(conn: psycopg.Connection[Any], job_id: int) -> tuple[str, int, str, str, str]:
    """(status, attempt, error code, class, message) of a job."""
    row = conn.execute(
        "SELECT status, attempt, error->>'code', error->>'class', error->>'message'"
        " FROM pgtasks.jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    status, attempt, code, klass, message = row
    return str(status), int(attempt), str(code), str(klass), str(message)


def _still_serving(worker: WorkerProcess, client: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    """The worker process is alive and runs a job enqueued now."""
    later = client.tasks["w.record"].delay(999).id
    eventually(lambda: _done(conn, [later]), timeout=20, message="a job enqueued afterwards finished")
    _assert_ran_once_with_attempt_1(conn, [later])
    assert worker.proc.poll() is None, worker.log()[-3000:]


# -- rows the claim's write refuses ----------------------------------------------------------

UNCLAIMABLE: dict[str, tuple[dict[str, Any], str]] = {
    # Accepted by INSERT (jobs_lock_running_idx only holds running jobs), refused by the claim.
    "oversized-lock-key": ({"args": "[0]", "lock_key": OVERSIZED_KEY}, "jobs_lock_running_idx"),
    # The claim raises attempt past max_attempts: jobs_attempt_bounded refuses it.
    "attempt-at-bound": ({"args": "[0]", "attempt": 1, "max_attempts": 1}, "jobs_attempt_bounded"),
}


@pytest.mark.parametrize("kind", list(UNCLAIMABLE))
def test_unclaimable_row_fails_alone_while_100_good_jobs_succeed_with_attempt_1(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path, kind: str
) -> None:
    columns, constraint = UNCLAIMABLE[kind]
    good = _good_jobs(conn, 50)
    poisoned = _insert(conn, columns)
    good += _good_jobs(conn, 50, start=50)
    with workers(wdsn, tmp_path, ["-c", "4", *FAST]) as (w,):
        eventually(lambda: _done(conn, [*good, poisoned]), timeout=60, message="every job finished")
        _assert_ran_once_with_attempt_1(conn, good)
        status, attempt, code, klass, message = _failed_with(conn, poisoned)
        assert (status, attempt, code, klass) == (
            "failed",
            columns.get("attempt", 0),
            "UNCLAIMABLE",
            "permanent",
        )
        assert message.startswith(f"job {poisoned} cannot be claimed: ") and constraint in message
        assert one(conn, "SELECT count(*) FROM public.ledger WHERE job_id = %s", (poisoned,)) == 0
        _still_serving(w, client, conn)
        assert f"job {poisoned} (w.record) failed without running" in w.log()


def test_unclaimable_row_named_by_a_notification_fails_alone(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    """An idle worker claims notified jobs by id (job_claim_ids): the same isolation applies."""
    with workers(wdsn, tmp_path, ["-c", "2", "--poll-interval", "30"]) as (w,):
        listening = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND query LIKE '%LISTEN pgtasks_cancel%'"
        )
        eventually(lambda: one(conn, listening) == 1, timeout=20, message="the worker listens")
        with conn.transaction():
            poisoned = _insert(conn, {"args": "[0]", "lock_key": OVERSIZED_KEY})
            good = _good_jobs(conn, 3)
            for job_id in (poisoned, *good):
                conn.execute("SELECT pg_notify('pgtasks_jobs', %s)", (f"default:{job_id}",))
        # Within seconds, not the 30 s poll: the named claim isolated the row and went on.
        eventually(lambda: _done(conn, [poisoned, *good]), timeout=10, message="every job finished")
        _assert_ran_once_with_attempt_1(conn, good)
        assert _failed_with(conn, poisoned)[:3] == ("failed", 0, "UNCLAIMABLE")
        assert w.proc.poll() is None, w.log()[-3000:]


# -- rows the worker cannot read -----------------------------------------------------------

UNDECODABLE: dict[str, tuple[dict[str, Any], str]] = {
    "unknown-type-tag": (
        {"args": '[{"$pgtasks": "nope", "v": 1}]'},
        "args cannot be read: unknown type tag 'nope'",
    ),
    "tag-without-value": ({"args": '[{"$pgtasks": "int"}]'}, "args cannot be read: missing key 'v'"),
    "malformed-tagged-int": (
        {"args": '[{"$pgtasks": "int", "v": "abc"}]'},
        "args cannot be read: invalid literal",
    ),
    "unknown-time-zone": (
        {"args": '[{"$pgtasks": "datetime", "v": "2030-01-01T02:00:00", "tz": "Mars/Olympus_Mons"}]'},
        "args cannot be read: No time zone found with key Mars/Olympus_Mons",
    ),
    "huge-number": ({"args": "[1e400]"}, "args cannot be read: number is infinity"),
    "args-an-object": ({"args": '{"n": 1}'}, "args is an object, not an array"),
    "args-a-number": ({"args": "7"}, "args is a number, not an array"),
    "kwargs-an-array": ({"args": "[0]", "kwargs": "[1, 2]"}, "kwargs is an array, not an object"),
    "headers-a-string": ({"args": "[0]", "headers": '"trace"'}, "headers is a string, not an object"),
    "scheduled-for-infinity": ({"args": "[0]", "scheduled_for": "infinity"}, "scheduled_for cannot be read"),
}


def test_undecodable_rows_fail_alone_in_their_claim_batch(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    """Every kind of poison among good jobs, all in one claim batch (capacity 8 x 4 = 32)."""
    good: list[int] = []
    poisoned: dict[str, int] = {}
    for n, (kind, (columns, _)) in enumerate(UNDECODABLE.items()):
        good += _good_jobs(conn, 2, start=2 * n)
        poisoned[kind] = _insert(conn, columns)
    assert len(good) + len(poisoned) <= 32
    with workers(wdsn, tmp_path, ["-c", "8", *FAST]) as (w,):
        eventually(lambda: _done(conn, [*good, *poisoned.values()]), timeout=60, message="every job finished")
        _assert_ran_once_with_attempt_1(conn, good)
        for kind, job_id in poisoned.items():
            status, attempt, code, klass, message = _failed_with(conn, job_id)
            assert (status, attempt, code, klass) == ("failed", 1, "UNDECODABLE", "permanent"), kind
            expected = UNDECODABLE[kind][1]
            assert message.startswith(f"job {job_id} cannot be read: {expected}"), (kind, message)
        assert (
            one(conn, "SELECT count(*) FROM public.ledger WHERE job_id = ANY(%s)", (list(poisoned.values()),))
            == 0
        )
        # One claim took them all: no job was claimed twice, none waited for the lease.
        assert (
            one(
                conn,
                "SELECT count(*) FROM pgtasks.jobs WHERE attempts <> '[]'"
                " AND coalesce(error->>'code', '') <> 'UNDECODABLE'",
            )
            == 0
        )
        _still_serving(w, client, conn)
        log = w.log()
        assert "Traceback" not in log, log[-3000:]


# -- the search itself ---------------------------------------------------------------------


# -- a success PostgreSQL refuses to store ---------------------------------------------------


def test_a_refused_success_fails_alone_while_its_batch_mates_are_recorded(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    """One row of a success batch that the database refuses (here a constraint the
    operator added; in the field a trigger, a storage limit) must not leave the other
    results of its batch unwritten until their lease expires."""
    conn.execute(
        "ALTER TABLE pgtasks.jobs ADD CONSTRAINT refuse_one_success"
        " CHECK (status <> 'succeeded' OR args <> '[4242]'::jsonb) NOT VALID"
    )
    good = _good_jobs(conn, 50)
    refused = _insert(conn, {"args": "[4242]"})
    good += _good_jobs(conn, 50, start=50)
    with workers(wdsn, tmp_path, ["-c", "4", *FAST]) as (w,):
        eventually(lambda: _done(conn, [*good, refused]), timeout=30, message="every job finished")
        _assert_ran_once_with_attempt_1(conn, good)
        status, attempt, code, klass, message = _failed_with(conn, refused)
        assert (status, attempt, code, klass) == ("failed", 1, "OUTCOME_NOT_RECORDED", "permanent")
        assert "refuse_one_success" in message, message
        assert one(conn, "SELECT count(*) FROM public.ledger WHERE job_id = %s", (refused,)) == 1
        _still_serving(w, client, conn)
        assert f"job {refused} (w.record): its result cannot be stored" in w.log()


def _probe_refusing(bad: set[int], races: frozenset[int] = frozenset()) -> tuple[Any, list[Sequence[int]]]:
    """A probe that refuses any set holding a job of ``bad`` (54000) or ``races`` (23505),
    and the list of the sets it was asked about."""
    calls: list[Sequence[int]] = []

    def probe(ids: Sequence[int]) -> None:
        calls.append(list(ids))
        if bad & set(ids):
            raise DatabaseError("index row size exceeds maximum", sqlstate="54000", transient=False)
        if races & set(ids):
            raise DatabaseError("duplicate key value", sqlstate="23505", transient=False)

    return probe, calls


def test_halving_finds_every_culprit_in_order_and_skips_lock_races() -> None:
    probe, calls = _probe_refusing({17, 3, 90}, races=frozenset({40}))
    found = find_unclaimable(probe, list(range(100)))
    assert [job_id for job_id, _ in found] == [3, 17, 90]
    assert all(exc.sqlstate == "54000" for _, exc in found)
    assert len(calls) < 60  # halving, not one dry run per job
    probe, calls = _probe_refusing(set())
    assert find_unclaimable(probe, list(range(100))) == [] and len(calls) == 1
    assert find_unclaimable(probe, []) == []


def test_halving_stops_on_a_transient_error() -> None:
    def probe(ids: Sequence[int]) -> None:
        raise DatabaseError("connection lost", transient=True)

    with pytest.raises(DatabaseError, match="connection lost"):
        find_unclaimable(probe, [1, 2, 3])


def test_suspects_keep_the_first_job_of_each_lock_key() -> None:
    suspects = [(1, None), (2, "a"), (3, "a"), (4, None), (5, "b"), (6, "a")]
    assert distinct_keys(suspects) == [1, 2, 4, 5]
