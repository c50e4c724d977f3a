"""The project's test fixtures (tests/conftest.py), for the harness's tests beside it.

Only the rootdir's conftest may name plugin modules, so the fixtures these tests use
are imported from tests/conftest.py: a migrated database of its own per test (`dsn`)
and the check that a test leaves no thread or child process behind. That conftest
imports its helpers as top-level modules, as pytest does for files under tests/.
"""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parents[2] / "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from tests.conftest import admin_dsn, dsn, no_leaks, template_db  # noqa: E402

__all__ = ["admin_dsn", "dsn", "no_leaks", "template_db"]
