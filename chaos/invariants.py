"""The invariants a chaos run must keep, checked from the database and the side ledger.

`check` reads every job row, the ledger (`chaos.app`: one row per execution of a
task body, written outside the job's transaction) and the effect rows (written
inside it), and returns one `Invariant` per rule with how many items it checked and
what broke:

- ``terminal``: every job ended, or waits legitimately (due later).
- ``no lost enqueue``: every write the enqueuer saw succeed is a job row.
- ``effect exactly once``: a succeeded ``chaos.effect`` job has exactly one effect
  row, written by its last attempt; any other job has none.
- ``no overlap without lease loss``: two executions of one job overlapped only if
  the first had lost its lease (its attempt recorded ``lost`` by a reaper, or its
  process was stopped past the lease, or, for the same attempt handed back unstarted,
  the database was down or its connections cut meanwhile).
- ``one execution per lock key``: executions of jobs sharing a lock key never
  overlapped, unless the first had lost its lease (as above).
- ``stale writer fenced``: a succeeded job's result comes from its last attempt,
  run by the worker that held it: an execution that lost its lease never overwrote
  the newer outcome.
- ``attempts per policy``: attempt numbers 1..n in the history, each failed one
  planned (or a database fault met by the task, or a lost worker); succeeded after
  the planned failures, failed only when permanent, exhausted, or lost and not
  idempotent.
- ``unstarted keeps its attempt``: every attempt the job used has an execution in
  the ledger (a claimed job lost with its worker before it started used none), and
  each job a killed worker held unstarted (read just before the kill) kept its
  attempt. One case is told apart: an attempt recorded ``lost`` whose start was
  written within `KILL_CUT` seconds before its worker was killed began its body,
  which died before its first ledger write committed.
- ``cron tick exactly once``: every fire time of the schedule in the window has
  exactly one ``schedule`` run, it ran, it started within ``tick_slack`` seconds of
  the fire time, and no run exists for an instant that is not a fire time.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
from psycopg.rows import dict_row

from chaos.app import MAX_RETRIES
from chaos.fleet import LEASE_TIMEOUT

#: Seconds before a kill within which a recorded start may lack its ledger row.
KILL_CUT = 1.0
TERMINAL = ("succeeded", "failed", "cancelled", "partial_failure")
#: Error types a task's own statements may raise during a database fault (then retried).
DB_FAULT_TYPES = frozenset(
    {"OperationalError", "InterfaceError", "DatabaseError", "ConnectionFailed", "AdminShutdown"}
)


@dataclass
class Invariant:
    """One rule: items checked and the violations found (each a sentence)."""

    name: str
    checked: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether no violation was found."""
        return not self.violations

    def fail(self, text: str) -> None:
        """Record a violation."""
        self.violations.append(text)


@dataclass(frozen=True)
class Execution:
    """One ledger row: an execution of a job's body (times in Unix seconds)."""

    token: str
    job_id: int
    attempt: int
    worker_pid: int
    worker_id: str | None
    started: float
    finished: float | None
    outcome: str | None


@dataclass(frozen=True)
class CronPhase:
    """The schedule's definition from ``since`` (Unix seconds) on: expression, zone, and
    ``matches(local minute)``, the rule computed here independently of pgtasks.cron."""

    since: float
    expression: str
    timezone: str
    matches: Callable[[datetime], bool]


@dataclass
class Evidence:
    """What the harness saw happen, which the checks weigh against the database."""

    landed: Mapping[int, int | None]
    pid_ends: Mapping[int, float]
    stopped: Sequence[tuple[int, float, float]]
    db_faults: Sequence[tuple[float, float]]
    #: each killed worker: pid, worker id, when (Unix seconds), jobs it held unstarted
    unstarted_at_kill: Sequence[tuple[int, str, float, Sequence[int]]]
    cron_phases: Sequence[CronPhase]
    cron_window: tuple[float, float]
    schedule: str
    tick_slack: float
    killed_at_fire: frozenset[float] = frozenset()


@dataclass
class Findings:
    """The invariants, the jobs by outcome and the cron figures."""

    invariants: list[Invariant]
    outcomes: dict[str, int]
    tick_lags: list[float]
    ended_attempts: dict[str, int] = field(default_factory=dict)
    ticks_with_killed_scheduler: int = 0
    notes: dict[str, int] = field(default_factory=dict)

    @property
    def violations(self) -> int:
        """Violations over all invariants."""
        return sum(len(i.violations) for i in self.invariants)


def fire_times(phases: Sequence[CronPhase], window: tuple[float, float]) -> list[float]:
    """Fire times (Unix seconds) within ``window`` under the phase in force at each minute."""
    begin = math.ceil(window[0] / 60) * 60
    out = []
    for t in range(int(begin), int(window[1]) + 1, 60):
        phase = [p for p in phases if p.since < t]
        if phase and phase[-1].matches(datetime.fromtimestamp(t, ZoneInfo(phase[-1].timezone))):
            out.append(float(t))
    return out


def _load(
    conn: psycopg.Connection[Any],
) -> tuple[list[dict[str, Any]], list[Execution], list[dict[str, Any]]]:
    with conn.cursor(row_factory=dict_row) as cur:
        jobs = cur.execute(
            "SELECT id, task_name, status, attempt, max_attempts, kwargs, result, error, attempts,"
            " retry_on_worker_lost, trigger, schedule_name,"
            " extract(epoch FROM scheduled_for) AS scheduled_for,"
            " extract(epoch FROM started_at) AS started_at, extract(epoch FROM run_at) AS run_at,"
            " worker_id, parent_id, lock_key, run_at > now() AS due_later FROM pgtasks.jobs ORDER BY id"
        ).fetchall()
        effects = cur.execute("SELECT job_id, attempt, token FROM public.chaos_effects").fetchall()
    ledger = [
        Execution(r[0], r[1], r[2], r[3], r[4], float(r[5]), None if r[6] is None else float(r[6]), r[7])
        for r in conn.execute(
            "SELECT token, job_id, attempt, worker_pid, worker_id, extract(epoch FROM started_at),"
            " extract(epoch FROM finished_at), outcome FROM public.chaos_ledger ORDER BY started_at"
        ).fetchall()
    ]
    return jobs, ledger, effects


def check(conn: psycopg.Connection[Any], evidence: Evidence) -> Findings:
    """Check every invariant on the run's database ``conn`` against ``evidence``."""
    jobs, ledger, effects = _load(conn)
    by_job: dict[int, list[Execution]] = defaultdict(list)
    for e in ledger:
        by_job[e.job_id].append(e)
    outcomes: dict[str, int] = defaultdict(int)
    for job in jobs:
        kind = "cron run" if job["schedule_name"] else job["task_name"]
        outcomes[f"{kind}: {job['status']}"] += 1
    ended: dict[str, int] = defaultdict(int)
    for job in jobs:
        for entry in job["attempts"]:
            error = entry.get("error") or {}
            ended[f"{entry.get('outcome')}: {error.get('type')} {error.get('code')}"] += 1
    stream = [j for j in jobs if j["task_name"] in ("chaos.work", "chaos.once", "chaos.effect")]
    notes: dict[str, int] = {}
    findings = Findings(
        invariants=[
            _terminal(jobs),
            _no_lost_enqueue(stream, evidence),
            _effects(stream, effects),
            _overlap(jobs, by_job, evidence, notes),
            _locks(jobs, by_job, evidence),
            _fenced(jobs, by_job, notes),
            _attempts(stream),
        ],
        outcomes=dict(sorted(outcomes.items())),
        ended_attempts=dict(sorted(ended.items())),
        tick_lags=[],
        notes=notes,
    )
    findings.invariants.append(_unstarted(jobs, by_job, evidence, findings))
    findings.invariants.append(_ticks(jobs, by_job, evidence, findings))
    return findings


def _terminal(jobs: Iterable[dict[str, Any]]) -> Invariant:
    inv = Invariant("terminal or legitimately waiting")
    for job in jobs:
        inv.checked += 1
        waiting = job["status"] == "queued" and job["due_later"]
        if job["status"] not in TERMINAL and not waiting:
            inv.fail(f"job {job['id']} ({job['task_name']}) is {job['status']}")
    return inv


def _no_lost_enqueue(stream: Sequence[dict[str, Any]], evidence: Evidence) -> Invariant:
    inv = Invariant("no acknowledged enqueue lost")
    seqs = {int(j["kwargs"]["seq"]) for j in stream}
    for seq in evidence.landed:
        inv.checked += 1
        if seq not in seqs:
            inv.fail(f"job #{seq} was enqueued (id {evidence.landed[seq]}) but has no row")
    return inv


def _effects(stream: Sequence[dict[str, Any]], effects: Sequence[dict[str, Any]]) -> Invariant:
    inv = Invariant("transactional effect exactly once")
    rows: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in effects:
        rows[e["job_id"]].append(e)
    for job in stream:
        if job["task_name"] != "chaos.effect":
            continue
        inv.checked += 1
        found = rows.get(job["id"], [])
        if job["status"] == "succeeded":
            if len(found) != 1:
                inv.fail(f"job {job['id']} succeeded with {len(found)} effect rows")
            elif found[0]["attempt"] != job["attempt"] or found[0]["token"] != job["result"]["token"]:
                inv.fail(f"job {job['id']}: effect of attempt {found[0]['attempt']}, job at {job['attempt']}")
        elif found:
            inv.fail(f"job {job['id']} is {job['status']} yet has {len(found)} effect rows")
    known = {j["id"] for j in stream}
    for job_id in rows.keys() - known:
        inv.fail(f"effect rows for job {job_id}, which is not a chaos.effect job")
    return inv


def _lost_entries(job: Mapping[str, Any]) -> set[tuple[int, str | None]]:
    return {(int(a["attempt"]), a.get("worker_id")) for a in job["attempts"] if a.get("outcome") == "lost"}


def _end(run: Execution, ev: Evidence) -> float:
    """When an execution ended: its stamp, else when its process was seen dead, else never."""
    return run.finished if run.finished is not None else ev.pid_ends.get(run.worker_pid, math.inf)


def _span(run: Execution, ev: Evidence) -> str:
    """An execution's start and end as UTC times of day, for a message."""

    def t(x: float) -> str:
        return "never" if math.isinf(x) else datetime.fromtimestamp(x, UTC).strftime("%H:%M:%S.%f")[:-3]

    return f"{t(run.started)} to {t(_end(run, ev))}"


def _lease_lost(a: Execution, b: Execution, a_job: Mapping[str, Any], ev: Evidence) -> bool:
    """Whether execution ``a`` had lost its lease by the time ``b`` started: the reaper
    recorded its attempt lost, its process was stopped meanwhile, or (``a`` handed back
    because its start was not yet written, which records nothing) the database was down
    or its connections were cut within a lease before ``b`` started."""
    if (a.attempt, a.worker_id) in _lost_entries(a_job):
        return True
    if any(
        pid == a.worker_pid and began <= b.started and resumed >= a.started
        for pid, began, resumed in ev.stopped
    ):
        return True
    handed_back = a.job_id != b.job_id or a.attempt == b.attempt
    return handed_back and any(
        began <= b.started and ended >= a.started - LEASE_TIMEOUT for began, ended in ev.db_faults
    )


def _overlaps(
    runs: Sequence[Execution], jobs: Mapping[int, Mapping[str, Any]], ev: Evidence
) -> Iterator[tuple[Execution, Execution, bool]]:
    """Each pair of overlapping executions among ``runs`` (sorted by start), first one
    first, with whether the first had lost its lease."""
    for i, a in enumerate(runs):
        end = _end(a, ev)
        for b in runs[i + 1 :]:
            if b.started >= end:
                continue
            yield a, b, _lease_lost(a, b, jobs[a.job_id], ev)


def _overlap(
    jobs: Sequence[dict[str, Any]],
    by_job: Mapping[int, list[Execution]],
    ev: Evidence,
    notes: dict[str, int],
) -> Invariant:
    inv = Invariant("no overlap unless the lease was lost")
    index = {j["id"]: j for j in jobs}
    overlaps = 0
    for job in jobs:
        inv.checked += 1
        for a, b, lost in _overlaps(by_job.get(job["id"], []), index, ev):
            if lost:
                overlaps += 1
                continue
            both = min(_end(a, ev), b.finished or math.inf) - b.started
            inv.fail(
                f"job {job['id']}: attempt {a.attempt} (pid {a.worker_pid}, {_span(a, ev)}) and attempt"
                f" {b.attempt} (pid {b.worker_pid}, {_span(b, ev)}) overlapped by {both:.3f} s"
                " without a lost lease"
            )
    notes["executions overlapping one whose lease was lost"] = overlaps
    return inv


def _locks(jobs: Sequence[dict[str, Any]], by_job: Mapping[int, list[Execution]], ev: Evidence) -> Invariant:
    inv = Invariant("one execution per lock key at a time")
    index = {j["id"]: j for j in jobs}
    by_key: dict[str, list[Execution]] = defaultdict(list)
    for job in jobs:
        if job["lock_key"] is not None:
            by_key[job["lock_key"]].extend(by_job.get(job["id"], []))
    for key, runs in sorted(by_key.items()):
        inv.checked += 1
        runs.sort(key=lambda e: e.started)
        for a, b, lost in _overlaps(runs, index, ev):
            if a.job_id != b.job_id and not lost:
                inv.fail(f"lock {key}: jobs {a.job_id} and {b.job_id} ran at once without a lost lease")
    return inv


def _fenced(
    jobs: Sequence[dict[str, Any]], by_job: Mapping[int, list[Execution]], notes: dict[str, int]
) -> Invariant:
    inv = Invariant("stale writer never overwrote the outcome")
    stale = 0
    for job in jobs:
        if job["status"] != "succeeded":
            continue
        inv.checked += 1
        result = job["result"] or {}
        token = result.get("token")
        run = next((e for e in by_job.get(job["id"], []) if e.token == token), None)
        if run is None:
            inv.fail(f"job {job['id']} succeeded with a result no execution wrote: {result!r}")
        elif run.attempt != job["attempt"] or run.worker_id != job["worker_id"]:
            inv.fail(
                f"job {job['id']}: result of attempt {run.attempt} on {run.worker_id},"
                f" job at attempt {job['attempt']} held by {job['worker_id']}"
            )
        elif run.outcome != "ok":
            inv.fail(f"job {job['id']} succeeded from an execution that ended {run.outcome!r}")
        stale += sum(1 for e in by_job.get(job["id"], []) if e.outcome == "ok" and e.token != token)
    notes["bodies that returned without deciding the outcome (lease lost or write failed)"] = stale
    return inv


def _attempts(stream: Sequence[dict[str, Any]]) -> Invariant:
    inv = Invariant("attempts as the retry policy says")
    for job in stream:
        if job["status"] not in TERMINAL:
            continue
        inv.checked += 1
        jid, kw, history = job["id"], job["kwargs"], job["attempts"]
        planned_fails, permanent = int(kw["fail_attempts"]), bool(kw["permanent"])
        numbers = [int(a["attempt"]) for a in history]
        problems = []
        if job["max_attempts"] != MAX_RETRIES + 1:
            problems.append(f"max_attempts {job['max_attempts']}")
        if numbers != list(range(1, len(numbers) + 1)):
            problems.append(f"history numbers {numbers}")
        for entry in history:
            n, outcome, error = int(entry["attempt"]), entry.get("outcome"), entry.get("error") or {}
            if outcome == "lost":
                continue
            kind = error.get("type")
            if permanent:
                planned = error.get("code") == "CHAOS_PERMANENT"
            else:
                planned = kind == "TransientFault" and n <= planned_fails
            if not planned and kind not in DB_FAULT_TYPES:
                problems.append(f"attempt {n} ended {outcome} with {kind} {error.get('code')}")
        last = history[-1] if history else {}
        if job["status"] == "succeeded":
            if job["attempt"] != len(history) + 1 or job["attempt"] <= planned_fails or permanent:
                problems.append(
                    f"succeeded at attempt {job['attempt']} after {len(history)} recorded"
                    f" ({planned_fails} planned failures, permanent {permanent})"
                )
        elif job["status"] == "failed":
            exhausted = job["attempt"] == job["max_attempts"]
            lost_once = last.get("outcome") == "lost" and not job["retry_on_worker_lost"]
            rejected = permanent and (last.get("error") or {}).get("code") == "CHAOS_PERMANENT"
            if job["attempt"] != len(history) or not (exhausted or lost_once or rejected):
                problems.append(f"failed at attempt {job['attempt']} with last entry {last.get('outcome')}")
        else:
            problems.append(f"ended {job['status']}")
        if not job["retry_on_worker_lost"]:
            lost_at = [int(a["attempt"]) for a in history if a.get("outcome") == "lost"]
            if lost_at and (lost_at != [numbers[-1]] or job["status"] != "failed"):
                problems.append(f"non-idempotent job ran again after a lost worker (lost at {lost_at})")
        if problems:
            inv.fail(f"job {jid} ({job['task_name']}): " + "; ".join(problems))
    return inv


def _start_cut_by_kill(entry: Mapping[str, Any], kills: Mapping[str, float]) -> bool:
    """Whether a ``lost`` attempt began in the second before its worker was killed: its
    start was written (a non-idempotent task's before its body, another's by the next
    heartbeat) but the body's first ledger write had not committed yet."""
    killed = kills.get(entry.get("worker_id") or "")
    started = entry.get("started_at")
    if entry.get("outcome") != "lost" or killed is None or not started:
        return False
    at = datetime.fromisoformat(started).timestamp()
    return killed - KILL_CUT <= at <= killed + 0.2


def _unstarted(
    jobs: Sequence[dict[str, Any]], by_job: Mapping[int, list[Execution]], ev: Evidence, findings: Findings
) -> Invariant:
    inv = Invariant("unstarted job lost with its worker keeps its attempt")
    index = {j["id"]: j for j in jobs}
    kills = {worker_id: at for _pid, worker_id, at, _held in ev.unstarted_at_kill}
    cut = 0
    for job in jobs:
        if job["schedule_name"]:
            continue
        inv.checked += 1
        ran = {(e.attempt, e.worker_id) for e in by_job.get(job["id"], [])}
        used = [(int(a["attempt"]), a.get("worker_id"), a) for a in job["attempts"]]
        if job["status"] == "succeeded":
            used.append((job["attempt"], job["worker_id"], {}))
        for attempt, worker, entry in used:
            if (attempt, worker) in ran:
                continue
            if _start_cut_by_kill(entry, kills):
                cut += 1
                continue
            inv.fail(f"job {job['id']}: attempt {attempt} on {worker} used without its body starting")
    kept = 0
    for pid, worker_id, _at, held in ev.unstarted_at_kill:
        for job_id in held:
            held_job = index.get(job_id)
            if held_job is None or any(e.worker_pid == pid for e in by_job.get(job_id, [])):
                continue  # it started in the instant before the kill: an attempt, rightly
            kept += 1
            inv.checked += 1
            charged = [a for a in held_job["attempts"] if a.get("worker_id") == worker_id]
            if any(not _start_cut_by_kill(a, kills) for a in charged):
                inv.fail(f"job {job_id}, held unstarted by killed worker {worker_id}, lost an attempt")
    findings.notes["unstarted jobs held by killed workers"] = kept
    findings.notes["starts cut off by a kill before the body's first ledger write"] = cut
    return inv


def _ticks(
    jobs: Sequence[dict[str, Any]], by_job: Mapping[int, list[Execution]], ev: Evidence, findings: Findings
) -> Invariant:
    inv = Invariant("cron tick exactly once, on time")
    runs = [j for j in jobs if j["schedule_name"] == ev.schedule and j["trigger"] == "schedule"]
    expected = fire_times(ev.cron_phases, ev.cron_window)
    retries = defaultdict(list)
    for j in jobs:
        if j["schedule_name"] == ev.schedule and j["trigger"] == "retry":
            retries[float(j["scheduled_for"])].append(j)
    by_time: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        by_time[float(r["scheduled_for"])].append(r)
    for t in expected:
        inv.checked += 1
        stamp = datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")
        found = by_time.get(t, [])
        if len(found) != 1:
            inv.fail(f"fire time {stamp}: {len(found)} runs")
            continue
        run = found[0]
        attempts = [run, *retries.get(t, [])]
        if not any(j["status"] == "succeeded" for j in attempts):
            inv.fail(f"fire time {stamp}: its run and retries ended {[j['status'] for j in attempts]}")
        starts = [e.started for e in by_job.get(run["id"], [])]
        if not starts:
            inv.fail(f"fire time {stamp}: run {run['id']} has no execution")
            continue
        lag = min(starts) - t
        findings.tick_lags.append(lag)
        if lag > ev.tick_slack:
            inv.fail(f"fire time {stamp}: started {lag:.2f} s late (limit {ev.tick_slack} s)")
        if t in ev.killed_at_fire:
            findings.ticks_with_killed_scheduler += 1
    lo, hi = ev.cron_window
    for t in by_time:
        if lo <= t <= hi and t not in expected:
            inv.fail(f"a run for {datetime.fromtimestamp(t).isoformat()}, which is not a fire time")
    return inv


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by the nearest-rank rule; NaN if empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def minute_every(step: int) -> Callable[[datetime], bool]:
    """A matcher for ``*/step`` in the minute field and ``*`` elsewhere (local time)."""
    return lambda local: local.minute % step == 0
