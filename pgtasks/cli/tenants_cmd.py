"""``pgtasks tenants``: tenant weights of the fair claim (docs/flow-control.md)."""

from __future__ import annotations

import click

from pgtasks.cli.common import AppLoader, new_console, new_table, shown
from pgtasks.cli.jsonout import echo_json

__all__ = ["tenants_group"]


@click.group("tenants")
def tenants_group() -> None:
    """Tenant weights: a tenant with due jobs gets a share of claims proportional to its weight."""


@tenants_group.command("weight")
@click.argument("tenant")
@click.argument("weight", type=float)
@click.option(
    "--queue", "-Q", default=None, help="Only in this queue (default: every queue without its own)."
)
@click.pass_obj
def weight_command(loader: AppLoader, tenant: str, weight: float, queue: str | None) -> None:
    """Set TENANT's WEIGHT (a number above 0; a tenant without one weighs 1). Workers
    use it from their next claim on."""
    loader.get().set_tenant_weight(tenant, weight, queue=queue)
    where = f" in queue {shown(queue)}" if queue is not None else ""
    click.echo(f"tenant {shown(tenant)} weighs {weight:g}{where}")


@tenants_group.command("unweight")
@click.argument("tenant")
@click.option("--queue", "-Q", default=None, help="The queue of the weight (default: every queue).")
@click.pass_obj
def unweight_command(loader: AppLoader, tenant: str, queue: str | None) -> None:
    """Drop TENANT's weight: it weighs 1 again."""
    loader.get().set_tenant_weight(tenant, None, queue=queue)
    click.echo(f"tenant {shown(tenant)} weighs 1")


@tenants_group.command("weights")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array, one object per weight.")
@click.pass_obj
def weights_command(loader: AppLoader, as_json: bool) -> None:
    """The weights set, by queue (``*``: every queue) and tenant."""
    weights = loader.get().tenant_weights()
    if as_json:
        echo_json([{"queue": w.queue or None, "tenant": w.tenant, "weight": w.weight} for w in weights])
        return
    table = new_table("queue", "tenant", "weight")
    for w in weights:
        table.add_row(shown(w.queue) if w.queue else "*", shown(w.tenant), f"{w.weight:g}")
    new_console().print(table)
