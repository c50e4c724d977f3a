"""``pgtasks plugins`` (what is loaded, and from where) and the command group that adds plugins' commands.

Plugins add sub-commands through the ``pgtasks_add_commands`` hook. click looks a
sub-command up before the root command's callback runs, so `PluginCommandGroup`
builds the app from the root options it already parsed (``-A``, ``--dsn``,
``--plugin``) when asked for a name that is neither built in nor lazy (see
`pgtasks.cli.group.LazyGroup`), and asks the app's plugins.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import click

from pgtasks.cli.common import AppLoader, fail, lines, new_console, new_table, shown
from pgtasks.cli.group import LazyGroup
from pgtasks.errors import PgtasksError
from pgtasks.plugins import available_entry_points, describe_plugins

if TYPE_CHECKING:
    from rich.text import Text

__all__ = ["PluginCommandGroup", "plugin_commands", "plugins_command"]

_META_KEY = "pgtasks.plugin_commands"


def plugin_commands(ctx: click.Context) -> dict[str, click.Command]:
    """The commands the app's plugins add (cached on the context), by name.

    Raises:
        PgtasksError: the app or a plugin cannot be loaded.
    """
    root = ctx.find_root()
    cached: dict[str, click.Command] | None = root.meta.get(_META_KEY)
    if cached is not None:
        return cached
    params = root.params
    loader = AppLoader(
        app_spec=params.get("app_spec"), dsn=params.get("dsn"), plugins=tuple(params.get("plugins") or ())
    )
    scratch = click.Group("plugins")
    loader.get().plugin_manager.hook.pgtasks_add_commands.call_historic(kwargs={"cli": scratch})
    root.meta[_META_KEY] = dict(scratch.commands)
    return root.meta[_META_KEY]  # type: ignore[no-any-return]


class PluginCommandGroup(LazyGroup):
    """A lazy click group whose unknown sub-commands are looked up in the app's plugins."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """A built-in (maybe lazy) command, else a plugin's (an app that fails to load is reported)."""
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        try:
            return plugin_commands(ctx).get(cmd_name)
        except PgtasksError as exc:
            raise click.ClickException(f"cannot look up plugin commands: {shown(exc)}") from exc

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Built-in, lazy and plugin commands, sorted (plugins that fail to load are left out here)."""
        names = set(super().list_commands(ctx))
        with contextlib.suppress(PgtasksError):
            names.update(plugin_commands(ctx))
        return sorted(names)


@click.command("plugins")
@click.option("--hooks/--no-hooks", default=True, show_default=True, help="Show the hooks each implements.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of a table.")
@click.pass_obj
def plugins_command(loader: AppLoader, hooks: bool, as_json: bool) -> None:
    """List the loaded plugins, where each comes from, and the entry points installed.

    ``--json``: ``{"plugins": [{"name", "source", "hooks"}], "entry_points": [{"name",
    "value", "dist", "loaded"}], "autoload": bool}``.
    """
    try:
        app = loader.get()
    except PgtasksError as exc:
        fail(exc)
        return
    if as_json:
        from pgtasks.cli.jsonout import echo_json  # this module loads with every command: import on use

        loaded_names = {info.name for info in describe_plugins(app.plugin_manager)}
        echo_json(
            {
                "plugins": [
                    {"name": info.name, "source": info.source, "hooks": list(info.hooks)}
                    for info in describe_plugins(app.plugin_manager)
                ],
                "entry_points": [
                    {"name": ep.name, "value": ep.value, "dist": ep.dist, "loaded": ep.name in loaded_names}
                    for ep in available_entry_points()
                ],
                "autoload": bool(app.settings.load_entry_points),
            }
        )
        return
    console = new_console()
    table = new_table(title=f"plugins of app {app.name!r}")
    table.add_column("name", style="bold")
    table.add_column("from")
    if hooks:
        table.add_column("hooks")
    for info in describe_plugins(app.plugin_manager):
        row: list[str | Text] = [info.name, info.source]
        if hooks:
            row.append(lines(info.hooks))
        table.add_row(*row)
    console.print(table)
    loaded = {info.name for info in describe_plugins(app.plugin_manager)}
    autoload = app.settings.load_entry_points
    for ep in available_entry_points():
        if ep.name not in loaded:
            why = "auto-loading is off" if not autoload else "not loaded"
            console.print(f"entry point {ep.name} = {ep.value} ({ep.dist}): {why}")
    if not autoload:
        console.print("entry-point auto-loading is off (PGTASKS_DISABLE_PLUGIN_AUTOLOAD)")
