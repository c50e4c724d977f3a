"""``pgtasks rls``: row-level security mode (`pgtasks.isolation`, docs/security.md)."""

from __future__ import annotations

import click

from pgtasks import isolation
from pgtasks.cli.common import AppLoader, confirm, confirm_options, new_console, new_table, shown
from pgtasks.cli.jsonout import echo_json

__all__ = ["rls_group"]


@click.group("rls")
def rls_group() -> None:
    """Row-level security mode: PostgreSQL keeps tenants apart (docs/security.md)."""


@rls_group.command("enable")
@click.option(
    "--fleet-role",
    "fleet_roles",
    multiple=True,
    metavar="ROLE",
    help="A role that runs workers, schedulers or operator commands and sees every "
    "tenant's rows (repeatable; default: the role this command connects as).",
)
@click.pass_obj
def enable_command(loader: AppLoader, fleet_roles: tuple[str, ...]) -> None:
    """Enable the mode on every table with a tenant column (idempotent; run it again
    to change the fleet roles). Run as the tables' owner."""
    tables = isolation.enable(loader.get().stores, fleet_roles)
    click.echo(f"row-level security on for {len(tables)} tables: {shown(', '.join(tables))}")


@rls_group.command("disable")
@confirm_options
@click.pass_obj
def disable_command(loader: AppLoader, yes: bool, dry_run: bool) -> None:
    """Drop the mode's policies: tenant handles still scope their statements, but
    PostgreSQL no longer enforces it."""
    stores = loader.get().stores
    tables = [s.table for s in isolation.status(stores) if s.enabled]
    if dry_run:
        click.echo(f"would disable row-level security on: {shown(', '.join(tables)) or '(none)'}")
        return
    confirm(f"Disable row-level security on {len(tables)} tables?", yes=yes)
    isolation.disable(stores)
    click.echo(f"row-level security off for {len(tables)} tables")


@rls_group.command("grant")
@click.argument("role")
@click.pass_obj
def grant_command(loader: AppLoader, role: str) -> None:
    """Grant ROLE, a tenant-facing role (not a fleet role, not a superuser), what
    tenant handles need; the policies choose its rows."""
    tables = isolation.grant_tenant_role(loader.get().stores, role)
    click.echo(f"granted {shown(role)} on {len(tables)} tables: {shown(', '.join(tables))}")


@rls_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array, one object per table.")
@click.pass_obj
def status_command(loader: AppLoader, as_json: bool) -> None:
    """The mode's state on each tenant table (exit status 3 when it is off on any)."""
    states = isolation.status(loader.get().stores)
    if as_json:
        rows = [
            {
                "table": s.table,
                "enabled": s.enabled,
                "forced": s.forced,
                "tenant_policy": s.tenant_policy,
                "fleet_roles": list(s.fleet_roles),
            }
            for s in states
        ]
        echo_json(rows)  # a role's name may hold what acts on a terminal: written as \u escapes
    else:
        table = new_table("table", "row-level security", "fleet roles")
        for s in states:
            on = s.enabled and s.forced and s.tenant_policy
            table.add_row(s.table, "on" if on else "off", ", ".join(s.fleet_roles) or "-")
        new_console().print(table)
    if not isolation.is_enabled(states):
        raise SystemExit(3)
