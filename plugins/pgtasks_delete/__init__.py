"""Built-in delete plugin: forget a document or mail everywhere, in one transaction.

The ``pgtasks.delete`` task (`DELETE_TASK`, queue ``index``) calls the
``pgtasks_delete_item`` hook of every loaded plugin on one connection inside one
transaction: the index plugin removes the entry, and plugins or applications that
keep derived data (extracted text, thumbnails) remove it when ``derived=True``.
The plugin imports no other plugin; whoever holds data about an item answers the
hook. Deleting twice, or deleting what was never indexed, succeeds with zero counts.
"""

from __future__ import annotations

from .tasks import DELETE_QUEUE, DELETE_TASK, delete_item

__all__ = ["DELETE_QUEUE", "DELETE_TASK", "delete_item"]
