"""Administrative SQL of the harness: databases per figure, settings, table sizes.

Every figure of every system runs in its own database, cloned from a per-system,
per-repetition template that the system's driver migrated; the clone is dropped
afterwards. Connections are autocommit because CREATE/DROP DATABASE refuse to run in
a transaction block.
"""

from __future__ import annotations

import re
from urllib.parse import quote, urlencode

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

SETTINGS = ("server_version", "shared_buffers", "synchronous_commit", "max_connections", "fsync", "work_mem")

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def with_dbname(dsn: str, dbname: str) -> str:
    """``dsn`` (URL or key=value) pointing at database ``dbname``, as a ``postgresql://`` URL.

    Always a URL because asyncpg (PgQueuer's driver) accepts no key=value DSN.
    """
    params = conninfo_to_dict(make_conninfo(dsn, dbname=dbname))
    user = quote(str(params.pop("user", "")), safe="")
    password = params.pop("password", None)
    host = str(params.pop("host", ""))
    if host.startswith("/"):  # a Unix-socket directory goes in the query string
        params["host"], host = host, ""
    port = params.pop("port", None)
    database = quote(str(params.pop("dbname")), safe="")
    auth = (
        f"{user}:{quote(str(password), safe='')}@" if password is not None else (f"{user}@" if user else "")
    )
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    query = f"?{urlencode({k: str(v) for k, v in params.items()})}" if params else ""
    return f"postgresql://{auth}{netloc}/{database}{query}"


def dbname_of(dsn: str) -> str:
    """The database name a DSN points at (``""`` when it names none)."""
    return str(conninfo_to_dict(dsn).get("dbname", ""))


def _check(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"not a safe database name: {name!r}")
    return name


def create_database(admin_dsn: str, name: str, template: str | None = None) -> str:
    """Create database ``name`` (dropping a leftover of that name first); return its DSN.

    ``template`` clones another database, which must have no open connections.
    Raises psycopg.Error on failure and ValueError on an unsafe name.
    """
    drop_database(admin_dsn, name)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(_check(name)))
        if template is not None:
            query = sql.SQL("{} TEMPLATE {}").format(query, sql.Identifier(_check(template)))
        conn.execute(query)
    return with_dbname(admin_dsn, name)


def drop_database(admin_dsn: str, name: str) -> None:
    """Drop ``name`` if it exists, ending any session still connected to it."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(_check(name))))


def server_settings(dsn: str) -> dict[str, str]:
    """``SHOW`` of each name in :data:`SETTINGS`, plus ``version()``."""
    out: dict[str, str] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in SETTINGS:
            row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
            out[name] = str(row[0]) if row else ""
        row = conn.execute("SELECT version()").fetchone()
        out["version"] = str(row[0]) if row else ""
    return out


def user_tables_bytes(dsn: str) -> int:
    """``pg_total_relation_size`` (table + indexes + TOAST), bytes, of every user table.

    The figure's database holds nothing but the system's own tables, so this is the
    system's footprint.
    """
    query = """
        SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relkind IN ('r', 'p')
          AND n.nspname NOT IN ('pg_catalog', 'information_schema')
          AND n.nspname NOT LIKE 'pg_toast%'
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
        return int(row[0]) if row else 0


def check_reachable(dsn: str) -> None:
    """Raise psycopg.OperationalError when PostgreSQL at ``dsn`` cannot be reached."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        conn.execute("SELECT 1")
