"""Automatic retention: the policy, its deletes over 200,000 finished jobs, the fleet's
lock, and ``pgtasks purge --policy``.

Expectations are computed here, from the rows this test writes and the policy as the
docs state it (task rule, else queue rule, else the status's default), not from
`RetentionPolicy.keep_for`.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from helpers import eventually

import pgtasks
from pgtasks.cli import cli
from pgtasks.db.retention import RetentionStore
from pgtasks.errors import ConfigurationError
from pgtasks.maintenance import Retention
from pgtasks.settings import RetentionPolicy, Settings
from pgtasks.worker import Worker

DAY = 86400.0
HOUR = 3600.0
STATUSES = ("succeeded", "failed", "cancelled", "partial_failure")
QUEUES = ("default", "reports", "billing")
TASKS = {
    "default": ("mail.send", "mail.index"),
    "reports": ("reports.weekly", "reports.daily"),
    "billing": ("billing.invoice", "billing.refund"),
}
AGES = (0.5 * HOUR, 2 * HOUR, 1.5 * DAY, 6 * DAY, 8 * DAY, 29 * DAY, 31 * DAY, 100 * DAY, 400 * DAY)
ROWS = 200_000

POLICY = RetentionPolicy(
    queues={"reports": {"succeeded": 1 * DAY, "failed": None}},
    tasks={"reports.weekly": {"cancelled": 1 * HOUR}, "billing.invoice": {"failed": 365 * DAY}},
    batch=1000,
    pause=0.0,
)


def expected_keep(status: str, queue: str, task: str) -> float:
    """The policy above, written out by hand (seconds; inf: forever)."""
    if task == "reports.weekly" and status == "cancelled":
        return 1 * HOUR
    if task == "billing.invoice" and status == "failed":
        return 365 * DAY
    if queue == "reports" and status == "succeeded":
        return 1 * DAY
    if queue == "reports" and status == "failed":
        return math.inf
    return {"succeeded": 7 * DAY, "cancelled": 7 * DAY, "failed": 30 * DAY, "partial_failure": 30 * DAY}[
        status
    ]


def row_category(i: int) -> tuple[str, str, str, int]:
    """(queue, task, status, age index) of generated row ``i``, as the INSERT below makes it."""
    status = STATUSES[i % 4]
    queue = QUEUES[(i // 4) % 3]
    task = TASKS[queue][(i // 12) % 2]
    return queue, task, status, (i // 24) % len(AGES)


def fill(conn: psycopg.Connection[Any], now: dt.datetime) -> None:
    """ROWS finished jobs spread over every (queue, task, status, age), as `row_category`
    says, plus queued and running jobs older than every rule (never deleted)."""
    conn.execute(
        """
        INSERT INTO pgtasks.jobs (task_name, queue, status, attempt, max_attempts, created_at,
                                  started_at, finished_at, worker_id, tenant)
        SELECT t.task, t.queue, t.status, 1, 1, f.at, f.at, f.at, 'gone:1:aaaaaa', 'acme'
        FROM generate_series(0, %(n)s - 1) AS i
        CROSS JOIN LATERAL (
            SELECT (ARRAY['succeeded', 'failed', 'cancelled', 'partial_failure'])[i %% 4 + 1] AS status,
                   (ARRAY['default', 'reports', 'billing'])[(i / 4) %% 3 + 1] AS queue) s
        CROSS JOIN LATERAL (
            SELECT s.status, s.queue,
                   (CASE s.queue WHEN 'default' THEN ARRAY['mail.send', 'mail.index']
                                 WHEN 'reports' THEN ARRAY['reports.weekly', 'reports.daily']
                                 ELSE ARRAY['billing.invoice', 'billing.refund'] END)[(i / 12) %% 2 + 1]
                   AS task) t
        CROSS JOIN LATERAL (
            SELECT %(now)s::timestamptz
                   - make_interval(secs => (%(ages)s::float8[])[(i / 24) %% %(n_ages)s + 1]) AS at) f
        """,
        {"n": ROWS, "now": now, "ages": list(AGES), "n_ages": len(AGES)},
    )
    old = now - dt.timedelta(days=1000)
    conn.execute(
        "INSERT INTO pgtasks.jobs (task_name, queue, status, created_at, run_at) "
        "SELECT 'mail.send', 'default', 'queued', %(old)s, %(old)s FROM generate_series(1, 50)",
        {"old": old},
    )
    conn.execute(
        "INSERT INTO pgtasks.jobs (task_name, queue, status, attempt, created_at, started_at, worker_id) "
        "SELECT 'mail.send', 'default', 'running', 1, %(old)s, %(old)s, 'w:1:bbbbbb' "
        "FROM generate_series(1, 50)",
        {"old": old},
    )


def remaining(conn: psycopg.Connection[Any], now: dt.datetime) -> Counter[tuple[str, str, str, int]]:
    """Finished jobs left per (queue, task, status, age index)."""
    rows = conn.execute(
        "SELECT queue, task_name, status, extract(epoch FROM %(now)s::timestamptz - finished_at)::float8, "
        "count(*) FROM pgtasks.jobs WHERE finished_at IS NOT NULL GROUP BY 1, 2, 3, 4",
        {"now": now},
    ).fetchall()
    index = {round(age): n for n, age in enumerate(AGES)}
    return Counter({(q, t, s, index[round(age)]): n for q, t, s, age, n in rows})


@pytest.fixture
def now(conn: psycopg.Connection[Any]) -> dt.datetime:
    value = conn.execute("SELECT date_trunc('second', now())").fetchone()
    assert value is not None
    return value[0]  # type: ignore[no-any-return]


@pytest.mark.slow
def test_a_pass_over_200000_finished_jobs_keeps_exactly_what_the_policy_says(
    app: pgtasks.App, conn: psycopg.Connection[Any], now: dt.datetime
) -> None:
    fill(conn, now)
    generated: Counter[tuple[str, str, str, int]] = Counter(row_category(i) for i in range(ROWS))
    assert remaining(conn, now) == generated  # the fill is what the test thinks it is
    kept = Counter(
        {key: n for key, n in generated.items() if AGES[key[3]] <= expected_keep(key[2], key[0], key[1])}
    )
    doomed = ROWS - sum(kept.values())
    assert 0 < doomed < ROWS

    retention = Retention(RetentionStore(app.database), POLICY, now=now)
    preview = retention.preview()
    assert sum(c.jobs for c in preview) == doomed
    assert {(c.queue, c.task_name, c.status) for c in preview} == {
        (q, t, s) for (q, t, s, a), n in generated.items() if (q, t, s, a) not in kept
    }

    result = retention.run_once()

    assert result.deleted == doomed
    assert not result.yielded
    # Bounded batches, the last one short; then one over the (empty) history.
    assert result.batches == doomed // POLICY.batch + 1 + 1
    by_status: Counter[str] = Counter()
    for (_, _, s, _), n in generated.items():
        by_status[s] += n
    for status in STATUSES:
        gone = sum(n for (q, t, s, a), n in generated.items() if s == status and (q, t, s, a) not in kept)
        assert getattr(result, status) == gone, status
        assert by_status[status] > gone
    assert remaining(conn, now) == kept
    unfinished = conn.execute("SELECT count(*) FROM pgtasks.jobs WHERE finished_at IS NULL").fetchone()
    assert unfinished == (100,)
    # A second pass finds nothing left to delete.
    again = retention.run_once()
    assert (again.deleted, again.batches) == (0, 2)  # one short statement per table
    assert retention.preview() == []


def _finished(
    conn: psycopg.Connection[Any], now: dt.datetime, n: int, *, days: float, status: str = "succeeded"
) -> None:
    conn.execute(
        "INSERT INTO pgtasks.jobs (task_name, status, attempt, started_at, finished_at, worker_id) "
        "SELECT 'mail.send', %(status)s, 1, %(at)s, %(at)s, 'w:1:cccccc' FROM generate_series(1, %(n)s)",
        {"status": status, "at": now - dt.timedelta(days=days), "n": n},
    )


def _count(conn: psycopg.Connection[Any]) -> int:
    """Jobs in the hot table and the history (where a worker moves finished jobs)."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pgtasks.jobs) + (SELECT count(*) FROM pgtasks.job_history)"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_only_one_batch_runs_at_a_time_across_the_fleet(
    app: pgtasks.App, conn: psycopg.Connection[Any], dsn: str, now: dt.datetime
) -> None:
    _finished(conn, now, 30, days=10)
    retention = Retention(RetentionStore(app.database), POLICY, now=now)
    with psycopg.connect(dsn) as other, other.transaction():  # another worker's batch, in flight
        other.execute("SELECT pg_advisory_xact_lock(hashtext('pgtasks.retention'))")
        result = retention.run_once()
        assert (result.yielded, result.deleted) == (True, 0)
        assert _count(conn) == 30
    result = retention.run_once()
    assert (result.yielded, result.deleted) == (False, 30)
    assert _count(conn) == 0


def test_a_locked_row_is_skipped_not_waited_for(
    app: pgtasks.App, conn: psycopg.Connection[Any], dsn: str, now: dt.datetime
) -> None:
    _finished(conn, now, 20, days=10)
    retention = Retention(RetentionStore(app.database), POLICY, now=now)
    with psycopg.connect(dsn) as other, other.transaction():
        locked = other.execute("SELECT id FROM pgtasks.jobs ORDER BY id LIMIT 1 FOR UPDATE").fetchone()
        result = retention.run_once()
        assert result.deleted == 19
    assert conn.execute("SELECT id FROM pgtasks.jobs").fetchall() == [locked]


def test_a_policy_that_keeps_everything_forever_deletes_nothing(
    app: pgtasks.App, conn: psycopg.Connection[Any], now: dt.datetime
) -> None:
    _finished(conn, now, 5, days=5000)
    forever = RetentionPolicy(succeeded=None, cancelled=None, failed=None, partial_failure=None)
    retention = Retention(RetentionStore(app.database), forever, now=now)
    assert retention.preview() == []
    assert retention.run_once().batches == 0
    assert _count(conn) == 5


def test_a_worker_runs_the_retention_service(
    dsn: str, conn: psycopg.Connection[Any], now: dt.datetime
) -> None:
    _finished(conn, now, 10, days=8)
    _finished(conn, now, 10, days=8, status="failed")  # kept: failed jobs stay 30 days
    _finished(conn, now, 10, days=1)
    policy = RetentionPolicy(interval=0.2)
    app = pgtasks.App("ret", settings=Settings.from_env(dsn, retention=policy), load_entry_points=False)
    worker = Worker(app, queues=("default",), poll_interval=0.1)
    try:
        import threading

        thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
        thread.start()
        eventually(lambda: _count(conn) == 20, timeout=20, message="old successes deleted")
        statuses = conn.execute(
            "SELECT status, count(*) FROM (SELECT status FROM pgtasks.jobs"
            " UNION ALL SELECT status FROM pgtasks.job_history) j GROUP BY 1 ORDER BY 1"
        ).fetchall()
        assert statuses == [("failed", 10), ("succeeded", 10)]
    finally:
        worker.request_stop("test")
        thread.join(30)
        app.close()


def test_a_worker_does_not_run_retention_when_the_policy_is_off(
    dsn: str, conn: psycopg.Connection[Any], now: dt.datetime
) -> None:
    _finished(conn, now, 10, days=800)
    policy = RetentionPolicy(enabled=False, interval=0.05)
    app = pgtasks.App("ret", settings=Settings.from_env(dsn, retention=policy), load_entry_points=False)
    worker = Worker(app, queues=("default",), poll_interval=0.1, burst=True)
    try:
        assert worker.run(install_signal_handlers=False) == 0
    finally:
        app.close()
    assert _count(conn) == 10


# -- the policy: defaults, overrides, environment, bad input -------------------------------


def test_defaults_keep_failures_longer_than_successes() -> None:
    policy = RetentionPolicy()
    assert policy.enabled
    assert (policy.succeeded, policy.cancelled) == (7 * DAY, 7 * DAY)
    assert (policy.failed, policy.partial_failure) == (30 * DAY, 30 * DAY)
    assert POLICY.keep_for("succeeded", queue="reports", task_name="reports.weekly") == 1 * DAY
    assert POLICY.keep_for("cancelled", queue="reports", task_name="reports.weekly") == 1 * HOUR
    assert POLICY.keep_for("failed", queue="reports", task_name="reports.daily") is None
    assert POLICY.keep_for("failed", queue="default", task_name="billing.invoice") == 365 * DAY


def test_the_environment_sets_the_policy() -> None:
    env = {
        "PGTASKS_RETENTION_SUCCEEDED": "2d",
        "PGTASKS_RETENTION_FAILED": "forever",
        "PGTASKS_RETENTION_CANCELLED": "3600",
        "PGTASKS_RETENTION_QUEUES": "reports:succeeded=12h,failed=90d; a:b:cancelled=1w",
        "PGTASKS_RETENTION_TASKS": "billing.invoice:failed=365d",
        "PGTASKS_RETENTION_INTERVAL": "30s",
    }
    policy = Settings.from_env("postgresql:///x", environ=env).retention
    assert (policy.succeeded, policy.failed, policy.cancelled) == (2 * DAY, None, 3600.0)
    assert policy.partial_failure == 30 * DAY
    assert policy.queues == {
        "reports": {"succeeded": 12 * HOUR, "failed": 90 * DAY},
        "a:b": {"cancelled": 7 * DAY},
    }
    assert policy.tasks == {"billing.invoice": {"failed": 365 * DAY}}
    assert policy.interval == 30.0
    assert not Settings.from_env("postgresql:///x", environ={"PGTASKS_RETENTION": "off"}).retention.enabled


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"PGTASKS_RETENTION": "sometimes"}, "PGTASKS_RETENTION must be on or off"),
        ({"PGTASKS_RETENTION_SUCCEEDED": "7 days"}, "PGTASKS_RETENTION_SUCCEEDED"),
        ({"PGTASKS_RETENTION_FAILED": "-1"}, "PGTASKS_RETENTION_FAILED"),
        ({"PGTASKS_RETENTION_FAILED": "20000d"}, "seconds in 0..315576000"),
        ({"PGTASKS_RETENTION_QUEUES": "reports"}, "PGTASKS_RETENTION_QUEUES"),
        ({"PGTASKS_RETENTION_QUEUES": "reports:running=1d"}, "not a final status"),
        ({"PGTASKS_RETENTION_TASKS": "t:failed"}, "not status=duration"),
        ({"PGTASKS_RETENTION_INTERVAL": "0"}, "positive"),
    ],
)
def test_a_bad_environment_is_a_configuration_error(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        Settings.from_env("postgresql:///x", environ=env)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"succeeded": -5.0}, "succeeded"),
        ({"failed": float("nan")}, "failed"),
        ({"queues": {"q": {"queued": 1.0}}}, "not a final status"),
        ({"tasks": {"t": {}}}, "non-empty"),
        ({"tasks": ["t"]}, "must map names"),
        ({"batch": 0}, "batch"),
        ({"interval": 0.0}, "interval"),
        ({"enabled": "yes"}, "enabled"),
    ],
)
def test_a_bad_policy_is_a_configuration_error(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        RetentionPolicy(**kwargs)


# -- pgtasks purge --policy ----------------------------------------------------------------


def _purge(dsn: str, *args: str, env: dict[str, str] | None = None) -> Any:
    wide = {"COLUMNS": "200", **(env or {})}  # rich fits its tables to the terminal
    return CliRunner().invoke(cli, ["--dsn", dsn, "purge", *args], env=wide, catch_exceptions=False)


def test_purge_policy_dry_run_shows_what_the_policy_would_delete_and_deletes_nothing(
    dsn: str, conn: psycopg.Connection[Any], now: dt.datetime
) -> None:
    _finished(conn, now, 4, days=8)
    _finished(conn, now, 3, days=8, status="failed")
    _finished(conn, now, 2, days=40, status="failed")
    env = {"PGTASKS_RETENTION_TASKS": "mail.send:succeeded=forever"}
    dry = _purge(dsn, "--policy", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "would delete 6 job(s)" in dry.output
    assert "mail.send" in dry.output and "succeeded" in dry.output and "7d" in dry.output
    kept = _purge(dsn, "--policy", "--dry-run", env=env)
    assert "would delete 2 job(s)" in kept.output
    assert _count(conn) == 9
    done = _purge(dsn, "--policy", "--yes", env=env)
    assert done.exit_code == 0, done.output
    assert "deleted 2 job(s)" in done.output
    assert _count(conn) == 7


def test_purge_policy_refuses_a_cutoff_or_status_beside_it(dsn: str, conn: psycopg.Connection[Any]) -> None:
    _finished(conn, dt.datetime.now(dt.UTC), 3, days=100)
    for extra in (["--older-than", "10"], ["--status", "failed"]):
        result = _purge(dsn, "--policy", "--yes", *extra)
        assert result.exit_code == 2
        assert "--policy" in result.output
    assert _count(conn) == 3


def test_purge_policy_for_one_tenant_touches_only_its_jobs(
    dsn: str, conn: psycopg.Connection[Any], now: dt.datetime
) -> None:
    _finished(conn, now, 4, days=8)
    conn.execute("UPDATE pgtasks.jobs SET tenant = 'acme' WHERE id IN (SELECT id FROM pgtasks.jobs LIMIT 3)")
    dry = _purge(dsn, "--policy", "--dry-run", "--tenant", "acme")
    assert "would delete 3 job(s) of tenant acme" in dry.output
    done = _purge(dsn, "--policy", "--yes", "--tenant", "acme")
    assert "deleted 3 job(s)" in done.output
    assert conn.execute("SELECT tenant FROM pgtasks.jobs").fetchall() == [("",)]
    refused = _purge(dsn, "--tenant", "acme", "--yes")
    assert refused.exit_code == 2 and "--tenant needs --policy" in refused.output
    bad = _purge(dsn, "--policy", "--yes", "--tenant", "a\x00b")
    assert bad.exit_code == 1
    assert _count(conn) == 1
