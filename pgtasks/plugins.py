"""Plugin management: pluggy, the ``pgtasks`` entry-point group, and isolated hook calls.

Plugins are found three ways: the ``pgtasks`` entry-point group (third-party
packages and the built-in handler plugins alike), ``--plugin module.path`` on the
CLI (`load_module_plugin`), and ``app.plugin_manager.register(obj)``. Every way
ends in `PluginManager.register`, which refuses a plugin that implements a hook
pgtasks does not specify, so a misspelled hook name fails at start-up.

Plugins that own tables name their migrations with the ``pgtasks_add_migrations``
hook (`PluginMigrations`); `migrate_plugins` applies them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Final

import pluggy

from pgtasks import hookspecs
from pgtasks.db import AnyConnection, Stores
from pgtasks.errors import ConfigurationError
from pgtasks.migrate import apply_each
from pgtasks.sql import Migration, read_migrations

__all__ = [
    "ENTRY_POINT_GROUP",
    "SLOW_HOOK_SECONDS",
    "EntryPointInfo",
    "PluginInfo",
    "PluginManager",
    "PluginMigrations",
    "available_entry_points",
    "call_isolated",
    "check_plugins",
    "describe_plugins",
    "load_module_plugin",
    "make_plugin_manager",
    "migrate_plugins",
]

log = logging.getLogger("pgtasks.plugins")

#: The entry-point group plugins are found in (``[project.entry-points.pgtasks]``).
ENTRY_POINT_GROUP: Final = "pgtasks"
#: A notification hook implementation running longer than this (seconds) is logged.
SLOW_HOOK_SECONDS: Final = 1.0

_HOOK_PREFIX: Final = "pgtasks_"
_PLUGIN_KEY: Final = re.compile(r"^[a-z][a-z0-9_]*$")

#: The distribution of the built-in plugins: theirs may need an extra not installed.
_OWN_DISTRIBUTION: Final = "pgtasks"
#: The extra that installs a library a built-in plugin needs (its top-level module).
EXTRA_OF_MODULE: Final = {
    "PIL": "ocr",
    "pypdfium2": "ocr",
    "prometheus_client": "metrics",
    "opentelemetry": "otel",
    "starlette": "dashboard",
    "jinja2": "dashboard",
}
# Built-in plugins already reported as skipped in this process: one log line each.
_REPORTED_SKIPS: set[str] = set()


class PluginManager(pluggy.PluginManager):
    """pluggy's manager with pgtasks' hook specs and strict registration.

    Differences from ``pluggy.PluginManager``:

    - every routine whose name starts with ``pgtasks_`` is a hook implementation,
      marked with ``@hookimpl`` or not (as pytest treats ``pytest_*`` names);
    - `register` refuses a plugin implementing a hook that has no spec, naming the
      closest spec, and turns pluggy's signature errors into `ConfigurationError`;
    - it remembers where entry-point plugins came from (for ``pgtasks plugins``).
    """

    def __init__(self) -> None:
        super().__init__("pgtasks")
        self.add_hookspecs(hookspecs)
        self.entry_points: dict[int, EntryPointInfo] = {}
        #: Built-in plugins not loaded because a library they need is missing: name -> why.
        self.skipped: dict[str, str] = {}

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        """pluggy's marker options, or default options for an unmarked ``pgtasks_*`` routine."""
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith(_HOOK_PREFIX):
            try:
                attr = getattr(plugin, name)
            except Exception:
                return None
            if inspect.isroutine(attr):
                return {}
        return opts

    def register(self, plugin: Any, name: str | None = None) -> str | None:
        """Register ``plugin`` (a module or object) after checking its hook names.

        Returns:
            The name it is registered under, or None if that name is blocked.

        Raises:
            ConfigurationError: it implements a hook without a spec (e.g. a typo), or
                a hook with arguments the spec does not have.
            ValueError: the plugin or its name is already registered (pluggy).
        """
        label = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        unknown = self._unknown_hooks(plugin)
        if unknown:
            import difflib  # only for this message: keeps it out of every worker process

            specs = sorted(self._spec_names())
            details = []
            for hook in unknown:
                close = difflib.get_close_matches(hook, specs, n=1)
                details.append(f"{hook!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise ConfigurationError(
                f"plugin {label!r} implements unknown hook(s) {', '.join(details)}; "
                "the hooks are listed in pgtasks.hookspecs"
            )
        try:
            return super().register(plugin, name)
        except pluggy.PluginValidationError as exc:
            raise ConfigurationError(f"plugin {label!r}: {exc}") from exc

    def _spec_names(self) -> set[str]:
        return {n for n, caller in vars(self.hook).items() if caller.has_spec()}

    def _unknown_hooks(self, plugin: Any) -> list[str]:
        specs = self._spec_names()
        unknown = []
        for attr in dir(plugin):
            opts = self.parse_hookimpl_opts(plugin, attr)
            if opts is None or opts.get("optionalhook"):
                continue
            if attr not in specs:
                unknown.append(attr)
        return unknown


@dataclass(frozen=True, slots=True)
class EntryPointInfo:
    """Where an entry-point plugin came from: ``name = value`` of distribution ``dist``."""

    name: str
    value: str
    dist: str


def available_entry_points() -> list[EntryPointInfo]:
    """Every plugin declared in the ``pgtasks`` entry-point group, loaded or not, by name."""
    found: dict[str, EntryPointInfo] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        dist_label = f"{dist.metadata['Name']} {dist.version}" if dist is not None else "?"
        found.setdefault(ep.name, EntryPointInfo(ep.name, ep.value, dist_label))
    return [found[n] for n in sorted(found)]


def make_plugin_manager(*, load_entry_points: bool = True) -> PluginManager:
    """A plugin manager with pgtasks' hook specs and, optionally, entry-point plugins.

    Raises:
        ConfigurationError: an entry-point plugin fails to import or implements a
            hook that does not exist.
    """
    pm = PluginManager()
    if load_entry_points:
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if pm.get_plugin(ep.name) is not None or pm.is_blocked(ep.name):
                continue  # the same distribution seen twice on sys.path
            try:
                plugin = ep.load()
            except ModuleNotFoundError as exc:
                reason = _missing_library(ep, exc)
                if reason is None:
                    raise ConfigurationError(
                        f"plugin {ep.name!r} ({ep.value}) of the {ENTRY_POINT_GROUP!r} entry-point group "
                        f"failed to load: {exc}"
                    ) from exc
                pm.skipped[ep.name] = reason
                if ep.name not in _REPORTED_SKIPS:
                    _REPORTED_SKIPS.add(ep.name)
                    log.warning("built-in plugin %s skipped: %s", ep.name, reason)
                continue
            except (ImportError, AttributeError) as exc:
                raise ConfigurationError(
                    f"plugin {ep.name!r} ({ep.value}) of the {ENTRY_POINT_GROUP!r} entry-point group "
                    f"failed to load: {exc}"
                ) from exc
            if pm.is_registered(plugin):
                continue
            pm.register(plugin, name=ep.name)
            dist = ep.dist
            dist_label = f"{dist.metadata['Name']} {dist.version}" if dist is not None else "?"
            pm.entry_points[id(plugin)] = EntryPointInfo(ep.name, ep.value, dist_label)
    return pm


def _missing_library(ep: importlib.metadata.EntryPoint, exc: ModuleNotFoundError) -> str | None:
    """Why a built-in plugin could not load, when the cause is a library of an extra that
    is not installed; None otherwise (a third-party plugin, or a module of the plugin's
    own package missing: a broken install, which stays an error)."""
    dist = ep.dist
    if dist is None or dist.metadata["Name"] != _OWN_DISTRIBUTION or not exc.name:
        return None
    top = exc.name.partition(".")[0]
    if top == ep.module.partition(".")[0] or top == "pgtasks":
        return None
    extra = EXTRA_OF_MODULE.get(top)
    install = f"pip install 'pgtasks[{extra}]'" if extra else f"install {top}"
    return f"it needs {top}, which is not installed ({install})"


def load_module_plugin(pm: pluggy.PluginManager, dotted: str) -> object:
    """Import ``dotted`` (a module, or ``module:attribute``) and register it as a plugin.

    Registering the same object twice is a no-op.

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

    `PluginManager.register` already refuses them; this also covers plugins
    registered on a plain ``pluggy.PluginManager``.

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
    name and the call goes on, so the job's outcome never depends on it. One that
    runs longer than `SLOW_HOOK_SECONDS` is logged as a warning (it is not cut
    short). Wrapper implementations are not supported on notification hooks and
    are skipped.
    """
    caller = getattr(pm.hook, hook_name)
    impls = caller.get_hookimpls()
    if not impls:
        return
    for impl in reversed(impls):  # pluggy calls last-registered first
        if impl.hookwrapper or impl.wrapper:
            log.debug("plugin %s: wrapper on %s skipped", impl.plugin_name, hook_name)
            continue
        started = time.perf_counter()
        try:
            impl.function(**{name: kwargs[name] for name in impl.argnames})
        except Exception:
            log.exception("plugin %s failed in %s; ignored", impl.plugin_name, hook_name)
        elapsed = time.perf_counter() - started
        if elapsed > SLOW_HOOK_SECONDS:
            log.warning(
                "plugin %s took %.1f s in %s; hooks should be cheap", impl.plugin_name, elapsed, hook_name
            )


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """A loaded plugin: its registered name, where it comes from, and its hooks."""

    name: str
    source: str
    hooks: tuple[str, ...]


def describe_plugins(pm: pluggy.PluginManager) -> list[PluginInfo]:
    """Every registered plugin with its origin (entry point, module file) and hooks, by name."""
    entry_points: dict[int, EntryPointInfo] = getattr(pm, "entry_points", {})
    out: list[PluginInfo] = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        ep = entry_points.get(id(plugin))
        if ep is not None:
            source = f"entry point {ep.name} = {ep.value} ({ep.dist})"
        elif inspect.ismodule(plugin):
            source = f"module {plugin.__name__} ({getattr(plugin, '__file__', None) or 'built-in'})"
        else:
            source = f"object of {type(plugin).__module__}.{type(plugin).__qualname__}"
        hooks = tuple(sorted(h.name for h in pm.get_hookcallers(plugin) or []))
        out.append(PluginInfo(name=str(name), source=source, hooks=hooks))
    return sorted(out, key=lambda p: p.name)


# ---------------------------------------------------------------------------
# Plugin migrations
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PluginMigrations:
    """Numbered SQL files a plugin ships for its own tables.

    Attributes:
        plugin: key the applied versions are recorded under in
            ``pgtasks.plugin_migrations`` (lower-case letters, digits, ``_``;
            normally the plugin's package name). Never change it once released.
        package: importable package holding the files (e.g. ``"pgtasks_index"``).
        directory: folder inside the package with the ``NNNN_name.sql`` files, in the
            same format as pgtasks' own (``pgtasks/sql/migrations``).
    """

    plugin: str
    package: str
    directory: str = "migrations"

    def __post_init__(self) -> None:
        if not _PLUGIN_KEY.match(self.plugin):
            raise ConfigurationError(f"plugin migration key must match [a-z][a-z0-9_]*, got {self.plugin!r}")

    def migrations(self) -> list[Migration]:
        """The plugin's migrations in version order.

        Raises:
            ConfigurationError: the folder is missing or two files share a version.
        """
        return read_migrations(self.package, self.directory, owner=f"plugin {self.plugin!r}")


def plugin_migration_sets(pm: pluggy.PluginManager) -> list[PluginMigrations]:
    """What every registered plugin answered to ``pgtasks_add_migrations``, in registration order.

    Raises:
        ConfigurationError: a plugin returned something else, or two share a key.
    """
    sets: list[PluginMigrations] = []
    for answer in reversed(pm.hook.pgtasks_add_migrations()):
        if not isinstance(answer, PluginMigrations):
            raise ConfigurationError(f"pgtasks_add_migrations must return PluginMigrations, got {answer!r}")
        if any(s.plugin == answer.plugin for s in sets):
            raise ConfigurationError(f"two plugins ship migrations under the key {answer.plugin!r}")
        sets.append(answer)
    return sets


def migrate_plugins(stores: Stores, pm: pluggy.PluginManager) -> list[str]:
    """Apply the pending migrations of every plugin; safe to call from many processes.

    Each migration runs in its own transaction under pgtasks' migration advisory
    lock and is recorded in ``pgtasks.plugin_migrations``. pgtasks' own schema
    must be current (call after `pgtasks.migrate.migrate`).

    Returns:
        ``plugin:NNNN_name`` of each migration this call applied.

    Raises:
        ConfigurationError: a plugin's migration set is malformed.
        DatabaseError: a migration failed; its transaction was rolled back.
    """
    ledger = stores.migrations
    applied: list[str] = []
    for mset in plugin_migration_sets(pm):
        key = mset.plugin

        def versions(conn: AnyConnection, key: str = key) -> set[int]:
            return ledger.plugin_applied(plugin=key, conn=conn)

        def record(conn: AnyConnection, migration: Migration, key: str = key) -> None:
            ledger.plugin_record(plugin=key, version=migration.version, name=migration.name, conn=conn)

        done = apply_each(stores, mset.migrations(), applied=versions, record=record, label=f"{key}:")
        applied += [f"{key}:{m.version:04d}_{m.name}" for m in done]
    return applied
