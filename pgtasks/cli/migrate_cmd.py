"""``pgtasks migrate``: create or upgrade the schema, or print it for a DBA."""

from __future__ import annotations

import click

from pgtasks.cli.common import AppLoader, shown
from pgtasks.migrate import migration_sql
from pgtasks.plugins import plugin_migration_sets

__all__ = ["migrate_command"]


@click.command("migrate")
@click.option("--sql", "print_sql", is_flag=True, help="Print the schema SQL instead of applying it.")
@click.pass_obj
def migrate_command(loader: AppLoader, print_sql: bool) -> None:
    """Apply pending migrations (idempotent; safe to run from several hosts at once)."""
    if print_sql:
        sets = plugin_migration_sets(loader.get().plugin_manager)
        click.echo(migration_sql(sets), nl=False)
        return
    applied = loader.get().migrate()
    click.echo(f"applied: {shown(', '.join(applied))}" if applied else "schema is up to date")
