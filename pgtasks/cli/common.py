"""What every command shares: loading the app from ``-A``, logging, error display."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

import pgtasks
from pgtasks.errors import ConfigurationError, PgtasksError
from pgtasks.plugins import load_module_plugin

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = ["AppLoader", "configure_logging", "fail", "load_app", "new_console", "new_table"]


def configure_logging(level: str) -> None:
    """Log to stderr with time, level and logger name."""
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


@dataclass
class AppLoader:
    """Loads the app lazily, so commands that need none (``migrate --sql``) work without ``-A``."""

    app_spec: str | None
    dsn: str | None
    plugins: tuple[str, ...]
    _app: pgtasks.App | None = field(default=None, repr=False)

    def get(self) -> pgtasks.App:
        """The app from ``-A``, or a bare one on the configured DSN when no ``-A`` was given."""
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


def _with_dsn(app: pgtasks.App, dsn: str) -> pgtasks.App:
    """Point a loaded app at another DSN (``--dsn`` wins over the app's own)."""
    from dataclasses import replace

    app.settings = replace(app.settings, dsn=dsn, dsn_source="--dsn")
    return app


def fail(exc: PgtasksError) -> None:
    """Print a pgtasks error without a traceback and exit 1."""
    click.echo(f"Error: {exc}", err=True)
    sys.exit(1)


def new_table(*columns: str, **options: Any) -> Table:
    """A ``rich`` table; rich is imported here, on first use, so a worker process never loads it (~2 MiB)."""
    from rich.table import Table

    return Table(*columns, **options)


def new_console() -> Console:
    """A ``rich`` console on stdout (imported on first use, as `new_table`)."""
    from rich.console import Console

    return Console()
