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
Secrets:
    `redact_text` masks secrets in text a plugin sends elsewhere (a URL's password, a
    sensitive ``name=value``), as pgtasks does in its own error records and logs.
Tenants:
    `job_tenant` is the tenant a task may write data for: its job's own
    (``self.request.tenant``); a ``tenant=`` argument naming another fails the job
    with `TENANT_MISMATCH`. `tenant_context` runs every statement of a block in a
    transaction of one tenant, as row-level security mode needs for a tenant's
    database role (docs/security.md).
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
from typing import Final, NoReturn

from pgtasks.context import TaskContext
from pgtasks.db.database import AnyConnection, Database, Row, tenant_context
from pgtasks.db.named import NamedQueries
from pgtasks.db.workers import WorkerInfo
from pgtasks.errors import PgtasksError, Reject
from pgtasks.hookspecs import hookimpl
from pgtasks.loader import AppLoader, shown
from pgtasks.plugins import PluginMigrations
from pgtasks.ports import Engine, StoreProvider, TaskRegistry
from pgtasks.redaction import redact_text
from pgtasks.sql import load_queries, parse_queries
from pgtasks.validation import short

__all__ = [
    "TENANT_MISMATCH",
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
    "echo_json",
    "fail",
    "hookimpl",
    "job_tenant",
    "list_workers",
    "load_queries",
    "package_queries",
    "parse_queries",
    "redact_text",
    "shown",
    "tenant_context",
]


#: Error code of a job failed by `job_tenant`: a ``tenant=`` argument named another
#: tenant than the job's own.
TENANT_MISMATCH: Final = "TENANT_MISMATCH"


def job_tenant(context: TaskContext, tenant: object = None) -> str:
    """The tenant whose data a task may read or write: its job's (``self.request.tenant``).

    Arguments cannot change it: a job enqueued by one tenant (``app.tenant("a")``)
    with ``tenant="b"`` among its arguments would otherwise write into tenant b's
    data. An argument naming the job's own tenant is accepted, as callers passed it
    before the job's tenant was the only source.

    Args:
        context: the job's context (``self`` of a bound task).
        tenant: the task's ``tenant`` argument: None (not given) or the job's tenant.

    Returns:
        The job's tenant.

    Raises:
        Reject: code `TENANT_MISMATCH` (the job fails at once, never retried) when
            ``tenant`` is given and differs from the job's tenant; both are shown
            escaped.
    """
    own = context.request.tenant
    if tenant is not None and tenant != own:
        raise Reject(
            f"tenant argument {short(tenant)} is not the job's tenant {short(own)}: "
            "a task acts only on its job's tenant (enqueue it through app.tenant(...) of that tenant)",
            code=TENANT_MISMATCH,
        )
    return own


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


def echo_json(document: object) -> None:
    """Print ``document`` as the one JSON document of a command's ``--json`` output.

    The shape rules of the built-in commands apply (docs/operations.md, "JSON
    output"): indented JSON on stdout, characters that could act on a terminal
    written as ``\\u`` escapes. Give times as ISO 8601 text with an offset.

    Raises:
        TypeError: a value JSON cannot hold (orjson's rules).
    """
    from pgtasks.cli.jsonout import echo_json as write  # click: loaded only by commands

    write(document)


def fail(exc: PgtasksError) -> NoReturn:
    """Print a pgtasks error on stderr, without a traceback, and exit with status 1.

    Control characters in the message (a value from the database or the command
    line) are shown as escapes (`shown`), as everywhere in the command line.
    """
    import click  # only commands call this: a worker process never loads click

    click.echo(f"Error: {shown(exc)}", err=True)
    sys.exit(1)
