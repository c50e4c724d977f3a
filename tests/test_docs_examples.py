"""The documentation's Python examples run against a real database.

A fenced ```python block preceded by ``<!-- test: run -->`` is executed; one preceded
by ``<!-- test: skip (reason) -->`` is not (e.g. it needs a running worker). In a file
that has any marker, every Python block must have one, so no example goes unchecked
by accident. Blocks of one file run in order in one namespace, against a fresh
database named by ``PGTASKS_DSN`` (which is how the examples find it, as users' code
would).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import pgtasks

DOCS = Path(__file__).resolve().parents[1] / "docs"
BLOCK = re.compile(
    r"(?:<!--\s*test:\s*(?P<marker>run|skip)(?P<reason>[^>]*?)\s*-->\s*\n)?```python\n(?P<code>.*?)```",
    re.DOTALL,
)
REQUIRED = ("getting-started.md", "calling.md")


@dataclass(frozen=True)
class Example:
    line: int
    marker: str | None
    reason: str
    code: str


def examples(path: Path) -> list[Example]:
    text = path.read_text(encoding="utf-8")
    return [
        Example(
            line=text.count("\n", 0, m.start("code")) + 1,
            marker=m.group("marker"),
            reason=(m.group("reason") or "").strip(),
            code=m.group("code"),
        )
        for m in BLOCK.finditer(text)
    ]


MARKED = sorted(p.name for p in DOCS.glob("*.md") if any(e.marker for e in examples(p)))


def test_the_tutorial_pages_have_executed_examples() -> None:
    for name in REQUIRED:
        assert name in MARKED, f"docs/{name} has no <!-- test: run --> example"


@pytest.mark.parametrize("name", MARKED)
def test_every_python_block_is_marked(name: str) -> None:
    for ex in examples(DOCS / name):
        assert ex.marker is not None, f"docs/{name}:{ex.line}: mark the block run or skip"
        if ex.marker == "skip":
            assert ex.reason.strip("() "), f"docs/{name}:{ex.line}: say why it is skipped"


@pytest.mark.parametrize("name", MARKED)
def test_examples_run(name: str, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGTASKS_DSN", dsn)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("PGTASKS_DISABLE_PLUGIN_AUTOLOAD", "1")
    namespace: dict[str, Any] = {"__name__": f"docs_{Path(name).stem.replace('-', '_')}"}
    try:
        for ex in examples(DOCS / name):
            if ex.marker != "run":
                continue
            code = compile(ex.code, f"docs/{name}:{ex.line}", "exec")
            exec(code, namespace)
    finally:
        for value in list(namespace.values()):
            if isinstance(value, pgtasks.App):
                value.close()
