"""The chaos harness's short profile: 90 seconds of faults, every invariant kept.

``python -m pytest -m chaos`` selects it. It starts a private PostgreSQL (skipped
when no PostgreSQL binaries are installed), a supervised fleet of real worker and
scheduler processes, and injects the seeded faults of `chaos.faults` while a job
stream runs; then it checks `chaos.invariants`. Timing is generous where the
machine's load decides it (a cron run may start up to 5 s after its fire time
here, 1 s in ``python -m chaos``); the invariants themselves are not relaxed.

Two invariants have open findings of the harness (docs/chaos.md, "Open findings"):
an outcome write of a success that is not fenced by its attempt (a success whose
reply was lost, with the job claimed again by the same worker), and a side-ledger
row the at-least-once task writes twice when its insert's reply is lost. Their
violations are printed here but do not fail the run until they are closed; every
other invariant must hold, and ``python -m chaos`` fails on any violation.
"""

from __future__ import annotations

import pytest

from chaos.report import render
from chaos.run import Options, run
from chaos.server import find_bindir

SEED = 20261202
# Invariants with an open finding (see the module docstring): reported, not yet gating.
OPEN_FINDINGS = frozenset(
    {"no overlap unless the lease was lost", "stale writer never overwrote the outcome"}
)


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(290)
@pytest.mark.skipif(find_bindir() is None, reason="no PostgreSQL binaries to start a private server")
def test_ninety_seconds_of_faults_break_no_invariant() -> None:
    outcome = run(Options(seed=SEED, duration=90.0, tick_slack=5.0, drain_timeout=60.0))
    table = render(outcome)
    print(table)
    broken = [i.name for i in outcome.findings.invariants if not i.ok and i.name not in OPEN_FINDINGS]
    assert broken == [], table
    assert sum(outcome.faults.values()) >= 8, table
    assert outcome.jobs_landed == outcome.jobs_planned, table
    assert outcome.drained_in is not None, table
