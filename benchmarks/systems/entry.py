"""Entry point of a driver module: ``OP PARAMS_JSON`` in, one JSON line out.

The harness runs a driver as ``python -m benchmarks.systems.<name>_system OP
PARAMS_JSON`` with the interpreter of the system's own virtual environment
(`benchmarks.invoke`), and reads the last line the driver prints on stdout: one JSON
object, ``{"ok": true, "result": {...}}`` or ``{"ok": false, "error": "..."}``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.systems.base import DSN_ENV, REDIS_ENV, Driver, Params
from benchmarks.systems.clock import BenchmarkError, Clock
from benchmarks.systems.ops import FIGURES
from benchmarks.systems.records import RECORD_DIR_ENV


def _versions(driver_cls: type[Driver]) -> dict[str, Any]:
    from importlib import metadata

    packages: dict[str, str] = {}
    for name in driver_cls.spec.packages:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = "not installed"
    return {"python": sys.version.split()[0], "packages": packages}


def main(driver_cls: type[Driver], argv: Sequence[str] | None = None) -> None:
    """Entry point of a driver module: ``OP PARAMS_JSON`` -> one JSON line on stdout.

    Ops: ``versions``, ``setup``, ``enqueue_one``, ``throughput``, ``latency``,
    ``fairness``, ``deep``, and ``worker`` (runs :meth:`Driver.serve_worker`).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    op = args[0]
    raw = json.loads(args[1]) if len(args) > 1 else {}
    if op == "versions":
        _emit({"ok": True, "result": _versions(driver_cls)})
        return
    params = Params(
        dsn=raw.get("dsn") or os.environ.get(DSN_ENV, ""),
        workdir=Path(raw.get("workdir") or os.environ.get(RECORD_DIR_ENV, "/tmp")),
        deadline=float(raw.get("deadline", 600)),
        redis_url=raw.get("redis_url") or os.environ.get(REDIS_ENV, ""),
        args=raw.get("args", {}),
    )
    if op == "worker":
        driver_cls.serve_worker(params)
        return
    try:
        driver = driver_cls(params)
        try:
            clock = Clock(params.deadline)
            if op == "setup":
                driver.reset()
                driver.migrate()
                result: dict[str, Any] = {}
            elif op in FIGURES:
                driver.reset()
                result = FIGURES[op](driver, clock, **params.args)
            else:
                raise BenchmarkError(f"unknown op {op!r}")
        finally:
            driver.close()
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        _emit({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]})
        return
    _emit({"ok": True, "result": result})


def _emit(payload: dict[str, Any]) -> None:
    sys.stdout.write("\n" + json.dumps(payload) + "\n")
    sys.stdout.flush()
