"""Django integration: ``INSTALLED_APPS += ["pgtasks.contrib.django"]`` (the ``django`` extra).

* settings in ``PGTASKS = {...}`` (`pgtasks.contrib.django.conf`);
* one pgtasks `App` per process, `get_app` (also ``pgtasks.contrib.django.app`` as an
  attribute, which ``-A pgtasks.contrib.django:app`` names), whose tasks write their
  jobs on Django's database connection, so ``transaction.atomic()`` covers them;
* ``tasks.py`` of every installed app imported at start-up;
* ``manage.py pgtasks ...`` (the pgtasks command line on this app) and a migration
  that applies pgtasks' schema with ``manage.py migrate``;
* admin pages for jobs and schedules, with retry and cancel actions;
* a backend for Django's task framework, `pgtasks.contrib.django.backend.PgtasksBackend`.

See docs/django.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgtasks.contrib.django.core import DjangoApp, django_connection, get_app

if TYPE_CHECKING:
    #: The process's pgtasks app (`get_app`), built on first access.
    app: DjangoApp

__all__ = ["APP_SPEC", "DjangoApp", "app", "django_connection", "get_app"]

#: What ``-A`` names: the command line loads ``pgtasks.contrib.django:app``.
APP_SPEC = "pgtasks.contrib.django:app"


def __getattr__(name: str) -> Any:
    """``app``: the process's pgtasks app (`get_app`), built on first access."""
    if name == "app":
        return get_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
