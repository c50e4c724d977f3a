"""A heartbeat that waited for its connection tells the worker its lease may have lapsed.

Found by the chaos harness through PgBouncer (`python -m chaos --pooler`): after a
restart of the server, PgBouncer refused logins for a while and the worker's pool
backed off, so a beat asked for at 3.3 s after the last one was written only at 6.2 s,
past the 5 s lease. The reaper of another worker had handed back a job this worker had
claimed ahead, and the worker then ran its body, unaware, while another worker ran it
too. The lapse is measured to when the beat's write returned.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, cast

from pgtasks.worker.heartbeat import Heartbeat

LEASE = 0.3  # seconds


class SlowWorkers:
    """A worker store whose second heartbeat waits ``LEASE`` and more for a connection."""

    def __init__(self) -> None:
        self.beats = 0
        self.waited_from: float | None = None

    def heartbeat(self, *, id: str, stopping: bool) -> datetime:
        self.beats += 1
        if self.beats == 2:
            self.waited_from = time.monotonic()  # a job claimed now may be handed back
            time.sleep(LEASE + 0.1)
        return datetime.now(UTC)


class NoCancels:
    def cancel_requested(self, *, worker_id: str) -> list[Any]:
        return []


def test_a_beat_that_waited_past_the_lease_for_its_write_reports_a_lapse() -> None:
    workers = SlowWorkers()
    beat = Heartbeat(
        cast(Any, workers),
        cast(Any, NoCancels()),
        "w",
        LEASE / 3,
        lambda i, t: None,
        lambda: None,
        lambda: False,
        lease_timeout=LEASE,
    )
    assert beat.run_once().extended
    assert beat.lapsed_at == float("-inf")
    # Asked for well within the lease, written past it.
    assert beat.run_once().extended
    assert workers.waited_from is not None
    assert beat.lapsed_at >= workers.waited_from  # covers what was claimed while it waited
