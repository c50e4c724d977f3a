"""The run's table: jobs by outcome, faults by kind, invariants with counts, cron figures."""

from __future__ import annotations

from chaos.invariants import percentile
from chaos.run import Outcome

#: Violations listed per invariant (the rest are counted).
SHOWN = 10


def render(outcome: Outcome) -> str:
    """The run as plain text (Markdown tables), the last line its verdict."""
    o, f = outcome.options, outcome.findings
    lines = [
        f"seed {o.seed}, {o.duration:.0f} s of faults, {o.workers} workers x {o.concurrency}"
        f" + 1 cron worker + 2 schedulers; wall time {outcome.wall_seconds:.0f} s",
        f"servers: {outcome.servers}",
        f"jobs planned {outcome.jobs_planned}, enqueued {outcome.jobs_landed}"
        f" ({outcome.enqueue_errors} enqueue attempts failed and were retried),"
        f" fencing probes {outcome.probes};"
        + (
            f" queue drained {outcome.drained_in:.1f} s after the faults"
            if outcome.drained_in is not None
            else " the queue did NOT drain"
        ),
        "",
        "| jobs by outcome | count |",
        "|---|---:|",
        *(f"| {name} | {count} |" for name, count in f.outcomes.items()),
        "",
        "| attempts that ended without success: outcome, error type and code | count |",
        "|---|---:|",
        *(f"| {name} | {count} |" for name, count in f.ended_attempts.items()),
        "",
        "| faults by kind | count |",
        "|---|---:|",
        *(f"| {kind} | {count} |" for kind, count in sorted(outcome.faults.items())),
        f"| **total** | {sum(outcome.faults.values())} |",
        "",
        "| invariant | checked | violations | result |",
        "|---|---:|---:|---|",
        *(
            f"| {i.name} | {i.checked} | {len(i.violations)} | {'pass' if i.ok else 'FAIL'} |"
            for i in f.invariants
        ),
        "",
    ]
    lags = f.tick_lags
    if lags:
        lines.append(
            f"cron: {len(lags)} ticks checked, start after fire time p50 {percentile(lags, 0.5):.3f} s,"
            f" p99 {percentile(lags, 0.99):.3f} s, max {max(lags):.3f} s (limit {o.tick_slack} s);"
            f" {f.ticks_with_killed_scheduler} of them with a scheduler killed at the fire time"
        )
    for name, value in f.notes.items():
        lines.append(f"{name}: {value}")
    for inv in f.invariants:
        for text in inv.violations[:SHOWN]:
            lines.append(f"VIOLATION {inv.name}: {text}")
        if len(inv.violations) > SHOWN:
            lines.append(f"VIOLATION {inv.name}: ... and {len(inv.violations) - SHOWN} more")
    lines.append(f"violations: {f.violations}" + ("" if outcome.ok else "  (FAILED)"))
    return "\n".join(lines)
