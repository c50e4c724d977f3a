"""Test helpers: wait on conditions, not sleeps."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from pgtasks.worker import Worker

T = TypeVar("T")


def eventually(
    check: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.02, message: str = "condition"
) -> T:
    """Call ``check`` until it returns a truthy value (returned) or ``timeout`` seconds pass.

    Raises:
        AssertionError: the condition never held; the last value is shown.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} not met within {timeout}s (last value: {last!r})")
        time.sleep(interval)


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``node`` of an ``EXPLAIN (FORMAT JSON)`` plan and every node below it, depth first."""
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def on_store_call(worker: Worker, method: str, note: Callable[[str], None]) -> None:
    """Have ``worker.jobs.<method>`` call ``note`` with its query's name (``job_<method>``) first."""
    original = getattr(worker.jobs, method)

    def wrapped(*args: Any, **kw: Any) -> Any:
        note(f"job_{method}")
        return original(*args, **kw)

    setattr(worker.jobs, method, wrapped)
