"""The public surface matches its documentation: exported names, errors, options, settings."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pgtasks
from pgtasks import errors
from pgtasks.flow import FLOW_OPTIONS
from pgtasks.settings import Settings
from pgtasks.task import ENQUEUE_OPTIONS, TaskOptions

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _section(path: Path, heading: str) -> str:
    """The text of a ``## heading`` section, up to the next heading of the same or higher level."""
    text = path.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^#{{1,2}} |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"{path.name} has no '## {heading}' section"
    return match.group(1)


def _table_names(text: str) -> list[str]:
    """First-column backticked names of a markdown table: ``| `name` | ...``."""
    return re.findall(r"^\|\s*`([^`]+)`\s*\|", text, re.MULTILINE)


def test_all_is_sorted_and_complete() -> None:
    assert pgtasks.__all__ == sorted(pgtasks.__all__)
    assert len(set(pgtasks.__all__)) == len(pgtasks.__all__)
    for name in pgtasks.__all__:
        assert hasattr(pgtasks, name), name


def test_all_matches_the_documented_api() -> None:
    documented = re.findall(r"^- `([^`]+)` —", _section(DOCS / "tasks.md", "API reference"), re.MULTILINE)
    assert documented == sorted(documented), "keep the documented list sorted like __all__"
    assert documented == pgtasks.__all__


def test_public_objects_have_docstrings() -> None:
    for name in pgtasks.__all__:
        obj = getattr(pgtasks, name)
        if name in {"__version__", "hookimpl"}:
            continue
        assert (obj.__doc__ or "").strip(), f"pgtasks.{name} has no docstring"


def test_version_matches_pyproject() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert pgtasks.__version__ == project["version"]


# -- errors -------------------------------------------------------------------------------------


def _error_classes() -> dict[str, type[BaseException]]:
    return {name: getattr(errors, name) for name in errors.__all__}


def test_errors_all_is_sorted_and_every_error_is_under_the_root() -> None:
    assert errors.__all__ == sorted(errors.__all__)
    defined = {
        name
        for name, obj in vars(errors).items()
        if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    }
    assert defined == set(errors.__all__)
    for cls in _error_classes().values():
        assert issubclass(cls, errors.PgtasksError)
        assert (cls.__doc__ or "").strip()


def test_every_error_is_documented_in_the_reference_table() -> None:
    assert sorted(_table_names(_section(DOCS / "errors.md", "Reference"))) == errors.__all__


def _tree(text: str) -> dict[str, str | None]:
    """``{class: parent}`` from a box-drawing hierarchy like the one in pgtasks.errors."""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        match = re.match(r"^([\s│├└─]*?)([A-Z]\w+)(\s|$)", line)
        if not match:
            continue
        depth = len(match.group(1))
        name = match.group(2)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[name] = stack[-1][1] if stack else None
        stack.append((depth, name))
    return parents


def _real_parents() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name, cls in _error_classes().items():
        bases = [b for b in cls.__bases__ if issubclass(b, errors.PgtasksError)]
        out[name] = bases[0].__name__ if bases else None
    return out


def test_hierarchy_drawings_match_the_classes() -> None:
    docstring = (errors.__doc__ or "").split("Hierarchy::", 1)[1].split("\n\n", 2)[1]
    assert _tree(docstring) == _real_parents(), "pgtasks/errors.py docstring"
    doc = (DOCS / "errors.md").read_text(encoding="utf-8")
    drawing = doc.split("```\n", 2)[1]
    assert _tree(drawing) == _real_parents(), "docs/errors.md"


# -- options and settings -----------------------------------------------------------------------


def test_every_task_option_is_documented() -> None:
    fields = [f.name for f in dataclasses.fields(TaskOptions)]
    assert _table_names(_section(DOCS / "tasks.md", "Options")) == fields


def test_every_enqueue_option_is_documented() -> None:
    documented = _table_names(_section(DOCS / "calling.md", "`delay` and `apply_async`"))
    assert sorted(documented) == sorted(ENQUEUE_OPTIONS | FLOW_OPTIONS | {"connection"})


def test_every_setting_and_environment_variable_is_documented() -> None:
    config = DOCS / "configuration.md"
    assert _table_names(_section(config, "Settings")) == [f.name for f in dataclasses.fields(Settings)]
    documented = set(_table_names(_section(config, "Environment variables")))
    used: set[str] = {"DATABASE_URL"}
    for path in (REPO / "pgtasks").rglob("*.py"):
        used |= set(re.findall(r"[\"'](PGTASKS_[A-Z_]+)[\"']", path.read_text(encoding="utf-8")))
    assert used == documented


def test_changelog_follows_keep_a_changelog() -> None:
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog\n")
    assert "https://keepachangelog.com/en/1.1.0/" in text
    assert re.search(r"^## \[Unreleased\]$", text, re.MULTILINE)
    for heading in re.findall(r"^### (.+)$", text, re.MULTILINE):
        assert heading in {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, heading
