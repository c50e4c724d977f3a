"""The seeded stream of jobs and the enqueuer that feeds it to the database.

`plan_jobs` draws the run's jobs from the seed: which task, when (seconds into the
fault period), how long its body works, how many attempts fail transiently, whether
it fails permanently, its tenant, lock key and priority. The enqueuer writes each at
its moment through the harness's own app; a write that fails (the server is
restarting, the connection was terminated) is tried again until it lands. Each job
carries a unique key of its number, so a retried write whose first try did commit
is refused (`AlreadyQueued`) instead of making a second job.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pgtasks
from pgtasks.errors import AlreadyQueued, PgtasksError

TENANTS = ("acme", "globex", "initech", "umbrella")
TENANT_WEIGHTS = (5, 2, 2, 1)
LOCKS = tuple(f"lock-{i}" for i in range(4))
#: Job numbers of fencing probes start here (the stream's are below).
PROBE_SEQ = 1_000_000


@dataclass(frozen=True)
class JobSpec:
    """One job of the stream (``at``: seconds into the fault period)."""

    seq: int
    at: float
    task: str
    duration: float
    fail_attempts: int
    permanent: bool
    tenant: str
    lock: str | None
    priority: int

    def kwargs(self) -> dict[str, Any]:
        """The job's keyword arguments."""
        return {
            "seq": self.seq,
            "duration": self.duration,
            "fail_attempts": self.fail_attempts,
            "permanent": self.permanent,
        }


#: Jobs in a burst (a backlog, so workers hold prefetched jobs when one is killed).
BURST = 40


def plan_jobs(seed: int, duration: float, rate: float = 4.0, bursts: Sequence[float] = ()) -> list[JobSpec]:
    """The job stream of ``seed``: about ``rate`` jobs a second over ``duration`` seconds,
    plus `BURST` short jobs at once at each offset of ``bursts`` (seconds)."""
    rng = random.Random(seed * 7919 + 1)
    jobs: list[JobSpec] = []
    for at in bursts:
        for _ in range(BURST):
            jobs.append(
                JobSpec(
                    seq=0,
                    at=round(at, 3),
                    task=rng.choices(("chaos.work", "chaos.effect", "chaos.once"), weights=(50, 25, 25))[0],
                    duration=round(rng.uniform(0.3, 1.2), 3),
                    fail_attempts=0,
                    permanent=False,
                    tenant=rng.choices(TENANTS, weights=TENANT_WEIGHTS)[0],
                    lock=None,
                    priority=0,
                )
            )
    at = 0.0
    while True:
        at += rng.expovariate(rate)
        if at >= duration:
            jobs.sort(key=lambda j: j.at)
            return [replace(j, seq=n) for n, j in enumerate(jobs)]
        task = rng.choices(("chaos.work", "chaos.effect", "chaos.once"), weights=(55, 25, 20))[0]
        band = rng.random()
        if band < 0.70:
            seconds = rng.uniform(0.02, 0.4)
        elif band < 0.92:
            seconds = rng.uniform(0.5, 2.5)
        else:
            seconds = rng.uniform(4.0, 8.0)
        fails = rng.choices((0, 1, 2), weights=(75, 15, 10))[0]
        jobs.append(
            JobSpec(
                seq=len(jobs),
                at=round(at, 3),
                task=task,
                duration=round(seconds, 3),
                fail_attempts=fails,
                permanent=rng.random() < 0.06,
                tenant=rng.choices(TENANTS, weights=TENANT_WEIGHTS)[0],
                lock=rng.choice(LOCKS) if rng.random() < 0.15 else None,
                priority=rng.randrange(3),
            )
        )


@dataclass
class Enqueuer:
    """Writes a job stream through ``app`` at the planned moments.

    Attributes:
        landed: job number -> job id (None: refused as already queued, so it landed).
        given_up: job numbers whose write never succeeded within ``patience`` seconds.
        write_errors: failed write attempts (each tried again).
    """

    app: pgtasks.App
    run_tag: str
    patience: float = 60.0
    landed: dict[int, int | None] = field(default_factory=dict)
    given_up: list[int] = field(default_factory=list)
    write_errors: int = 0

    def _write(self, spec: JobSpec, queue: str = "default") -> None:
        deadline = time.monotonic() + self.patience
        while True:
            try:
                result = self.app.tasks[spec.task].apply_async(
                    kwargs=spec.kwargs(),
                    queue=queue,
                    tenant=spec.tenant,
                    lock=spec.lock,
                    priority=spec.priority,
                    unique_key=f"{self.run_tag}:{spec.seq}",
                )
            except AlreadyQueued:
                self.landed[spec.seq] = None
                return
            except PgtasksError:
                self.write_errors += 1
                if time.monotonic() > deadline:
                    self.given_up.append(spec.seq)
                    return
                time.sleep(0.3)
            else:
                self.landed[spec.seq] = result.id
                return

    def probe(self, seconds: float) -> int | None:
        """Enqueue a fencing probe on the ``probe`` queue: a job working ``seconds``,
        ``chaos.work`` and ``chaos.effect`` in turn, numbered from `PROBE_SEQ`; returns
        its id, or None if it could not be written within ``patience``."""
        n = sum(1 for seq in self.landed if seq >= PROBE_SEQ)
        task = ("chaos.work", "chaos.effect")[n % 2]
        spec = JobSpec(PROBE_SEQ + n, 0.0, task, seconds, 0, False, TENANTS[0], None, 9)
        self._write(spec, queue="probe")
        return self.landed.get(spec.seq)

    def run(self, jobs: Sequence[JobSpec], start: float, stop: threading.Event) -> None:
        """Write ``jobs`` at ``start`` (Unix seconds) plus each one's offset. Once ``stop``
        is set, the jobs already due are still written (a write held up by a fault may
        have left some behind), the rest are not."""
        for spec in jobs:
            wait = start + spec.at - time.time()
            if wait > 0 and stop.wait(wait):
                return
            self._write(spec)
