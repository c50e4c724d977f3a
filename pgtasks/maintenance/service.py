"""`Service`: the one shape of pgtasks' background services (River's maintenance services).

Each service has a frozen config with named defaults, a ``run_once()`` returning a
small result of counts (what tests call), and start/stop from `Service`. A
transient database error in one tick is logged and retried on the next tick; it
is never fatal. The worker (heartbeat, reaper) and the scheduler use it.
`check_pass_config` refuses the out-of-range values of a config whose passes run in
bounded batches (`HistoryConfig`, `FlowPruneConfig`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from pgtasks.errors import ConfigurationError, DatabaseError

__all__ = ["Service", "check_pass_config"]

log = logging.getLogger("pgtasks.maintenance")


def check_pass_config(
    service: str,
    *,
    interval: object,
    batches: Iterable[tuple[str, object, int]],
    at_least: Iterable[tuple[str, object, float]] = (),
) -> None:
    """Refuse a batched service's config with a value out of range, in this order:
    each of ``at_least`` (seconds, ``>= low``), ``interval`` (seconds, ``> 0``), each
    of ``batches`` (an int in ``1..high``). A bool is not a number here.

    Args:
        service: the config's name in the messages (``"history"``, ``"flow prune"``).
        interval: seconds between the passes of a worker.
        batches: ``(name, value, high)`` of each per-statement limit.
        at_least: ``(name, value, low)`` of each other time (``pause``: low 0).

    Raises:
        ConfigurationError: naming the service, the field and the range.
    """
    for name, value, low in at_least:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low:
            raise ConfigurationError(f"{service} {name} must be a number of seconds >= {low}, got {value!r}")
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
        raise ConfigurationError(f"{service} interval must be a number of seconds > 0, got {interval!r}")
    for name, value, high in batches:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            raise ConfigurationError(f"{service} {name} must be an int in 1..{high}, got {value!r}")


class Service:
    """A thread that calls `run_once` every ``interval`` seconds until stopped.

    Subclasses implement `run_once`. ``DatabaseError`` in a tick is logged (a
    warning for transient errors, an error otherwise) and the next tick runs as
    usual.
    """

    name = "service"

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks = 0
        self.failures = 0

    def run_once(self) -> Any:
        """Do one round of work; return a small result of counts."""
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
                self.ticks += 1
            except DatabaseError as exc:
                self.failures += 1
                level = logging.WARNING if exc.transient else logging.ERROR
                log.log(level, "%s: database error, retrying next tick: %s", self.name, exc)
            except Exception:
                self.failures += 1
                log.exception("%s: unexpected error, retrying next tick", self.name)
            self._stop.wait(self.interval)

    def start(self) -> None:
        """Start the service thread (daemon)."""
        self._thread = threading.Thread(target=self._loop, name=f"pgtasks-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to stop and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
