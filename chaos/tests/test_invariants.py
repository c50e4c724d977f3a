"""The invariant checks find each kind of violation they exist for.

A run with no violation proves little if the checks cannot fail, so here each check
is given rows written by hand on a migrated database: one job that keeps every rule,
and for each invariant a job (or cron run) that breaks it the way a bug would (an
effect written twice, two executions overlapping without a lost lease, a stale
result, an attempt used by a job that never started, a missed and a doubled tick).
The plans are also checked to depend on the seed alone.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from chaos.app import LEDGER_DDL, MAX_RETRIES
from chaos.faults import KINDS, plan_faults
from chaos.invariants import CronPhase, Evidence, check, fire_times, minute_every, percentile
from chaos.workload import plan_jobs

SCHEDULE = "s"
T0 = 1_800_000_000.0  # a whole minute (Unix seconds)


def _job(
    conn: psycopg.Connection[Any],
    *,
    task: str = "chaos.work",
    status: str = "succeeded",
    attempt: int = 1,
    seq: int = 0,
    result: dict[str, Any] | None = None,
    history: list[dict[str, Any]] | None = None,
    worker: str | None = "w1",
    fail_attempts: int = 0,
    schedule_for: float | None = None,
    lock: str | None = None,
) -> int:
    finished = None if status in ("queued", "running") else datetime.fromtimestamp(T0 + 30, UTC)
    row = conn.execute(
        "INSERT INTO pgtasks.jobs (task_name, status, attempt, max_attempts, kwargs, result, attempts,"
        " worker_id, started_at, finished_at, queue, schedule_name, scheduled_for, trigger, lock_key)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
        (
            task,
            status,
            attempt,
            MAX_RETRIES + 1,
            json.dumps({"seq": seq, "duration": 0.1, "fail_attempts": fail_attempts, "permanent": False}),
            None if result is None else json.dumps(result),
            json.dumps(history or []),
            worker,
            datetime.fromtimestamp(T0, UTC),
            finished,
            "cron" if schedule_for is not None else "default",
            SCHEDULE if schedule_for is not None else None,
            None if schedule_for is None else datetime.fromtimestamp(schedule_for, UTC),
            "schedule" if schedule_for is not None else "api",
            lock,
        ),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _run(
    conn: psycopg.Connection[Any],
    job: int,
    token: str,
    *,
    attempt: int = 1,
    worker: str = "w1",
    pid: int = 100,
    start: float = T0,
    end: float | None = T0 + 1,
    outcome: str | None = "ok",
) -> None:
    conn.execute(
        "INSERT INTO public.chaos_ledger (token, job_id, attempt, task, worker_pid, worker_id, started_at,"
        " finished_at, outcome) VALUES (%s, %s, %s, 't', %s, %s, %s, %s, %s)",
        (
            token,
            job,
            attempt,
            pid,
            worker,
            datetime.fromtimestamp(start, UTC),
            None if end is None else datetime.fromtimestamp(end, UTC),
            outcome,
        ),
    )


def _ok(token: str, attempt: int = 1, worker: str = "w1") -> dict[str, Any]:
    return {"token": token, "attempt": attempt, "worker_id": worker}


def _evidence(**changes: Any) -> Evidence:
    base: dict[str, Any] = {
        "landed": {},
        "pid_ends": {},
        "stopped": [],
        "db_faults": [],
        "unstarted_at_kill": [],
        "cron_phases": [CronPhase(0.0, "* * * * *", "UTC", minute_every(1))],
        "cron_window": (T0 - 1, T0 + 150),
        "schedule": SCHEDULE,
        "tick_slack": 1.0,
    }
    base.update(changes)
    return Evidence(**base)


def test_each_check_finds_the_violation_it_exists_for(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LEDGER_DDL)
        # Keeps every rule: one effect, written by its only attempt.
        good = _job(conn, task="chaos.effect", result=_ok("g"), seq=0)
        _run(conn, good, "g")
        conn.execute("INSERT INTO public.chaos_effects VALUES (%s, 1, 100, 'g')", (good,))
        # Recovered from a stopped worker: overlapping executions, a lost attempt 1, result of 2.
        lost = [{"attempt": 1, "outcome": "lost", "worker_id": "w1", "error": {"code": "WORKER_LOST"}}]
        fenced = _job(conn, attempt=2, result=_ok("f2", 2, "w2"), history=lost, worker="w2", seq=1)
        _run(conn, fenced, "f1", start=T0, end=T0 + 20)
        _run(conn, fenced, "f2", attempt=2, worker="w2", pid=200, start=T0 + 10, end=T0 + 11)
        # Effect written twice.
        double = _job(conn, task="chaos.effect", result=_ok("d"), seq=2)
        _run(conn, double, "d")
        conn.execute(
            "INSERT INTO public.chaos_effects VALUES (%s, 1, 100, 'd'), (%s, 1, 100, 'd')", (double, double)
        )
        # Two executions at once, no lease lost.
        overlap = _job(conn, result=_ok("o2", 1, "w2"), worker="w2", seq=3)
        _run(conn, overlap, "o1", start=T0, end=T0 + 5)
        _run(conn, overlap, "o2", worker="w2", pid=200, start=T0 + 1, end=T0 + 2)
        # The stale attempt's result won over the newer attempt.
        stale = _job(conn, attempt=2, result=_ok("s1", 1, "w1"), history=lost, worker="w2", seq=4)
        _run(conn, stale, "s1", start=T0, end=T0 + 20)
        _run(conn, stale, "s2", attempt=2, worker="w2", pid=200, start=T0 + 10, end=T0 + 11)
        # An attempt used although the body never started on that worker (a prefetched job).
        unstarted = _job(conn, attempt=2, result=_ok("u2", 2, "w2"), history=lost, worker="w2", seq=5)
        _run(conn, unstarted, "u2", attempt=2, worker="w2", pid=200)
        # Two jobs of one lock key at once, each run once and well.
        locked = [_job(conn, result=_ok(f"k{n}"), seq=10 + n, lock="k") for n in range(2)]
        for n, job in enumerate(locked):
            _run(conn, job, f"k{n}", start=T0 + n, end=T0 + 5)
        # Still running after the drain.
        running = _job(conn, status="running", seq=6, result=None)
        # Cron: T0 once and on time, T0+60 twice, T0+120 never. (The database refuses a
        # second run of a fire time; without that index, as if a bug had lost it, it is
        # the check that must find it.)
        conn.execute("DROP INDEX pgtasks.jobs_schedule_fire_idx")
        for t, token in ((T0, "c0"), (T0 + 60, "c1"), (T0 + 60, "c2")):
            run = _job(conn, task="chaos.tick", result=_ok(token), schedule_for=t)
            _run(conn, run, token, start=t + 0.2)
        findings = check(conn, _evidence(landed={0: good, 1: fenced, 7: None}))
    by_name = {i.name: i.violations for i in findings.invariants}
    text = json.dumps(by_name, indent=1)

    def hits(name: str, job: int) -> bool:
        return any(re.search(rf"(job |#){job}\b", v) for v in by_name[name])

    assert hits("terminal or legitimately waiting", running), text
    assert hits("no acknowledged enqueue lost", 7), text
    assert hits("transactional effect exactly once", double), text
    assert not hits("transactional effect exactly once", good), text
    assert hits("no overlap unless the lease was lost", overlap), text
    assert not hits("no overlap unless the lease was lost", fenced), text
    assert hits("stale writer never overwrote the outcome", stale), text
    assert not hits("stale writer never overwrote the outcome", fenced), text
    assert hits("unstarted job lost with its worker keeps its attempt", unstarted), text
    assert any(
        f"jobs {locked[0]} and {locked[1]}" in v for v in by_name["one execution per lock key at a time"]
    )
    assert not any(hits(name, good) for name in by_name), text
    ticks = by_name["cron tick exactly once, on time"]
    assert len(ticks) == 2 and any("2 runs" in v for v in ticks) and any("0 runs" in v for v in ticks), text
    assert findings.tick_lags == pytest.approx([0.2])


def test_a_late_tick_and_an_overlap_during_a_stop_are_told_apart(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LEDGER_DDL)
        job = _job(conn, result=_ok("b", 1, "w2"), worker="w2")
        _run(conn, job, "a", pid=100, start=T0, end=T0 + 20, outcome="ok")
        _run(conn, job, "b", worker="w2", pid=200, start=T0 + 10, end=T0 + 11)
        run = _job(conn, task="chaos.tick", result=_ok("late"), schedule_for=T0 + 60)
        _run(conn, run, "late", start=T0 + 62.5)
        stopped = check(conn, _evidence(stopped=[(100, T0 + 1, T0 + 14)], cron_window=(T0 + 30, T0 + 90)))
        running = check(conn, _evidence(cron_window=(T0 + 30, T0 + 90), tick_slack=5.0))
    names = {i.name: i for i in stopped.invariants}
    assert names["no overlap unless the lease was lost"].ok
    assert stopped.notes["executions overlapping one whose lease was lost"] == 1
    assert (
        stopped.notes["bodies that returned without deciding the outcome (lease lost or write failed)"] == 1
    )
    assert [v for v in names["cron tick exactly once, on time"].violations if "late" in v]
    again = {i.name: i for i in running.invariants}
    assert not again["no overlap unless the lease was lost"].ok
    assert again["cron tick exactly once, on time"].ok


def test_a_start_cut_off_by_a_kill_is_not_an_attempt_used_without_a_start(dsn: str) -> None:
    def lost(worker: str, started: float) -> list[dict[str, Any]]:
        at = datetime.fromtimestamp(started, UTC).isoformat()
        return [{"attempt": 1, "outcome": "lost", "worker_id": worker, "started_at": at}]

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LEDGER_DDL)
        cut = _job(conn, task="chaos.once", status="failed", history=lost("w9", T0 + 9.7), result=None)
        early = _job(conn, task="chaos.once", status="failed", history=lost("w9", T0 + 5), result=None)
        findings = check(conn, _evidence(unstarted_at_kill=[(900, "w9", T0 + 10, [cut, early])]))
    (inv,) = [i for i in findings.invariants if i.name.startswith("unstarted")]
    assert [v for v in inv.violations if f"job {early}:" in v] and not [
        v for v in inv.violations if f"job {cut}:" in v
    ]
    assert findings.notes["starts cut off by a kill before the body's first ledger write"] == 1


def test_the_plans_depend_on_the_seed_alone() -> None:
    assert plan_faults(7, 600) == plan_faults(7, 600)
    assert plan_faults(7, 600) != plan_faults(8, 600)
    assert {f.kind for f in plan_faults(7, 90)} == set(KINDS)  # every kind, even in a short run
    assert len(plan_faults(7, 600)) >= 50
    assert plan_jobs(7, 60, bursts=[10.0]) == plan_jobs(7, 60, bursts=[10.0])
    assert [j.seq for j in plan_jobs(7, 60)] == list(range(len(plan_jobs(7, 60))))


def test_fire_times_follow_the_change_of_expression_and_zone() -> None:
    phases = [
        CronPhase(0.0, "* * * * *", "UTC", minute_every(1)),
        CronPhase(T0 + 150, "*/2 * * * *", "Asia/Kathmandu", minute_every(2)),
    ]
    got = [int(t - T0) for t in fire_times(phases, (T0 - 1, T0 + 420))]
    # Up to the change every minute; after it the even minutes of UTC+05:45, odd in UTC.
    assert got == [0, 60, 120, 180, 300, 420]
    assert datetime.fromtimestamp(T0, UTC).minute % 2 == 0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.99) == 4.0 and percentile([1.0, 2.0], 0.5) == 1.0
