"""``python -m benchmarks.pooler`` at a tiny size: PgBouncer is started, both variants
run every job, and the two rates and their ratio are printed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DSN = os.environ.get("PGTASKS_TEST_DSN", "")


@pytest.mark.skipif(
    not DSN, reason="needs PGTASKS_TEST_DSN (a server PgBouncer can reach without a password)"
)
@pytest.mark.skipif(
    shutil.which("pgbouncer") is None and not Path("/usr/sbin/pgbouncer").exists(),
    reason="no pgbouncer binary: apt-get install pgbouncer",
)
def test_pooler_probe_prints_both_rates_and_their_ratio() -> None:
    command = [
        sys.executable, "-m", "benchmarks.pooler", "--jobs", "200", "--workers", "1", "--concurrency", "8",
        "--pool", "2", "--dsn", DSN,
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    direct = re.search(r"^\s*direct:\s+(\d+) jobs/s", done.stdout, re.M)
    pooled = re.search(
        r"^\s*pooled:\s+(\d+) jobs/s .*through 2 server connections, PgBouncer", done.stdout, re.M
    )
    ratio = re.search(r"^\s*pooled / direct: ([0-9.]+)$", done.stdout, re.M)
    assert direct and pooled and ratio, done.stdout
    assert int(direct.group(1)) > 0 and int(pooled.group(1)) > 0 and float(ratio.group(1)) > 0


def test_pooler_probe_refuses_bad_arguments() -> None:
    command = [sys.executable, "-m", "benchmarks.pooler", "--pool", "0", "--dsn", DSN or "postgresql:///x"]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--pool must be >= 1" in done.stderr
