"""One settings object, read from the environment once, at start-up.

The CLI (or `pgtasks.App`) builds a `Settings`; everything below receives it.
Nothing deeper in pgtasks reads environment variables.

DSN resolution order (as the design brief fixes it): the explicit ``dsn``
argument, then ``PGTASKS_DSN``, then ``DATABASE_URL``, then the embedded
PostgreSQL (see `pgtasks.embedded`), whose data directory is
``PGTASKS_EMBEDDED_DIR`` when set.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from pgtasks.errors import ConfigurationError
from pgtasks.redaction import redact_dsn
from pgtasks.validation import MAX_BATCH, check_bool, check_int, check_seconds, check_text, short

__all__ = ["RetentionPolicy", "Settings"]

#: Most connections one process's pool may hold (PostgreSQL's ``max_connections``
#: is 100 by default; a pool larger than this is a typo, not a plan).
MAX_POOL_SIZE = 1000
#: Most UTF-8 bytes of a DSN (libpq's connection strings are short; this only stops
#: a pasted file).
MAX_DSN_BYTES = 8192

DAY = 86400.0
#: The final statuses a retention policy keeps for a while, in the order it lists them.
RETENTION_STATUSES = ("succeeded", "cancelled", "failed", "partial_failure")
#: Most overrides (queue and task rules together) of one policy: each is a row the
#: retention statement looks up per finished job.
MAX_RETENTION_RULES = 1000
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY, "w": 7 * DAY}
_FOREVER = ("forever", "never", "keep")
# The variables of the policy's times and overrides, by field (named in full, so a
# search for a variable finds where it is read).
_STATUS_VARIABLES = {
    "succeeded": "PGTASKS_RETENTION_SUCCEEDED",
    "cancelled": "PGTASKS_RETENTION_CANCELLED",
    "failed": "PGTASKS_RETENTION_FAILED",
    "partial_failure": "PGTASKS_RETENTION_PARTIAL_FAILURE",
}
_OVERRIDE_VARIABLES = {"queues": "PGTASKS_RETENTION_QUEUES", "tasks": "PGTASKS_RETENTION_TASKS"}
_OFF = {"0", "false", "no", "off"}
_ON = {"1", "true", "yes", "on"}

Keep = float | None  # seconds a finished job is kept; None: kept forever


def parse_duration(label: str, text: str) -> Keep:
    """A retention time from the environment: seconds (``3600``), a number with a
    unit (``90s``, ``30m``, ``12h``, ``7d``, ``2w``), or ``forever``.

    Raises:
        ConfigurationError: anything else, or more than ten years (naming ``label``).
    """
    if text.strip().lower() in _FOREVER:
        return None
    match = _DURATION.match(text)
    if match is None:
        raise ConfigurationError(
            f"{label}: {short(text)} is not a duration (seconds, or a number with s, m, h, d or w, "
            "or 'forever')"
        )
    return check_seconds(label, float(match.group(1)) * _UNITS[match.group(2)])


def _check_keep(label: str, value: object) -> Keep:
    if value is None or (isinstance(value, float) and math.isinf(value) and value > 0):
        return None
    return check_seconds(label, value)


def _check_overrides(label: str, value: object) -> Mapping[str, Mapping[str, Keep]]:
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"retention {label} must map names to {{status: seconds}}, got {type(value).__name__}"
        )
    checked: dict[str, Mapping[str, Keep]] = {}
    for name, keeps in value.items():
        check_text(f"retention {label} name", name)
        if not isinstance(keeps, Mapping) or not keeps:
            raise ConfigurationError(
                f"retention {label}[{short(name)}] must be a non-empty mapping of status to seconds"
            )
        rule: dict[str, Keep] = {}
        for status, keep in keeps.items():
            if status not in RETENTION_STATUSES:
                raise ConfigurationError(
                    f"retention {label}[{short(name)}]: {short(status)} is not a final status "
                    f"({', '.join(RETENTION_STATUSES)})"
                )
            rule[status] = _check_keep(f"retention {label}[{short(name)}][{status}]", keep)
        checked[name] = MappingProxyType(rule)
    return MappingProxyType(checked)


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long finished jobs are kept before the workers' retention service deletes
    them (`pgtasks.maintenance.Retention`; docs/operations.md, "Retention").

    A finished job is kept for the time of the most specific rule for its status:
    its task's (``tasks``), else its queue's (``queues``), else the default of the
    status. A time is seconds (``None``: forever); a job is deleted once it ended
    more than that long ago.

    Attributes:
        enabled: whether workers run the retention service (default True;
            ``PGTASKS_RETENTION=off`` turns it off).
        succeeded: default 7 days (604,800 s).
        cancelled: default 7 days.
        failed: default 30 days (2,592,000 s): a failure is kept longer, for a
            person to look at.
        partial_failure: default 30 days, as failed.
        queues: per-queue overrides, ``{queue: {status: seconds or None}}``; a
            status not named falls back to the default.
        tasks: per-task overrides, ``{task name: {status: seconds or None}}``;
            win over the queue's.
        interval: seconds between retention passes of a worker (default 60).
        batch: most jobs one statement deletes (default 1,000).
        pause: seconds between two batches of a pass (default 0.1), so the
            deletes leave room for the queue's own work.

    Raises:
        ConfigurationError: a time that is not seconds in 0 to ten years (or None),
            a status that is not final, an override that is not such a mapping, more
            than `MAX_RETENTION_RULES` overrides, an ``interval`` not positive, a
            ``batch`` not in 1 to `pgtasks.validation.MAX_BATCH`.
    """

    enabled: bool = True
    succeeded: Keep = 7 * DAY
    cancelled: Keep = 7 * DAY
    failed: Keep = 30 * DAY
    partial_failure: Keep = 30 * DAY
    queues: Mapping[str, Mapping[str, Keep]] = field(default_factory=dict)
    tasks: Mapping[str, Mapping[str, Keep]] = field(default_factory=dict)
    interval: float = 60.0
    batch: int = 1000
    pause: float = 0.1

    def __post_init__(self) -> None:
        check_bool("retention enabled", self.enabled)
        for status in RETENTION_STATUSES:
            object.__setattr__(self, status, _check_keep(f"retention {status}", getattr(self, status)))
        object.__setattr__(self, "queues", _check_overrides("queues", self.queues))
        object.__setattr__(self, "tasks", _check_overrides("tasks", self.tasks))
        rules = sum(len(r) for r in self.queues.values()) + sum(len(r) for r in self.tasks.values())
        if rules > MAX_RETENTION_RULES:
            raise ConfigurationError(f"retention has {rules} overrides; at most {MAX_RETENTION_RULES}")
        check_seconds("retention interval", self.interval, positive=True)
        check_int("retention batch", self.batch, 1, MAX_BATCH)
        check_seconds("retention pause", self.pause)

    def default(self, status: str) -> Keep:
        """The default time a job finished with ``status`` is kept (seconds; None: forever)."""
        return getattr(self, status)  # type: ignore[no-any-return]

    def keep_for(self, status: str, *, queue: str, task_name: str) -> Keep:
        """Seconds a job of ``task_name`` in ``queue`` that ended ``status`` is kept
        (None: forever): the task's rule, else the queue's, else the default.

        Raises:
            ConfigurationError: ``status`` is not a final status.
        """
        if status not in RETENTION_STATUSES:
            raise ConfigurationError(f"{short(status)} is not a final status")
        for overrides, name in ((self.tasks, task_name), (self.queues, queue)):
            rule = overrides.get(name)
            if rule is not None and status in rule:
                return rule[status]
        return self.default(status)

    def rules(self) -> list[tuple[str, str, str, Keep]]:
        """Every rule as ``(scope, name, status, seconds or None)``: scope ``task``,
        ``queue`` or ``default`` (name ``""``), most specific first."""
        found: list[tuple[str, str, str, Keep]] = []
        for scope, overrides in (("task", self.tasks), ("queue", self.queues)):
            for name, rule in sorted(overrides.items()):
                found.extend((scope, name, status, keep) for status, keep in rule.items())
        found.extend(("default", "", status, self.default(status)) for status in RETENTION_STATUSES)
        return found

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> RetentionPolicy:
        """The policy the environment describes (docs/configuration.md):

        * ``PGTASKS_RETENTION``: ``on`` (default) or ``off`` (also 1/0, true/false, yes/no);
        * ``PGTASKS_RETENTION_SUCCEEDED``, ``_CANCELLED``, ``_FAILED``,
          ``_PARTIAL_FAILURE``: a duration (`parse_duration`);
        * ``PGTASKS_RETENTION_QUEUES``, ``PGTASKS_RETENTION_TASKS``: overrides as
          ``name:status=duration,status=duration;name2:...`` (a name may hold ``:``,
          not ``;``; use `Settings` in Python for such names);
        * ``PGTASKS_RETENTION_INTERVAL``: a duration between passes.

        Raises:
            ConfigurationError: a value that cannot be read, naming the variable.
        """
        values: dict[str, object] = {}
        switch = environ.get("PGTASKS_RETENTION", "").strip().lower()
        if switch:
            if switch not in _ON | _OFF:
                raise ConfigurationError(f"PGTASKS_RETENTION must be on or off, got {short(switch)}")
            values["enabled"] = switch in _ON
        for status, variable in _STATUS_VARIABLES.items():
            if environ.get(variable, "").strip():
                values[status] = parse_duration(variable, environ[variable])
        for label, variable in _OVERRIDE_VARIABLES.items():
            if environ.get(variable, "").strip():
                values[label] = _parse_overrides(variable, environ[variable])
        interval = environ.get("PGTASKS_RETENTION_INTERVAL", "").strip()
        if interval:
            seconds = parse_duration("PGTASKS_RETENTION_INTERVAL", interval)
            if not seconds:
                raise ConfigurationError("PGTASKS_RETENTION_INTERVAL must be a positive duration")
            values["interval"] = seconds
        return cls(**values)  # type: ignore[arg-type]


def _parse_overrides(variable: str, text: str) -> dict[str, dict[str, Keep]]:
    """``name:status=duration,...;name2:...`` as ``{name: {status: seconds}}``.

    Raises:
        ConfigurationError: a part without ``:`` or ``=``, or a bad duration.
    """
    overrides: dict[str, dict[str, Keep]] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        name, sep, items = part.strip().rpartition(":")
        if not sep or not name or not items.strip():
            raise ConfigurationError(f"{variable}: {short(part)} is not name:status=duration,...")
        rule = overrides.setdefault(name, {})
        for item in items.split(","):
            status, eq, duration = item.partition("=")
            if not eq:
                raise ConfigurationError(f"{variable}: {short(item)} is not status=duration")
            rule[status.strip()] = parse_duration(variable, duration)
    return overrides


@dataclass(frozen=True, slots=True)
class Settings:
    """Connection settings shared by the app, workers and schedulers.

    Attributes:
        dsn: libpq DSN or URI (at most 8,192 bytes, no NUL); None means "use the
            embedded PostgreSQL".
        dsn_source: where the DSN came from: ``"argument"``, ``"PGTASKS_DSN"``,
            ``"DATABASE_URL"`` or ``"embedded"``.
        embedded_dir: data directory of the embedded server (None: its default).
        pool_size: most pooled connections per process (1..1000).
        prepare_threshold: psycopg's server-side prepare threshold (an int >= 0) of the
            app's connections, or None to disable prepared statements (PgBouncer
            transaction pooling before 1.21; ``PGTASKS_PREPARE_THRESHOLD=off``, or a
            number). A worker's own connections prepare at first use unless it is None
            (`pgtasks.db.workers.worker_database`).
        read_dsn: libpq DSN or URI of a replica for the read-only views (``jobs list``
            and ``show``, ``queues``, ``workers``, ``metrics``, the dashboard;
            ``PGTASKS_READ_DSN``),
            or None to read on ``dsn``. Writes never go there. A hot standby lags the
            primary by its replay delay: what it shows may be that much behind.
        listen: whether pgtasks may ``LISTEN`` (default True; ``PGTASKS_LISTEN=off``
            behind PgBouncer in transaction pooling): off, ``AsyncResult.get`` reads
            the job each second instead, and ``pgtasks worker`` polls as with
            ``--no-listen``.
        load_entry_points: whether plugins of the ``pgtasks`` entry-point group are
            loaded automatically (``PGTASKS_DISABLE_PLUGIN_AUTOLOAD=1`` turns it off).
        ocr_roots: absolute directories the OCR task (plugin ``pgtasks_ocr``) may read
            documents from; empty refuses every path (``PGTASKS_OCR_ROOTS``, a list
            separated by ``os.pathsep``).
        retention: how long finished jobs are kept (`RetentionPolicy`; from the
            ``PGTASKS_RETENTION*`` variables).
        history_after: seconds after its finish a job moves from the hot table
            pgtasks.jobs to pgtasks.job_history (`pgtasks.maintenance.History`, run by
            every worker; default 3600; 0: at the next pass), or None to keep finished
            jobs in the hot table (``PGTASKS_HISTORY_AFTER``: seconds, a number with a
            unit as ``30m``, or ``off``). Readers see moved jobs as before.

    Raises:
        ConfigurationError: a field of the wrong type or out of range, naming it and
            the limit (a refused DSN is never echoed: it may hold a password).
    """

    dsn: str | None = None
    dsn_source: str = "embedded"
    embedded_dir: Path | None = None
    pool_size: int = 8
    prepare_threshold: int | None = 5
    read_dsn: str | None = None
    listen: bool = True
    load_entry_points: bool = True
    ocr_roots: tuple[Path, ...] = ()
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    history_after: float | None = 3600.0

    def __repr__(self) -> str:
        # The DSN may hold a password (URI user:PASSWORD@, or password=...): masked, so a
        # settings object in a log line, a traceback or a debugger shows none.
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values["dsn"] = redact_dsn(self.dsn)
        values["read_dsn"] = redact_dsn(self.read_dsn)
        return "Settings(" + ", ".join(f"{name}={value!r}" for name, value in values.items()) + ")"

    def __post_init__(self) -> None:
        check_text("dsn_source", self.dsn_source)
        if self.dsn is not None:
            if not isinstance(self.dsn, str) or not self.dsn.strip():
                raise ConfigurationError(f"empty DSN from {self.dsn_source}")
            _check_dsn(self.dsn, self.dsn_source)
        if self.read_dsn is not None:
            if not isinstance(self.read_dsn, str) or not self.read_dsn.strip():
                raise ConfigurationError("read_dsn (PGTASKS_READ_DSN) must be a non-empty DSN or None")
            _check_dsn(self.read_dsn, "read_dsn")
        if self.embedded_dir is not None and not isinstance(self.embedded_dir, Path):
            raise ConfigurationError(f"embedded_dir must be a Path or None, got {short(self.embedded_dir)}")
        check_int("pool_size", self.pool_size, 1, MAX_POOL_SIZE)
        if self.prepare_threshold is not None:
            check_int("prepare_threshold", self.prepare_threshold, 0, 2**31 - 1)
        check_bool("listen", self.listen)
        check_bool("load_entry_points", self.load_entry_points)
        if not isinstance(self.ocr_roots, tuple):
            kind = type(self.ocr_roots).__name__
            raise ConfigurationError(f"ocr_roots must be a tuple of Paths, got a {kind}")
        for root in self.ocr_roots:
            if not isinstance(root, Path) or not root.is_absolute():
                raise ConfigurationError(
                    f"ocr_roots (PGTASKS_OCR_ROOTS) must hold absolute directories, got {str(root)!r}"
                )
        if not isinstance(self.retention, RetentionPolicy):
            kind = type(self.retention).__name__
            raise ConfigurationError(f"retention must be a RetentionPolicy, got a {kind}")
        if self.history_after is not None:
            object.__setattr__(self, "history_after", check_seconds("history_after", self.history_after))

    @classmethod
    def from_env(
        cls,
        dsn: str | None = None,
        environ: Mapping[str, str] | None = None,
        **overrides: object,
    ) -> Settings:
        """Resolve settings from an explicit DSN and the environment.

        Args:
            dsn: explicit DSN; wins over the environment.
            environ: the environment to read (default ``os.environ``).
            overrides: other `Settings` fields.

        Raises:
            ConfigurationError: a value is empty, of the wrong type or out of range,
                or an override names no `Settings` field.
        """
        env = os.environ if environ is None else environ
        source = "embedded"
        if dsn is not None:
            source = "argument"
        elif env.get("PGTASKS_DSN"):
            dsn, source = env["PGTASKS_DSN"], "PGTASKS_DSN"
        elif env.get("DATABASE_URL"):
            dsn, source = env["DATABASE_URL"], "DATABASE_URL"
        embedded = env.get("PGTASKS_EMBEDDED_DIR")
        autoload = env.get("PGTASKS_DISABLE_PLUGIN_AUTOLOAD", "").lower() not in {"1", "true", "yes"}
        ocr_roots = tuple(Path(part) for part in env.get("PGTASKS_OCR_ROOTS", "").split(os.pathsep) if part)
        values: dict[str, object] = {
            "dsn": dsn,
            "dsn_source": source,
            "embedded_dir": Path(embedded) if embedded else None,
            "load_entry_points": autoload,
            "ocr_roots": ocr_roots,
        }
        if "retention" not in overrides:
            values["retention"] = RetentionPolicy.from_env(env)
        history = env.get("PGTASKS_HISTORY_AFTER", "").strip()
        if "history_after" not in overrides and history:
            values["history_after"] = (
                None if history.lower() in _OFF - {"0"} else parse_duration("PGTASKS_HISTORY_AFTER", history)
            )
        if "prepare_threshold" not in overrides and env.get("PGTASKS_PREPARE_THRESHOLD", "").strip():
            values["prepare_threshold"] = _parse_prepare_threshold(env["PGTASKS_PREPARE_THRESHOLD"])
        switch = env.get("PGTASKS_LISTEN", "").strip().lower()
        if "listen" not in overrides and switch:
            if switch not in _ON | _OFF:
                raise ConfigurationError(f"PGTASKS_LISTEN must be on or off, got {short(switch)}")
            values["listen"] = switch in _ON
        if "read_dsn" not in overrides and env.get("PGTASKS_READ_DSN", "").strip():
            values["read_dsn"] = env["PGTASKS_READ_DSN"]
        unknown = sorted(set(overrides) - set(cls.__dataclass_fields__))
        if unknown:
            allowed = ", ".join(sorted(cls.__dataclass_fields__))
            raise ConfigurationError(f"unknown setting(s) {', '.join(unknown)}; allowed: {allowed}")
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    def resolve_read_dsn(self) -> str:
        """The DSN the read-only views connect with: `read_dsn`, else `resolve_dsn`."""
        return self.read_dsn if self.read_dsn is not None else self.resolve_dsn()

    def resolve_dsn(self) -> str:
        """The DSN to connect with, starting the embedded server when none is set."""
        if self.dsn is not None:
            return self.dsn
        from pgtasks.embedded import embedded_dsn

        return embedded_dsn(self.embedded_dir)


def _parse_prepare_threshold(text: str) -> int | None:
    """``PGTASKS_PREPARE_THRESHOLD``: ``off`` (also ``none``, ``never``: no prepared
    statements, for PgBouncer's transaction pooling before 1.21) or a number >= 0.

    Raises:
        ConfigurationError: anything else.
    """
    value = text.strip().lower()
    if value in {"off", "none", "never"}:
        return None
    if not value.isdigit():
        raise ConfigurationError(
            f"PGTASKS_PREPARE_THRESHOLD must be 'off' or a number >= 0, got {short(text)}"
        )
    return int(value)


def _check_dsn(dsn: str, source: str) -> None:
    """Refuse a DSN with NUL, a lone surrogate or more than `MAX_DSN_BYTES` bytes,
    without showing it (it may hold a password).

    Raises:
        ConfigurationError: naming where the DSN came from and the limit.
    """
    if "\x00" in dsn:
        raise ConfigurationError(f"the DSN from {source} contains a NUL character")
    try:
        size = len(dsn.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigurationError(f"the DSN from {source} holds a lone surrogate (not valid UTF-8)") from None
    if size > MAX_DSN_BYTES:
        raise ConfigurationError(f"the DSN from {source} is {size} bytes; at most {MAX_DSN_BYTES} allowed")
