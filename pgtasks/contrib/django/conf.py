"""The ``PGTASKS`` setting of a Django project, read once and checked.

```python
PGTASKS = {
    "APP_NAME": "mysite",          # the pgtasks App's name (logs, worker ids); default "django"
    "DATABASE": "default",         # Django database whose connection and transactions jobs join
    "DSN": None,                   # pgtasks' own connections; default: that database's settings
    "QUEUES": ["default"],         # what `manage.py pgtasks worker` serves when -Q is not given
    "AUTODISCOVER": True,          # import `tasks.py` of every installed app at start-up
    "TASKS_MODULE": "tasks",       # the module name autodiscovery imports
    "LOAD_ENTRY_POINTS": None,     # plugins of the `pgtasks` entry-point group (None: pgtasks' default)
}
```

Every key is optional. ``DATABASE: None`` makes jobs independent of Django's
transactions (pgtasks' own pool; ``DSN`` or pgtasks' resolution order then names the
database).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from psycopg.conninfo import make_conninfo

from pgtasks.errors import ConfigurationError
from pgtasks.task import check_queue
from pgtasks.validation import check_text

__all__ = ["DjangoSettings", "dsn_of_database", "read_settings"]

#: The keys ``PGTASKS`` may hold.
KEYS: Final = frozenset(
    {"APP_NAME", "DATABASE", "DSN", "QUEUES", "AUTODISCOVER", "TASKS_MODULE", "LOAD_ENTRY_POINTS"}
)

# libpq parameters a Django database's OPTIONS may carry over to pgtasks' DSN ("34.1.2.
# Parameter Key Words" of the PostgreSQL docs); the others (isolation_level, pool,
# server_side_binding, assume_role, ...) are Django's own.
_LIBPQ_OPTIONS: Final = frozenset(
    {
        "application_name", "channel_binding", "connect_timeout", "gssencmode", "keepalives",
        "keepalives_count", "keepalives_idle", "keepalives_interval", "options", "passfile",
        "service", "sslcert", "sslcrl", "sslkey", "sslmode", "sslpassword", "sslrootcert",
        "target_session_attrs", "tcp_user_timeout",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class DjangoSettings:
    """``PGTASKS`` checked (see the module docstring for each key's meaning)."""

    app_name: str = "django"
    database: str | None = "default"
    dsn: str | None = None
    queues: tuple[str, ...] = ("default",)
    autodiscover: bool = True
    tasks_module: str = "tasks"
    load_entry_points: bool | None = None


def read_settings(raw: object) -> DjangoSettings:
    """Check the ``PGTASKS`` setting (None or missing: every default).

    Raises:
        ConfigurationError: not a dict, an unknown key, or a value of the wrong type
            (the message names the key).
    """
    if raw is None:
        return DjangoSettings()
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"settings.PGTASKS must be a dict, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in KEYS)
    if unknown:
        raise ConfigurationError(
            f"unknown key(s) in settings.PGTASKS: {', '.join(unknown)}; allowed: {', '.join(sorted(KEYS))}"
        )
    values: dict[str, Any] = {}
    if "APP_NAME" in raw:
        values["app_name"] = check_text("PGTASKS['APP_NAME']", raw["APP_NAME"])
    if "DATABASE" in raw:
        alias = raw["DATABASE"]
        values["database"] = None if alias is None else check_text("PGTASKS['DATABASE']", alias)
    if "DSN" in raw:
        dsn = raw["DSN"]
        values["dsn"] = None if dsn is None else check_text("PGTASKS['DSN']", dsn, max_bytes=8192)
    if "QUEUES" in raw:
        queues = raw["QUEUES"]
        if isinstance(queues, str) or not isinstance(queues, list | tuple) or not queues:
            raise ConfigurationError("PGTASKS['QUEUES'] must be a non-empty list of queue names")
        for queue in queues:
            check_queue(queue)
        values["queues"] = tuple(queues)
    for key, field in (("AUTODISCOVER", "autodiscover"), ("LOAD_ENTRY_POINTS", "load_entry_points")):
        if key in raw:
            flag = raw[key]
            if not isinstance(flag, bool) and not (key == "LOAD_ENTRY_POINTS" and flag is None):
                raise ConfigurationError(f"PGTASKS[{key!r}] must be True or False, got {type(flag).__name__}")
            values[field] = flag
    if "TASKS_MODULE" in raw:
        module = check_text("PGTASKS['TASKS_MODULE']", raw["TASKS_MODULE"])
        if not module.isidentifier():
            raise ConfigurationError(f"PGTASKS['TASKS_MODULE'] must be a module name, got {module!r}")
        values["tasks_module"] = module
    return DjangoSettings(**values)


def dsn_of_database(settings_dict: Mapping[str, Any]) -> str:
    """A libpq DSN for the database a Django ``DATABASES`` entry describes.

    Takes ``NAME``, ``USER``, ``PASSWORD``, ``HOST``, ``PORT`` and the libpq
    parameters among ``OPTIONS`` (``sslmode``, ``service``, ``options`` ...).

    Raises:
        ConfigurationError: the entry is not a PostgreSQL database.
    """
    engine = str(settings_dict.get("ENGINE") or "")
    if engine != "django.db.backends.postgresql" and not engine.endswith(".postgresql"):
        raise ConfigurationError(
            f"the Django database uses {engine or 'no ENGINE'}; pgtasks needs PostgreSQL "
            "(django.db.backends.postgresql), or set PGTASKS['DSN'] and PGTASKS['DATABASE'] = None"
        )
    params: dict[str, Any] = {}
    for key, name in (("NAME", "dbname"), ("USER", "user"), ("PASSWORD", "password"), ("HOST", "host")):
        if settings_dict.get(key):
            params[name] = str(settings_dict[key])
    if settings_dict.get("PORT"):
        params["port"] = str(settings_dict["PORT"])
    options = settings_dict.get("OPTIONS") or {}
    params.update({k: v for k, v in options.items() if k in _LIBPQ_OPTIONS and v is not None})
    return make_conninfo("", **params)
