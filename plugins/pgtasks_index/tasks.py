"""The ``pgtasks.index`` task: upsert one document or mail into the full-text index."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pgtasks.context import TaskContext
from pgtasks.errors import ConfigurationError, DatabaseError, Reject, SerializationError
from pgtasks.plugin_api import job_tenant

from .api import upsert

__all__ = ["INDEX_QUEUE", "INDEX_TASK", "index_task"]

#: Name other plugins and applications enqueue by (``app.get_task(INDEX_TASK)``).
INDEX_TASK: Final = "pgtasks.index"
#: Default queue of the index task.
INDEX_QUEUE: Final = "index"


def index_task(
    self: TaskContext,
    kind: str,
    key: str,
    text: str,
    *,
    title: str = "",
    language: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    tenant: str | None = None,
) -> dict[str, Any]:
    """Index ``text`` as entry ``(tenant, kind, key)``, replacing what was there.

    Args:
        self: the job's context (bound task).
        kind: ``"document"``, ``"mail"`` or another lower-case word.
        key: the entry's id within tenant and kind.
        text: the text to index.
        title: the entry's title.
        language: text-search configuration (default: the app's index language).
        metadata: JSON object kept with the entry.
        tenant: accepted for callers that pass it, but the entry's tenant is always the
            job's own (``self.request.tenant``, set by ``apply_async(tenant=...)`` or
            ``app.tenant(...)``): None or that same tenant.

    Returns:
        ``{"tenant", "kind", "key", "created", "lexemes", "language"}``.

    Raises:
        Reject: a ``tenant`` argument naming another tenant than the job's
            (``TENANT_MISMATCH``), bad arguments (``INDEX_BAD_INPUT``) or a statement
            PostgreSQL refuses for good (``INDEX_REFUSED``); never retried.
        Retry: a transient database failure (lost connection, deadlock).
    """
    owner = job_tenant(self, tenant)
    try:
        done = upsert(
            self.app,
            tenant=owner,
            kind=kind,
            key=key,
            text=text,
            title=title,
            language=language,
            metadata=metadata,
        )
    except (ConfigurationError, SerializationError) as exc:
        raise Reject(f"cannot index {kind} {key!r}: {exc}", code="INDEX_BAD_INPUT") from exc
    except DatabaseError as exc:
        if exc.transient:
            self.retry(exc=exc)
        raise Reject(f"PostgreSQL refused to index {kind} {key!r}: {exc}", code="INDEX_REFUSED") from exc
    return {
        "tenant": done.tenant,
        "kind": done.kind,
        "key": done.key,
        "created": done.created,
        "lexemes": done.lexemes,
        "language": done.language,
    }
