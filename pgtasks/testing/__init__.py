"""The testing kit: test an app's tasks against a real, isolated PostgreSQL.

* `run_until_idle`: run the due jobs of an app in this process, through the
  worker's own claim, execution and completion code, and say how they ended
  (`RunSummary`);
* `TestClock` (`clock_for`): move time on for countdowns, retry backoff and cron
  without sleeping;
* `eager`: a block in which ``delay`` / ``apply_async`` run the job at once
  (Celery's ``task_always_eager``), after the same validation and serialisation
  as in production; the job is written to the database as usual;
* the pytest plugin (`pgtasks.testing.plugin`, entry point ``pytest11``): the
  fixtures ``pgtasks_app``, ``pgtasks_dsn``, ``pgtasks_clock``, ``pgtasks_eager``
  and their session-scoped helpers.

See docs/testing.md. The names are loaded on first use, so pytest loading the
plugin does not import the worker or the scheduler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgtasks.testing.clock import TestClock, clock_for
    from pgtasks.testing.eager import eager
    from pgtasks.testing.runner import RunSummary, run_until_idle

__all__ = ["RunSummary", "TestClock", "clock_for", "eager", "run_until_idle"]

_LAZY = {
    "RunSummary": "pgtasks.testing.runner",
    "run_until_idle": "pgtasks.testing.runner",
    "TestClock": "pgtasks.testing.clock",
    "clock_for": "pgtasks.testing.clock",
    "eager": "pgtasks.testing.eager",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pgtasks.testing' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
