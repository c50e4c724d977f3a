"""docs/fuzzing.md stays true to the suite: the modules it lists, its profiles and command."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import settings

from .conftest import REPO

DOC = (REPO / "docs" / "fuzzing.md").read_text(encoding="utf-8")


def test_the_doc_lists_every_fuzz_module_and_no_other() -> None:
    listed = set(re.findall(r"`(test_fuzz_\w+\.py)`", DOC))
    present = {p.name for p in Path(__file__).parent.glob("test_fuzz_*.py")} - {Path(__file__).name}
    assert listed == present


def test_the_doc_names_the_profiles_the_suite_registers() -> None:
    for name in ("ci", "long"):
        settings.get_profile(name)  # raises if the suite does not register it
        assert f"`{name}`" in DOC
    assert "PGTASKS_FUZZ_PROFILE=long pytest -q tests/fuzz" in DOC
    assert ".hypothesis/" in (REPO / ".gitignore").read_text(encoding="utf-8")
