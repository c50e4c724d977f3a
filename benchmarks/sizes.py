"""How many jobs each figure uses, for quick and full runs, and the ``--n`` override."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# The claim-path figures' fixed shapes (not scaled by --n): producer threads of the
# concurrent-enqueue figure; tenants and jobs per lock key of the mixed-work figure;
# jobs per call of the bulk figure in calls of 1,000.
PRODUCER_THREADS = (1, 4, 16, 64)
MIXED_TENANTS = 150
# Lock keys name an entity (a mailbox, a document, a backup agent), so there are many
# of them, each with a few jobs: one key per this many locked jobs. A few keys holding
# thousands of jobs each would measure a chain of serial commits, not the claim.
MIXED_JOBS_PER_LOCK_KEY = 10
BULK_CALL = 1000


def mixed_lock_keys(jobs: int) -> int:
    """Distinct lock keys of a mixed-work figure of ``jobs`` jobs (one in ten is locked)."""
    return max(1, jobs // (10 * MIXED_JOBS_PER_LOCK_KEY))


@dataclass(frozen=True, slots=True)
class Sizes:
    """Job counts (jobs), a rate (jobs/s) and a duration (s) for one run.

    ``enqueue_one``: jobs enqueued one call each. ``bulk``: jobs bulk-enqueued and then
    processed (the processing-throughput figure uses the same queue). ``latency_rate``
    and ``latency_seconds``: the probe rate and how long it lasts. ``fairness_backlog``:
    tenant A's backlog; ``fairness_b``: tenant B's jobs. ``deep_small`` / ``deep_large``:
    due jobs in the queue; ``deep_jobs``: how many of them are processed and timed.
    ``process_cap``: seconds of processing after which a throughput, fairness,
    deep-queue or mixed-work figure is cut short and reported as partial. ``mixed``:
    jobs of the mixed-work figure; ``producer_jobs``: jobs enqueued per producer
    thread count (never fewer than the largest count, `PRODUCER_THREADS`).
    """

    enqueue_one: int
    bulk: int
    latency_rate: float
    latency_seconds: float
    fairness_backlog: int
    fairness_b: int
    deep_small: int
    deep_large: int
    deep_jobs: int
    process_cap: float
    mixed: int
    producer_jobs: int

    def scaled(self, n: int) -> Sizes:
        """These sizes with ``enqueue_one`` set to ``n`` and every other count scaled alike.

        The latency rate stays; its duration scales too but never below 1 s. Counts
        never drop below 10 jobs. Raises ValueError when ``n`` < 1.
        """
        if n < 1:
            raise ValueError(f"--n must be at least 1, got {n}")
        factor = n / self.enqueue_one

        def count(value: int) -> int:
            return max(10, round(value * factor))

        return dataclasses.replace(
            self,
            enqueue_one=n,
            bulk=count(self.bulk),
            latency_seconds=max(1.0, self.latency_seconds * min(1.0, factor)),
            fairness_backlog=count(self.fairness_backlog),
            fairness_b=min(self.fairness_b, count(self.fairness_b)),
            deep_small=count(self.deep_small),
            deep_large=count(self.deep_large),
            deep_jobs=count(self.deep_jobs),
            mixed=count(self.mixed),
            producer_jobs=max(*PRODUCER_THREADS, count(self.producer_jobs)),
        )


QUICK = Sizes(
    enqueue_one=2_000,
    bulk=20_000,
    latency_rate=50.0,
    latency_seconds=3.0,
    fairness_backlog=10_000,
    fairness_b=10,
    deep_small=10_000,
    deep_large=100_000,
    deep_jobs=10_000,
    process_cap=60.0,
    mixed=20_000,
    producer_jobs=2_000,
)

# Processing is capped at 60 s per figure (partial results beyond), which keeps a full
# run of five systems near 40 minutes here: procrastinate works off about 900 jobs/s
# and Celery about 1,100, so they would need minutes per figure. See benchmarks/README.md.
FULL = Sizes(
    enqueue_one=20_000,
    bulk=200_000,
    latency_rate=50.0,
    latency_seconds=10.0,
    fairness_backlog=100_000,
    fairness_b=10,
    deep_small=10_000,
    deep_large=1_000_000,
    deep_jobs=10_000,
    process_cap=60.0,
    mixed=200_000,
    producer_jobs=10_000,
)
