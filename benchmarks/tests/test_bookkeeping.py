"""The benchmark drivers' ``finished()`` counts agree with the rows their workers wrote.

The harness ends a processing or deep-queue window when the system's own bookkeeping
agrees that the jobs ran; for pgtasks and the raw reference that is ``finished()``. A
count that ran ahead of the database would cut the window short, one that lagged would
stretch it, so each is checked against the rows in the table after real workers ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from benchmarks.systems.base import Driver, Params
from benchmarks.systems.pgtasks_system import PgtasksDriver
from benchmarks.systems.raw_system import RawDriver
from benchmarks.systems.records import progress_count

REPO_ROOT = Path(__file__).resolve().parents[2]
JOBS = 250

DONE_ROWS = {
    "raw": "SELECT count(*) FROM bench_jobs WHERE status = 'done'",
    "pgtasks": "SELECT count(*) FROM pgtasks.jobs WHERE status = 'succeeded'",
}


def _count(dsn: str, query: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def _wait(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("driver_cls", [RawDriver, PgtasksDriver], ids=["raw", "pgtasks"])
def test_finished_matches_the_rows_the_workers_wrote(
    driver_cls: type[Driver], empty_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.delenv("BENCH_RECORD_DIR", raising=False)  # the driver sets it for its workers
    driver = driver_cls(Params(dsn=empty_dsn, workdir=tmp_path, deadline=60))
    try:
        driver.migrate()
        driver.fill(JOBS)
        assert driver.finished() == 0
        fleet = driver.fleet()
        fleet.start()
        try:
            _wait("the tasks to run", lambda: progress_count(driver.record_dir) >= JOBS)
            _wait("the completions to be counted", lambda: driver.finished() == JOBS)
        finally:
            fleet.stop()
        assert _count(empty_dsn, DONE_ROWS[driver.spec.name]) == JOBS
        assert driver.finished() == JOBS
    finally:
        driver.close()
