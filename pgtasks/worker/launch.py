"""Starting a worker process from the command line, without keeping the command line.

``pgtasks worker`` parses and checks its options with click and loads the app once,
so a mistake is reported as a usage error. It then replaces its own process image
(``os.execv``: same pid, same open terminal, signals and exit code go to the
worker) with ``python -m pgtasks.worker SPEC``, where ``SPEC`` is this module's
`WorkerLaunch` as JSON. The new image imports the app and the worker but not the
CLI: a worker process lives for days, often several per host, and click with the
command modules is about 1.3 MiB of resident memory per process on CPython 3.11
(peak RSS of a benchmark worker, 2 processes: 78.3 -> 75.6 MiB).

``PGTASKS_WORKER_REEXEC=0`` keeps the worker in the first image (for a debugger or
a profiler attached to the command). The command also runs in place when it was
not started through `pgtasks.cli.main` (click's ``CliRunner``), and on platforms
without ``os.execv`` semantics (Windows). Interpreter options given on the command
line (``python -X dev -m pgtasks``) do not reach the new image; their environment
variables (``PYTHONDEVMODE``, ``PYTHONWARNINGS`` ...) do.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn, Protocol

from pgtasks.errors import ConfigurationError, PgtasksError
from pgtasks.loader import AppLoader, configure_logging
from pgtasks.worker.config import WorkerConfig
from pgtasks.worker.worker import Worker

if TYPE_CHECKING:
    from pgtasks.ports import Engine
    from pgtasks.scheduler.service import SchedulerHost

    class LaunchHost(Engine, SchedulerHost, Protocol):
        """What a launched worker runs for: an `Engine` that can also host the scheduler (``-B``)."""


__all__ = ["REEXEC_ENV", "WorkerLaunch", "main", "reexec", "reexec_allowed", "run"]

#: Environment variable that, set to ``0``, ``false`` or ``no``, keeps a worker in its first image.
REEXEC_ENV = "PGTASKS_WORKER_REEXEC"


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    """Everything a worker process needs to start: app, DSN, plugins, log level, config.

    Args:
        app_spec: ``module:attr`` of the app (``-A``).
        dsn: ``--dsn``, or None for the app's own.
        plugins: ``--plugin`` modules.
        loglevel: root log level name (``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``).
        config: the checked worker configuration (its ``worker_id`` is already set,
            so both images use the same id).
        beat: also run the scheduler in this process (``-B``).
    """

    app_spec: str
    dsn: str | None
    plugins: tuple[str, ...]
    loglevel: str
    config: WorkerConfig
    beat: bool = False

    def to_json(self) -> str:
        """This launch as one JSON object (the ``SPEC`` argument of ``python -m pgtasks.worker``)."""
        return json.dumps(dataclasses.asdict(self))  # config nested; tuples as lists

    @classmethod
    def from_json(cls, text: str) -> WorkerLaunch:
        """Read a launch written by `to_json`.

        Raises:
            ConfigurationError: not such a JSON object, or a value the worker
                configuration rejects.
        """
        try:
            fields = json.loads(text)
            config = fields["config"]
            tuples = {"queues": tuple(config["queues"]), "plugins": tuple(config.get("plugins", ()))}
            fields["config"] = WorkerConfig(**{**config, **tuples})
            fields["plugins"] = tuple(fields["plugins"])
            return cls(**fields)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ConfigurationError(f"not a worker launch spec: {exc}") from None


def run(launch: WorkerLaunch, app: LaunchHost | None = None) -> int:
    """Run the worker until it stops; returns its exit code (see `Worker.run`).

    ``app`` is the already loaded app, or None to load it from the launch. The
    launch's plugin modules go to the worker's configuration too, for the
    children of the processes pool.

    Raises:
        ConfigurationError: the app or a plugin cannot be loaded.
        PgtasksError: the worker could not start (database unreachable ...).
    """
    if app is None:
        app = AppLoader(app_spec=launch.app_spec, dsn=launch.dsn, plugins=launch.plugins).get()
    config = launch.config
    if launch.plugins and not config.plugins:
        config = dataclasses.replace(config, plugins=launch.plugins)
    worker = Worker(app, config)
    if launch.beat:  # the worker's own reaper already recovers lost runs
        from pgtasks.scheduler import SchedulerConfig
        from pgtasks.scheduler import beat as scheduler_beside

        with scheduler_beside(app, SchedulerConfig(reap=False)):
            return worker.run()
    return worker.run()


def reexec_allowed() -> bool:
    """Whether this process may replace its image (POSIX, a known interpreter, not opted out)."""
    opted_out = os.environ.get(REEXEC_ENV, "").strip().lower() in {"0", "false", "no"}
    return os.name == "posix" and bool(sys.executable) and not opted_out


def reexec(launch: WorkerLaunch) -> NoReturn:
    """Replace this process with ``python -m pgtasks.worker SPEC`` (same pid); never returns.

    Buffered output is flushed first: the new image starts with empty buffers.

    Raises:
        OSError: the interpreter could not be executed (this image keeps running).
    """
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "pgtasks.worker", launch.to_json()])


def main(argv: list[str] | None = None) -> int:
    """``python -m pgtasks.worker SPEC``: run the worker a `WorkerLaunch` describes.

    Exit codes as ``pgtasks worker``: 0 after a graceful stop, 1 on a configuration
    or database error at start, 2 when ``SPEC`` is missing, 130 after a forced stop.
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m pgtasks.worker SPEC (started by `pgtasks worker`)", file=sys.stderr)
        return 2
    try:
        launch = WorkerLaunch.from_json(args[0])
        configure_logging(launch.loglevel)
        return run(launch)
    except PgtasksError as exc:
        logging.getLogger("pgtasks").debug("error", exc_info=True)
        print(f"Error: {exc}", file=sys.stderr)
        return 1
