"""Records: the frozen values the data layer (`pgtasks.db`) returns and the engine reads.

`Job` and its history of `Attempt` and `Requeue` entries; why a job is where it
is (`Explanation` of `Reason` entries); a schedule as stored (`Schedule`) and one
of its runs (`Run`).
"""

from __future__ import annotations

from pgtasks.records.explanation import Explanation, Reason, ReasonCode
from pgtasks.records.job import Attempt, Job, Requeue
from pgtasks.records.schedule import Run, Schedule

__all__ = ["Attempt", "Explanation", "Job", "Reason", "ReasonCode", "Requeue", "Run", "Schedule"]
