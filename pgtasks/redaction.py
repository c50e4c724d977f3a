"""Masking secrets in everything pgtasks shows or stores about a job but its arguments.

A job's arguments are stored as they were given (the task needs them; anyone who can
read ``pgtasks.jobs`` can read them, see docs/security.md). Everything else pgtasks
writes about a job passes through here first: the stored error's message and
traceback, the lines pgtasks logs, what ``pgtasks jobs show`` prints, and the repr of
the settings. A secret that must not be stored at all goes as a reference
(`pgtasks.secret_ref`).

What counts as sensitive (`is_sensitive`), on a name made lower case, camelCase and
``-`` turned into ``_`` (``apiToken`` and ``X-Api-Key`` as ``api_token`` and
``x_api_key``):

* the names in `SENSITIVE_NAMES` (``password``, ``token``, ``api_key``, ``auth`` ...);
* names ending in one of `SENSITIVE_SUFFIXES`: ``password`` (``db_password``,
  ``PGPASSWORD``), ``passwd``, ``passphrase``, ``_pwd``, ``_secret``, ``_token``,
  ``_api_key``, ``_apikey``, ``_private_key``, ``_access_key``, ``_secret_key``,
  ``_credentials``;
* not ``key`` alone nor other names ending in ``_key`` (``lock_key``,
  ``unique_key``, ``concurrency_key``, ``public_key`` are not secrets), nor names
  that merely start with a sensitive word (``token_count``, ``password_hash``).

A task names more with ``@app.task(redact=[...])``: argument names, keys at any depth,
or dotted paths (``card.number``: key ``number`` inside argument ``card``).

Masking replaces the value with `MARK` (``***``):

* in data (`Redactor.call`, `redact_data`): the value under a sensitive key, whole;
* in text (`redact_text`): a URL's password (``scheme://user:PASSWORD@host``), the value
  of a sensitive name written ``name=value``, ``name: value``, ``'name': 'value'`` or
  ``"name": "value"`` (libpq's ``password=...``, ``PGPASSWORD=...``, a dict's repr,
  JSON, ``Authorization: Bearer ...``), and any literal secret value it is given that
  has at least `MIN_SECRET_CHARS` characters (shorter ones would mask ordinary text).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pgtasks.errors import ConfigurationError

__all__ = [
    "MARK",
    "MIN_SECRET_CHARS",
    "SENSITIVE_NAMES",
    "SENSITIVE_SUFFIXES",
    "RedactingFilter",
    "Redactor",
    "check_redact",
    "is_sensitive",
    "redact_data",
    "redact_dsn",
    "redact_text",
]

#: What replaces a masked value.
MARK: Final = "***"
#: Shortest literal value `redact_text` masks wherever it appears.
MIN_SECRET_CHARS: Final = 4
#: Most entries of a task's ``redact`` option, and most characters of one entry.
MAX_REDACT_ENTRIES: Final = 100
MAX_REDACT_CHARS: Final = 200

SENSITIVE_NAMES: Final = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "secret",
        "token",
        "api_key",
        "apikey",
        "authorization",
        "auth",
        "credentials",
        "private_key",
        "access_key",
        "secret_key",
    }
)
SENSITIVE_SUFFIXES: Final = (
    "password",
    "passwd",
    "passphrase",
    "_pwd",
    "_secret",
    "_token",
    "_api_key",
    "_apikey",
    "_private_key",
    "_access_key",
    "_secret_key",
    "_credentials",
)

_CAMEL: Final = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _normal(name: str) -> str:
    return _CAMEL.sub("_", name).lower().replace("-", "_")


def is_sensitive(name: str, extra: Collection[str] = ()) -> bool:
    """Whether a value under ``name`` is a secret (see the module docs for the rule).

    Args:
        name: an argument name or a key (any case, camelCase and ``-`` allowed).
        extra: more names, compared the same way (a task's ``redact`` entries).
    """
    if not isinstance(name, str):
        return False
    normal = _normal(name)
    if normal in SENSITIVE_NAMES or normal.endswith(SENSITIVE_SUFFIXES):
        return True
    return bool(extra) and normal in {_normal(e) for e in extra}


def check_redact(entries: object) -> tuple[str, ...]:
    """Validate a task's ``redact`` option: a list (or tuple, set) of names or dotted paths.

    Returns:
        The entries as a tuple.

    Raises:
        ConfigurationError: not a collection of strings (one str alone is refused: it
            would be read letter by letter), an empty entry or path segment, NUL, more
            than `MAX_REDACT_ENTRIES` entries or an entry over `MAX_REDACT_CHARS` characters.
    """
    if isinstance(entries, str | bytes) or not isinstance(entries, Iterable):
        raise ConfigurationError(
            f"redact must be a list of argument names or dotted paths, got {entries!r:.60}"
        )
    out = tuple(entries)
    if len(out) > MAX_REDACT_ENTRIES:
        raise ConfigurationError(f"redact has {len(out)} entries; at most {MAX_REDACT_ENTRIES} allowed")
    for entry in out:
        if not isinstance(entry, str) or "\x00" in entry or not all(entry.split(".")):
            raise ConfigurationError(
                f"redact entries are names or dotted paths without empty parts or NUL, got {entry!r:.60}"
            )
        if len(entry) > MAX_REDACT_CHARS:
            raise ConfigurationError(
                f"redact entry {entry[:40]!r}... is {len(entry)} characters; "
                f"at most {MAX_REDACT_CHARS} allowed"
            )
    return out


# -- text ---------------------------------------------------------------------------

# scheme://user:PASSWORD@host: the password runs to the last "@" before the host's end.
_URL_PASSWORD: Final = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?#@'\"]*:)(?P<value>[^\s/?#'\"]+)(?=@)"
)
# name=value, name: value, 'name': 'value', "name": "value" (the name's quote closes it).
# A quoted value is looked for up to 4,096 characters, so that text with many unclosed
# quotes costs time in proportion to its length, not its square.
_NAME_VALUE: Final = re.compile(
    r"(?<![A-Za-z0-9_\-])(?P<quote>[\"']?)(?P<name>[A-Za-z_][A-Za-z0-9_\-]*)(?P=quote)"
    r"(?P<sep>\s*[=:]\s*)"
    r"(?P<value>\"(?:[^\"\\\n]|\\.){0,4096}\"|'(?:[^'\\\n]|\\.){0,4096}'"
    r"|(?:(?:Bearer|Basic|Token|Digest)[ \t]+)?[^\s,;&'\"()\[\]{}<>]+)",
    re.IGNORECASE,
)


def _variants(value: str) -> set[str]:
    """A secret as it may appear in text: itself, and escaped as a repr or a traceback
    shows it (``\\n`` for a line break, ``\\'`` for a quote)."""
    found = {value, repr(value)[1:-1]}
    found.add(value.encode("unicode_escape").decode("ascii"))
    return {v for v in found if len(v) >= MIN_SECRET_CHARS}


def redact_text(text: str, *, names: Collection[str] = (), values: Iterable[str] = ()) -> str:
    """``text`` with secrets replaced by `MARK` (see the module docs).

    Args:
        text: any text (an error message, a traceback, a log line).
        names: more sensitive names (a task's ``redact`` entries; for a dotted path its
            last part).
        values: literal secrets to mask wherever they appear; shorter than
            `MIN_SECRET_CHARS` characters are ignored.
    """
    if not text:
        return text
    literals = sorted(
        {v for s in values if len(s) >= MIN_SECRET_CHARS for v in _variants(s)}, key=len, reverse=True
    )
    if not literals and not names and len(text) >= _CACHED_MIN_CHARS:
        return _redact_plain(text)
    for literal in literals:
        text = text.replace(literal, MARK)
    return _redact_patterns(text, names)


# Texts masked with no names or values of their own, by a digest of the text: a task
# that fails the same way for many jobs gives the same message and traceback each time,
# and the patterns cost about 0.1 µs per character (a third of a retried job's worker
# time, measured), the digest a few ns. Keyed by the digest, so the cache holds masked
# text only; emptied when full. Texts shorter than 32 characters cost less than the digest.
_CACHED_MIN_CHARS: Final = 32
_CACHE_ENTRIES: Final = 256
_plain_cache: dict[bytes, str] = {}


def _redact_plain(text: str) -> str:
    key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    masked = _plain_cache.get(key)
    if masked is None:
        masked = _redact_patterns(text, ())
        if len(_plain_cache) >= _CACHE_ENTRIES:
            _plain_cache.clear()
        _plain_cache[key] = masked
    return masked


def _redact_patterns(text: str, names: Collection[str]) -> str:
    """``text`` with URL passwords and the values of sensitive names (and of ``names``) masked."""
    text = _URL_PASSWORD.sub(_mask_url, text)
    extra = frozenset(_normal(n.rsplit(".", 1)[-1]) for n in names)

    def mask_pair(match: re.Match[str]) -> str:
        name = match.group("name")
        if not (is_sensitive(name) or _normal(name) in extra):
            return match.group(0)
        value = match.group("value")
        masked = value[0] + MARK + value[0] if value[:1] in ("'", '"') else MARK
        return match.group("quote") + name + match.group("quote") + match.group("sep") + masked

    return _NAME_VALUE.sub(mask_pair, text)


def _mask_url(match: re.Match[str]) -> str:
    return match.group("head") + MARK


def redact_dsn(dsn: str | None) -> str | None:
    """A DSN (URI or libpq ``key=value`` form) with its password replaced by `MARK`."""
    return None if dsn is None else redact_text(dsn)


# -- data ---------------------------------------------------------------------------


def _walk(value: Any, path: tuple[str, ...], secret: bool, rules: _Rules, found: list[Any] | None) -> Any:
    """``value`` masked (a copy; the original is not changed); with ``found``, the
    masked scalars are collected there instead of being replaced."""
    if secret and value is not None and not _is_reference(value):
        if found is not None:
            _collect(value, found)
            return value
        return MARK
    if isinstance(value, Mapping):
        return {
            key: _walk(item, (*path, str(key)), rules.hides(str(key), (*path, str(key))), rules, found)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        items = [_walk(item, path, False, rules, found) for item in value]
        return items if isinstance(value, list) else type(value)(items)
    return value


def _collect(value: Any, found: list[Any]) -> None:
    if isinstance(value, Mapping):
        for item in value.values():
            _collect(item, found)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            _collect(item, found)
    elif isinstance(value, str | bytes | int | float) and not isinstance(value, bool):
        found.append(value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value))


def _is_reference(value: object) -> bool:
    return bool(getattr(value, "__pgtasks_secret_ref__", False))


@dataclass(frozen=True, slots=True)
class _Rules:
    names: frozenset[str]  # normalised single names: match a key at any depth
    paths: frozenset[tuple[str, ...]]  # normalised dotted paths from an argument

    def hides(self, name: str, path: tuple[str, ...]) -> bool:
        normal = _normal(name)
        if normal in self.names or is_sensitive(name):
            return True
        return tuple(_normal(p) for p in path) in self.paths


@dataclass(frozen=True, slots=True)
class Redactor:
    """The masking rules of one task: the built-in names plus its ``redact`` entries.

    Args:
        redact: the task's ``redact`` entries (names and dotted paths).
        params: the function's parameter names in order (a bound task's context
            excepted), to name positional arguments; empty when unknown (then only
            keyword arguments and keys inside values are matched by name).
    """

    redact: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    _rules: _Rules = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = frozenset(_normal(e) for e in self.redact if "." not in e)
        paths = frozenset(tuple(_normal(p) for p in e.split(".")) for e in self.redact if "." in e)
        object.__setattr__(self, "_rules", _Rules(names, paths))

    @classmethod
    def of(cls, fn: Callable[..., Any], redact: Sequence[str] = (), *, bind: bool = False) -> Redactor:
        """The rules of a task function: its ``redact`` entries and its parameter names
        (a bound task's first parameter, the context, left out)."""
        try:
            parameters = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):  # a builtin or C function without a signature
            return cls(tuple(redact))
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        params = tuple(p.name for p in parameters if p.kind in kinds)
        return cls(tuple(redact), params[1:] if bind else params)

    def _named(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[tuple[str | None, Any]]:
        named: list[tuple[str | None, Any]] = [
            (self.params[i] if i < len(self.params) else None, value) for i, value in enumerate(args)
        ]
        return named + [(str(k), v) for k, v in kwargs.items()]

    def call(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """A job's arguments to show: copies with every sensitive value replaced by `MARK`
        (secret references are shown as they are: they hold no secret)."""
        rules = self._rules
        shown_args = [
            _walk(v, (n,) if n else (), n is not None and rules.hides(n, (n,)), rules, None)
            for n, v in self._named(args, {})
        ]
        shown_kwargs = {
            str(k): _walk(v, (str(k),), rules.hides(str(k), (str(k),)), rules, None)
            for k, v in kwargs.items()
        }
        return shown_args, shown_kwargs

    def secrets(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> frozenset[str]:
        """The literal values of a job's sensitive arguments (as text), to mask in its
        error message and traceback with `redact_text`."""
        rules = self._rules
        found: list[Any] = []
        for n, v in self._named(args, kwargs):
            _walk(v, (n,) if n else (), n is not None and rules.hides(n, (n,)), rules, found)
        return frozenset(s for s in found if len(s) >= MIN_SECRET_CHARS)

    def text(self, text: str, values: Iterable[str] = ()) -> str:
        """`redact_text` with this task's names and the given literal values."""
        return redact_text(text, names=self.redact, values=values)


def redact_data(value: Any, redact: Sequence[str] = ()) -> Any:
    """A copy of ``value`` (dicts, lists, tuples, sets, scalars) with the value under
    every sensitive key, at any depth, replaced by `MARK` (headers, results, progress)."""
    return _walk(value, (), False, Redactor(tuple(redact))._rules, None)


# -- logging ------------------------------------------------------------------------


class RedactingFilter(logging.Filter):
    """A logging filter that masks secrets (`redact_text`) in a record's message and
    in its exception text, installed by `pgtasks.loader.configure_logging` on its
    handler: it sees every line that handler writes, pgtasks' and the tasks' own."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record's message as masked text; always keep the record."""
        try:
            message = record.getMessage()
        except Exception:  # a broken format: left to the handler, which reports it
            return True
        masked = redact_text(message)
        if masked != message or record.args:
            record.msg = masked
            record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return True
