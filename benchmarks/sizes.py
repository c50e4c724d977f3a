"""How many jobs each figure uses, for quick and full runs, and the ``--n`` override."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sizes:
    """Job counts (jobs), a rate (jobs/s) and a duration (s) for one run.

    ``enqueue_one``: jobs enqueued one call each. ``bulk``: jobs bulk-enqueued and then
    processed (the processing-throughput figure uses the same queue). ``latency_rate``
    and ``latency_seconds``: the probe rate and how long it lasts. ``fairness_backlog``:
    tenant A's backlog; ``fairness_b``: tenant B's jobs. ``deep_small`` / ``deep_large``:
    due jobs in the queue; ``deep_jobs``: how many of them are processed and timed.
    ``process_cap``: seconds of processing after which a throughput, fairness or
    deep-queue figure is cut short and reported as partial.
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
)

# Scaled down from 200,000 bulk and 100,000 fairness jobs so that a full run fits in
# under 45 minutes here: procrastinate processes 100-250 jobs/s on this machine and
# Celery's group enqueue about 2,000 jobs/s. See benchmarks/README.md.
FULL = Sizes(
    enqueue_one=20_000,
    bulk=100_000,
    latency_rate=50.0,
    latency_seconds=10.0,
    fairness_backlog=50_000,
    fairness_b=10,
    deep_small=10_000,
    deep_large=1_000_000,
    deep_jobs=10_000,
    process_cap=60.0,
)
