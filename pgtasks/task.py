"""Tasks: decorated functions with Celery's options, and how they are called.

`Task` objects are made by ``@app.task``. Calling one runs the function at once,
in process (as in Celery); ``delay`` / ``apply_async`` enqueue a job instead.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final

from pgtasks.errors import ConfigurationError
from pgtasks.flow import FLOW_OPTIONS, FlowRule
from pgtasks.flow import KeyRule as FlowKeyRule
from pgtasks.redaction import check_redact
from pgtasks.validation import (
    MAX_DELAY,
    MAX_KEY_BYTES,
    CallCheck,
    check_bool,
    check_instant,
    check_name,
    check_seconds,
    check_text,
    check_utf8,
    short,
)

if TYPE_CHECKING:
    from pgtasks.ports import Engine, Enqueuer
    from pgtasks.result import AsyncResult

__all__ = [
    "ENQUEUE_OPTIONS",
    "MAX_DELAY",
    "MAX_KEY_BYTES",
    "Signature",
    "Task",
    "TaskOptions",
    "backoff_delay",
]

SMALLINT_MIN: Final = -32768
SMALLINT_MAX: Final = 32767
UNLIMITED_ATTEMPTS: Final = 2**31 - 1
# MAX_DELAY (longest delay pgtasks schedules) and MAX_KEY_BYTES (most UTF-8 bytes of
# a queue, tenant, lock key, unique key or task name) live with the other limits in
# pgtasks.validation and are re-exported here, where they were first defined.

ENQUEUE_OPTIONS: Final = frozenset(
    {
        "countdown", "eta", "queue", "priority", "tenant", "lock", "unique_key", "headers", "max_retries",
        # job dependencies (docs/workflows.md)
        "depends_on", "on_prerequisite_failure", "link", "link_error",
    }
)  # fmt: skip

KeyRule = str | Callable[..., str | None] | None


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """A task's options; the names and defaults are Celery's where Celery has one.

    Attributes:
        name: registered name (default ``module.qualname`` of the function).
        queue: queue its jobs go to (default ``"default"``).
        priority: higher runs first, -32768..32767 (default 0). Unlike Celery on
            Redis, where 0 is highest, pgtasks follows RabbitMQ's and
            procrastinate's rule: bigger number, earlier.
        max_retries: retries after the first run (Celery's meaning): 3 allows up to
            4 attempts; 0 means a single attempt; None retries without limit.
        autoretry_for: exception classes that trigger an automatic retry.
        retry_backoff: False for a fixed ``default_retry_delay``; True for
            exponential backoff with factor 1 s; a number for that factor in seconds.
        retry_backoff_max: cap of the exponential delay in seconds (default 600,
            Celery's).
        retry_jitter: full jitter (a uniform delay in ``[0, backoff]``), as Celery,
            after "Exponential Backoff And Jitter" (AWS Architecture Blog, 2015).
        default_retry_delay: seconds before a retry without backoff (default 180,
            Celery's).
        time_limit: hard limit in seconds (enforced by killing the child in the
            ``processes`` pool; best-effort in ``threads``).
        soft_time_limit: seconds after which `TimeLimitExceeded` is raised inside
            the task.
        bind: pass the `TaskContext` as first argument (``self``).
        acks_late: accepted for Celery compatibility and always effectively True:
            a job stays ``running`` (and recoverable) until its outcome is written.
        lock: lock key (or a callable of the call's args returning one): at most one
            running job per key across the fleet.
        unique_key: unique key (or callable): at most one unfinished job per key;
            enqueueing another raises `AlreadyQueued`.
        tenant: default tenant for fair dispatch (default ``""``).
        retry_on_worker_lost: False for non-idempotent tasks: a job whose worker
            vanished ends ``failed`` with ``WORKER_LOST`` instead of running again.
        redact: argument names, keys or dotted paths (``"card.number"``) whose values
            are masked in everything shown or stored about a job but its arguments
            (errors, logs, ``pgtasks jobs show``); the built-in sensitive names of
            `pgtasks.redaction` always apply too. The task itself gets the real values.
        typing: check at enqueue that the call's arguments fit the function's
            signature (default True, Celery's ``typing``); False for a function whose
            ``*args, **kwargs`` only pass its arguments on.
        concurrency_key, concurrency_limit: at most ``concurrency_limit`` (an int >= 1)
            running jobs per key across the fleet; the key rule is the name of an
            argument (a dict or set value, or a list or tuple holding one, is written
            as canonical JSON, keys sorted: ``'p={"a":1,"b":2}'``; any other as `str`
            writes it), ``pgtasks.TENANT`` or a callable of the call's arguments
            (`pgtasks.flow`, docs/flow-control.md). The limit is the job's own and is
            checked when it starts: it starts only if the key's running jobs, whatever
            their limits, are then at most its limit, it included. Jobs of the key with
            a higher limit may start after it, beside it, up to theirs: give every job
            of one key the same limit.
        rate_limit: starts per period across the fleet, in Celery's syntax (``"10/s"``,
            ``"100/m"``, ``"1000/h"``), spaced one per step of period / count; per task,
            or per key with ``rate_limit_key`` (a rule as ``concurrency_key``). The
            count is cumulative, not a sliding window: a key never starts more than its
            grid of steps allows since its first start, but one that fell behind
            starts up to the count at once (docs/flow-control.md).
        cost: what one job counts for in its tenant's weighted share (default 1).
    """

    name: str
    queue: str = "default"
    priority: int = 0
    max_retries: int | None = 3
    autoretry_for: tuple[type[BaseException], ...] = ()
    retry_backoff: bool | float = False
    retry_backoff_max: float = 600.0
    retry_jitter: bool = True
    default_retry_delay: float = 180.0
    time_limit: float | None = None
    soft_time_limit: float | None = None
    bind: bool = False
    acks_late: bool = True
    lock: KeyRule = None
    unique_key: KeyRule = None
    tenant: str = ""
    retry_on_worker_lost: bool = True
    redact: tuple[str, ...] = ()
    typing: bool = True
    concurrency_key: FlowKeyRule = None
    concurrency_limit: int | None = None
    rate_limit: str | int | None = None
    rate_limit_key: FlowKeyRule = None
    cost: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "redact", check_redact(self.redact))  # a list given: kept as a tuple
        check_text("task name", self.name)
        _check_queue(self.queue)
        _check_priority(self.priority)
        check_tenant(self.tenant)
        for label in ("lock", "unique_key"):
            rule = getattr(self, label)
            if isinstance(rule, str):  # a fixed key; a callable's keys are checked per call
                check_key("task option " + label, rule)
            elif rule is not None and not callable(rule):
                raise ConfigurationError(f"{label} must be a str, a callable or None, got {short(rule)}")
        attempts_allowed(self.max_retries)  # validates
        for exc in self.autoretry_for:
            if not (isinstance(exc, type) and issubclass(exc, BaseException)):
                raise ConfigurationError(f"autoretry_for must hold exception classes, got {exc!r}")
        for label in ("retry_backoff_max", "default_retry_delay"):
            check_seconds(label, getattr(self, label))
        if not isinstance(self.retry_backoff, bool):
            check_seconds("retry_backoff", self.retry_backoff)
        for label in ("time_limit", "soft_time_limit"):
            value = getattr(self, label)
            if value is not None:
                check_seconds(label, value, positive=True)
        for label in ("retry_jitter", "bind", "acks_late", "retry_on_worker_lost", "typing"):
            check_bool(label, getattr(self, label))
        self.flow_rule()  # validates

    def flow_rule(self, fn: Callable[..., Any] | None = None) -> FlowRule:
        """The task's flow control, checked (with ``fn``, that key rules name its arguments).

        Raises:
            ConfigurationError: see `pgtasks.flow.FlowRule.of`.
        """
        return FlowRule.of(
            concurrency_key=self.concurrency_key,
            concurrency_limit=self.concurrency_limit,
            rate_limit=self.rate_limit,
            rate_limit_key=self.rate_limit_key,
            cost=self.cost,
            fn=fn,
            bind=self.bind,
        )

    @property
    def max_attempts(self) -> int:
        """Attempts allowed in all: ``max_retries + 1`` (or unlimited)."""
        return attempts_allowed(self.max_retries)


def attempts_allowed(max_retries: object) -> int:
    """Attempts allowed in all for Celery's ``max_retries``: ``max_retries + 1``, or unlimited for None.

    Raises:
        ConfigurationError: ``max_retries`` is neither None nor an int >= 0.
    """
    if max_retries is None:
        return UNLIMITED_ATTEMPTS
    if type(max_retries) is not int or max_retries < 0:
        raise ConfigurationError(f"max_retries must be None or an int >= 0, got {short(max_retries)}")
    return min(max_retries + 1, UNLIMITED_ATTEMPTS)


def _check_queue(queue: object) -> str:
    """Validate a queue name: a non-empty string of at most `MAX_KEY_BYTES` in UTF-8,
    without NUL, control characters or marks that reorder text
    (`pgtasks.validation.check_name`).

    Raises:
        ConfigurationError: naming the problem and the bound.
    """
    return check_name("queue", queue)


def check_tenant(tenant: object) -> str:
    """Validate a tenant: a string (empty allowed) of at most `MAX_KEY_BYTES`, without
    NUL, control characters or marks that reorder text (`pgtasks.validation.check_name`).

    Raises:
        ConfigurationError: naming the problem and the bound.
    """
    return check_name("tenant", tenant, empty=True)


def check_key_size(label: str, value: str) -> str:
    """Refuse a value bound for an index whose UTF-8 form is longer than `MAX_KEY_BYTES`
    bytes, or that is not valid UTF-8 (a lone surrogate); returns ``value``.

    Raises:
        ConfigurationError: naming the label, the size and the bound.
    """
    size = check_utf8(label, value)
    if size > MAX_KEY_BYTES:
        raise ConfigurationError(
            f"{label} {short(value)} is {size} bytes in UTF-8; at most {MAX_KEY_BYTES} are allowed "
            "(it goes into an index)"
        )
    return value


def _check_priority(priority: object) -> int:
    if type(priority) is not int or not SMALLINT_MIN <= priority <= SMALLINT_MAX:
        raise ConfigurationError(
            f"priority must be an int in {SMALLINT_MIN}..{SMALLINT_MAX}, got {short(priority)}"
        )
    return priority


def backoff_delay(options: TaskOptions, retries: int, rand: Callable[[float], float]) -> float:
    """Seconds to wait before retry number ``retries + 1``.

    Exponential: ``min(retry_backoff_max, factor * 2**retries)``, then full jitter
    (``rand(upper)`` returns a uniform float in ``[0, upper]``), as Celery's
    ``get_exponential_backoff_interval``. Without backoff: ``default_retry_delay``.
    Never exceeds `MAX_DELAY`, however large ``retries`` grows.

    Args:
        options: the task's options.
        retries: retries already made (0 before the first retry).
        rand: jitter source, e.g. ``lambda hi: random.uniform(0, hi)``.
    """
    if options.retry_backoff is False:
        return min(options.default_retry_delay, MAX_DELAY)
    factor = 1.0 if options.retry_backoff is True else float(options.retry_backoff)
    cap = min(options.retry_backoff_max, MAX_DELAY)
    exponent = min(max(retries, 0), 1024)  # 2.0**1024 overflows a float
    delay = cap if exponent >= 1023 else min(cap, factor * 2.0**exponent)
    if options.retry_jitter:
        delay = rand(delay)
    return max(0.0, min(delay, cap))


@dataclass(frozen=True, slots=True)
class Signature:
    """A task call not yet sent: task, arguments and enqueue options (Celery's ``s()``).

    A signature is partial (``task.s(...)``): run after another job in a chain, or as a
    ``link`` callback, it gets that job's result prepended to its arguments (a chord's
    callback: the list of the header's results). An immutable one (``task.si(...)``)
    keeps its arguments as given. ``a | b`` builds ``pgtasks.chain(a, b)``.

    Attributes:
        task: the task. args, kwargs: the call's arguments. options: enqueue options
            (as `Task.apply_async` takes them). immutable: never given a result.
    """

    task: Task
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    immutable: bool = False

    def set(self, **options: Any) -> Signature:
        """A copy with more enqueue options (``queue``, ``countdown``, ``link``, ...).

        Raises:
            ConfigurationError: an unknown option name.
        """
        _check_option_names(options)
        return replace(self, options={**self.options, **options})

    def clone(
        self, args: Iterable[Any] = (), kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> Signature:
        """A copy with ``args`` prepended (unless immutable, as Celery), ``kwargs`` and
        ``options`` merged in.

        Raises:
            ConfigurationError: an unknown option name.
        """
        _check_option_names(options)
        extra = tuple(args)
        return replace(
            self,
            args=self.args if self.immutable or not extra else extra + self.args,
            kwargs={**self.kwargs, **(kwargs or {})},
            options={**self.options, **options},
        )

    def link(self, callback: Signature) -> Signature:
        """A copy that runs ``callback`` after its job succeeds (option ``link``)."""
        return self._add_link("link", callback)

    def link_error(self, errback: Signature) -> Signature:
        """A copy that runs ``errback`` if its job fails for good (option ``link_error``)."""
        return self._add_link("link_error", errback)

    on_error = link_error  # Celery's other name

    def _add_link(self, option: str, sig: Signature) -> Signature:
        if not isinstance(sig, Signature):
            raise ConfigurationError(f"{option} takes a signature (task.s(...)), got {short(sig)}")
        have = self.options.get(option)
        links = [] if have is None else [have] if isinstance(have, Signature) else list(have)
        return replace(self, options={**self.options, option: [*links, sig]})

    def apply_async(
        self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> AsyncResult:
        """Enqueue this call, with ``args`` prepended (unless immutable), ``kwargs`` and
        ``options`` merged in; see `Task.apply_async`."""
        sig = self.clone(args or (), kwargs, **options)
        return sig.task.apply_async(sig.args, dict(sig.kwargs), **sig.options)

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """Enqueue this call (``args`` prepended unless immutable, ``kwargs`` merged)."""
        return self.apply_async(args, kwargs)

    def __or__(self, other: Any) -> Any:
        """``a | b``: `pgtasks.chain` of the two (a chain on either side is extended)."""
        from pgtasks.canvas import chain

        return chain(self) | other


def _check_option_names(options: Mapping[str, Any]) -> None:
    unknown = sorted(set(options) - ENQUEUE_OPTIONS - FLOW_OPTIONS - {"connection"})
    if unknown:
        raise ConfigurationError(
            f"unknown option(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(ENQUEUE_OPTIONS | FLOW_OPTIONS))}, connection"
        )


class Task:
    """A registered task. Call it to run in process; ``delay`` to enqueue.

    Args:
        app: the owning application (a `pgtasks.App`, typed as `pgtasks.ports.Engine`).
        fn: the decorated function (sync or ``async def``).
        options: its `TaskOptions`.
        enqueuer: what writes its jobs (`pgtasks.enqueue.JobEnqueuer`); default ``app``.

    Raises:
        ConfigurationError: ``fn`` is not callable.

    Attributes:
        app, fn, options: as given.
    """

    def __init__(
        self, app: Engine, fn: Callable[..., Any], options: TaskOptions, *, enqueuer: Enqueuer | None = None
    ) -> None:
        if not callable(fn):
            raise ConfigurationError(f"task {options.name!r} must wrap a function, got {short(fn)}")
        self.app = app
        self._enqueuer: Enqueuer = app if enqueuer is None else enqueuer
        self.fn = fn
        self.options = options
        self.is_async = inspect.iscoroutinefunction(fn)
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", options.name)
        self.__wrapped__ = fn
        self._call_check = CallCheck(options.name, fn, bind=options.bind) if options.typing else None
        #: The task's flow control (`pgtasks.flow`), its key rules checked against ``fn``.
        self.flow = options.flow_rule(fn)

    @property
    def name(self) -> str:
        """The registered name."""
        return self.options.name

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.options.queue}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function here and now (no job); bound tasks get a detached context."""
        if self.options.bind:
            from pgtasks.context import TaskContext

            args = (TaskContext.detached(self, args, kwargs), *args)
        result = self.fn(*args, **kwargs)
        if self.is_async:
            return asyncio.run(result)
        return result

    # -- enqueue ----------------------------------------------------------------

    def check_call(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        """Refuse arguments that do not fit the function's signature (a bound task's
        first parameter, the context, excepted); nothing when the task has ``typing=False``.

        Raises:
            ConfigurationError: too many or too few arguments, or an unknown or
                repeated keyword.
        """
        if self._call_check is not None:
            self._call_check(args, kwargs)

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """Enqueue a job with these arguments and the task's default options."""
        return self.apply_async(args, kwargs)

    def apply_async(
        self,
        args: Iterable[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Enqueue a job.

        Args:
            args: positional arguments (a tuple or list).
            kwargs: keyword arguments.
            options: ``countdown`` (seconds, >= 0), ``eta`` (aware datetime; naive
                is refused), ``queue``, ``priority``, ``tenant``, ``lock``,
                ``unique_key``, ``headers`` (dict), ``max_retries``, ``connection``
                (the caller's psycopg connection: the job commits or rolls back with
                the caller's transaction), and the dependencies of docs/workflows.md:
                ``depends_on`` (`AsyncResult` objects or job ids of the same tenant:
                the job waits, ``blocked``, until all have succeeded),
                ``on_prerequisite_failure`` (``"cancel"``, the default: a prerequisite
                that fails or is cancelled cancels the job; ``"run"``: it runs once
                all have finished), ``link`` / ``link_error`` (signatures, or lists
                of them, enqueued with the job: run after it succeeds / fails for good;
                they are the job's tenant's, and one whose ``tenant`` option names
                another is refused).

        Returns:
            An `AsyncResult` for the new job.

        Raises:
            ConfigurationError: unknown option names, invalid values (each limit is
                listed in docs/errors.md), ``args`` / ``kwargs`` that are not a
                sequence / mapping (a str is refused), arguments that do not fit
                the function's signature (unless the task has ``typing=False``), or a
                callback signature naming another tenant than the job's (nothing written).
            SerializationError: an argument cannot round-trip exactly (nothing written).
            AlreadyQueued: the unique key is held by an unfinished job.
            JobNotFound: a ``depends_on`` id names no job of the job's tenant
                (nothing written).
            DatabaseError: PostgreSQL refused the write.
        """
        call_args, call_kwargs = _checked_call(args, kwargs, options)
        return self._enqueuer.enqueue(self, call_args, call_kwargs, options)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A partial `Signature` of this task with these arguments (``app.bulk_apply``,
        `pgtasks.chain`): in a chain it gets the previous job's result prepended."""
        return Signature(self, args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """An immutable `Signature`: in a chain or as a callback it keeps exactly
        these arguments (Celery's ``si``)."""
        return Signature(self, args, kwargs, immutable=True)

    def signature(
        self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> Signature:
        """A `Signature` with enqueue options (Celery's ``signature``; ``immutable=True``
        for an immutable one).

        Raises:
            ConfigurationError: an unknown option name.
        """
        immutable = bool(options.pop("immutable", False))
        _check_option_names(options)
        return Signature(self, tuple(args or ()), dict(kwargs or {}), options, immutable=immutable)

    def delay_many(self, items: Iterable[Any], **options: Any) -> list[AsyncResult]:
        """Enqueue many jobs of this task in one round trip.

        Args:
            items: one entry per job. A tuple is the job's positional arguments;
                any other value is its single argument (wrap a tuple argument in
                another tuple).
            options: enqueue options shared by every job (as `apply_async`).

        Returns:
            One `AsyncResult` per written job, in order.

        Raises:
            ConfigurationError, SerializationError: an item or an option is refused, as
                `apply_async` would refuse it; the message starts with the 0-based index
                of the first item refused (``"item 3: args[0]: ..."``), and nothing is
                written.
        """
        _check_option_names(options)
        connection = options.pop("connection", None)
        no_kwargs: dict[str, Any] = {}
        calls = ((self, item if type(item) is tuple else (item,), no_kwargs, options) for item in items)
        return self._enqueuer.enqueue_batch(calls, connection=connection)

    async def delay_async(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """`delay` for asyncio callers (the enqueue runs in a worker thread, as
        `apply_async_async` without a connection)."""
        return await self.apply_async_async(args, kwargs)

    async def apply_async_async(
        self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> AsyncResult:
        """`apply_async` for asyncio callers: the same options, checks and errors.

        With ``connection=`` a ``psycopg.AsyncConnection`` (one of your own, or from
        ``psycopg_pool.AsyncConnectionPool``), the job is written on it in the event
        loop, inside your transaction: it commits or rolls back with your writes, and
        workers are woken when your transaction commits. Without a connection (or with
        a sync ``psycopg.Connection``) the enqueue runs in a worker thread on the app's
        pool, as `apply_async` would.

        Raises:
            ConfigurationError, SerializationError, AlreadyQueued, DatabaseError: as
                `apply_async` (nothing is written on a refusal).
        """
        call_args, call_kwargs = _checked_call(args, kwargs, options)
        return await self._enqueuer.enqueue_async(self, call_args, call_kwargs, options)


def _checked_call(
    args: Iterable[Any] | None, kwargs: Mapping[str, Any] | None, options: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's arguments as a tuple and a dict, after checking their types and the
    option names (what `Task.apply_async` and `Task.apply_async_async` check first).

    Raises:
        ConfigurationError: an unknown option name, or ``args`` / ``kwargs`` that are
            not a sequence / mapping (a str is refused).
    """
    _check_option_names(options)
    if args is not None and (isinstance(args, str | bytes | Mapping) or not isinstance(args, Iterable)):
        raise ConfigurationError(f"args must be a tuple or list, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ConfigurationError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    return tuple(args or ()), dict(kwargs or {})


def check_key(label: str, key: object) -> str | None:
    """A lock or unique key: None, or a non-empty string of at most `MAX_KEY_BYTES`
    bytes in UTF-8, without NUL, control characters or marks that reorder text
    (`pgtasks.validation.check_name`).

    Raises:
        ConfigurationError: naming the problem.
    """
    return None if key is None else check_name(label, key)


def resolve_key(rule: KeyRule, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    """A lock or unique key from a task-level rule: a fixed string or a callable of the args."""
    if rule is None or isinstance(rule, str):
        return rule
    key = rule(*args, **kwargs)
    if key is not None and not isinstance(key, str):
        raise ConfigurationError(f"key rule {rule!r} returned {type(key).__name__}, expected str or None")
    return key


def check_eta(eta: object) -> dt.datetime:
    """Validate an ``eta``: an aware datetime (naive ones are refused, not guessed as UTC)
    between `pgtasks.validation.MIN_INSTANT` and `pgtasks.validation.MAX_INSTANT`.

    Raises:
        ConfigurationError: naming the problem and the range.
    """
    return check_instant("eta", eta)


def check_countdown(countdown: object) -> float:
    """Validate a ``countdown`` in seconds: finite, >= 0, at most `MAX_DELAY`.

    Raises:
        ConfigurationError: naming the problem and the range (also for an int too
            large for a float).
    """
    return check_seconds("countdown", countdown)


check_queue = _check_queue
check_priority = _check_priority
