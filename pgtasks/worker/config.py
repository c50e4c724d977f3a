"""Worker settings: one frozen object, validated once, built by the CLI or by tests."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from pgtasks.errors import ConfigurationError
from pgtasks.validation import check_bool, check_int, check_name, check_seconds, check_text, short

__all__ = ["WorkerConfig", "make_worker_id"]

POOLS = ("threads", "processes")
UNKNOWN_TASK_POLICIES = ("fail", "defer")
#: Most of each count a worker takes (a typo such as ``-c 40000`` is refused, not tried).
COUNT_LIMITS = {
    "concurrency": 10_000,
    "prefetch_multiplier": 1000,
    "max_tenants_per_claim": 100_000,
    "completion_batch": 100_000,
}
#: Most UTF-8 bytes of a host name (RFC 1035's 255, part of a worker id that is indexed).
MAX_HOSTNAME_BYTES = 255


def make_worker_id(hostname: str | None = None) -> str:
    """A worker id unique per process start: ``host:pid:random``."""
    return f"{hostname or socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How a worker claims, runs and recovers jobs.

    Attributes:
        queues: queues to serve (Celery ``-Q``), default ``("default",)``.
        concurrency: jobs run at once (Celery ``-c``), >= 1; default 4.
        pool: ``"threads"`` (default) or ``"processes"`` (CPU-bound work, hard
            time limits, ``terminate`` on revoke).
        hostname: host part of the worker id (Celery ``-n``); default the host name.
        prefetch_multiplier: jobs held claimed-but-not-started per slot (Celery's
            ``worker_prefetch_multiplier``, default 4). A claim asks for
            ``concurrency * prefetch_multiplier`` minus what is held.
        lease_timeout: seconds without a heartbeat after which this worker's jobs
            may be reaped by others (default 30).
        heartbeat_interval: seconds between heartbeats (default lease / 3).
        poll_interval: seconds between polls when no notification arrives
            (default 1.0; NOTIFY only wakes, polling always runs).
        listen: use LISTEN/NOTIFY wake-ups (False behind PgBouncer transaction pooling).
        shutdown_timeout: seconds running jobs get to finish after SIGTERM (default 30).
        tenant_fair: serve tenants round-robin (default True).
        max_tenants_per_claim: tenants one claim looks at (default 100); beyond that
            the claim continues from where the last one stopped.
        burst: exit once no due job is left and nothing is running.
        max_tasks_per_child: in the processes pool, replace a child after this many jobs.
        reap_interval: seconds between reaper runs (default 5).
        completion_batch: most results written by one statement (default 500).
        completion_delay: seconds a finished job waits for others to share its write
            (default 0.002).
        unknown_tasks: ``"fail"`` (default: fail jobs of unknown task names at once)
            or ``"defer"`` (claim only the tasks this worker knows; other tasks' jobs
            stay queued, untouched, for a worker that knows them).
        worker_id: explicit id (default `make_worker_id`).
        app_spec: ``module:attribute`` of the app, needed by the processes pool.
        plugins: plugin modules (``--plugin``) the processes pool's children
            register too (the worker's own app has them already).
        metrics_port: serve the worker's Prometheus metrics on ``/metrics`` at this
            TCP port (`pgtasks.worker.metrics`; 0: any free port); None (default):
            no metrics, nothing is counted.
        metrics_host: address to serve them on (default ``127.0.0.1``: this host only).
        metrics_tenants: add a ``tenant`` label to the per-job metrics (one series
            per tenant served; default False).

    Raises:
        ConfigurationError: a field of the wrong type or out of range, naming it and
            the limit (queues and the worker id as `pgtasks.validation.check_name`:
            at most 1,000 bytes of valid UTF-8, no control character; counts up to
            `COUNT_LIMITS`; seconds finite and at most `pgtasks.validation.MAX_DELAY`).
    """

    queues: tuple[str, ...] = ("default",)
    concurrency: int = 4
    pool: str = "threads"
    hostname: str | None = None
    prefetch_multiplier: int = 4
    lease_timeout: float = 30.0
    heartbeat_interval: float | None = None
    poll_interval: float = 1.0
    listen: bool = True
    shutdown_timeout: float = 30.0
    tenant_fair: bool = True
    max_tenants_per_claim: int = 100
    burst: bool = False
    max_tasks_per_child: int | None = None
    reap_interval: float = 5.0
    completion_batch: int = 500
    completion_delay: float = 0.002
    unknown_tasks: str = "fail"
    worker_id: str = field(default="")
    app_spec: str | None = None
    plugins: tuple[str, ...] = ()
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    metrics_tenants: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.queues, str) or not self.queues:
            raise ConfigurationError(
                f"queues must be a non-empty tuple of queue names, got {short(self.queues)}"
            )
        for queue in self.queues:
            check_name("queue", queue)
        if self.pool not in POOLS:
            raise ConfigurationError(f"pool must be one of {', '.join(POOLS)}, got {short(self.pool)}")
        if self.unknown_tasks not in UNKNOWN_TASK_POLICIES:
            raise ConfigurationError(f"unknown_tasks must be one of {UNKNOWN_TASK_POLICIES}")
        for name, high in COUNT_LIMITS.items():
            check_int(name, getattr(self, name), 1, high)
        for name in ("lease_timeout", "poll_interval", "shutdown_timeout", "reap_interval"):
            check_seconds(name, getattr(self, name), positive=True)
        check_seconds("completion_delay", self.completion_delay)
        if self.heartbeat_interval is not None:
            check_seconds("heartbeat_interval", self.heartbeat_interval, positive=True)
            if not self.heartbeat_interval < self.lease_timeout:
                raise ConfigurationError("heartbeat_interval must be positive and below lease_timeout")
        if self.max_tasks_per_child is not None:
            check_int("max_tasks_per_child", self.max_tasks_per_child, 1, 2**31 - 1)
        if self.hostname is not None:
            check_text("hostname", self.hostname, max_bytes=MAX_HOSTNAME_BYTES)
        if self.worker_id:
            check_name("worker_id", self.worker_id)
        if self.metrics_port is not None:
            check_int("metrics_port", self.metrics_port, 0, 65535)
        check_text("metrics_host", self.metrics_host, max_bytes=MAX_HOSTNAME_BYTES)
        for label in ("listen", "tenant_fair", "burst", "metrics_tenants"):
            check_bool(label, getattr(self, label))
        if self.pool == "processes" and not self.app_spec:
            raise ConfigurationError("the processes pool needs the app's import path (-A module:app)")
        if not self.worker_id:
            object.__setattr__(self, "worker_id", make_worker_id(self.hostname))

    @property
    def heartbeat_every(self) -> float:
        """Seconds between heartbeats."""
        return self.heartbeat_interval or self.lease_timeout / 3.0

    @property
    def capacity(self) -> int:
        """Most jobs this worker holds (running plus claimed-but-not-started)."""
        return self.concurrency * self.prefetch_multiplier
