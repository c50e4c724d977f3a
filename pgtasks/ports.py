"""The narrow interfaces the engine is typed against, instead of `pgtasks.App`.

The worker, the scheduler service, `Schedules`, `AsyncResult`, `TaskContext`,
tasks and the hook specifications name one of these Protocols. `App` implements
all of them; so can a test double or an embedding host, without importing
``pgtasks.app``. See docs/architecture.md for which layer may import which.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pluggy

    from pgtasks.db import Stores
    from pgtasks.result import AsyncResult
    from pgtasks.settings import Settings
    from pgtasks.task import Task

__all__ = ["Engine", "Enqueuer", "Hooks", "StoreProvider", "TaskRegistry"]


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

    def enqueue_batch(self, calls: Iterable[Any], *, connection: Any = None) -> list[AsyncResult]:
        """Write many jobs in one transaction; see `pgtasks.App.enqueue_batch`."""


class Engine(TaskRegistry, Hooks, StoreProvider, Enqueuer, Protocol):
    """Everything the worker and the scheduler need of an application."""

    @property
    def name(self) -> str:
        """The application's name (logs, worker ids)."""
