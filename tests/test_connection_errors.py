"""Connection failures say whether retrying can help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgtasks.db import Database
from pgtasks.errors import ConnectionFailed


def test_unreachable_server_is_transient() -> None:
    with pytest.raises(ConnectionFailed) as info:
        Database("postgresql://postgres@127.0.0.1:1/x", connect_timeout=2).connect()
    assert info.value.transient
    assert "127.0.0.1:1" in str(info.value)


def test_missing_database_is_permanent(admin_dsn: str) -> None:
    params = conninfo_to_dict(admin_dsn)
    params["dbname"] = "pgtasks_no_such_database"
    with pytest.raises(ConnectionFailed) as info:
        Database(make_conninfo("", **params)).connect()
    assert not info.value.transient
    assert "pgtasks_no_such_database" in str(info.value)


def test_embedded_status_names_an_unused_data_directory(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pgtasks", "embedded", "status"],
        env={"PGTASKS_EMBEDDED_DIR": str(tmp_path / "pg"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == f"not running (data directory {tmp_path / 'pg'})"
