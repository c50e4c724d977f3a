"""The named-query file, loaded once at import into a read-only mapping.

``pgtasks/sql/queries.sql`` holds every statement pgtasks runs. Each block starts
with a ``-- name: entity_verb`` line (the habit of procrastinate's ``queries.sql``
and River's entity-first query names), followed by comment lines saying what the
statement is for, then the statement. Plugins that own tables ship their own
query file in the same format and load it with `load_queries`.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Final

from pgtasks.errors import ConfigurationError

__all__ = ["QUERIES", "load_queries", "parse_queries"]

_NAME_LINE: Final = re.compile(r"^-- name: ([a-z][a-z0-9_]*)\s*$", re.MULTILINE)


def parse_queries(text: str, *, source: str = "<sql>") -> MappingProxyType[str, str]:
    """Split a named-query file into ``{name: statement}``.

    Args:
        text: the file's contents.
        source: file name used in error messages.

    Returns:
        A read-only mapping; statements keep their comment lines and lose the
        trailing semicolon.

    Raises:
        ConfigurationError: a name appears twice or a block has no statement.
    """
    queries: dict[str, str] = {}
    matches = list(_NAME_LINE.finditer(text))
    for index, match in enumerate(matches):
        name = match.group(1)
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip()
        code = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("--"))
        if not code.strip():
            raise ConfigurationError(f"{source}: query {name!r} has no statement")
        if name in queries:
            raise ConfigurationError(f"{source}: query {name!r} is defined twice")
        queries[name] = body.rstrip().rstrip(";")
    return MappingProxyType(queries)


def load_queries(path: Path | str) -> MappingProxyType[str, str]:
    """Load a named-query file from disk (plugins use this for their own tables)."""
    path = Path(path)
    return parse_queries(path.read_text(encoding="utf-8"), source=str(path))


QUERIES: Final = parse_queries(
    resources.files("pgtasks").joinpath("sql/queries.sql").read_text(encoding="utf-8"),
    source="pgtasks/sql/queries.sql",
)
