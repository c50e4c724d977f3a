"""The narrow interfaces the engine is typed against, instead of `pgtasks.App`.

The worker, the scheduler service, `Schedules`, `AsyncResult`, `TaskContext`,
tasks and the hook specifications name one of these Protocols. `App` implements
all of them; so can a test double or an embedding host, without importing
``pgtasks.app``. See docs/architecture.md for which layer may import which.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pluggy

    from pgtasks.db import Stores
    from pgtasks.records import Explanation, Job
    from pgtasks.result import AsyncResult
    from pgtasks.settings import Settings
    from pgtasks.task import Signature, Task

__all__ = ["Engine", "Enqueuer", "Hooks", "JobOperations", "ResultSource", "StoreProvider", "TaskRegistry"]


class TaskRegistry(Protocol):
    """The registered tasks, by name."""

    @property
    def tasks(self) -> Mapping[str, Task]:
        """Every registered task by its name."""

    def get_task(self, name: str) -> Task:
        """The task registered under ``name``.

        Raises:
            UnknownTask: none is.
        """

    def register_task(self, fn: Callable[..., Any], **options: Any) -> Task:
        """Register ``fn`` as a task with `pgtasks.task.TaskOptions` fields as ``options``.

        Raises:
            ConfigurationError: an unknown option, a bad value, or a name already
                registered to another function.
        """


class Hooks(Protocol):
    """The plugin manager whose ``hook`` relays calls to the ``pgtasks_*`` hooks."""

    @property
    def plugin_manager(self) -> pluggy.PluginManager:
        """The pluggy plugin manager (`pgtasks.hookspecs`)."""


class StoreProvider(Protocol):
    """The settings and the data layer's stores."""

    @property
    def settings(self) -> Settings:
        """The frozen settings the stores were opened with."""

    @property
    def stores(self) -> Stores:
        """The typed stores over the shared `pgtasks.db.Database` (opened on first use)."""


class Enqueuer(Protocol):
    """Writes jobs: what `Task.apply_async` and `Task.delay_many` call."""

    def enqueue(
        self, task: Task, args: tuple[Any, ...], kwargs: dict[str, Any], options: Mapping[str, Any]
    ) -> AsyncResult:
        """Write one job; see `Task.apply_async` for the options and errors."""

    async def enqueue_async(
        self, task: Task, args: tuple[Any, ...], kwargs: dict[str, Any], options: Mapping[str, Any]
    ) -> AsyncResult:
        """Write one job from asyncio code; see `Task.apply_async_async`."""

    def enqueue_batch(self, calls: Iterable[Any], *, connection: Any = None) -> list[AsyncResult]:
        """Write many jobs in one transaction; see `pgtasks.App.enqueue_batch`."""

    def bulk_apply(self, signatures: Iterable[Signature], *, connection: Any = None) -> list[AsyncResult]:
        """Write the calls of ``task.s(...)`` signatures in one round trip; see `pgtasks.App.bulk_apply`."""


class JobOperations(Protocol):
    """An operator's actions on one job: what `AsyncResult.job` and `AsyncResult.revoke` call."""

    def get_job(self, job_id: int) -> Job:
        """The job record.

        Raises:
            JobNotFound: no job has this id.
        """

    def explain(self, job_id: int) -> Explanation:
        """Why the job is where it is (`pgtasks.jobadmin.explain`); JobNotFound if none."""

    def cancel(self, job_id: int, *, terminate: bool = False) -> bool:
        """Cancel a queued job at once or ask a running one to stop; False if it had finished.

        Raises:
            JobNotFound: no job has this id.
        """


class ResultSource(JobOperations, Protocol):
    """What an `AsyncResult` reads its job through: the job store, the database
    (a dedicated connection to LISTEN on while it waits), job lookup and cancel."""

    @property
    def stores(self) -> Stores:
        """The typed stores over the shared `pgtasks.db.Database`."""


class Engine(TaskRegistry, Hooks, StoreProvider, Enqueuer, JobOperations, Protocol):
    """Everything the worker and the scheduler need of an application."""

    @property
    def name(self) -> str:
        """The application's name (logs, worker ids)."""
