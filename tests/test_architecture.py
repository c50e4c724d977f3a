"""The layering of docs/architecture.md: the engine never reaches for `pgtasks.App`.

The worker, the scheduler, the maintenance services, results, task contexts, tasks,
the enqueue path, the hook specifications and the data layer are typed against the
Protocols of `pgtasks.ports`. Only the application's shell may name the App: the
package root (which exports it), `pgtasks.app` itself, the command line, the web
dashboard, and the loader of ``-A module:attr`` (with ``python -m pgtasks``).

Three checks, from the source and from a fresh interpreter:

* no engine module imports `pgtasks.app`, at run time, inside a function, or under
  ``TYPE_CHECKING``, nor takes ``App`` from the package root;
* the import graph of pgtasks (every import statement, ``TYPE_CHECKING`` ones
  included) has no circle through `pgtasks.app`;
* the engine's packages import without loading `pgtasks.app` (the package root,
  which imports the App for its users, is stood in for, so what is measured is the
  engine's own imports).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pgtasks"

# The application and its shell: these may import the App (paths relative to pgtasks/).
SHELL_FILES = frozenset({"__init__.py", "__main__.py", "app.py", "asgi.py", "loader.py"})
SHELL_DIRS = frozenset({"cli", "contrib", "dashboard", "testing"})

# The engine's packages and modules, imported in a fresh interpreter.
ENGINE_MODULES = (
    "pgtasks.db",
    "pgtasks.maintenance",
    "pgtasks.completion",
    "pgtasks.migrate",
    "pgtasks.worker",
    "pgtasks.scheduler",
    "pgtasks.result",
    "pgtasks.context",
    "pgtasks.task",
    "pgtasks.enqueue",
    "pgtasks.canvas",
    "pgtasks.execution",
    "pgtasks.hookspecs",
    "pgtasks.plugins",
    "pgtasks.ports",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_shell(path: Path) -> bool:
    relative = path.relative_to(PACKAGE)
    return str(relative) in SHELL_FILES or relative.parts[0] in SHELL_DIRS


def _absolute(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name ``from <level dots><target>`` refers to inside ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def _imports(module: str, path: Path, known: set[str]) -> Iterator[tuple[int, str, str]]:
    """(line, imported pgtasks module, how it was written) for every import statement of ``module``.

    ``from X import name`` counts as an import of ``X.name`` when that is a module,
    else of ``X``. Statements under ``TYPE_CHECKING`` and inside functions count too.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "pgtasks" or alias.name.startswith("pgtasks."):
                    yield node.lineno, alias.name, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, is_package, node.level, node.module)
            if source != "pgtasks" and not source.startswith("pgtasks."):
                continue
            for alias in node.names:
                written = f"from {'.' * node.level}{node.module or ''} import {alias.name}"
                candidate = f"{source}.{alias.name}"
                if candidate in known:
                    yield node.lineno, candidate, written
                elif source == "pgtasks" and alias.name == "App":
                    yield node.lineno, "pgtasks.app", written  # the root re-exports it
                else:
                    yield node.lineno, source, written


def _names_app_through_root(path: Path) -> Iterator[int]:
    """Lines that write ``pgtasks.App`` (the package root's re-export) as code."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "App"
            and isinstance(node.value, ast.Name)
            and node.value.id == "pgtasks"
        ):
            yield node.lineno


def _graph() -> dict[str, set[str]]:
    """Module -> the pgtasks modules it imports (every statement, ``TYPE_CHECKING`` included)."""
    modules = _modules()
    known = set(modules)
    return {
        name: {target for _, target, _ in _imports(name, path, known) if target != name}
        for name, path in modules.items()
    }


def test_the_scan_sees_the_package() -> None:
    graph = _graph()
    assert {"pgtasks.app", "pgtasks.worker.worker", "pgtasks.scheduler.service", "pgtasks.result"} <= set(
        graph
    )
    assert "pgtasks.app" in graph["pgtasks"]  # the root imports the App: the scan follows it
    assert "pgtasks.cli" not in graph["pgtasks.app"]


def test_no_engine_module_imports_the_app() -> None:
    modules = _modules()
    known = set(modules)
    offences = []
    for name, path in modules.items():
        if _is_shell(path):
            continue
        where = path.relative_to(PACKAGE.parent)
        offences += [
            f"{where}:{line}: {written}"
            for line, target, written in _imports(name, path, known)
            if target == "pgtasks.app"
        ]
        offences += [f"{where}:{line}: pgtasks.App" for line in _names_app_through_root(path)]
    assert offences == [], "the engine is typed against pgtasks.ports, not the App:\n" + "\n".join(offences)


def _cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A shortest path start -> ... -> start, or None."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for target in sorted(graph.get(module, ())):
                if target == start:
                    return [*paths[module], start]
                if target not in paths:
                    paths[target] = [*paths[module], target]
                    following.append(target)
        frontier = following
    return None


def test_no_import_circle_passes_through_the_app() -> None:
    cycle = _cycle_through(_graph(), "pgtasks.app")
    assert cycle is None, "an import circle through the App: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("module", ENGINE_MODULES)
def test_the_engine_imports_without_the_app(module: str) -> None:
    # The real root imports the App for its users; a stand-in package object lets the
    # engine's own imports be measured (an import of the root's names fails loudly).
    code = (
        "import importlib, json, sys, types\n"
        "root = types.ModuleType('pgtasks')\n"
        f"root.__path__ = [{str(PACKAGE)!r}]\n"
        "sys.modules['pgtasks'] = root\n"
        f"importlib.import_module({module!r})\n"
        "shell = [m for m in sys.modules if m == 'pgtasks.app' or m.startswith('pgtasks.cli')]\n"
        "print(json.dumps(sorted(shell)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []
