"""`delete_item` and the ``pgtasks.delete`` task built on it."""

from __future__ import annotations

import logging
import re
from collections import Counter
from typing import Any, Final

from pgtasks.context import TaskContext
from pgtasks.errors import ConfigurationError, DatabaseError, Reject
from pgtasks.plugin_api import AnyConnection, Engine, job_tenant

__all__ = ["DELETE_QUEUE", "DELETE_TASK", "delete_item", "delete_task"]

log = logging.getLogger("pgtasks_delete")

#: Name applications and other plugins enqueue by.
DELETE_TASK: Final = "pgtasks.delete"
#: Default queue (the index's: a delete is ordered after the index jobs before it).
DELETE_QUEUE: Final = "index"

_KIND_RE: Final = re.compile(r"^[a-z][a-z0-9_]*$")


def delete_item(
    app: Engine, *, tenant: str, kind: str, key: str, derived: bool = False, conn: AnyConnection | None = None
) -> dict[str, int]:
    """Remove one item from every plugin that holds data about it, all or nothing.

    Args:
        app: the app whose plugins are asked (a `pgtasks.App`, or a task's ``self.app``).
        tenant: the item's tenant.
        kind: ``"document"``, ``"mail"`` or another lower-case word.
        key: the item's key.
        derived: also remove derived data (the application's choice).
        conn: the caller's connection; the deletion joins its transaction.

    Returns:
        Counts summed over plugins, e.g. ``{"index_entries": 1, "documents": 1}``;
        zeros (or nothing) when the item was already gone.

    Raises:
        ConfigurationError: bad arguments.
        DatabaseError: a plugin's deletion failed; nothing was deleted.
    """
    if not isinstance(tenant, str) or "\x00" in tenant:
        raise ConfigurationError(f"tenant must be a string without NUL, got {tenant!r}")
    if not isinstance(kind, str) or not _KIND_RE.match(kind):
        raise ConfigurationError(f"kind must match [a-z][a-z0-9_]*, got {kind!r}")
    if not isinstance(key, str) or not key or "\x00" in key:
        raise ConfigurationError(f"key must be a non-empty string without NUL, got {key!r}")
    hook = app.plugin_manager.hook.pgtasks_delete_item
    if not hook.get_hookimpls():
        log.warning("no plugin implements pgtasks_delete_item: nothing holds %s %r to delete", kind, key)
        return {}
    totals: Counter[str] = Counter()
    with app.stores.database.transaction(conn) as tx:
        for answer in hook(app=app, tenant=tenant, kind=kind, key=key, derived=derived, conn=tx):
            if answer is None:
                continue
            for name, count in dict(answer).items():
                totals[str(name)] += int(count)
    return dict(totals)


def delete_task(
    self: TaskContext, kind: str, key: str, *, derived: bool = False, tenant: str | None = None
) -> dict[str, Any]:
    """Delete ``(tenant, kind, key)`` everywhere; idempotent.

    Args:
        self: the job's context (bound task).
        kind, key: the item.
        derived: also remove derived data.
        tenant: accepted for callers that pass it, but the item's tenant is always the
            job's own (``self.request.tenant``): None or that same tenant.

    Returns:
        ``{"tenant", "kind", "key", "derived", "removed": {name: count}}``.

    Raises:
        Reject: a ``tenant`` argument naming another tenant than the job's
            (``TENANT_MISMATCH``), bad arguments (``DELETE_BAD_INPUT``) or a permanent
            database error (``DELETE_REFUSED``).
        Retry: a transient database failure.
    """
    owner = job_tenant(self, tenant)
    try:
        removed = delete_item(self.app, tenant=owner, kind=kind, key=key, derived=derived)
    except ConfigurationError as exc:
        raise Reject(f"cannot delete {kind} {key!r}: {exc}", code="DELETE_BAD_INPUT") from exc
    except DatabaseError as exc:
        if exc.transient:
            self.retry(exc=exc)
        raise Reject(f"PostgreSQL refused to delete {kind} {key!r}: {exc}", code="DELETE_REFUSED") from exc
    return {"tenant": owner, "kind": kind, "key": key, "derived": derived, "removed": removed}
