"""Hook implementations of the ``pgtasks_index`` plugin (the entry point ``pgtasks_index``).

- ``pgtasks_register_tasks``: the ``pgtasks.index`` task (queue ``index``);
- ``pgtasks_add_migrations``: the ``pgtasks_index`` schema (``migrations/``);
- ``pgtasks_search``: answers `pgtasks.App.search`;
- ``pgtasks_delete_item``: removes an entry when the ``pgtasks.delete`` task asks;
- ``pgtasks_add_commands``: ``pgtasks search``.
"""

from __future__ import annotations

import click

from pgtasks.plugin_api import AnyConnection, Engine, PluginMigrations, TaskRegistry, hookimpl

from . import api
from .records import SearchHit
from .tasks import INDEX_QUEUE, INDEX_TASK, index_task

__all__: list[str] = []


@hookimpl
def pgtasks_register_tasks(app: TaskRegistry) -> None:
    """Register ``pgtasks.index`` (bound; 5 retries with backoff for transient failures)."""
    app.register_task(
        index_task, name=INDEX_TASK, queue=INDEX_QUEUE, bind=True, max_retries=5, retry_backoff=True
    )


@hookimpl
def pgtasks_add_migrations() -> PluginMigrations:
    """The index tables, in schema ``pgtasks_index``."""
    return PluginMigrations(plugin="pgtasks_index", package="pgtasks_index")


@hookimpl
def pgtasks_search(app: Engine, query: str, tenant: str, limit: int, language: str | None) -> list[SearchHit]:
    """Full-text search (see `pgtasks_index.search`)."""
    return api.search(app, query, tenant=tenant, limit=limit, language=language)


@hookimpl
def pgtasks_delete_item(  # noqa: PLR0917 - pluggy passes hook arguments by name
    app: Engine, tenant: str, kind: str, key: str, derived: bool, conn: AnyConnection
) -> dict[str, int]:
    """Remove the entry (whatever ``derived`` says: the index is never derived data to keep)."""
    return {"index_entries": int(api.remove(app, tenant=tenant, kind=kind, key=key, conn=conn))}


@hookimpl
def pgtasks_add_commands(cli: click.Group) -> None:
    """``pgtasks search QUERY --tenant T``."""
    from .cli import search_command

    cli.add_command(search_command)
