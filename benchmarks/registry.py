"""Which systems the harness knows, and how their adapters are found.

A system named ``x`` is the module ``benchmarks.systems.x_system`` defining ``SYSTEM``
(a SystemSpec) and ``DRIVER``. A known name whose module does not exist (``pgtasks``
until its adapter is written) is skipped with the note "adapter not present".
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from benchmarks.systems.base import SystemSpec

KNOWN_SYSTEMS = ("raw", "procrastinate", "pgqueuer", "celery", "pgtasks")
REFERENCE = "raw"
SUBJECT = "pgtasks"


@dataclass(frozen=True, slots=True)
class Adapter:
    """A loadable system: its spec and the module its driver runs as."""

    spec: SystemSpec
    module: str


def module_name(name: str) -> str:
    """Dotted module of system ``name``'s adapter."""
    return f"benchmarks.systems.{name}_system"


def load(name: str) -> Adapter | None:
    """The adapter of ``name``, or None when its module file does not exist.

    Raises ValueError for a name that is not a valid identifier and AttributeError
    or TypeError when the module lacks a proper ``SYSTEM``.
    """
    if not name.isidentifier():
        raise ValueError(f"not a system name: {name!r}")
    module = module_name(name)
    if importlib.util.find_spec(module) is None:
        return None
    spec = importlib.import_module(module).SYSTEM
    if not isinstance(spec, SystemSpec):
        raise TypeError(f"{module}.SYSTEM is not a SystemSpec")
    return Adapter(spec=spec, module=module)
