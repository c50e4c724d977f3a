"""`Database`: the pool, connections, transactions and COPY; the only owner of a cursor.

Every statement comes from a named-query mapping (`pgtasks.sql.QUERIES` or a
plugin's own file). The typed stores beside this module (`pgtasks.db.jobs`,
`pgtasks.db.workers`, `pgtasks.db.schedules`, `pgtasks.db.migrations`) are the
only callers of its run-by-name methods inside pgtasks: one method per named
query, and they turn rows into records. jsonb values are decoded with orjson and
pgtasks' tagged types (see `pgtasks.serialization`).

Connections are autocommit: each statement is its own transaction unless the
caller passes its own connection (``conn=``), in which case the statement joins
the caller's transaction and commits or rolls back with it.

A pooled connection whose server side has gone (``pg_terminate_backend``, a
server restart, an idle timeout) is never handed out: `Database.pooled_alive`
checks each one as it leaves the pool, and after a cut the pool replaces it with
a fresh connection at once. No statement is ever re-run here: one that fails
while in flight may have committed, so it raises `DatabaseError` (``transient``)
and its caller decides (see docs/workers.md, "After a connection cut").

A statement run for a tenant (through a `Database.scoped` view, or inside
`tenant_context`) runs in a transaction that first says whose it is
(``set_config('pgtasks.tenant', tenant, true)``, the named query
``tenant_scope``): the row-level security policies of migration 0006 read it.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import select
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import sql as psql
from psycopg.adapt import AdaptersMap, Loader
from psycopg.conninfo import conninfo_to_dict, timeout_from_conninfo
from psycopg.rows import RowFactory, dict_row, tuple_row
from psycopg.types.datetime import TimestamptzBinaryLoader, TimestamptzLoader
from psycopg_pool import ConnectionPool

from pgtasks.errors import ConfigurationError, ConnectionFailed, DatabaseError
from pgtasks.redaction import redact_text
from pgtasks.serialization import loads_json, undecodable
from pgtasks.sql import QUERIES

if TYPE_CHECKING:
    from pgtasks.db.held import HeldTransaction

__all__ = [
    "MAX_APPLICATION_NAME_BYTES",
    "AnyAsyncConnection",
    "AnyConnection",
    "Database",
    "Now",
    "Row",
    "bigint_array_literal",
    "check_dsn",
    "current_tenant",
    "describe_dsn",
    "fit_application_name",
    "tenant_context",
    "text_array_literal",
    "translate_error",
]

log = logging.getLogger("pgtasks.db")

Row = dict[str, Any]
T = TypeVar("T")
Params = Mapping[str, Any] | None
AnyConnection = psycopg.Connection[Any]
# A caller's asyncio connection (``connection=`` of the async enqueue), or a dedicated
# one of `Database.connect_async` (`AsyncResult.get_async` waits on it).
AnyAsyncConnection = psycopg.AsyncConnection[Any]
# A time parameter of a store method: an instant to pin it (tests of leases, backoff
# and cron), or None for the database clock, which the statements then read with
# ``coalesce(%(now)s, now())``. Workers never use their own clock.
Now = datetime | None


Buffer = bytes | bytearray | memoryview

# The tenant whose transaction a statement runs in, when no `Database.scoped` view
# says it (`tenant_context`): what a tenant handle sets around the code it calls
# (enqueue, a plugin's search) so that every statement says whose it is.
_TENANT: ContextVar[str | None] = ContextVar("pgtasks_tenant", default=None)


@contextmanager
def tenant_context(tenant: str) -> Iterator[None]:
    """Run every statement of the block, on any `Database`, in a transaction of
    ``tenant`` (see the module docstring); contexts nest, the innermost wins.

    Args:
        tenant: the tenant, a non-empty string (checked by the caller).
    """
    token = _TENANT.set(tenant)
    try:
        yield
    finally:
        _TENANT.reset(token)


def _nothing() -> None:
    return None


async def _nothing_async() -> None:
    return None


def _aborted(c: AnyConnection) -> bool:
    """Whether ``c``'s transaction failed (PostgreSQL refuses every statement until it ends)."""
    return c.info.transaction_status == psycopg.pq.TransactionStatus.INERROR


def current_tenant() -> str | None:
    """The tenant of the innermost `tenant_context`, or None."""
    return _TENANT.get()


# libpq messages of a server that answered and said no (settings must change first).
_REFUSED_BY_SERVER = (
    "authentication failed",
    "does not exist",
    "no pg_hba.conf entry",
    "permission denied",
)

# How libpq's messages about a connection parameter's value begin (fe-connect.c):
# ``invalid sslmode value: "bogus"``, ``invalid integer value "abc" for connection
# option "port"``, ``invalid port number``, ``could not match 2 port numbers to 3
# hosts``, ``could not parse network address "abc"`` (hostaddr). libpq checks most
# values before it opens a socket, some (keepalives) as it connects; either way no
# server has answered, and the DSN must change before a retry can succeed.
_REFUSED_BY_LIBPQ = ("invalid ", "could not match ", "could not parse network address ")
# What precedes such a message: psycopg's "connection is bad: " or "connection failed: ",
# and libpq's 'connection to server at "host", port 5432 failed: ' of the host it tried.
_MESSAGE_PREFIX = re.compile(
    r"^(?:connection (?:is bad|failed): )?(?:connection to server (?:at|on socket) .*? failed: )?"
)
# SQLSTATEs of a statement that names an object pgtasks' migrations create, when the
# object is missing: undefined_table, invalid_schema_name, undefined_function.
_UNDEFINED_OBJECT = frozenset({"42P01", "3F000", "42883"})
# ... and the message naming one of pgtasks' schema: relation "pgtasks.workers",
# schema "pgtasks", function pgtasks.tenant_role(...).
_NAMES_PGTASKS_SCHEMA = re.compile(r'\bpgtasks\.|schema "pgtasks"')

#: PostgreSQL keeps at most this many bytes of ``application_name`` (NAMEDATALEN - 1).
MAX_APPLICATION_NAME_BYTES = 63


class _JsonbLoader(Loader):
    """Decode jsonb (text or binary) with orjson and pgtasks' type tags."""

    def load(self, data: Buffer) -> Any:
        raw = bytes(data)
        if raw == b"{}":  # empty headers, args and kwargs: most jobs have some
            return {}
        if raw == b"[]":
            return []
        if raw[:1] == b"\x01":  # binary jsonb: version byte, then text
            raw = raw[1:]
        return loads_json(raw)


class _JsonbBinaryLoader(_JsonbLoader):
    format = psycopg.pq.Format.BINARY


# Lenient loaders, for the worker's claims (``lenient=True``): a value that cannot be read
# becomes an `Undecodable` marker instead of an exception, which would fail the fetch of the
# whole batch after its UPDATE had already marked every row running.


class _LenientJsonbLoader(_JsonbLoader):
    def load(self, data: Buffer) -> Any:
        try:
            return super().load(data)
        except Exception as exc:  # any error of orjson, a type tag or a time zone: this value only
            return undecodable(exc)


class _LenientJsonbBinaryLoader(_LenientJsonbLoader):
    format = psycopg.pq.Format.BINARY


class _LenientTimestamptzLoader(TimestamptzLoader):
    def load(self, data: Buffer) -> Any:
        try:
            return super().load(data)
        except psycopg.DataError as exc:  # 'infinity', or a year Python's datetime cannot hold
            return undecodable(exc)


class _LenientTimestamptzBinaryLoader(TimestamptzBinaryLoader):
    def load(self, data: Buffer) -> Any:
        try:
            return super().load(data)
        except psycopg.DataError as exc:
            return undecodable(exc)


_LENIENT_LOADERS: tuple[tuple[str, type[Loader]], ...] = (
    ("jsonb", _LenientJsonbLoader),
    ("jsonb", _LenientJsonbBinaryLoader),
    ("json", _LenientJsonbLoader),
    ("timestamptz", _LenientTimestamptzLoader),
    ("timestamptz", _LenientTimestamptzBinaryLoader),
)


def _has_input(fd: int) -> bool:
    """Whether socket ``fd`` has something to read (or hung up), without waiting.

    ``poll`` where there is one: ``select`` refuses descriptors past 1023 on Linux,
    which a busy application process reaches.
    """
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)  # Windows: no poll, and no such limit
    return bool(readable)


def text_array_literal(items: Iterable[str]) -> str:
    """A PostgreSQL ``text[]`` literal of ``items`` (each double-quoted, ``\\`` and ``"`` escaped).

    For parameters sent again and again (a worker's queues): psycopg adapts a list
    element by element on every call. Quoting follows "8.15.6. Array Input and
    Output Syntax" of the PostgreSQL documentation.
    """
    quoted = ('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' for item in items)
    return "{" + ",".join(quoted) + "}"


def bigint_array_literal(ids: Iterable[int]) -> str:
    """A PostgreSQL ``bigint[]`` literal of ``ids``: one string where psycopg would adapt a
    list element by element."""
    return "{" + ",".join([str(i) for i in ids]) + "}"


def describe_dsn(dsn: str) -> str:
    """A DSN without its password, as ``host:port/dbname`` for messages and logs.

    A multi-host DSN (``host=a,b port=5432,5433``: libpq tries each in turn) is
    shown host by host, ``a:5432,b:5433/dbname``; one port given for several hosts
    applies to each, as libpq reads it.
    """
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    hosts = str(parts.get("host") or parts.get("hostaddr") or "local socket").split(",")
    ports = str(parts.get("port") or "5432").split(",")
    if len(ports) != len(hosts):  # one port for all (libpq refuses other counts when connecting)
        ports = [ports[0]] * len(hosts)
    db = str(parts.get("dbname") or parts.get("user") or "")
    servers = ",".join(
        f"{host or 'local socket'}:{port or '5432'}" for host, port in zip(hosts, ports, strict=True)
    )
    return f"{servers}/{db}"


def translate_error(exc: psycopg.Error, *, schema_hint: bool = True) -> DatabaseError:
    """Wrap a psycopg error in `DatabaseError`, judging transience by SQLSTATE.

    Args:
        exc: the error.
        schema_hint: when the statement names a table, schema or function of pgtasks'
            schema that is missing (`_UNDEFINED_OBJECT`), say so in one line with what
            to do, ``run `pgtasks migrate```, and PostgreSQL's first line (without the
            ``LINE``/``HINT`` lines that point into pgtasks' SQL). False for the
            migrations' own scripts, which create that schema.
    """
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate is None:  # no SQLSTATE: the connection itself failed or was lost
        transient = isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    else:
        transient = DatabaseError.is_transient_sqlstate(sqlstate)
    message = str(exc).strip() or type(exc).__name__
    if schema_hint and sqlstate in _UNDEFINED_OBJECT:
        primary = getattr(getattr(exc, "diag", None), "message_primary", None) or message.splitlines()[0]
        if _NAMES_PGTASKS_SCHEMA.search(primary):
            message = (
                f"pgtasks' schema is not installed in this database, or is older than this "
                f"version of pgtasks ({primary}): run `pgtasks migrate`"
            )
    err = DatabaseError(message, sqlstate=sqlstate, transient=transient)
    err.__cause__ = exc
    return err


def check_dsn(dsn: str) -> dict[str, Any]:
    """Check a DSN as libpq and psycopg read it, without connecting.

    libpq's parser (through `psycopg.conninfo.conninfo_to_dict`) refuses bad syntax
    and unknown parameters; psycopg's `psycopg.conninfo.timeout_from_conninfo`
    refuses a ``connect_timeout`` (or ``PGCONNECT_TIMEOUT``) that is not a number.
    Other values (``sslmode``, ``port`` ...) libpq checks only when it connects:
    `Database.connect` reports its refusal as a `ConfigurationError` too.

    Returns:
        The DSN's parameters, as ``conninfo_to_dict`` gives them (those it names only).

    Raises:
        ConfigurationError: the DSN is refused; the message gives the reason as libpq
            or psycopg word it, with any password masked.
    """
    try:
        params = conninfo_to_dict(dsn)
        timeout_from_conninfo(params)
    except psycopg.ProgrammingError as exc:
        raise _dsn_refused(dsn, exc) from None
    return params


def _dsn_refused(dsn: str, exc: psycopg.Error) -> ConfigurationError:
    """The `ConfigurationError` of a DSN that libpq or psycopg refused with ``exc``."""
    return ConfigurationError(f"invalid PostgreSQL DSN ({describe_dsn(dsn)}): {_reason(exc)}")


def _reason(exc: psycopg.Error) -> str:
    """The message of a failed connection attempt on one line: psycopg's prefix
    ("connection failed: ") dropped, libpq's lines (its hint on a line of its own,
    each host of a multi-host DSN) joined with ``; ``, runs of whitespace made one
    space, and any password masked."""
    lines = [" ".join(line.split()) for line in str(exc).splitlines()]
    text = "; ".join(line for line in lines if line)
    text = re.sub(r"^connection (?:is bad|failed): ", "", text)
    return redact_text(text) or type(exc).__name__


def _refused_by_libpq(exc: psycopg.Error) -> bool:
    """Whether libpq refused a connection parameter's value (see `_REFUSED_BY_LIBPQ`)."""
    return any(
        _MESSAGE_PREFIX.sub("", line.strip()).startswith(_REFUSED_BY_LIBPQ) for line in str(exc).splitlines()
    )


def fit_application_name(name: str) -> str:
    """``name`` shortened, if need be, to what PostgreSQL keeps of an ``application_name``
    (`MAX_APPLICATION_NAME_BYTES` bytes of UTF-8): its middle is replaced by ``...``, so
    that both ends stay (a worker's id ends with its process id and a random part)."""
    if len(name.encode("utf-8")) <= MAX_APPLICATION_NAME_BYTES:
        return name
    tail = name[-20:]
    head = name[: len(name) - 20]
    room = MAX_APPLICATION_NAME_BYTES - len(tail.encode("utf-8")) - 3
    head_bytes = head.encode("utf-8")[:room]
    return head_bytes.decode("utf-8", "ignore") + "..." + tail


def _register_loaders(adapters: AdaptersMap) -> None:
    """Decode jsonb and json with orjson and pgtasks' type tags (`_JsonbLoader`)."""
    adapters.register_loader("jsonb", _JsonbLoader)
    adapters.register_loader("jsonb", _JsonbBinaryLoader)
    adapters.register_loader("json", _JsonbLoader)


def _connect_failed(dsn: str, exc: psycopg.Error) -> ConnectionFailed | ConfigurationError:
    """The error of a connection attempt that failed with ``exc``.

    A `ConfigurationError` when psycopg refused the DSN (a ``ProgrammingError``) or
    libpq refused a parameter's value (`_REFUSED_BY_LIBPQ`); else `ConnectionFailed`,
    transient unless the server answered and refused (`_REFUSED_BY_SERVER`). The
    message is one line (`_reason`).
    """
    if isinstance(exc, psycopg.ProgrammingError) or _refused_by_libpq(exc):
        return _dsn_refused(dsn, exc)
    refused = any(marker in str(exc) for marker in _REFUSED_BY_SERVER)
    return ConnectionFailed(
        f"cannot connect to PostgreSQL at {describe_dsn(dsn)}: {_reason(exc)}", transient=not refused
    )


def _pipeline_scope(autocommit: bool, idle: bool) -> tuple[str, str | None]:
    """The statements around one statement of a tenant sent in a pipeline (see
    `Database._as_tenant`): ``tenant_scope`` alone when the pipeline's implicit
    transaction ends with it (an autocommit connection outside any transaction), else
    ``tenant_scope_enter`` before and ``tenant_scope_leave`` after (a transaction that
    goes on, the caller's)."""
    if autocommit and idle:
        return "tenant_scope", None
    return "tenant_scope_enter", "tenant_scope_leave"


def configure_connection(conn: AnyConnection, session: str = "session_setup") -> None:
    """Prepare one of pgtasks' own connections (pooled and dedicated; never a caller's).

    Registers the jsonb loaders and runs the named ``session`` query: by default
    ``session_setup`` (JIT off: the claim's cost estimate crosses ``jit_above_cost``
    and JIT compilation then costs more than the whole statement; PostgreSQL's docs
    advise against JIT for short OLTP queries, "Chapter 30. Just-in-Time
    Compilation"); a worker's store uses ``worker_session_setup``, which also asks
    for generic plans (``plan_cache_mode``, "20.7.4. Other Planner Options") and
    prices sequential scans out (``enable_seqscan``, "20.7.1. Planner Method
    Configuration"): a generic plan made while the queue was empty would otherwise
    scan the whole table for each claimed job once it is full. Behind a
    transaction-pooling PgBouncer they may not stick; nothing else depends on them.
    """
    _register_loaders(conn.adapters)
    with conn.cursor() as cur:
        cur.execute(QUERIES[session])
    if not conn.autocommit:
        conn.commit()


async def configure_async_connection(conn: AnyAsyncConnection, session: str = "session_setup") -> None:
    """`configure_connection` for a dedicated asyncio connection (`Database.connect_async`)."""
    _register_loaders(conn.adapters)
    async with conn.cursor() as cur:
        await cur.execute(QUERIES[session])
    if not conn.autocommit:
        await conn.commit()


class Database:
    """Runs named queries against PostgreSQL through a small connection pool.

    Args:
        dsn: libpq connection string or URI.
        queries: name → statement mapping (default: pgtasks' own file).
        max_size: most pooled connections (default 8).
        connect_timeout: seconds to wait for a first connection (default 10), and for
            each dedicated connection (`connect`) unless the DSN sets its own
            ``connect_timeout`` (or the environment ``PGCONNECT_TIMEOUT``): that one
            applies then, as libpq applies it to each host of a multi-host DSN.
        prepare_threshold: psycopg's automatic server-side prepare threshold; None
            disables prepared statements (needed behind PgBouncer in transaction
            pooling before PgBouncer 1.21).
        session: the named query run on every new connection (`configure_connection`).
        prepare_at_first_use: the named queries run through `fetch_all`, `fetch_one` and
            `fetch_tuples` are prepared at their first execution on a connection, not
            after ``prepare_threshold`` executions (a worker's store: it runs a few of
            them again and again, and with psycopg's default threshold of 5 a drain of
            20,000 jobs ran three claims in ten unprepared, each parsed and planned
            again: 16 against 8 ms on the server, one per pooled connection and query
            until the threshold). No effect when ``prepare_threshold`` is None.
        listen: whether waits on a dedicated connection may ``LISTEN`` (`listen`;
            False behind PgBouncer in transaction pooling, where a ``LISTEN`` would
            stay behind on a server connection other clients then get).
        application_name: what PostgreSQL shows of this database's connections
            (``pg_stat_activity.application_name``; default ``pgtasks``), shortened to
            `MAX_APPLICATION_NAME_BYTES` (`fit_application_name`). It is libpq's
            ``fallback_application_name``: an ``application_name`` of the DSN, or
            ``PGAPPNAME``, wins over it, and so does a ``fallback_application_name``
            of the DSN.

    Raises:
        ConfigurationError: (on first use) libpq or psycopg refuse the DSN (`check_dsn`,
            and a value libpq refuses as it connects); the message gives their reason.
        ConnectionFailed: (on first use) the server cannot be reached; the message
            names host, port and database.
    """

    def __init__(
        self,
        dsn: str,
        *,
        queries: Mapping[str, str] = QUERIES,
        max_size: int = 8,
        connect_timeout: float = 10.0,
        prepare_threshold: int | None = 5,
        session: str = "session_setup",
        listen: bool = True,
        prepare_at_first_use: bool = False,
        application_name: str = "pgtasks",
    ) -> None:
        self.dsn = dsn
        # psycopg's per-execution flag: True prepares now, None leaves it to the threshold.
        self._prepare: bool | None = True if prepare_at_first_use and prepare_threshold is not None else None
        self._session = session
        #: Whether `AsyncResult.get` LISTENs for "jobs finished" while it waits (else
        #: it only reads the job again each second).
        self.listen = listen
        self.queries = MappingProxyType(dict(queries))
        self._max_size = max_size
        self._connect_timeout = connect_timeout
        self._prepare_threshold = prepare_threshold
        self._application_name = fit_application_name(application_name)
        # The keyword arguments of every connection, once the DSN is checked (`_connect_kwargs`).
        self._kwargs: dict[str, Any] | None = None
        self._timeout_given = False  # the DSN or PGCONNECT_TIMEOUT sets connect_timeout
        self._pool: ConnectionPool[AnyConnection] | None = None
        self._lock = threading.Lock()
        self._root = self
        self.tenant: str | None = None

    def scoped(self, tenant: str) -> Database:
        """A view of this database whose every statement runs in a transaction of
        ``tenant`` (``set_config('pgtasks.tenant', ...)`` first; see the module
        docstring). It shares this database's pool; closing either closes both.

        Args:
            tenant: the tenant, a non-empty string (checked by the caller).
        """
        view = Database.__new__(Database)
        view.__dict__.update(self.__dict__)
        view.tenant = tenant
        return view

    # -- connections -------------------------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of every connection this database opens (its pool's and
        dedicated ones), the DSN checked the first time (`check_dsn`).

        Raises:
            ConfigurationError: the DSN is refused.
        """
        kwargs = self._kwargs
        if kwargs is None:
            params = check_dsn(self.dsn)
            kwargs = {"prepare_threshold": self._prepare_threshold}
            if "fallback_application_name" not in params:  # the DSN's own wins
                kwargs["fallback_application_name"] = self._application_name
            self._timeout_given = "connect_timeout" in params or "PGCONNECT_TIMEOUT" in os.environ
            self._kwargs = kwargs
        return kwargs

    def _dedicated_kwargs(self) -> dict[str, Any]:
        """`_connect_kwargs`, and this database's ``connect_timeout`` unless the DSN or
        ``PGCONNECT_TIMEOUT`` gives one (a keyword argument would override it: a
        multi-host DSN's short timeout, kept so for failover, would become 10 s).

        Raises:
            ConfigurationError: the DSN is refused.
        """
        kwargs = self._connect_kwargs()
        if self._timeout_given:
            return kwargs
        return {**kwargs, "connect_timeout": max(1, int(self._connect_timeout))}

    def connect(self, *, autocommit: bool = True) -> AnyConnection:
        """Open a dedicated connection (listener, worker loop); the caller closes it.

        Raises:
            ConfigurationError: libpq or psycopg refuse the DSN (bad syntax, an unknown
                parameter, a value such as ``connect_timeout=abc`` or ``sslmode=bogus``).
            ConnectionFailed: the server cannot be reached.
            DatabaseError: the connection was lost while it was set up (a server
                shutting down right after accepting it: transient).
        """
        kwargs = self._dedicated_kwargs()
        try:
            conn = psycopg.connect(self.dsn, autocommit=autocommit, **kwargs)
        except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
            raise _connect_failed(self.dsn, exc) from None
        try:
            configure_connection(conn, self._session)
        except psycopg.Error as exc:  # e.g. the server stopped between connect and set-up
            conn.close()
            raise translate_error(exc) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    async def connect_async(self, *, autocommit: bool = True) -> AnyAsyncConnection:
        """Open a dedicated asyncio connection (what `AsyncResult.get_async` listens on),
        prepared as `connect` prepares its own; the caller closes it.

        Raises:
            ConfigurationError: libpq or psycopg refuse the DSN (see `connect`).
            ConnectionFailed: the server cannot be reached.
            DatabaseError: the connection was lost while it was set up (transient).
        """
        kwargs = self._dedicated_kwargs()
        try:
            conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=autocommit, **kwargs)
        except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
            raise _connect_failed(self.dsn, exc) from None
        try:
            await configure_async_connection(conn, self._session)
        except psycopg.Error as exc:
            await conn.close()
            raise translate_error(exc) from exc
        except BaseException:
            await conn.close()
            raise
        return conn

    def _get_pool(self) -> ConnectionPool[AnyConnection]:
        if self._root is not self:
            return self._root._get_pool()
        pool = self._pool
        if pool is not None:
            return pool
        with self._lock:
            if self._pool is None:
                # Fail fast with a clear message: the DSN checked (`check_dsn`; the pool
                # would retry a refused one until its timeout), then one connection made.
                self.connect().close()
                self._pool = ConnectionPool(
                    self.dsn,
                    min_size=1,
                    max_size=self._max_size,
                    kwargs={"autocommit": True, **self._connect_kwargs()},
                    configure=functools.partial(configure_connection, session=self._session),
                    open=False,
                    name="pgtasks",
                    timeout=self._connect_timeout,
                    check=self.pooled_alive,
                )
                self._pool.open(wait=True, timeout=self._connect_timeout)
            return self._pool

    def pooled_alive(self, conn: AnyConnection) -> None:
        """The pool's check of a connection it is about to hand out; raises if it is dead.

        An idle autocommit connection receives nothing until it sends a statement,
        so a socket with something to read (at once, without waiting) means the
        server has spoken on its own: almost always the ``FATAL`` and close of a
        terminated backend or a shutting-down server, rarely a parameter report.
        Only then does the check ask the server (an empty statement, one round
        trip: psycopg_pool's ``check_connection``); the usual case costs one
        ``poll()`` call. When the connection is dead, its idle siblings died with
        it most likely, so the pool checks them all at once (``ConnectionPool.check``,
        which replaces the dead ones) instead of handing them out one by one: its
        loop over failed checks backs off 1 s, 2 s, 4 s between tries.

        Raises:
            psycopg.Error: the connection is dead; the pool discards it and hands
                out another, or waits for a new one (up to ``connect_timeout``).
        """
        if not _has_input(conn.fileno()):
            return
        try:
            ConnectionPool.check_connection(conn)
        except psycopg.Error:
            pool = self._root._pool
            if pool is not None:
                log.warning("pooled connections to %s were cut; replacing them", describe_dsn(self.dsn))
                pool.check()
            raise

    def held_transaction(self) -> HeldTransaction:
        """A transaction to keep open across a task's body and commit with its job's
        outcome (`pgtasks.db.held.HeldTransaction`), on a pooled connection taken at
        its first statement."""
        from pgtasks.db.held import HeldTransaction

        return HeldTransaction(self._get_pool(), timeout=self._connect_timeout)

    @contextmanager
    def connection(self, conn: AnyConnection | None = None) -> Iterator[AnyConnection]:
        """Yield ``conn`` if given (the caller's transaction), else a pooled connection."""
        if conn is not None:
            yield conn
            return
        with self._get_pool().connection() as pooled:
            yield pooled

    def close(self) -> None:
        """Close the pool; later calls reopen it."""
        if self._root is not self:
            self._root.close()
            return
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    # -- statements --------------------------------------------------------------

    def now(self, *, conn: AnyConnection | None = None) -> datetime:
        """The database clock (``now()``: the start of ``conn``'s transaction, if given)."""
        row = self.fetch_one("clock_now", conn=conn)
        assert row is not None
        value: datetime = row["now"]
        return value

    def query(self, name: str) -> str:
        """The text of a named query.

        Raises:
            KeyError: no query has that name (a programming error).
        """
        return self.queries[name]

    def fetch_all(self, name: str, params: Params = None, *, conn: AnyConnection | None = None) -> list[Row]:
        """Run a named query and return every row as a dict.

        Raises:
            DatabaseError: PostgreSQL refused the statement or the connection broke.
        """
        return self._fetch(name, params, conn, dict_row)

    def fetch_tuples(
        self, name: str, params: Params = None, *, conn: AnyConnection | None = None, lenient: bool = False
    ) -> list[tuple[Any, ...]]:
        """Run a named query and return every row as a tuple (the worker's hot path).

        Args:
            lenient: a jsonb or timestamptz value that cannot be read comes back as a
                `pgtasks.serialization.Undecodable` marker instead of raising (the
                worker's claims: the statement has written by the time its rows are
                read, so one unreadable row must not fail the others).

        Raises:
            DatabaseError: PostgreSQL refused the statement or the connection broke.
        """
        return self._fetch(name, params, conn, tuple_row, lenient)

    def _fetch(
        self,
        name: str,
        params: Params,
        conn: AnyConnection | None,
        row_factory: RowFactory[T],
        lenient: bool = False,
    ) -> list[T]:
        text = self.queries[name]
        try:
            with (
                self.connection(conn) as c,
                self._as_tenant(c) as flush,
                c.cursor(row_factory=row_factory) as cur,
            ):
                if lenient:
                    for type_name, loader in _LENIENT_LOADERS:
                        cur.adapters.register_loader(type_name, loader)
                cur.execute(text, params, prepare=self._prepare)
                flush()
                return cur.fetchall() if cur.description is not None else []
        except psycopg.Error as exc:
            raise translate_error(exc) from exc

    @contextmanager
    def _as_tenant(
        self, c: AnyConnection, *, pipeline: bool = True, pooled_block: bool = False
    ) -> Iterator[Callable[[], None]]:
        """Prepare ``c`` for one statement of this view's tenant, or of the
        `tenant_context`'s: yields what to call after the statement, before reading
        its result (a no-op when there is no tenant).

        With a tenant, ``tenant_scope`` runs first in the statement's transaction: the
        caller's, or else the implicit transaction that PostgreSQL gives the
        statements of a pipeline up to its next Sync ("55.2.4. Pipelining" of the
        protocol docs): both go in one pipeline (psycopg's pipeline mode), one round
        trip, and commit together. ``pipeline=False`` (COPY, which a pipeline cannot
        carry, and `transaction`) runs it on its own, in an explicit transaction when
        ``c`` is an autocommit connection outside any.

        In a transaction that goes on after the statement or block (the caller's,
        ``connection=``), the tenant is the statement's alone: the transaction's own
        (another tenant's, or none) is put back after it, in the same pipeline
        (``tenant_scope_enter`` and ``tenant_scope_leave``), or after the block
        (``tenant_scope_swap``); a statement that fails leaves the transaction
        aborted, or rolled back to the block's savepoint, which undoes the setting
        anyway. ``pooled_block`` (`transaction` on a pooled connection, which
        ``TenantScope.connection`` hands to the caller's own SQL) resets a
        session-level ``pgtasks.tenant`` at the end of the block instead, so the
        pool's next user does not inherit it.
        """
        tenant = self.tenant if self.tenant is not None else _TENANT.get()
        if tenant is None:
            yield _nothing
            return
        params = {"tenant": tenant}
        idle = c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if pipeline:
            before, after = _pipeline_scope(c.autocommit, idle)
            with c.pipeline() as p:
                c.execute(QUERIES[before], params)

                def leave() -> None:
                    if after is not None:
                        c.execute(QUERIES[after])
                    p.sync()

                yield leave
            return
        if c.autocommit and idle:
            with c.transaction():
                c.execute(QUERIES["tenant_scope"], params)
                yield _nothing
            return
        if pooled_block:
            c.execute(QUERIES["tenant_scope"], params)
            yield _nothing
            if not _aborted(c):  # an aborted transaction rolls back, its SET with it
                c.execute(QUERIES["tenant_scope_reset"])
            return
        row = c.execute(QUERIES["tenant_scope_swap"], params).fetchone()
        assert row is not None
        yield _nothing
        if not _aborted(c):
            c.execute(QUERIES["tenant_scope"], {"tenant": row[0]})

    def fetch_one(self, name: str, params: Params = None, *, conn: AnyConnection | None = None) -> Row | None:
        """Run a named query and return its first row, or None."""
        rows = self.fetch_all(name, params, conn=conn)
        return rows[0] if rows else None

    # -- statements on an asyncio connection -------------------------------------------

    async def fetch_all_async(
        self, name: str, params: Params = None, *, conn: AnyAsyncConnection
    ) -> list[Row]:
        """`fetch_all` on an asyncio connection, without leaving the event loop.

        There is no asyncio pool: ``conn`` is the caller's `psycopg.AsyncConnection`
        (the statement joins its transaction and commits or rolls back with it, as
        ``conn=`` of `fetch_all`) or a dedicated one of `connect_async`. A tenant's
        statement first says whose transaction it is, in the same pipeline, as
        `_as_tenant` does; jsonb values are decoded as on pgtasks' own connections,
        on the caller's connection too.

        Raises:
            DatabaseError: PostgreSQL refused the statement or the connection broke.
        """
        text = self.queries[name]
        try:
            async with self._as_tenant_async(conn) as flush, conn.cursor(row_factory=dict_row) as cur:
                _register_loaders(cur.adapters)
                await cur.execute(text, params)
                await flush()
                return await cur.fetchall() if cur.description is not None else []
        except psycopg.Error as exc:
            raise translate_error(exc) from exc

    async def fetch_one_async(
        self, name: str, params: Params = None, *, conn: AnyAsyncConnection
    ) -> Row | None:
        """`fetch_one` on an asyncio connection (see `fetch_all_async`)."""
        rows = await self.fetch_all_async(name, params, conn=conn)
        return rows[0] if rows else None

    @asynccontextmanager
    async def _as_tenant_async(self, c: AnyAsyncConnection) -> AsyncIterator[Callable[[], Awaitable[None]]]:
        """`_as_tenant` (in a pipeline) for an asyncio connection: yields what to await
        after the statement, before reading its result."""
        tenant = self.tenant if self.tenant is not None else _TENANT.get()
        if tenant is None:
            yield _nothing_async
            return
        idle = c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        before, after = _pipeline_scope(c.autocommit, idle)
        async with c.pipeline() as p:
            await c.execute(QUERIES[before], {"tenant": tenant})

            async def leave() -> None:
                if after is not None:
                    await c.execute(QUERIES[after])
                await p.sync()

            yield leave

    def execute(self, name: str, params: Params = None, *, conn: AnyConnection | None = None) -> int:
        """Run a named query for its effect; returns the affected row count."""
        text = self.queries[name]
        try:
            with self.connection(conn) as c, self._as_tenant(c) as flush, c.cursor() as cur:
                cur.execute(text, params)
                flush()
                return cur.rowcount
        except psycopg.Error as exc:
            raise translate_error(exc) from exc

    def execute_script(self, sql_text: str, *, conn: AnyConnection) -> None:
        """Run a trusted multi-statement script shipped in the package (migrations only).

        Raises:
            DatabaseError: PostgreSQL refused a statement (its message as it is: the
                script creates pgtasks' schema, so a missing object of it is not a
                schema to install).
        """
        try:
            conn.execute(psql.SQL(sql_text))
        except psycopg.Error as exc:
            raise translate_error(exc, schema_hint=False) from exc

    def copy_in(self, name: str, rows: Iterable[Sequence[Any]], *, conn: AnyConnection | None = None) -> None:
        """Stream rows into a named ``COPY ... FROM STDIN`` statement (text format)."""
        text = self.queries[name]
        try:
            with (
                self.connection(conn) as c,
                self._as_tenant(c, pipeline=False),
                c.cursor() as cur,
                cur.copy(text) as copy,
            ):
                for row in rows:
                    copy.write_row(row)
        except psycopg.Error as exc:
            raise translate_error(exc) from exc

    @contextmanager
    def dry_run(self) -> Iterator[AnyConnection]:
        """A transaction on a pooled connection that is always rolled back: statements
        run in it to see whether PostgreSQL accepts them, and change nothing.

        Raises:
            DatabaseError: a statement in the block failed (the block's error, translated).
        """
        try:
            with self.connection() as c, c.transaction(force_rollback=True):
                yield c
        except psycopg.Error as exc:
            raise translate_error(exc) from exc

    @contextmanager
    def lent_transaction(self) -> Iterator[AnyConnection]:
        """A transaction on a pooled connection that code outside pgtasks runs its own
        SQL in (`pgtasks.TenantScope.connection`), committed when the block ends
        without an error (rolled back otherwise), in this view's tenant's transaction.

        Whatever that code did to the session is undone before the connection goes back
        to the pool (``session_reset``, then the session set-up again), so the pool's
        next user (pgtasks' own statements, another tenant's request) does not inherit
        a ``SET``, a ``SET ROLE``, a session advisory lock or a temporary table: one
        more round trip, on this path only.

        Raises:
            DatabaseError: a statement in the block failed (the block's error, translated).
        """
        try:
            with self.connection() as c:
                try:
                    with c.transaction(), self._as_tenant(c, pipeline=False, pooled_block=True):
                        yield c
                finally:
                    if not c.closed and c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                        c.execute(QUERIES["session_reset"])
                        configure_connection(c, self._session)
        except psycopg.Error as exc:
            raise translate_error(exc) from exc

    @contextmanager
    def transaction(self, conn: AnyConnection | None = None) -> Iterator[AnyConnection]:
        """A transaction on a pooled connection, or a block inside the caller's transaction.

        With the caller's ``conn`` nothing is ever committed here: inside a
        transaction the block is a savepoint; on a non-autocommit connection whose
        transaction has not begun yet, the statements simply open it (psycopg's
        ``transaction()`` would commit there); only an autocommit connection outside
        any transaction gets a transaction of its own, committed at the end.
        """
        try:
            if (
                conn is not None
                and not conn.autocommit
                and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            ):
                yield conn
                return
            with (
                self.connection(conn) as c,
                c.transaction(),
                self._as_tenant(c, pipeline=False, pooled_block=conn is None),
            ):
                yield c
        except psycopg.Error as exc:
            raise translate_error(exc) from exc
