"""Which of a worker's queues no registered task routes to: a likely typo, said once at start.

A worker started with ``-Q emials`` while the task routes to ``emails`` would wait
forever without a word. At start the worker compares its queues with the default
queues of the app's registered tasks (the app's own and the plugins', which
register through ``pgtasks_register_tasks`` before any worker starts) and logs one
warning naming the others, with the closest known names (`difflib`). It still
serves those queues: another app may send jobs there by task name, or a call may
pick the queue with ``queue=``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pgtasks.task import Task

__all__ = ["known_queues", "unrouted_queues_warning"]


def known_queues(tasks: Mapping[str, Task]) -> list[str]:
    """The default queues of ``tasks`` (name -> task), sorted, each once."""
    return sorted({task.options.queue for task in tasks.values()})


def unrouted_queues_warning(queues: Iterable[str], tasks: Mapping[str, Task]) -> str | None:
    """The warning for the queues in ``queues`` that no task of ``tasks`` routes to, or None.

    Args:
        queues: the queues the worker serves (``-Q``).
        tasks: the app's registered tasks by name (`pgtasks.ports.TaskRegistry.tasks`).

    Returns:
        One line naming each such queue (``repr``, so no control character reaches
        a log), a "did you mean" for those close to a known queue, and the known
        queues; None when every queue is some task's.
    """
    known = known_queues(tasks)
    unrouted = [q for q in dict.fromkeys(queues) if q not in known]
    if not unrouted:
        return None
    named = []
    for queue in unrouted:
        close = difflib.get_close_matches(queue, known, n=1)
        named.append(f"{queue!r} (did you mean {close[0]!r}?)" if close else repr(queue))
    listing = ", ".join(repr(q) for q in known) if known else "none: the app registers no task"
    return (
        f"no registered task routes to queue(s) {', '.join(named)}; known queues: {listing}. "
        "The worker serves them anyway (jobs sent there by task name or with queue= still run)."
    )
