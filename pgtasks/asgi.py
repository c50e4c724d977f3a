"""ASGI applications (FastAPI, Starlette): open a pgtasks `App` with the server, close it after.

`lifespan` is what ``FastAPI(lifespan=...)`` and ``Starlette(lifespan=...)`` take: on
startup it opens the app's resources (resolves the DSN, starting the embedded server
when there is none; opens the connection pool, failing at once with
`pgtasks.errors.ConnectionFailed` when PostgreSQL cannot be reached; migrates when
asked), and on shutdown it closes them (`pgtasks.App.close`: pending wake-ups sent,
pool closed). These calls block, so they run in a worker thread, never in the event
loop. The app is put in the lifespan state, so a request finds it as
``request.state.pgtasks``, and FastAPI endpoints can take it with
``Depends(pgtasks.asgi.current_app)``.

`running` is the same opening and closing as an async context manager, for an
application that writes its lifespan itself.

Enqueue from endpoints with ``await task.apply_async_async(..., connection=aconn)``
(docs/asyncio.md). Needs Starlette (the ``fastapi`` or ``dashboard`` extra).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Final

from starlette.requests import Request

from pgtasks.app import App
from pgtasks.errors import ConfigurationError
from pgtasks.validation import check_bool, short

__all__ = ["STATE_KEY", "AppLifespan", "Lifespan", "current_app", "lifespan", "running"]

#: The lifespan state's key for the app (``request.state.pgtasks``).
STATE_KEY: Final = "pgtasks"

#: A lifespan as Starlette takes one: called with the ASGI app, an async context
#: manager yielding the state (a mapping, or None for none).
Lifespan = Callable[[Any], AbstractAsyncContextManager[Mapping[str, Any] | None]]
#: What `lifespan` returns: a lifespan whose state holds the app (and ``inner``'s state).
AppLifespan = Callable[[Any], AbstractAsyncContextManager[dict[str, Any]]]


def _open(app: App, migrate: bool) -> None:
    """Open ``app``'s resources (in a worker thread): migrate if asked, then the pool."""
    if migrate:
        app.migrate()
    app.database.now()  # the first statement opens the pool, or fails with a clear message


@asynccontextmanager
async def running(app: App, *, migrate: bool = False) -> AsyncIterator[App]:
    """Open ``app``'s resources for the block and close them after it (see the module
    docstring); the blocking calls run in a worker thread.

    Args:
        app: the pgtasks application.
        migrate: run `pgtasks.App.migrate` first (idempotent and safe with several
            server processes starting at once).

    Yields:
        ``app``.

    Raises:
        ConfigurationError: ``app`` is not a `pgtasks.App`, or ``migrate`` not a bool.
        ConnectionFailed: PostgreSQL cannot be reached (nothing is left open).
        DatabaseError: a migration failed.
    """
    if not isinstance(app, App):
        raise ConfigurationError(f"app must be a pgtasks.App, got {short(app)}")
    check_bool("migrate", migrate)
    try:
        await asyncio.to_thread(_open, app, migrate)
        yield app
    finally:
        await asyncio.to_thread(app.close)


def lifespan(app: App, *, migrate: bool = False, inner: Lifespan | None = None) -> AppLifespan:
    """A lifespan for ``FastAPI(lifespan=...)`` or ``Starlette(lifespan=...)``: `running`
    around the server's life, with the app in the state under `STATE_KEY`.

    Args:
        app: the pgtasks application.
        migrate: migrate on startup (see `running`).
        inner: your own lifespan, run inside once the app is open (so it may use
            ``app.database.dsn``, e.g. to open a ``psycopg_pool.AsyncConnectionPool``)
            and ended before the app closes; the state it yields is merged in.

    Returns:
        The lifespan (a callable of the ASGI application).

    Raises:
        ConfigurationError: ``app`` is not a `pgtasks.App`, ``migrate`` is not a
            bool, or ``inner`` is not callable.
    """
    if not isinstance(app, App):
        raise ConfigurationError(f"app must be a pgtasks.App, got {short(app)}")
    check_bool("migrate", migrate)
    if inner is not None and not callable(inner):
        raise ConfigurationError(f"inner must be a lifespan (a callable), got {short(inner)}")

    @asynccontextmanager
    async def serve(asgi_app: Any) -> AsyncIterator[dict[str, Any]]:
        async with running(app, migrate=migrate):
            if inner is None:
                yield {STATE_KEY: app}
                return
            async with inner(asgi_app) as state:
                yield {**(state or {}), STATE_KEY: app}

    return serve


def current_app(request: Request) -> App:
    """The pgtasks app of the request's lifespan (``Depends(current_app)`` in FastAPI).

    Raises:
        ConfigurationError: the application was not started with `lifespan`.
    """
    app = getattr(request.state, STATE_KEY, None)
    if not isinstance(app, App):
        raise ConfigurationError(
            "no pgtasks app in the request state: start the ASGI application with "
            "lifespan=pgtasks.asgi.lifespan(app)"
        )
    return app
