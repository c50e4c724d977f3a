"""Plugin management: pluggy, the ``pgtasks`` entry-point group, and isolated hook calls.

Plugins are found three ways: the ``pgtasks`` entry-point group (third-party
packages and the built-in handler plugins alike), ``--plugin module.path`` on the
CLI (`load_module_plugin`), and ``app.plugin_manager.register(obj)``.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Any

import pluggy

from pgtasks import hookspecs
from pgtasks.errors import ConfigurationError

__all__ = [
    "PluginInfo",
    "call_isolated",
    "check_plugins",
    "describe_plugins",
    "load_module_plugin",
    "make_plugin_manager",
]

log = logging.getLogger("pgtasks.plugins")

ENTRY_POINT_GROUP = "pgtasks"


def make_plugin_manager(*, load_entry_points: bool = True) -> pluggy.PluginManager:
    """A plugin manager with pgtasks' hook specs and, optionally, entry-point plugins.

    Raises:
        ConfigurationError: an entry-point plugin fails to import or implements a
            hook that does not exist.
    """
    pm = pluggy.PluginManager("pgtasks")
    pm.add_hookspecs(hookspecs)
    if load_entry_points:
        try:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        except ImportError as exc:
            raise ConfigurationError(
                f"a plugin of the {ENTRY_POINT_GROUP!r} entry-point group failed to import: {exc}"
            ) from exc
        check_plugins(pm)
    return pm


def load_module_plugin(pm: pluggy.PluginManager, dotted: str) -> object:
    """Import ``dotted`` (a module, or ``module:attribute``) and register it as a plugin.

    Raises:
        ConfigurationError: it cannot be imported, or implements unknown hooks.
    """
    module_name, _, attr = dotted.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        if attr:
            obj = getattr(obj, attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load plugin {dotted!r}: {exc}") from exc
    if pm.is_registered(obj):
        return obj
    pm.register(obj, name=dotted)
    check_plugins(pm)
    return obj


def check_plugins(pm: pluggy.PluginManager) -> None:
    """Refuse hook implementations whose names match no hook spec (e.g. misspelled).

    Raises:
        ConfigurationError: naming the plugin and the unknown hook.
    """
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise ConfigurationError(f"plugin {exc.plugin!r}: {exc}") from exc


def call_isolated(pm: pluggy.PluginManager, hook_name: str, **kwargs: Any) -> None:
    """Call a notification hook so that one failing implementation cannot harm the rest.

    Each implementation runs on its own; an exception is logged with the plugin's
    name and the call goes on. The job's outcome never depends on it.
    """
    caller = getattr(pm.hook, hook_name)
    impls = caller.get_hookimpls()
    if not impls:
        return
    for impl in reversed(impls):  # pluggy calls last-registered first
        try:
            impl.function(**{name: kwargs[name] for name in impl.argnames})
        except Exception:
            log.exception("plugin %s failed in %s; ignored", impl.plugin_name, hook_name)


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """A loaded plugin: its registered name, where it comes from, and its hooks."""

    name: str
    source: str
    hooks: tuple[str, ...]


def describe_plugins(pm: pluggy.PluginManager) -> list[PluginInfo]:
    """Every registered plugin with its origin (entry point, module file) and hooks."""
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    out: list[PluginInfo] = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        dist = dists.get(id(plugin))
        if dist is not None:
            source = f"entry point of {dist.project_name} {dist.version}"
        else:
            source = getattr(plugin, "__file__", None) or type(plugin).__module__
        hooks = tuple(sorted(h.name for h in pm.get_hookcallers(plugin) or []))
        out.append(PluginInfo(name=str(name), source=str(source), hooks=hooks))
    return sorted(out, key=lambda p: p.name)
