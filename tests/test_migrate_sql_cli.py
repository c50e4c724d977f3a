"""``pgtasks migrate --sql`` prints what ``App.migrate`` would apply, plugins included."""

from __future__ import annotations

import subprocess
import sys

import psycopg
from conftest import REPO

import pgtasks


def test_printed_script_builds_the_whole_schema(empty_dsn: str) -> None:
    script = subprocess.run(
        [sys.executable, "-m", "pgtasks", "--dsn", empty_dsn, "migrate", "--sql"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(script)
        plugins = conn.execute("SELECT plugin FROM pgtasks.plugin_migrations").fetchall()
        index_schema = conn.execute("SELECT to_regnamespace('pgtasks_index') IS NOT NULL").fetchone()
    assert ("pgtasks_index",) in plugins
    assert index_schema == (True,)
    app = pgtasks.App("after-script", dsn=empty_dsn)
    try:
        assert app.migrate() == []  # the script left nothing for migrate to do
    finally:
        app.close()
