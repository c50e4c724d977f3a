"""Secrets passed by reference: the job stores where the secret is, never the secret.

A job's arguments are stored in ``pgtasks.jobs`` as given, readable by anyone who can
read that table (and its backups, replicas and logs of statements). A secret that must
not be stored goes as a reference instead::

    backup.delay(host="db1", password=pgtasks.secret_ref.env("BACKUP_PASSWORD"))

The job stores ``{"$pgtasks": "secret", "v": "env:BACKUP_PASSWORD"}``: the name of an
environment variable. The worker reads the variable from its own environment just
before it calls the task (`resolve_call`), so the task receives the value, a ``str``;
the value is never stored, logged or shown, and an error message or traceback that
holds it is masked (`pgtasks.redaction`). A variable the worker does not have fails
the job at once, permanently, with the error code ``SECRET_UNAVAILABLE``.

``self.request.args`` of a bound task keeps the references, not the values.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from pgtasks.errors import ConfigurationError, Reject, SerializationError
from pgtasks.states import ErrorCode

__all__ = ["SecretRef", "env", "has_refs", "referenced_values", "resolve_call", "secret_from_text"]

#: Most characters of an environment variable's name in a reference.
MAX_NAME_CHARS: Final = 256
# POSIX's portable names: letters, digits and "_", not starting with a digit.
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class SecretRef:
    """A reference to a secret the worker resolves; made by `env`.

    Attributes:
        source: where the secret is: ``"env"`` (an environment variable of the worker).
        name: the variable's name.
    """

    source: str
    name: str

    __pgtasks_secret_ref__: ClassVar[bool] = True  # pgtasks.redaction shows references as they are

    def __repr__(self) -> str:
        return f"<secret {self.source}:{self.name}>"

    @property
    def text(self) -> str:
        """The stored form, ``"env:NAME"``."""
        return f"{self.source}:{self.name}"

    def resolve(self, environ: Mapping[str, str] | None = None) -> str:
        """The secret's value from ``environ`` (default: the process environment).

        Raises:
            Reject: code ``SECRET_UNAVAILABLE``: the variable is not set (a permanent
                failure: retrying on the same worker would not set it).
        """
        values = os.environ if environ is None else environ
        value = values.get(self.name)
        if value is None:
            raise Reject(
                f"secret {self.text} is not set in the worker's environment",
                code=ErrorCode.SECRET_UNAVAILABLE,
            )
        return value


def _check_name(name: object) -> str:
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or _NAME.fullmatch(name) is None:
        raise ConfigurationError(
            "secret_ref.env name must be an environment variable name (letters, digits and _, "
            f"not starting with a digit, at most {MAX_NAME_CHARS} characters), got {name!r:.60}"
        )
    return name


def env(name: str) -> SecretRef:
    """A reference to the worker's environment variable ``name``, to pass as an argument.

    Raises:
        ConfigurationError: ``name`` is not a portable variable name (letters, digits
            and ``_``, not starting with a digit, at most `MAX_NAME_CHARS` characters).
    """
    return SecretRef("env", _check_name(name))


def secret_from_text(text: object) -> SecretRef:
    """The reference stored as ``"env:NAME"`` (`pgtasks.serialization` reads it back).

    Raises:
        SerializationError: not of that form.
    """
    source, _, name = text.partition(":") if isinstance(text, str) else ("", "", "")
    if source != "env" or _NAME.fullmatch(name) is None or len(name) > MAX_NAME_CHARS:
        raise SerializationError("stored value", f"a secret reference is 'env:NAME', not {text!r:.60}")
    return SecretRef(source, name)


def has_refs(value: Any) -> bool:
    """Whether ``value`` holds a `SecretRef` (in lists, tuples, sets or dict values)."""
    kind = type(value)
    if kind in _SCALARS:  # most arguments: answered before the abstract Mapping check
        return False
    if kind is SecretRef:
        return True
    if kind is tuple or kind is list:
        return any(has_refs(v) for v in value)
    if kind is dict or isinstance(value, Mapping):
        return any(has_refs(v) for v in value.values())
    if isinstance(value, list | tuple | set | frozenset):
        return any(has_refs(v) for v in value)
    return False


# Types that never hold a reference, looked up by exact type (a subclass takes the long way).
_SCALARS: frozenset[type] = frozenset({str, int, float, bool, type(None), bytes})


def _resolve(value: Any, environ: Mapping[str, str] | None, found: list[str]) -> Any:
    if type(value) is SecretRef:
        secret = value.resolve(environ)
        found.append(secret)
        return secret
    if isinstance(value, Mapping):
        return {k: _resolve(v, environ, found) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [_resolve(v, environ, found) for v in value]
        return items if isinstance(value, list) else type(value)(items)
    return value


def resolve_call(
    args: Sequence[Any], kwargs: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> tuple[tuple[Any, ...], dict[str, Any], list[str]]:
    """A job's arguments with every reference replaced by its value, and the values.

    Args:
        args, kwargs: the job's arguments (not changed).
        environ: where ``env`` references are read (default: the process environment).

    Returns:
        ``(args, kwargs, secrets)``; ``secrets`` lists the values read.

    Raises:
        Reject: ``SECRET_UNAVAILABLE`` for a variable that is not set.
    """
    found: list[str] = []
    if not (has_refs(args) or has_refs(kwargs)):
        return tuple(args), dict(kwargs), found
    resolved_args = tuple(_resolve(a, environ, found) for a in args)
    resolved_kwargs = {k: _resolve(v, environ, found) for k, v in kwargs.items()}
    return resolved_args, resolved_kwargs, found


def referenced_values(
    args: Sequence[Any], kwargs: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> list[str]:
    """The values of the references among a job's arguments that are set in ``environ``
    (default: the process environment): what the worker masks in the job's error."""
    found: list[str] = []
    for value in (args, kwargs):
        for ref in _refs(value):
            secret = (os.environ if environ is None else environ).get(ref.name)
            if secret is not None:
                found.append(secret)
    return found


def _refs(value: Any) -> list[SecretRef]:
    if type(value) is SecretRef:
        return [value]
    if isinstance(value, Mapping):
        return [r for v in value.values() for r in _refs(v)]
    if isinstance(value, list | tuple | set | frozenset):
        return [r for v in value for r in _refs(v)]
    return []
