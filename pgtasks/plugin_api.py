"""What a plugin may use of pgtasks' inside, in one public module (see docs/plugins.md).

A plugin imports `pgtasks`, this module and the other documented public modules
(`pgtasks.errors`, `pgtasks.states`, `pgtasks.context`, `pgtasks.serialization`), never
the data layer's internals, the SQL package or the command line's modules. The
built-in plugins (``plugins/pgtasks_*``) keep to that, as a test checks.

Tables of its own:
    `PluginMigrations` (returned from ``pgtasks_add_migrations``) names its numbered
    migration files; `package_queries` (or `load_queries`, `parse_queries`) reads
    its named-query file; `NamedQueries` runs those statements on the app's
    connections (``NamedQueries(app.stores.database, queries)``), joining a
    caller's transaction when given ``conn=``, with rows as `Row` dicts. One data
    module of the plugin alone names its queries (``pgtasks_index/store.py``).
State of the fleet:
    `list_workers` gives the registered workers as `WorkerInfo` records.
Commands (``pgtasks_add_commands``):
    a command receives the `AppLoader` as click's ``obj`` (``@click.pass_obj``) and
    calls ``loader.get()`` for the app; `fail` prints a pgtasks error and exits 1;
    `shown` makes a value from the database safe to print (control characters as
    escapes).
Typing:
    hook implementations annotate the app as the hook specification does, with the
    Protocols `pgtasks.App` implements: `TaskRegistry` (``pgtasks_register_tasks``),
    `Engine` (everything), `StoreProvider` (settings and stores, what a data module
    needs). A task's ``self.app`` is an `Engine`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from importlib import resources
from typing import NoReturn

from pgtasks.db.database import AnyConnection, Database, Row
from pgtasks.db.named import NamedQueries
from pgtasks.db.workers import WorkerInfo
from pgtasks.errors import PgtasksError
from pgtasks.hookspecs import hookimpl
from pgtasks.loader import AppLoader, shown
from pgtasks.plugins import PluginMigrations
from pgtasks.ports import Engine, StoreProvider, TaskRegistry
from pgtasks.sql import load_queries, parse_queries

__all__ = [
    "AnyConnection",
    "AppLoader",
    "Database",
    "Engine",
    "NamedQueries",
    "PluginMigrations",
    "Row",
    "StoreProvider",
    "TaskRegistry",
    "WorkerInfo",
    "fail",
    "hookimpl",
    "list_workers",
    "load_queries",
    "package_queries",
    "parse_queries",
    "shown",
]


def package_queries(package: str, resource: str = "sql/queries.sql") -> Mapping[str, str]:
    """The named-query file ``resource`` shipped inside ``package``, as a read-only mapping.

    Args:
        package: the plugin's importable package (e.g. ``"pgtasks_index"``).
        resource: the file's path inside the package, ``/``-separated.

    Raises:
        FileNotFoundError: the package has no such file.
        ConfigurationError: a name appears twice or a block has no statement.
    """
    text = resources.files(package).joinpath(resource).read_text(encoding="utf-8")
    return parse_queries(text, source=f"{package}/{resource}")


def list_workers(app: StoreProvider) -> list[WorkerInfo]:
    """Every registered worker of ``app``'s database, by host and start time.

    Raises:
        DatabaseError: the database cannot be read.
    """
    return app.stores.workers.list()


def fail(exc: PgtasksError) -> NoReturn:
    """Print a pgtasks error on stderr, without a traceback, and exit with status 1.

    Control characters in the message (a value from the database or the command
    line) are shown as escapes (`shown`), as everywhere in the command line.
    """
    import click  # only commands call this: a worker process never loads click

    click.echo(f"Error: {shown(exc)}", err=True)
    sys.exit(1)
