"""Row-level security mode: PostgreSQL itself keeps tenants apart.

A tenant handle (``app.tenant("acme")``, `pgtasks.tenancy.TenantScope`) already puts
its tenant into every statement it runs. This optional mode adds a second wall, in
the database: row-level security policies on every table of pgtasks' schemas that
has a ``tenant`` column (``pgtasks.jobs``, ``pgtasks.schedules``,
``pgtasks_index.entries``, and a plugin's own). A row is then visible and writable
only in a transaction whose setting ``pgtasks.tenant`` names its tenant, which the
handle sets first in each of its transactions; a transaction that names no tenant
sees no row. The roles that run workers, schedulers and operator commands (the
"fleet") see every row through a second policy.

So a bug in a query, or raw SQL in a tenant's transaction (``acme.connection()``),
cannot read or write another tenant's rows, provided the tenant-facing code
connects as a role outside the fleet, that is neither a superuser nor ``BYPASSRLS``
(PostgreSQL exempts those from every policy). The setting is chosen by whoever runs
SQL: the mode protects against mistakes, not against a tenant who runs arbitrary
SQL as that role. See docs/security.md, "Database-enforced isolation", for the
set-up and its cost.

The mode is switched with ``pgtasks rls enable|disable|status|grant`` or these
functions; `refresh` (run by ``App.migrate``) extends it to tables that migrations
created since it was enabled.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from pgtasks.db import Stores, TableIsolation
from pgtasks.errors import ConfigurationError, DatabaseError
from pgtasks.validation import check_text

__all__ = ["TableIsolation", "disable", "enable", "grant_tenant_role", "is_enabled", "refresh", "status"]

# PostgreSQL truncates longer identifiers (NAMEDATALEN - 1), so a longer role name
# would name another role than the one given.
MAX_ROLE_BYTES = 63


# SQLSTATEs of a database whose pgtasks schema is missing or older than migration 0006:
# invalid_schema_name, undefined_function, undefined_table.
_NOT_MIGRATED = frozenset({"3F000", "42883", "42P01"})


def _role(value: object) -> str:
    return check_text("role", value, max_bytes=MAX_ROLE_BYTES)


@contextmanager
def _plain_errors() -> Iterator[None]:
    """Say what a refusal of the mode's functions means, in PostgreSQL's own first
    line: without the ``LINE``/``CONTEXT`` lines that locate it in pgtasks' SQL and
    PL/pgSQL, and "run pgtasks migrate" when the schema lacks the mode's functions.

    Raises:
        DatabaseError: the same SQLSTATE and transience, the message so shortened.
    """
    try:
        yield
    except DatabaseError as exc:
        if exc.sqlstate in _NOT_MIGRATED:
            raise DatabaseError(
                "row-level security mode needs pgtasks' schema up to migration "
                "0006_row_level_security: run `pgtasks migrate` first",
                sqlstate=exc.sqlstate,
            ) from exc
        diag = getattr(exc.__cause__, "diag", None)
        primary = getattr(diag, "message_primary", None)
        if not primary or primary == str(exc):
            raise
        raise DatabaseError(primary, sqlstate=exc.sqlstate, transient=exc.transient) from exc


def enable(stores: Stores, fleet_roles: Iterable[str] | None = None) -> list[str]:
    """Switch row-level security mode on (again: it is idempotent, and re-running
    replaces the fleet roles).

    Args:
        stores: the app's stores (``app.stores``); the current role must own the tables.
        fleet_roles: roles that see every row (workers, schedulers, operator
            commands); None or empty for the current role alone. Members of a role
            inherit its policies.

    Returns:
        The tables now under the mode, qualified (``pgtasks.jobs``).

    Raises:
        ConfigurationError: a role name that is not a non-empty string without NUL of
            at most 63 bytes (nothing changed).
        DatabaseError: a role does not exist (``undefined_object``), the current role
            does not own a table, or the schema is older than migration 0006
            (nothing changed: one transaction).
    """
    roles = [_role(r) for r in fleet_roles or ()]
    with _plain_errors():
        return stores.isolation.enable(roles or None)


def disable(stores: Stores) -> list[str]:
    """Switch the mode off: drop its policies and disable row-level security.

    Returns:
        The tenant tables, qualified.

    Raises:
        DatabaseError: the current role does not own a table, or the schema is older
            than migration 0006 (nothing changed).
    """
    with _plain_errors():
        return stores.isolation.disable()


def grant_tenant_role(stores: Stores, role: str) -> list[str]:
    """Grant a tenant-facing role what tenant handles need: use of pgtasks' schemas
    and sequences, and SELECT, INSERT and UPDATE on the tenant tables (no DELETE; the
    policies choose the rows). Create the role itself with your usual tooling.

    Returns:
        The tables granted on, qualified.

    Raises:
        ConfigurationError: a bad role name (nothing changed).
        DatabaseError: the role does not exist, the current role may not grant, or
            the schema is older than migration 0006 (nothing changed).
    """
    checked = _role(role)
    with _plain_errors():
        return stores.isolation.grant_tenant_role(checked)


def status(stores: Stores) -> list[TableIsolation]:
    """The mode's state on each tenant table.

    Raises:
        DatabaseError: the schema is older than migration 0006 (the message says to
            run ``pgtasks migrate``), or the database failed.
    """
    with _plain_errors():
        return stores.isolation.status()


def is_enabled(states: Iterable[TableIsolation]) -> bool:
    """Whether the mode is on for every one of these tables (and there is one)."""
    states = list(states)
    return bool(states) and all(s.enabled and s.forced and s.tenant_policy for s in states)


def refresh(stores: Stores) -> list[str]:
    """Extend the mode to every tenant table when it is on for some: tables that
    migrations created after it was enabled (a plugin installed later). Keeps the
    fleet roles already set. Does nothing when the mode is off everywhere.

    Returns:
        The tables now under the mode, or ``[]`` when it is off.

    Raises:
        ConfigurationError: the mode is on but no fleet role is recorded (it was
            edited by hand): enable it again with the fleet roles.
    """
    states = status(stores)
    if not any(s.enabled for s in states):
        return []
    roles = sorted({r for s in states for r in s.fleet_roles})
    if not roles:
        raise ConfigurationError(
            "row-level security is on but no table has a fleet policy; "
            "run `pgtasks rls enable --fleet-role ROLE`"
        )
    return enable(stores, roles)
