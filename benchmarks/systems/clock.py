"""A figure's deadline, and the error of a figure that cannot be measured."""

from __future__ import annotations

import time


class BenchmarkError(Exception):
    """A figure could not be measured (timeout, a worker died, a bad parameter)."""


class Clock:
    """A figure's deadline: ``deadline`` seconds from now; `check` raises `BenchmarkError` past it."""

    def __init__(self, deadline: float) -> None:
        self.end = time.monotonic() + deadline
        self.deadline = deadline

    def check(self, what: str) -> None:
        if time.monotonic() > self.end:
            raise BenchmarkError(f"timeout after {self.deadline:.0f} s while {what}")


class Unsupported(BenchmarkError):
    """A system has no way to run a figure as specified (the report shows it as n/a, with why)."""
