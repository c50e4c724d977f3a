"""The mail index worker: ``mail.index`` and ``pgtasks.delete`` jobs with JSON payloads.

A mail server (the producer) enqueues one ``mail.index`` job per delivered message,
with a JSON payload naming the message file, in the mailbox owner's tenant. A
worker parses the message and writes it to the full-text index of the
``pgtasks_index`` plugin. Deleting a message enqueues ``pgtasks.delete`` (plugin
``pgtasks_delete``).

Messages are keyed by their place in the mailbox (the file name, like an IMAP UID),
not by Message-ID: real mail has messages that share one Message-ID (three of the
corpus's do) and messages with none, and each of them must be kept. The Message-ID
is stored with the entry, so `delete_by_message_id` can find every copy. A file
that is not a mail at all (the corpus's ``broken.eml``) fails its job permanently
with ``MALFORMED_MAIL``; the worker carries on.

A payload names a file, so the task reads it only inside the app's OCR roots
(`pgtasks_ocr.configure`: ``PGTASKS_OCR_ROOTS`` when set, else the corpus's mail folder,
`DEFAULT_ROOT`; `examples.mail_index.run` adds the folder it indexes), as a regular
file and within the OCR plugin's limits. Workers can run this app on their own::

    PGTASKS_OCR_ROOTS=/var/mail pgtasks -A examples.mail_index.app:app worker -Q index
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import pgtasks
import pgtasks_index
import pgtasks_ocr
from pgtasks.context import TaskContext
from pgtasks.errors import ConfigurationError, DatabaseError, Reject
from pgtasks_ocr import extract_mail

__all__ = [
    "DEFAULT_ROOT",
    "INDEX_MAIL",
    "allow_folder",
    "delete_by_message_id",
    "delete_mail",
    "enqueue_mail",
    "make_app",
]

#: The task name producers enqueue by.
INDEX_MAIL: Final = "mail.index"
KIND: Final = "mail"
#: Where messages may be read when ``PGTASKS_OCR_ROOTS`` is not set: the corpus's mail.
DEFAULT_ROOT: Final = Path(__file__).resolve().parents[2].parent / "shared" / "corpus" / "documents" / "mail"


def index_mail(self: TaskContext, payload: Mapping[str, Any]) -> dict[str, Any]:
    """Parse one message and upsert it into the tenant's index.

    Args:
        self: the job's context; the job's tenant is the mailbox owner.
        payload: ``{"path": "/var/mail/.../msg.eml", "key": "msg.eml"}``; ``key``
            defaults to the file name.

    Returns:
        ``{"key", "message_id", "subject", "created"}``.

    Raises:
        Reject: ``MAIL_BAD_PAYLOAD`` (no path, no tenant), ``MALFORMED_MAIL`` (not a
            mail, or nested too deep), ``PATH_NOT_ALLOWED`` (outside the app's OCR
            roots), ``NOT_REGULAR_FILE``, ``FILE_TOO_LARGE`` (past the OCR limits).
        Retry: the file cannot be read yet, or a transient database failure.
    """
    tenant = self.request.tenant
    path = payload.get("path") if isinstance(payload, Mapping) else None
    if not isinstance(path, str) or not path or not tenant:
        raise Reject(f"payload needs a 'path' and the job a tenant, got {payload!r}", code="MAIL_BAD_PAYLOAD")
    key = str(payload.get("key") or Path(path).name)
    config = pgtasks_ocr.ocr_config(self.app)
    try:
        # Reject(MALFORMED_MAIL) when there is no header at all; PATH_NOT_ALLOWED outside the roots
        message = extract_mail(path, roots=config.roots, limits=config.limits)
    except OSError as exc:
        self.retry(exc=exc, countdown=5)
    metadata = {
        "message_id": message.message_id,
        "from": message.sender,
        "date": message.date.isoformat() if message.date else None,
        "attachments": list(message.attachments),
        "path": path,
    }
    try:
        done = pgtasks_index.upsert(
            self.app,
            tenant=tenant,
            kind=KIND,
            key=key,
            title=message.subject or "(no subject)",
            text=message.to_text(),
            metadata=metadata,
        )
    except ConfigurationError as exc:
        raise Reject(str(exc), code="MAIL_BAD_PAYLOAD") from exc
    except DatabaseError as exc:
        if exc.transient:
            self.retry(exc=exc)
        raise
    return {"key": key, "message_id": message.message_id, "subject": message.subject, "created": done.created}


def make_app(dsn: str | None = None) -> pgtasks.App:
    """The mail index app: built-in plugins from their entry points, plus ``mail.index``."""
    application = pgtasks.App("mail-index", dsn=dsn, load_entry_points=True)
    application.register_task(
        index_mail, name=INDEX_MAIL, queue="index", bind=True, max_retries=5, retry_backoff=True
    )
    if not application.settings.ocr_roots:
        pgtasks_ocr.configure(application, roots=[DEFAULT_ROOT])
    return application


def allow_folder(application: pgtasks.App, folder: Path) -> None:
    """Let ``mail.index`` jobs of ``application`` read the messages in ``folder`` too."""
    roots = pgtasks_ocr.ocr_config(application).roots
    pgtasks_ocr.configure(application, roots=[*roots, folder.resolve()])


def enqueue_mail(application: pgtasks.App, tenant: str, path: Path) -> int:
    """Enqueue the indexing of one message file for ``tenant``; returns the job id."""
    payload = {"path": str(path), "key": path.name}
    return application.get_task(INDEX_MAIL).apply_async((payload,), tenant=tenant).id


def delete_mail(application: pgtasks.App, tenant: str, key: str) -> int:
    """Enqueue the removal of one message from ``tenant``'s index; returns the job id."""
    return application.get_task("pgtasks.delete").apply_async((KIND, key), tenant=tenant).id


def delete_by_message_id(application: pgtasks.App, tenant: str, message_id: str) -> list[int]:
    """Enqueue the removal of every message of ``tenant`` with this Message-ID; returns job ids."""
    keys = pgtasks_index.find_keys(application, tenant=tenant, kind=KIND, metadata={"message_id": message_id})
    return [delete_mail(application, tenant, key) for key in keys]


app = make_app()
