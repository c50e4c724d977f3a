"""The claim-path figures' ops at smoke sizes, run in-process against a real database.

Each test runs one op of `benchmarks.systems.ops` with the raw reference's or
pgtasks' driver (and, where the op needs them, real worker processes), and checks
the rows it wrote or the work the workers did, not only that a number came out.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from benchmarks.figures import METRICS, TARGETS, MissingInput, load_rate
from benchmarks.report import target_outcome
from benchmarks.systems.base import Driver, Params
from benchmarks.systems.clock import BenchmarkError, Clock
from benchmarks.systems.ops import (
    WARMUP_CALLS,
    figure_bulk_chunked,
    figure_latency_load,
    figure_mixed,
    figure_producers,
    mixed_jobs,
)
from benchmarks.systems.pgtasks_system import PgtasksDriver
from benchmarks.systems.raw_system import RawDriver
from benchmarks.systems.records import FAIL_ONCE

REPO_ROOT = Path(__file__).resolve().parents[2]
QUEUE_ROWS = {"raw": "SELECT count(*) FROM bench_jobs", "pgtasks": "SELECT count(*) FROM pgtasks.jobs"}


def _count(dsn: str, query: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def workers_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the harness gives a driver: the repository on the path, as the working directory."""
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.delenv("BENCH_RECORD_DIR", raising=False)  # the driver sets it for its workers


def _driver(driver_cls: type[Driver], dsn: str, workdir: Path) -> Iterator[Driver]:
    driver = driver_cls(Params(dsn=dsn, workdir=workdir, deadline=120))
    try:
        driver.migrate()
        yield driver
    finally:
        driver.close()


@pytest.fixture(params=[RawDriver, PgtasksDriver], ids=["raw", "pgtasks"])
def driver(
    request: pytest.FixtureRequest, empty_dsn: str, tmp_path: Path, workers_env: None
) -> Iterator[Driver]:
    yield from _driver(request.param, empty_dsn, tmp_path)


@pytest.fixture
def pgtasks_driver(empty_dsn: str, tmp_path: Path, workers_env: None) -> Iterator[Driver]:
    yield from _driver(PgtasksDriver, empty_dsn, tmp_path)


def test_mixed_jobs_spread_failures_and_lock_keys_over_the_tenants() -> None:
    jobs = mixed_jobs(3000, tenants=150, lock_keys=5)
    assert len(jobs) == 3000
    assert len({tenant for _, tenant, _ in jobs}) == 150
    failing = [tenant for kind, tenant, _ in jobs if kind == FAIL_ONCE]
    locks = Counter(lock for _, _, lock in jobs if lock is not None)
    assert len(failing) == 300
    assert len(set(failing)) > 100  # shuffled, not one tenant in ten
    assert locks == {f"lock-{i}": 60 for i in range(5)}
    assert not any(kind == FAIL_ONCE and lock for kind, _, lock in jobs)
    with pytest.raises(ValueError, match="tenants"):
        mixed_jobs(100, tenants=0, lock_keys=5)


def test_mixed_work_retries_exactly_the_failing_jobs_and_all_succeed(pgtasks_driver: Driver) -> None:
    result = figure_mixed(pgtasks_driver, Clock(120), 600, tenants=150, lock_keys=5, cap=60)
    assert result["partial"] is False
    assert result["jobs_done"] == 600
    assert result["recorded_succeeded"] == 600 and result["recorded_other"] == 0
    assert result["fail_once_jobs"] == result["recorded_retried"] == result["failed_attempts"] == 60
    assert result["lock_jobs"] == 60
    assert result["process_jobs_per_s"] > 0
    tenants = _count(pgtasks_driver.params.dsn, "SELECT count(DISTINCT tenant) FROM pgtasks.jobs")
    locked = _count(pgtasks_driver.params.dsn, "SELECT count(*) FROM pgtasks.jobs WHERE lock_key IS NOT NULL")
    assert (tenants, locked) == (150, 60)


class _MiscountingDriver(PgtasksDriver):
    """pgtasks whose record claims one retried job fewer than happened."""

    def mixed_outcome(self) -> dict[str, int]:
        outcome = super().mixed_outcome()
        return dict(outcome, retried=outcome["retried"] - 1)


def test_mixed_work_fails_when_the_counts_disagree(empty_dsn: str, tmp_path: Path, workers_env: None) -> None:
    for driver in _driver(_MiscountingDriver, empty_dsn, tmp_path):
        with pytest.raises(BenchmarkError, match="did not happen as specified"):
            figure_mixed(driver, Clock(120), 100, tenants=7, lock_keys=2, cap=60)


def test_raw_does_the_same_mixed_work(empty_dsn: str, tmp_path: Path, workers_env: None) -> None:
    for driver in _driver(RawDriver, empty_dsn, tmp_path):
        result = figure_mixed(driver, Clock(120), 600, tenants=150, lock_keys=5, cap=60)
        assert result["partial"] is False
        assert result["jobs_done"] == 600
        assert result["recorded_succeeded"] == 600 and result["recorded_other"] == 0
        assert result["fail_once_jobs"] == result["recorded_retried"] == result["failed_attempts"] == 60
        assert result["lock_jobs"] == 60
    rows = "SELECT count(DISTINCT tenant), count(*) FILTER (WHERE lock_key IS NOT NULL) FROM bench_jobs"
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute(rows).fetchone() == (150, 60)


def test_producers_enqueue_every_job_from_each_thread_count(driver: Driver) -> None:
    result = figure_producers(driver, Clock(120), threads=[1, 3], jobs=30)
    assert result["jobs_per_s_1"] > 0 and result["jobs_per_s_3"] > 0
    written = sum(30 + WARMUP_CALLS * threads for threads in (1, 3))
    assert _count(driver.params.dsn, QUEUE_ROWS[driver.spec.name]) == written


def test_bulk_in_calls_of_1000_writes_every_job(driver: Driver) -> None:
    result = figure_bulk_chunked(driver, Clock(60), 2500, 1000)
    assert result["jobs"] == 2500 and result["chunk"] == 1000 and result["jobs_per_s"] > 0
    assert _count(driver.params.dsn, QUEUE_ROWS[driver.spec.name]) == 2500


def test_latency_under_load_times_every_job_at_the_rate_asked(driver: Driver) -> None:
    result = figure_latency_load(driver, Clock(120), rate=300.0, seconds=1.0)
    assert result["batch"] == 3 and result["jobs"] == 300
    assert 0 < result["p50_ms"] <= result["p95_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert 100 < result["achieved_rate"] <= 330
    warmups = 2 * len(driver.worker_commands())
    assert _count(driver.params.dsn, QUEUE_ROWS[driver.spec.name]) == 300 + warmups


def test_latency_under_load_refuses_a_rate_that_is_not_positive(pgtasks_driver: Driver) -> None:
    with pytest.raises(BenchmarkError, match="rate"):
        figure_latency_load(pgtasks_driver, Clock(30), rate=0.0, seconds=1.0)


def test_load_rate_is_half_the_processing_figure_or_missing() -> None:
    assert load_rate({"throughput": {"process_jobs_per_s": 30_000.0}}) == {"rate": 15_000.0}
    missing: list[dict[str, dict[str, float]]] = [
        {}, {"throughput": {}}, {"throughput": {"process_jobs_per_s": math.nan}}
    ]  # fmt: skip
    for earlier in missing:
        with pytest.raises(MissingInput, match="processing throughput"):
            load_rate(earlier)


def _summary(
    **medians: tuple[float | None, float | None],
) -> dict[str, dict[str, dict[str, float | int | None]]]:
    """A summary with (pgtasks, raw) medians per metric key; every other metric empty."""
    out: dict[str, dict[str, dict[str, float | int | None]]] = {m.key: {} for m in METRICS}
    for key, (mine, raw) in medians.items():
        out[key] = {"pgtasks": {"median": mine}, "raw": {"median": raw}}
    return out


def test_targets_are_judged_from_the_medians() -> None:
    targets = {t.metric: t for t in TARGETS}
    summary = _summary(
        process_mixed=(30_000.0, None), process=(None, 60_000.0), producers_16=(700.0, 1000.0),
        latency_load_p99=(12.0, 3.0), latency_p99=(3.0, 11.0),
    )  # fmt: skip
    shown, verdict = target_outcome(summary, targets["process_mixed"])
    assert verdict == "missed" and "0.50x" in shown
    assert target_outcome(summary, targets["producers_16"])[1] == "missed"
    assert target_outcome(summary, targets["latency_load_p99"])[1] == "missed"
    assert target_outcome(summary, targets["latency_p99"])[1] == "met"
    assert target_outcome(summary, targets["enqueue_bulk_call"]) == ("no number", "n/a")
    summary = _summary(process_mixed=(42_000.0, None), process=(None, 60_000.0))
    assert target_outcome(summary, targets["process_mixed"])[1] == "met"


def test_mixed_jobs_without_an_ingredient_make_those_jobs_plain() -> None:
    plain = mixed_jobs(1000, tenants=150, lock_keys=5, retries=False, locks=False)
    assert all(kind != FAIL_ONCE and lock is None for kind, _, lock in plain)
    only_locks = mixed_jobs(1000, tenants=150, lock_keys=5, retries=False)
    assert sum(1 for _, _, lock in only_locks if lock) == 100
    assert not any(kind == FAIL_ONCE for kind, _, _ in only_locks)


def test_mixed_probe_reports_each_variant(admin_dsn: str) -> None:
    """``python -m benchmarks.mixed`` drains each variant with real workers; one line each.

    Enough jobs that each drain spans several of the timer's polls: with 400, a drain
    now and then finished between two of them (the first sample already counted every
    job), leaving nothing to time."""
    command = [
        sys.executable, "-m", "benchmarks.mixed", "--jobs", "2000", "--reps", "1", "--dsn", admin_dsn,
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.findall(r"^\s*(\w+):\s+([0-9,]+) jobs/s .*, ([0-9.]+)x of plain$", done.stdout, re.M)
    assert [name for name, _, _ in found] == ["plain", "retries", "locks", "mixed"], done.stdout
    assert all(float(rate.replace(",", "")) > 0 for _, rate, _ in found)
    assert found[0][2] == "1.00"


@pytest.mark.parametrize("bad", [["--jobs", "20"], ["--reps", "0"]])
def test_mixed_probe_refuses_bad_arguments(bad: list[str], admin_dsn: str) -> None:
    command = [sys.executable, "-m", "benchmarks.mixed", *bad, "--dsn", admin_dsn]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert bad[0] in done.stderr
