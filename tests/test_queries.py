"""The named-query files: every name used exists, every query is used, every statement PREPAREs.

Scans the code of ``pgtasks/`` and of every plugin under ``plugins/`` (whatever has
been added since), so it keeps holding as new services add statements.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import psycopg
import pytest

from pgtasks.errors import ConfigurationError
from pgtasks.sql import QUERIES, parse_queries

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "pgtasks"
PLUGINS = REPO / "plugins"
STORE_METHODS = frozenset({"fetch_one", "fetch_all", "fetch_tuples", "execute", "copy_in", "query"})
PREPARABLE = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE", "WITH", "VALUES"})
UTILITY = frozenset({"COPY", "LISTEN", "UNLISTEN", "CREATE", "ALTER", "DROP", "DO", "SET", "RESET"})
PLACEHOLDER = re.compile(r"%\((\w+)\)s")
NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class QueryFile:
    """One named-query file and the code package it belongs to."""

    path: Path
    package: Path
    queries: Mapping[str, str]


def _query_files() -> list[QueryFile]:
    files = [QueryFile(CORE / "sql" / "queries.sql", CORE, QUERIES)]
    for path in sorted(PLUGINS.glob("*/sql/*.sql")):
        text = path.read_text(encoding="utf-8")
        files.append(QueryFile(path, path.parent.parent, parse_queries(text, source=str(path))))
    return files


def _code_files(root: Path) -> Iterator[Path]:
    yield from sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


@dataclass(frozen=True)
class Use:
    name: str
    where: str


def _store_calls(path: Path) -> Iterator[Use]:
    """Names passed as a string literal to a store method, or used as ``QUERIES["..."]``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        literal: ast.expr | None = None
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in STORE_METHODS and node.args:
                literal = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            literal = node.slice if node.value.id == "QUERIES" else None
        if (
            isinstance(literal, ast.Constant)
            and isinstance(literal.value, str)
            and NAME.fullmatch(literal.value)
        ):
            yield Use(literal.value, f"{path.relative_to(REPO)}:{literal.lineno}")


def _string_literals(root: Path) -> set[str]:
    found: set[str] = set()
    for path in _code_files(root):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return found


def _statement(text: str) -> str:
    """The statement without its comment lines."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--")).strip()


def _keyword(text: str) -> str:
    return _statement(text).split(None, 1)[0].upper().lstrip("(")


def _to_prepared(text: str) -> tuple[str, int]:
    """``%(name)s`` placeholders to ``$n`` (same name, same number), ``%%`` to ``%``."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${numbers.setdefault(match.group(1), len(numbers) + 1)}"

    statement = _statement(text)
    if not PLACEHOLDER.search(statement):
        return statement, 0  # run without parameters: % is literal
    return PLACEHOLDER.sub(number, statement).replace("%%", "%"), len(numbers)


FILES = _query_files()


def test_the_core_file_is_read_only_and_not_empty() -> None:
    assert isinstance(QUERIES, MappingProxyType)
    assert len(QUERIES) > 10
    with pytest.raises(TypeError):
        QUERIES["x"] = "SELECT 1"  # type: ignore[index]


@pytest.mark.parametrize("qfile", FILES, ids=[str(f.path.relative_to(REPO)) for f in FILES])
def test_every_query_says_what_it_is_for(qfile: QueryFile) -> None:
    for name, text in qfile.queries.items():
        first = text.lstrip().splitlines()[0]
        assert first.startswith("-- ") and len(first) > 10, f"{name}: first line must say what it is for"
        assert _statement(text), name


def test_every_name_the_code_uses_exists() -> None:
    missing: list[str] = []
    uses = 0
    for qfile in FILES:
        known = set(qfile.queries) | set(QUERIES)  # a plugin may run core statements too
        roots = [qfile.package]
        for root in roots:
            for path in _code_files(root):
                for use in _store_calls(path):
                    uses += 1
                    if use.name not in known:
                        missing.append(f"{use.where}: {use.name!r}")
    assert uses > 20, "the scan found the store calls"
    assert missing == [], "names used in code but missing from their query file"


def test_every_query_in_a_file_is_used_somewhere_in_code() -> None:
    literals = _string_literals(CORE) | _string_literals(PLUGINS)
    unused = [
        f"{qfile.path.relative_to(REPO)}: {name}"
        for qfile in FILES
        for name in qfile.queries
        if name not in literals
    ]
    assert unused == [], "queries no code refers to:\n" + "\n".join(unused)


def test_every_statement_is_preparable_or_a_known_utility() -> None:
    for qfile in FILES:
        for name, text in qfile.queries.items():
            assert _keyword(text) in PREPARABLE | UTILITY, f"{qfile.path.name}:{name}: {_keyword(text)}"


def _apply_plugin_migrations(conn: psycopg.Connection[Any], package: Path) -> None:
    for path in sorted((package / "migrations").glob("[0-9][0-9][0-9][0-9]_*.sql")):
        conn.execute(path.read_text(encoding="utf-8").encode())


@pytest.mark.parametrize("qfile", FILES, ids=[str(f.path.relative_to(REPO)) for f in FILES])
def test_every_statement_prepares_against_a_migrated_database(
    qfile: QueryFile, conn: psycopg.Connection[Any]
) -> None:
    if qfile.package != CORE:
        _apply_plugin_migrations(conn, qfile.package)
    failures: list[str] = []
    prepared = 0
    for index, (name, text) in enumerate(sorted(qfile.queries.items())):
        if _keyword(text) not in PREPARABLE:
            continue
        statement, _ = _to_prepared(text)
        try:
            conn.execute(f"PREPARE pgtasks_check_{index} AS {statement}".encode())
            conn.execute(f"DEALLOCATE pgtasks_check_{index}".encode())
            prepared += 1
        except psycopg.Error as exc:
            failures.append(f"{name}: {str(exc).strip().splitlines()[0]}")
    assert failures == []
    assert prepared > 0


def test_placeholder_conversion() -> None:
    text = "-- doc\nSELECT %(a)s, %(b)s, %(a)s::text LIKE 'x%%'"
    assert _to_prepared(text) == ("SELECT $1, $2, $1::text LIKE 'x%'", 2)
    assert _to_prepared("SELECT '<%(text,text)'") == ("SELECT '<%(text,text)'", 0)


def test_every_job_update_names_the_status_it_expects() -> None:
    """STYLE.md: a stale writer changes nothing, because each UPDATE checks the status."""
    for qfile in FILES:
        for name, text in qfile.queries.items():
            statement = _statement(text)
            for match in re.finditer(r"\bUPDATE\s+pgtasks\.jobs\b", statement):
                rest = statement[match.end() :]
                where = re.search(r"\bWHERE\b(.*?)(?:\bRETURNING\b|$)", rest, re.DOTALL)
                assert where is not None, f"{name}: UPDATE without WHERE"
                assert re.search(r"\bstatus\b", where.group(1)), f"{name}: WHERE does not check status"


def test_parse_queries_refuses_duplicates_and_empty_blocks() -> None:
    with pytest.raises(ConfigurationError, match="defined twice"):
        parse_queries("-- name: a\n-- x\nSELECT 1;\n-- name: a\n-- y\nSELECT 2;")
    with pytest.raises(ConfigurationError, match="no statement"):
        parse_queries("-- name: a\n-- only a comment\n-- name: b\n-- x\nSELECT 1;")
    parsed = parse_queries("-- name: a\n-- what\nSELECT 1;\n\n-- name: b\n-- what\nSELECT 2;\n")
    assert dict(parsed) == {"a": "-- what\nSELECT 1", "b": "-- what\nSELECT 2"}
