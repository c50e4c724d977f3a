"""pgtasks' SQL: the named-query file, its loader, and the numbered migrations.

``pgtasks/sql/queries.sql`` holds every statement pgtasks runs; it is loaded once at
import into the read-only mapping `QUERIES`, which only the data layer
(`pgtasks.db`) reads. ``pgtasks/sql/migrations/NNNN_name.sql`` are the schema
migrations (`read_migrations`). Each block starts
with a ``-- name: entity_verb`` line (the habit of procrastinate's ``queries.sql``
and River's entity-first query names), followed by comment lines saying what the
statement is for, then the statement. A condition two statements must share
exactly (what ``purge`` deletes and what ``purge --dry-run`` counts) is written
once, in a ``-- fragment: name`` block, and a statement takes it in with a line
``-- include: name``: the loader puts the fragment's code in place of that line.
Plugins that own tables ship their own query file in the same format and load it
with `load_queries`.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Final

from pgtasks.errors import ConfigurationError

__all__ = ["QUERIES", "Migration", "load_queries", "parse_queries", "read_migrations"]

_BLOCK_LINE: Final = re.compile(r"^-- (name|fragment): ([a-z][a-z0-9_]*)\s*$", re.MULTILINE)
_INCLUDE_LINE: Final = re.compile(r"^([ \t]*)-- include: ([a-z][a-z0-9_]*)\s*$", re.MULTILINE)
_MIGRATION_FILE: Final = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One migration file: its number, name and SQL text."""

    version: int
    name: str
    sql: str


def read_migrations(package: str, directory: str, *, owner: str = "pgtasks") -> list[Migration]:
    """The ``NNNN_name.sql`` files in ``package``'s ``directory``, in version order.

    Args:
        package: importable package holding the folder (``"pgtasks.sql"`` for pgtasks'
            own, a plugin's package for its tables).
        directory: folder inside the package.
        owner: who ships them, for error messages.

    Raises:
        ConfigurationError: the folder is missing or two files share a version.
    """
    try:
        entries = list(resources.files(package).joinpath(directory).iterdir())
    except (ImportError, FileNotFoundError, NotADirectoryError) as exc:
        raise ConfigurationError(f"{owner}: no migrations folder {package}/{directory}: {exc}") from exc
    found: dict[int, Migration] = {}
    for entry in entries:
        match = _MIGRATION_FILE.match(entry.name)
        if not match:
            continue
        version = int(match.group(1))
        if version in found:
            raise ConfigurationError(f"{owner}: two migrations with version {version}")
        found[version] = Migration(version, match.group(2), entry.read_text(encoding="utf-8"))
    return [found[v] for v in sorted(found)]


def parse_queries(text: str, *, source: str = "<sql>") -> MappingProxyType[str, str]:
    """Split a named-query file into ``{name: statement}``.

    A ``-- fragment: name`` block holds a piece of SQL (a condition) that
    statements share: each ``-- include: name`` line of a statement is replaced
    by the fragment's code, indented as that line. Fragments are not statements
    and are not in the mapping.

    Args:
        text: the file's contents.
        source: file name used in error messages.

    Returns:
        A read-only mapping; statements keep their comment lines and lose the
        trailing semicolon.

    Raises:
        ConfigurationError: a name appears twice, a block has no statement, a
            statement includes an unknown fragment, or a fragment is never included.
    """
    queries: dict[str, str] = {}
    fragments: dict[str, str] = {}
    matches = list(_BLOCK_LINE.finditer(text))
    for index, match in enumerate(matches):
        kind, name = match.group(1), match.group(2)
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip()
        code = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("--"))
        if not code.strip():
            raise ConfigurationError(f"{source}: {kind} {name!r} has no statement")
        if name in queries or name in fragments:
            raise ConfigurationError(f"{source}: query {name!r} is defined twice")
        if kind == "fragment":
            fragments[name] = textwrap.dedent(code).strip().rstrip(";")
        else:
            queries[name] = body.rstrip().rstrip(";")
    included: set[str] = set()

    def expand(include: re.Match[str]) -> str:
        indent, fragment = include.group(1), include.group(2)
        if fragment not in fragments:
            raise ConfigurationError(f"{source}: unknown fragment {fragment!r} included")
        included.add(fragment)
        return textwrap.indent(fragments[fragment], indent)

    queries = {name: _INCLUDE_LINE.sub(expand, body) for name, body in queries.items()}
    unused = sorted(set(fragments) - included)
    if unused:
        raise ConfigurationError(f"{source}: fragment(s) never included: {', '.join(unused)}")
    return MappingProxyType(queries)


def load_queries(path: Path | str) -> MappingProxyType[str, str]:
    """Load a named-query file from disk (plugins use this for their own tables)."""
    path = Path(path)
    return parse_queries(path.read_text(encoding="utf-8"), source=str(path))


QUERIES: Final = parse_queries(
    resources.files("pgtasks.sql").joinpath("queries.sql").read_text(encoding="utf-8"),
    source="pgtasks/sql/queries.sql",
)
