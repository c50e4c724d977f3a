"""`WorkerStore`: the registry of running workers (``pgtasks.workers``), one method per named query."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from pgtasks.db.database import Database, Now, Row

__all__ = ["WorkerInfo", "WorkerStore", "worker_database"]


def worker_database(
    dsn: str, *, max_size: int, prepare_threshold: int | None, worker_id: str | None = None
) -> Database:
    """A `Database` for a worker process (the worker and its pool's children).

    Its connections run ``worker_session_setup``: generic plans (the claim would be
    planned again on every execution), no sequential scans (a plan kept from a run on
    an empty queue must not read the whole table once it fills) and no JIT; its
    queries are prepared at their first use on a connection (`Database`'s
    ``prepare_at_first_use``).

    Args:
        dsn: the database. max_size: most pooled connections.
        prepare_threshold: psycopg's server-side prepare threshold (None: never).
        worker_id: the worker's id: its connections' ``application_name`` is then
            ``pgtasks worker <id>`` (shortened to 63 bytes in its middle; the DSN's own
            ``application_name`` wins, see `Database`), else ``pgtasks``.
    """
    return Database(
        dsn,
        max_size=max_size,
        prepare_threshold=prepare_threshold,
        session="worker_session_setup",
        prepare_at_first_use=True,
        application_name="pgtasks" if worker_id is None else f"pgtasks worker {worker_id}",
    )


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A registered worker as ``worker_list`` shows it.

    Attributes:
        id: ``host:pid:suffix``. host, pid: where it runs.
        queues: the queues it claims from. concurrency: jobs it runs at once.
        pool: ``threads`` or ``processes``.
        started_at, last_seen_at, lease_expires_at: its registration and lease.
        stopping: it is draining. expired: its lease has run out (it is lost).
        running: jobs whose body it runs (``running``, started).
        claimed: jobs it holds claimed ahead, not started (``running``, ``started_at`` NULL).
    """

    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    pool: str
    started_at: dt.datetime
    last_seen_at: dt.datetime
    lease_expires_at: dt.datetime
    stopping: bool
    expired: bool
    running: int
    claimed: int = 0

    @classmethod
    def of(cls, r: Row) -> WorkerInfo:
        """The worker of a row of ``worker_list`` or ``overview_workers``."""
        return cls(
            id=str(r["id"]),
            host=str(r["host"]),
            pid=int(r["pid"]),
            queues=tuple(r["queues"]),
            concurrency=int(r["concurrency"]),
            pool=str(r["pool"]),
            started_at=r["started_at"],
            last_seen_at=r["last_seen_at"],
            lease_expires_at=r["lease_expires_at"],
            stopping=bool(r["stopping"]),
            expired=bool(r["expired"]),
            running=int(r["running"]),
            claimed=int(r["claimed"]),
        )

    @property
    def state(self) -> str:
        """``alive``, ``stopping`` or ``expired``."""
        return "expired" if self.expired else ("stopping" if self.stopping else "alive")


class WorkerStore:
    """Typed access to the workers table.

    Args:
        database: the `Database` that runs the statements.
    """

    def __init__(self, database: Database) -> None:
        self.database = database

    def register(
        self,
        *,
        id: str,
        host: str,
        pid: int,
        queues: Sequence[str],
        concurrency: int,
        pool: str,
        lease_timeout: float,
        now: Now = None,
    ) -> dt.datetime:
        """Register (or register again) a worker with a lease of ``lease_timeout`` seconds;
        returns the database clock at the write (`pgtasks.worker.dbtime`)."""
        params = {
            "id": id, "host": host, "pid": pid, "queues": list(queues), "concurrency": concurrency,
            "pool": pool, "lease_timeout": lease_timeout, "now": now,
        }  # fmt: skip
        row = self.database.fetch_one("worker_register", params)
        assert row is not None  # an INSERT without ON CONFLICT returns its row
        clock: dt.datetime = row["clock"]
        return clock

    def heartbeat(self, *, id: str, stopping: bool, now: Now = None) -> dt.datetime | None:
        """Extend the worker's lease; returns the database clock at the write, or None if
        its row is gone (it was taken for lost)."""
        row = self.database.fetch_one("worker_heartbeat", {"id": id, "now": now, "stopping": stopping})
        return None if row is None else row["clock"]

    def unregister(self, *, id: str) -> None:
        """Remove the worker's row (at a clean shutdown)."""
        self.database.execute("worker_unregister", {"id": id})

    def list(self) -> list[WorkerInfo]:
        """Every registered worker, by host and start time."""
        return [WorkerInfo.of(r) for r in self.database.fetch_all("worker_list")]

    def prune_expired(self, *, older_than: float, now: Now = None) -> int:
        """Delete rows of workers whose lease expired over ``older_than`` seconds ago and
        that hold no running job; returns how many."""
        return len(self.database.fetch_all("worker_prune_expired", {"now": now, "older_than": older_than}))
