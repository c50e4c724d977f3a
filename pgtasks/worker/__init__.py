"""The worker: claiming, running, retrying and recovering jobs."""

from __future__ import annotations

from pgtasks.worker.config import WorkerConfig, make_worker_id
from pgtasks.worker.worker import Worker

__all__ = ["Worker", "WorkerConfig", "make_worker_id"]
