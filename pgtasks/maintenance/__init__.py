"""Maintenance services shared by the worker and the scheduler, all of one shape.

`Service` is the base (a thread calling ``run_once()`` every interval); `Reaper`
recovers the jobs of lost workers; `Retention` deletes finished jobs the retention
policy no longer keeps; `History` moves finished jobs out of the hot table;
`FlowPrune` deletes the concurrency counters and rate windows of idle keys. Each
service is handed its config and the stores it needs, never the application.
"""

from __future__ import annotations

from pgtasks.maintenance.flow_prune import FlowPrune, FlowPruneConfig, FlowPruneResult
from pgtasks.maintenance.history import History, HistoryConfig, HistoryResult
from pgtasks.maintenance.reaper import Reaper, ReaperConfig, ReaperResult
from pgtasks.maintenance.retention import Retention, RetentionResult
from pgtasks.maintenance.service import Service

__all__ = [
    "FlowPrune",
    "FlowPruneConfig",
    "FlowPruneResult",
    "History",
    "HistoryConfig",
    "HistoryResult",
    "Reaper",
    "ReaperConfig",
    "ReaperResult",
    "Retention",
    "RetentionResult",
    "Service",
]
