"""Loading the app named by ``-A module:attr``, the command line's logging, and `shown`.

`shown` is the one place that makes a value safe for a terminal (control
characters as visible escapes); the commands print through it
(`pgtasks.cli.common`), and so do the log lines of every process the command line
starts, the worker's included.

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
from pgtasks.redaction import RedactingFilter
from pgtasks.validation import HIDDEN_MARKS

__all__ = ["AppLoader", "configure_logging", "load_app", "shown"]


def _visible_escapes() -> dict[int, str]:
    """``str.translate`` table: C0 and C1 control characters, DEL, the bidirectional
    overrides and isolates, and the line and paragraph separators, each to its escape."""
    table = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))}
    table.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})
    table.update({code: f"\\u{code:04x}" for code in HIDDEN_MARKS})
    return table


_VISIBLE = _visible_escapes()
# Log lines keep their line breaks and tabs: a traceback spans lines.
_LOG_VISIBLE = {code: text for code, text in _VISIBLE.items() if chr(code) not in "\n\t"}


def shown(value: object) -> str:
    """``str(value)`` made safe for a terminal: nothing in it acts on the terminal.

    Control characters (``\\x00``-``\\x1f``, DEL, ``\\x80``-``\\x9f``: ANSI escape
    sequences, bells, carriage returns, newlines, tabs) become visible escapes
    (``\\x1b``, ``\\n``), as do the Unicode marks that reorder or hide text
    (bidirectional overrides such as ``\\u202e``, line separators). Everything else,
    rich markup such as ``[red]`` included, is kept as it is: a console from
    `pgtasks.cli.common.new_console` (or ``click.echo``) prints it literally.
    """
    return str(value).translate(_VISIBLE)


class _VisibleFormatter(logging.Formatter):
    """A log formatter whose lines carry no control character but line breaks and tabs:
    a job's error message holding ``\\x1b[2J`` is logged as those characters."""

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).translate(_LOG_VISIBLE)


def configure_logging(level: str) -> None:
    """Log to stderr with time, level and logger name (``level``: DEBUG, INFO, WARNING, ERROR).

    Control characters in a line (from a task's error, a queue name ...) are written as
    escapes, as `shown` does, except line breaks and tabs. Secrets are masked in every
    line, its traceback included (`pgtasks.redaction.RedactingFilter`): a URL's
    password, ``password=...``, ``'api_token': '...'`` and the like.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(_VisibleFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])


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
        read_dsn: ``--read-dsn`` (``PGTASKS_READ_DSN``), or None for the app's own
            ``Settings.read_dsn``: where the read-only commands read (`reader`).
    """

    app_spec: str | None
    dsn: str | None = field(repr=False)  # may hold a password
    plugins: tuple[str, ...]
    read_dsn: str | None = field(default=None, repr=False)  # may hold a password
    _app: pgtasks.App | None = field(default=None, repr=False)
    _reader: pgtasks.App | None = field(default=None, repr=False)

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

    def reader(self) -> pgtasks.App:
        """The app the read-only commands read through (``jobs list`` and ``show``,
        ``queues``, ``workers``, ``metrics``, the dashboard's pages): one on the read DSN (a
        replica: ``--read-dsn``, else the app's ``Settings.read_dsn``) with the
        loaded app's tasks and settings, or the loaded app itself when there is none.
        Nothing writes through it.

        Raises:
            ConfigurationError: the app cannot be loaded, or the read DSN is refused
                as `pgtasks.Settings` refuses a DSN (never echoed).
        """
        app = self.get()
        read_dsn = self.read_dsn or app.settings.read_dsn
        if read_dsn is None:
            return app
        if self._reader is None:
            settings = replace(app.settings, dsn=read_dsn, dsn_source="read_dsn", read_dsn=None)
            reader = pgtasks.App(app.name, settings=settings, load_entry_points=False)
            reader.tasks.update(app.tasks)  # the tasks' redaction rules, for what is shown
            self._reader = reader
        return self._reader

    def close(self) -> None:
        """Close the connections of the apps `get` and `reader` loaded, if any (they reopen on use)."""
        if self._app is not None:
            self._app.close()
        if self._reader is not None:
            self._reader.close()
