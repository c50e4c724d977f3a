"""The project's test fixtures (tests/conftest.py), for the harness's tests beside it.

Only the rootdir's conftest may name plugin modules (``pytest_plugins``), so the
fixtures these tests use are imported from tests/conftest.py instead: a fresh empty
database (`empty_dsn`, on the server of ``PGTASKS_TEST_DSN`` or else the embedded
PostgreSQL) and the check that a test leaves no thread or child process behind.
tests/conftest.py imports its helpers as a top-level module, as the tests do (pytest
puts tests/ on the path only when it collects them), so tests/ goes on the path first.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from tests.conftest import admin_dsn, empty_dsn, no_leaks

__all__ = ["admin_dsn", "empty_dsn", "no_leaks"]
