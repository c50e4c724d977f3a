"""Starting a worker process from the command line, without keeping the command line.

``pgtasks worker`` parses and checks its options with click and loads the app once,
so a mistake is reported as a usage error. It then replaces its own process image
(``os.execv``: same pid, same open terminal, signals and exit code go to the
worker) with ``python -m pgtasks.worker --spec-fd N``, where descriptor ``N`` holds
this module's `WorkerLaunch` as JSON. The new image imports the app and the worker
but not the CLI: a worker process lives for days, often several per host, and click
with the command modules is about 1.3 MiB of resident memory per process on
CPython 3.11 (peak RSS of a benchmark worker, 2 processes: 78.3 -> 75.6 MiB).

The spec holds the DSN, password included, so it never goes into argv: every local
user can read a process's command line (``/proc/PID/cmdline``, ``ps``) for as long
as it runs. `spec_fd` puts it in an anonymous memory file (Linux
``memfd_create(2)``) or, where there is none, in a pipe; the descriptor is
inherited across ``execv`` and `read_spec_fd` reads it to the end and closes it,
so the worker's jobs and the processes pool's children never see it.

``PGTASKS_WORKER_REEXEC=0`` keeps the worker in the first image (for a debugger or
a profiler attached to the command). The command also runs in place when it was
not started through `pgtasks.cli.main` (click's ``CliRunner``), on platforms
without ``os.execv`` semantics (Windows), and when the spec does not fit in a pipe
where there is no ``memfd_create``. Interpreter options given on the command line
(``python -X dev -m pgtasks``) do not reach the new image; their environment
variables (``PYTHONDEVMODE``, ``PYTHONWARNINGS`` ...) do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
from dataclasses import dataclass, field
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


__all__ = [
    "REEXEC_ENV",
    "SPEC_FD_OPTION",
    "WorkerLaunch",
    "main",
    "read_spec_fd",
    "reexec",
    "reexec_allowed",
    "run",
    "spec_fd",
]

#: Environment variable that, set to ``0``, ``false`` or ``no``, keeps a worker in its first image.
REEXEC_ENV = "PGTASKS_WORKER_REEXEC"
#: Option of ``python -m pgtasks.worker`` naming the inherited descriptor that holds the spec.
SPEC_FD_OPTION = "--spec-fd"

_READ_CHUNK = 65536


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
    dsn: str | None = field(repr=False)  # may hold a password
    plugins: tuple[str, ...]
    loglevel: str
    config: WorkerConfig
    beat: bool = False

    def to_json(self) -> str:
        """This launch as one JSON object (what ``python -m pgtasks.worker --spec-fd N`` reads)."""
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


def spec_fd(data: bytes) -> int:
    """An inheritable descriptor to read ``data`` from, positioned at its start.

    Linux: an anonymous memory file (``os.memfd_create`` without ``MFD_CLOEXEC``),
    any size. Elsewhere: the read end of a pipe, with ``data`` already written to
    it; the write end is closed, so the reader sees EOF after ``data``. No other
    user can open either (``/proc/PID/fd`` is the owner's only).

    Args:
        data: the bytes (a `WorkerLaunch` as JSON).

    Raises:
        OSError: no descriptor could be made, or (pipe) ``data`` is larger than the
            pipe's buffer: writing more would block this process, which is also
            the only reader.
    """
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        fd: int = memfd_create("pgtasks-worker-spec", 0)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.lseek(fd, 0, os.SEEK_SET)
            os.set_inheritable(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd
    read_end, write_end = os.pipe()
    try:
        os.set_blocking(write_end, False)
        try:
            written = os.write(write_end, data) if data else 0
        except BlockingIOError:
            written = 0
        if written != len(data):
            raise OSError(f"the worker launch spec ({len(data)} bytes) does not fit in a pipe")
        os.set_inheritable(read_end, True)
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return read_end


def read_spec_fd(fd: int) -> str:
    """Read descriptor ``fd`` to its end as UTF-8 and close it (also on error).

    Raises:
        OSError: ``fd`` is not an open, readable descriptor.
        UnicodeDecodeError: the bytes are not UTF-8.
    """
    chunks = []
    try:
        while chunk := os.read(fd, _READ_CHUNK):
            chunks.append(chunk)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return b"".join(chunks).decode("utf-8")


def reexec(launch: WorkerLaunch) -> NoReturn:
    """Replace this process with ``python -m pgtasks.worker --spec-fd N`` (same pid); never returns.

    The launch, DSN included, goes through descriptor ``N`` (`spec_fd`), not
    through the command line. Buffered output is flushed first: the new image
    starts with empty buffers.

    Raises:
        OSError: the spec could not be handed over or the interpreter could not be
            executed (this image keeps running; the descriptor is closed).
    """
    fd = spec_fd(launch.to_json().encode("utf-8"))
    try:
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "pgtasks.worker", SPEC_FD_OPTION, str(fd)])
    except BaseException:
        os.close(fd)
        raise


def main(argv: list[str] | None = None) -> int:
    """``python -m pgtasks.worker --spec-fd N``: run the worker a `WorkerLaunch` describes.

    Reads the launch as JSON from the inherited descriptor ``N`` to its end and
    closes it before anything else runs.

    Exit codes as ``pgtasks worker``: 0 after a graceful stop, 1 on a configuration
    or database error at start (an unreadable descriptor or a bad spec included),
    2 on a wrong command line, 130 after a forced stop.
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != SPEC_FD_OPTION or not args[1].isdigit():
        print(
            f"usage: python -m pgtasks.worker {SPEC_FD_OPTION} N (started by `pgtasks worker`)",
            file=sys.stderr,
        )
        return 2
    try:
        fd = int(args[1])
        try:
            text = read_spec_fd(fd)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(
                f"cannot read the worker launch spec from descriptor {fd}: {exc}"
            ) from None
        launch = WorkerLaunch.from_json(text)
        configure_logging(launch.loglevel)
        return run(launch)
    except PgtasksError as exc:
        logging.getLogger("pgtasks").debug("error", exc_info=True)
        print(f"Error: {exc}", file=sys.stderr)
        return 1
