"""docs/plugins.md agrees with pgtasks/hookspecs.py: every hook, its arguments and its kind."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pgtasks import hookspecs
from pgtasks.plugins import make_plugin_manager

DOC = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"
ENTRY = re.compile(r"^#### `(pgtasks_\w+)\(([^)]*)\)`\n\*kind: ([a-z, ]+)\*", re.MULTILINE)


def _specs() -> dict[str, object]:
    return {name: fn for name, fn in vars(hookspecs).items() if name.startswith("pgtasks_") and callable(fn)}


def _expected_kind(name: str) -> str:
    fn = _specs()[name]
    manager = make_plugin_manager(load_entry_points=False)
    opts: Mapping[str, Any] = manager.parse_hookspec_opts(hookspecs, name) or {}
    if opts.get("historic"):
        return "historic"
    if opts.get("firstresult"):
        return "firstresult, wrapper" if name == "pgtasks_execute_job" else "firstresult"
    if name in hookspecs.ISOLATED_HOOKS:
        return "isolated"
    returns = inspect.signature(fn).return_annotation  # type: ignore[arg-type]
    return "plain" if returns in (None, "None") else "collect"


def test_every_hook_is_documented_with_its_arguments_and_kind() -> None:
    documented = {
        m.group(1): (m.group(2), m.group(3)) for m in ENTRY.finditer(DOC.read_text(encoding="utf-8"))
    }
    assert sorted(documented) == sorted(_specs()), "the hook reference and hookspecs.py list different hooks"
    for name, fn in _specs().items():
        args, kind = documented[name]
        expected_args = ", ".join(inspect.signature(fn).parameters)  # type: ignore[arg-type]
        assert args == expected_args, f"{name}: documented ({args}), spec ({expected_args})"
        assert kind == _expected_kind(name), f"{name}: documented kind {kind!r}"


def test_every_hook_spec_is_documented_in_the_module_too() -> None:
    for name, fn in _specs().items():
        doc = inspect.getdoc(fn) or ""
        for arg in inspect.signature(fn).parameters:  # type: ignore[arg-type]
            assert f"{arg}:" in doc, f"{name}: argument {arg!r} has no line in the docstring"


def test_isolated_hooks_exist() -> None:
    assert set(_specs()) >= hookspecs.ISOLATED_HOOKS
