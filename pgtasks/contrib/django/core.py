"""The one pgtasks `App` of a Django process, and enqueueing on Django's connection.

`get_app` builds the app from ``settings.PGTASKS`` (`pgtasks.contrib.django.conf`) on
first use and returns the same one afterwards. Its tasks write their jobs on the
connection of Django's database ``PGTASKS["DATABASE"]`` (``"default"``) when no
``connection=`` is given: inside ``transaction.atomic()`` the job commits or rolls
back with the block; outside it (autocommit) the job commits at once, as any
statement Django runs there. `pgtasks.db.Database.transaction` never commits a
caller's transaction, so pgtasks leaves Django's transaction management alone.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Generator, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import psycopg

from pgtasks.app import App
from pgtasks.contrib.django.conf import DjangoSettings, dsn_of_database, read_settings
from pgtasks.enqueue import BatchCall, JobEnqueuer
from pgtasks.errors import ConfigurationError
from pgtasks.plugin_api import hookimpl
from pgtasks.result import AsyncResult

if TYPE_CHECKING:
    from pgtasks.task import Task

__all__ = [
    "DjangoApp",
    "DjangoConnections",
    "DjangoEnqueuer",
    "django_connection",
    "follow_django_database",
    "get_app",
    "loaded_settings",
    "migrate_database",
]

_lock = threading.Lock()
_built: dict[str, DjangoApp] = {}  # "app": the process's one app, once built


def django_connection(alias: str = "default") -> psycopg.Connection[Any]:
    """The psycopg 3 connection under Django's connection ``alias`` in this thread,
    opened if it was not (``ensure_connection``). Statements on it are inside the
    ``transaction.atomic()`` block that is open, if any.

    Raises:
        ConfigurationError: no such database, or it is not PostgreSQL through
            psycopg 3 (psycopg2 and other engines have no such connection).
    """
    from django.db import connections
    from django.utils.connection import ConnectionDoesNotExist

    try:
        wrapper = connections[alias]
    except ConnectionDoesNotExist:
        raise ConfigurationError(f"Django has no database {alias!r} (PGTASKS['DATABASE'])") from None
    wrapper.ensure_connection()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise ConfigurationError(
            f"Django's database {alias!r} is not PostgreSQL through psycopg 3 "
            f"(its connection is {type(raw).__name__}); install psycopg 3, or set PGTASKS['DATABASE'] = None"
        )
    return raw


class DjangoEnqueuer(JobEnqueuer):
    """A `JobEnqueuer` whose jobs go on Django's connection when the call names none.

    The Django database is the app's ``django_database`` (`DjangoApp`); None keeps
    pgtasks' own pool.
    """

    def _connection(self, given: Any) -> Any:
        if given is not None:
            return given
        alias = getattr(self.source, "django_database", None)
        return None if alias is None else django_connection(alias)

    def enqueue(
        self, task: Task, args: tuple[Any, ...], kwargs: dict[str, Any], options: Mapping[str, Any]
    ) -> AsyncResult:
        """`JobEnqueuer.enqueue` on Django's connection unless ``connection`` is given.

        Raises:
            ConfigurationError: as `JobEnqueuer.enqueue`, or Django's database is not
                PostgreSQL through psycopg 3 (`django_connection`).
        """
        if options.get("connection") is None:
            options = {**options, "connection": self._connection(None)}
        return super().enqueue(task, args, kwargs, options)

    async def enqueue_async(
        self, task: Task, args: tuple[Any, ...], kwargs: dict[str, Any], options: Mapping[str, Any]
    ) -> AsyncResult:
        """`JobEnqueuer.enqueue_async`; without ``connection`` the job goes on pgtasks' own
        connections, committed at once: Django's connections are synchronous, and one
        opened in the thread the enqueue runs in would outlive it (Django closes
        connections at the end of a request, in the request's thread).

        Raises:
            as `JobEnqueuer.enqueue_async`.
        """
        if options.get("connection") is None:
            return await asyncio.to_thread(JobEnqueuer.enqueue, self, task, args, kwargs, options)
        return await super().enqueue_async(task, args, kwargs, options)

    def enqueue_batch(self, calls: Iterable[BatchCall], *, connection: Any = None) -> list[AsyncResult]:
        """`JobEnqueuer.enqueue_batch` on Django's connection unless ``connection`` is given.

        Raises:
            ConfigurationError: as `JobEnqueuer.enqueue_batch`, or as `django_connection`.
        """
        return super().enqueue_batch(calls, connection=self._connection(connection))


class DjangoConnections:
    """A plugin every `DjangoApp` registers: around each job a worker runs, Django's
    connections of the worker thread that are broken or past ``CONN_MAX_AGE`` are
    closed, before and after, as Django does around each request
    (``close_old_connections``). One in an ``atomic()`` block is left alone (a test's
    transaction, when a test runs a job in its own thread)."""

    @hookimpl(wrapper=True)
    def pgtasks_execute_job(self, context: Any) -> Generator[None, Any, Any]:
        """Close old connections, run the job, close old connections."""
        _close_old_connections()
        try:
            return (yield)
        finally:
            _close_old_connections()


def _close_old_connections() -> None:
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()


class DjangoApp(App):
    """An `App` whose jobs join Django's transactions (see `DjangoEnqueuer`), and whose
    jobs close Django's old connections around them (`DjangoConnections`).

    Args:
        name: the app's name.
        dsn: pgtasks' own connections (results, workers, the CLI).
        django_database: alias of the Django database whose connection jobs are
            written on when a call names no ``connection``; None for pgtasks' pool.
        load_entry_points: as `App`.
    """

    enqueuer_class = DjangoEnqueuer

    def __init__(
        self,
        name: str,
        dsn: str | None,
        *,
        django_database: str | None = "default",
        follow_django: bool = False,
        load_entry_points: bool | None = None,
    ) -> None:
        self.django_database = django_database
        #: Whether the DSN is that of Django's database, and follows it when its
        #: settings change (`follow_django_database`).
        self.follow_django = follow_django and django_database is not None
        super().__init__(name, dsn, load_entry_points=load_entry_points, plugins=[DjangoConnections()])


def follow_django_database(sender: object, connection: Any, **kwargs: Any) -> None:
    """Django's ``connection_created`` receiver: when Django opens a connection of the
    app's database with other settings than the app's DSN, point the app there
    (`pgtasks.App.use_database`), so that jobs and their results are read where they
    are written. Django's test runner does this: it renames each database to its test
    database (``test_<NAME>``, and one per process in parallel runs) before the tests.
    Only an app whose DSN comes from Django's settings follows (no ``PGTASKS["DSN"]``).
    """
    app = _built.get("app")
    if app is None or not app.follow_django or connection.alias != app.django_database:
        return
    dsn = dsn_of_database(connection.settings_dict)
    if dsn != app.settings.dsn:
        app.use_database(dsn)


def loaded_settings() -> DjangoSettings:
    """``settings.PGTASKS`` of the Django project, checked (`read_settings`).

    Raises:
        ConfigurationError: see `read_settings`.
    """
    from django.conf import settings

    return read_settings(getattr(settings, "PGTASKS", None))


def _ensure_django() -> None:
    """Set Django up when it is not yet (a worker process that re-executed itself, a
    child of the processes pool): ``DJANGO_SETTINGS_MODULE`` names the settings."""
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured

    if apps.apps_ready or apps.loading:  # set up, or setting up (an AppConfig's ready())
        return
    import django

    try:
        django.setup()
    except ImproperlyConfigured as exc:
        raise ConfigurationError(
            f"Django is not configured: {exc} (set DJANGO_SETTINGS_MODULE, as manage.py does)"
        ) from exc


def get_app() -> DjangoApp:
    """The pgtasks app of this process, built from ``settings.PGTASKS`` on first call.

    Its DSN is ``PGTASKS["DSN"]`` or else that of Django's database
    ``PGTASKS["DATABASE"]`` (`pgtasks.contrib.django.conf.dsn_of_database`); with
    neither, pgtasks' own resolution (``PGTASKS_DSN``, ``DATABASE_URL``, embedded).
    Sets Django up first if it is not (``DJANGO_SETTINGS_MODULE`` must name the
    settings then).

    Raises:
        ConfigurationError: a bad ``PGTASKS`` setting, or a Django database that is
            not PostgreSQL.
    """
    app = _built.get("app")
    if app is not None:
        return app
    _ensure_django()
    with _lock:
        if "app" not in _built:
            from django.db import connections

            conf = loaded_settings()
            dsn = conf.dsn
            if dsn is None and conf.database is not None:
                if conf.database not in connections.settings:
                    raise ConfigurationError(
                        f"Django has no database {conf.database!r} (PGTASKS['DATABASE'])"
                    )
                dsn = dsn_of_database(connections[conf.database].settings_dict)
            _built["app"] = DjangoApp(
                conf.app_name,
                dsn,
                django_database=conf.database,
                follow_django=conf.dsn is None,
                load_entry_points=conf.load_entry_points,
            )
        return _built["app"]


def migrate_database(connection: Any) -> list[str]:
    """Apply pgtasks' schema to the database Django is migrating (what this app's Django
    migration runs, so ``manage.py migrate`` covers pgtasks, test databases included).

    Args:
        connection: Django's connection of the database being migrated
            (``schema_editor.connection``).

    Returns:
        The pgtasks migrations applied (`pgtasks.App.migrate`); none when ``connection``
        is not the database pgtasks lives in (``PGTASKS["DATABASE"]``, or ``default``
        with ``DATABASE: None``, whose schema goes where ``DSN`` says).

    Raises:
        ConfigurationError: a bad ``PGTASKS`` setting, or not a PostgreSQL database.
        DatabaseError: PostgreSQL refused a migration.
    """
    from django.db import DEFAULT_DB_ALIAS

    conf = loaded_settings()
    if conf.database is None:
        return get_app().migrate() if connection.alias == DEFAULT_DB_ALIAS else []
    if connection.alias != conf.database:
        return []
    # The database being migrated, which is not the app's when Django's test runner made it.
    app = App(
        conf.app_name, dsn_of_database(connection.settings_dict), load_entry_points=conf.load_entry_points
    )
    try:
        return app.migrate()
    finally:
        app.close()
