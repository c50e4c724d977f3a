"""One settings object, read from the environment once, at start-up.

The CLI (or `pgtasks.App`) builds a `Settings`; everything below receives it.
Nothing deeper in pgtasks reads environment variables.

DSN resolution order (as the design brief fixes it): the explicit ``dsn``
argument, then ``PGTASKS_DSN``, then ``DATABASE_URL``, then the embedded
PostgreSQL (see `pgtasks.embedded`), whose data directory is
``PGTASKS_EMBEDDED_DIR`` when set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pgtasks.errors import ConfigurationError
from pgtasks.redaction import redact_dsn
from pgtasks.validation import check_bool, check_int, check_text, short

__all__ = ["Settings"]

#: Most connections one process's pool may hold (PostgreSQL's ``max_connections``
#: is 100 by default; a pool larger than this is a typo, not a plan).
MAX_POOL_SIZE = 1000
#: Most UTF-8 bytes of a DSN (libpq's connection strings are short; this only stops
#: a pasted file).
MAX_DSN_BYTES = 8192


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
        prepare_threshold: psycopg's server-side prepare threshold (an int >= 0), or None to
            disable prepared statements (PgBouncer transaction pooling before 1.21).
        load_entry_points: whether plugins of the ``pgtasks`` entry-point group are
            loaded automatically (``PGTASKS_DISABLE_PLUGIN_AUTOLOAD=1`` turns it off).
        ocr_roots: absolute directories the OCR task (plugin ``pgtasks_ocr``) may read
            documents from; empty refuses every path (``PGTASKS_OCR_ROOTS``, a list
            separated by ``os.pathsep``).

    Raises:
        ConfigurationError: a field of the wrong type or out of range, naming it and
            the limit (a refused DSN is never echoed: it may hold a password).
    """

    dsn: str | None = None
    dsn_source: str = "embedded"
    embedded_dir: Path | None = None
    pool_size: int = 8
    prepare_threshold: int | None = 5
    load_entry_points: bool = True
    ocr_roots: tuple[Path, ...] = ()

    def __repr__(self) -> str:
        # The DSN may hold a password (URI user:PASSWORD@, or password=...): masked, so a
        # settings object in a log line, a traceback or a debugger shows none.
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values["dsn"] = redact_dsn(self.dsn)
        return "Settings(" + ", ".join(f"{name}={value!r}" for name, value in values.items()) + ")"

    def __post_init__(self) -> None:
        check_text("dsn_source", self.dsn_source)
        if self.dsn is not None:
            if not isinstance(self.dsn, str) or not self.dsn.strip():
                raise ConfigurationError(f"empty DSN from {self.dsn_source}")
            _check_dsn(self.dsn, self.dsn_source)
        if self.embedded_dir is not None and not isinstance(self.embedded_dir, Path):
            raise ConfigurationError(f"embedded_dir must be a Path or None, got {short(self.embedded_dir)}")
        check_int("pool_size", self.pool_size, 1, MAX_POOL_SIZE)
        if self.prepare_threshold is not None:
            check_int("prepare_threshold", self.prepare_threshold, 0, 2**31 - 1)
        check_bool("load_entry_points", self.load_entry_points)
        if not isinstance(self.ocr_roots, tuple):
            kind = type(self.ocr_roots).__name__
            raise ConfigurationError(f"ocr_roots must be a tuple of Paths, got a {kind}")
        for root in self.ocr_roots:
            if not isinstance(root, Path) or not root.is_absolute():
                raise ConfigurationError(
                    f"ocr_roots (PGTASKS_OCR_ROOTS) must hold absolute directories, got {str(root)!r}"
                )

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
        unknown = sorted(set(overrides) - set(cls.__dataclass_fields__))
        if unknown:
            allowed = ", ".join(sorted(cls.__dataclass_fields__))
            raise ConfigurationError(f"unknown setting(s) {', '.join(unknown)}; allowed: {allowed}")
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    def resolve_dsn(self) -> str:
        """The DSN to connect with, starting the embedded server when none is set."""
        if self.dsn is not None:
            return self.dsn
        from pgtasks.embedded import embedded_dsn

        return embedded_dsn(self.embedded_dir)


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
