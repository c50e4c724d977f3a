"""Loading the app named by ``-A module:attr``, and the command line's logging.

Kept free of click: a worker process re-executes itself without the command line
(see `pgtasks.worker.launch`) and the processes pool's children load the app
through here too, so neither carries the CLI library for days.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from dataclasses import dataclass, field, replace

import pgtasks
from pgtasks.errors import ConfigurationError
from pgtasks.plugins import load_module_plugin

__all__ = ["AppLoader", "configure_logging", "load_app"]


def configure_logging(level: str) -> None:
    """Log to stderr with time, level and logger name (``level``: DEBUG, INFO, WARNING, ERROR)."""
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", stream=sys.stderr
    )


def load_app(spec: str) -> pgtasks.App:
    """Import ``module:attr`` (or ``module``, taking its ``app``) and return the `App`.

    The current directory is put on ``sys.path`` first, as Celery does.

    Raises:
        ConfigurationError: the module cannot be imported or has no App there.
    """
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import app module {module_name!r}: {exc}") from exc
    app = getattr(module, attr or "app", None)
    if not isinstance(app, pgtasks.App):
        raise ConfigurationError(f"{spec!r} is not a pgtasks.App (found {type(app).__name__})")
    return app


def _with_dsn(app: pgtasks.App, dsn: str) -> pgtasks.App:
    """Point a loaded app at another DSN (``--dsn`` wins over the app's own)."""
    app.settings = replace(app.settings, dsn=dsn, dsn_source="--dsn")
    return app


@dataclass
class AppLoader:
    """Loads the app lazily, so commands that need none (``migrate --sql``) work without ``-A``.

    Args:
        app_spec: ``module:attr`` from ``-A``, or None.
        dsn: ``--dsn``, or None for the app's own.
        plugins: modules from ``--plugin``, loaded into the app's plugin manager.
    """

    app_spec: str | None
    dsn: str | None
    plugins: tuple[str, ...]
    _app: pgtasks.App | None = field(default=None, repr=False)

    def get(self) -> pgtasks.App:
        """The app from ``-A``, or a bare one on the configured DSN when no ``-A`` was given.

        Raises:
            ConfigurationError: the app or a plugin module cannot be loaded.
        """
        if self._app is None:
            if self.app_spec:
                app = load_app(self.app_spec)
                if self.dsn and app.settings.dsn != self.dsn:
                    app = _with_dsn(app, self.dsn)
            else:
                app = pgtasks.App("pgtasks", dsn=self.dsn)
            for plugin in self.plugins:  # historic hooks reach late plugins by themselves
                load_module_plugin(app.plugin_manager, plugin)
            self._app = app
        return self._app
