"""The chaos harness's short profile: 90 seconds of faults, every invariant kept.

``python -m pytest -m chaos`` selects it. It starts a private primary and its
synchronous standby (skipped when no PostgreSQL binaries are installed), a
supervised fleet of real worker and scheduler processes, and injects the seeded
faults of `chaos.faults` while a job stream runs, every kind at least once (a
failover to the standby among them); then it checks `chaos.invariants` on the new
primary. The same profile runs once with the fleet connecting directly (a libpq
multi-host DSN) and once through PgBouncer in transaction pooling (skipped without
``pgbouncer``). Timing is generous where the machine's load decides it (a cron run
may start up to 5 s after its fire time here, 1 s in ``python -m chaos``); the
invariants themselves are not relaxed.
"""

from __future__ import annotations

import pytest

from chaos.faults import KINDS
from chaos.report import render
from chaos.run import Options, run
from chaos.server import find_bindir, pgbouncer_bin

SEED = 20261202


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(290)
@pytest.mark.skipif(find_bindir() is None, reason="no PostgreSQL binaries to start a private server")
@pytest.mark.parametrize(
    "pooler",
    [
        False,
        pytest.param(
            True,
            marks=pytest.mark.skipif(
                pgbouncer_bin() is None, reason="no pgbouncer: apt-get install pgbouncer"
            ),
        ),
    ],
    ids=["direct", "pgbouncer"],
)
def test_ninety_seconds_of_faults_break_no_invariant(pooler: bool) -> None:
    outcome = run(Options(seed=SEED, duration=90.0, tick_slack=5.0, drain_timeout=60.0, pooler=pooler))
    table = render(outcome)
    print(table)
    broken = [i.name for i in outcome.findings.invariants if not i.ok]
    assert broken == [], table
    assert set(outcome.faults) >= set(KINDS), table  # every kind, the failover among them
    assert sum(outcome.faults.values()) >= 8, table
    assert outcome.jobs_landed == outcome.jobs_planned, table
    assert outcome.drained_in is not None, table
