"""The named-query files: every name used exists, every query is used, every statement PREPAREs,
and no module outside the data layer names a query.

The data layer is ``pgtasks/db/`` for ``pgtasks/sql/queries.sql``, and for a plugin's
own ``sql/*.sql`` file the plugin's data module (``store.py`` beside its ``sql/``
folder). Every plugin under ``plugins/`` is found by its query files (whatever has
been added since), so the checks keep holding as new services add statements.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator, Mapping
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
EXAMPLES = REPO / "examples"
DATA_LAYER = CORE / "db"
#: The module of a plugin that alone names the queries of its ``sql/`` files.
PLUGIN_DATA_MODULE = "store.py"
# Methods of `pgtasks.db.Database` and `pgtasks.plugin_api.NamedQueries` taking a query name
# first, and a data module's private wrappers of them (``_fetch``).
STORE_METHOD = re.compile(r"_?(fetch\w*|execute|copy_in|query)")
PREPARABLE = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE", "WITH", "VALUES"})
UTILITY = frozenset({"COPY", "LISTEN", "UNLISTEN", "CREATE", "ALTER", "DROP", "DO", "SET", "RESET"})
PLACEHOLDER = re.compile(r"%\((\w+)\)s")
NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class QueryFile:
    """One named-query file, the code package it belongs to, and its data modules."""

    path: Path
    package: Path
    queries: Mapping[str, str]
    data_modules: tuple[Path, ...]


def _query_files() -> list[QueryFile]:
    files = [QueryFile(CORE / "sql" / "queries.sql", CORE, QUERIES, tuple(_code_files(DATA_LAYER)))]
    for path in sorted(PLUGINS.glob("*/sql/*.sql")):
        text = path.read_text(encoding="utf-8")
        package = path.parent.parent
        queries = parse_queries(text, source=str(path))
        files.append(QueryFile(path, package, queries, (package / PLUGIN_DATA_MODULE,)))
    return files


def _code_files(root: Path) -> Iterator[Path]:
    yield from sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _where(path: Path, node: ast.expr) -> str:
    return f"{path.relative_to(REPO)}:{node.lineno}"


@dataclass(frozen=True)
class Use:
    name: str
    where: str


def _store_calls(path: Path) -> Iterator[Use]:
    """Names passed as a string literal to a run-by-name method, as a ``session=`` query
    (argument or default), or used as ``QUERIES["..."]``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        literals: list[ast.expr] = []
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and STORE_METHOD.fullmatch(func.attr) and node.args:
                literals.append(node.args[0])
            literals += [k.value for k in node.keywords if k.arg == "session"]
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            literals += [node.slice] if node.value.id == "QUERIES" else []
        elif isinstance(node, ast.arguments):
            named = [*node.posonlyargs, *node.args][-len(node.defaults) :] if node.defaults else []
            pairs = [
                *zip(named, node.defaults, strict=True),
                *zip(node.kwonlyargs, node.kw_defaults, strict=True),
            ]
            literals += [default for arg, default in pairs if arg.arg == "session" and default is not None]
        for literal in literals:
            value = literal.value if isinstance(literal, ast.Constant) else None
            if isinstance(value, str) and NAME.fullmatch(value):
                yield Use(value, _where(path, literal))


def _string_constants(path: Path) -> Iterator[ast.Constant]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node


def _string_literals(paths: Iterable[Path]) -> set[str]:
    return {str(node.value) for path in paths for node in _string_constants(path)}


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
        known = set(qfile.queries)
        for path in qfile.data_modules:
            for use in _store_calls(path):
                uses += 1
                if use.name not in known:
                    missing.append(f"{use.where}: {use.name!r}")
    assert uses > 20, "the scan found the store calls"
    assert missing == [], "names used in code but missing from their query file"


def test_every_query_in_a_file_is_used_somewhere_in_code() -> None:
    unused = [
        f"{qfile.path.relative_to(REPO)}: {name}"
        for qfile in FILES
        for name in qfile.queries
        if name not in _string_literals(qfile.data_modules)
    ]
    assert unused == [], "queries their data layer never refers to:\n" + "\n".join(unused)


def test_no_module_outside_the_data_layer_names_a_query() -> None:
    """docs/architecture.md: a query name appears as a string only in ``pgtasks/db/`` and,
    for a plugin's own file, in that plugin's data module."""
    names: dict[str, str] = {}
    for qfile in FILES:
        for name in qfile.queries:
            names.setdefault(name, str(qfile.path.relative_to(REPO)))
    data_modules = {path for qfile in FILES for path in qfile.data_modules}
    scanned = 0
    found: list[tuple[str, int, str]] = []
    for root in (CORE, PLUGINS, EXAMPLES):
        for path in _code_files(root):
            if path in data_modules or DATA_LAYER in path.parents:
                continue
            scanned += 1
            found += [
                (str(path.relative_to(REPO)), node.lineno, f"{node.value!r} (a query of {names[node.value]})")
                for node in _string_constants(path)
                if node.value in names
            ]
    assert scanned > 50, "the scan found the modules"
    listing = [f"{where}:{line}: {what}" for where, line, what in sorted(found)]
    assert listing == [], "query names outside the data layer:\n" + "\n".join(listing)


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


def test_a_fragment_is_written_once_and_included_where_named() -> None:
    text = (
        "-- fragment: due\n-- what is due\nstatus = 'queued'\nAND run_at <= now()\n\n"
        "-- name: a\n-- count\nSELECT count(*) FROM t\nWHERE\n    -- include: due\n;\n\n"
        "-- name: b\n-- delete\nDELETE FROM t WHERE\n  -- include: due\n"
    )
    parsed = parse_queries(text)
    assert set(parsed) == {"a", "b"}  # a fragment is no statement
    assert parsed["a"].endswith("WHERE\n    status = 'queued'\n    AND run_at <= now()")
    assert parsed["b"].endswith("DELETE FROM t WHERE\n  status = 'queued'\n  AND run_at <= now()")
    with pytest.raises(ConfigurationError, match="unknown fragment 'missing'"):
        parse_queries("-- name: a\n-- x\nSELECT 1 WHERE\n-- include: missing\n")
    with pytest.raises(ConfigurationError, match="never included: due"):
        parse_queries("-- fragment: due\n-- x\ntrue\n-- name: a\n-- x\nSELECT 1\n")
    with pytest.raises(ConfigurationError, match="defined twice"):
        parse_queries("-- fragment: a\n-- x\ntrue\n-- name: a\n-- x\nSELECT 1 WHERE\n-- include: a\n")


def test_purge_and_its_dry_run_count_share_one_condition() -> None:
    """``pgtasks purge --dry-run`` counts exactly what ``purge`` deletes."""
    condition = "finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s"
    assert condition in QUERIES["job_purge_finished"] and condition in QUERIES["job_purge_count"]
    text = (CORE / "sql" / "queries.sql").read_text(encoding="utf-8")
    assert text.count(condition) == 1  # written once, in the fragment
