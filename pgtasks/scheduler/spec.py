"""A schedule's definition, validated once, when it is defined.

`ScheduleSpec` is what ``@app.periodic_task``, ``app.add_periodic_task`` and
``app.schedules.create/change`` build. Every bad input is refused here with
`InvalidSchedule` (a `ConfigurationError`), `SerializationError` or `UnknownTask`,
before anything is written: a cron expression croniter rejects or that can never
fire, an unknown time zone (both judged by `pgtasks.cron.CronSchedule`), an unknown
policy name, a bad bound, arguments that cannot be stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from pgtasks.cron import CronSchedule, load_zone
from pgtasks.errors import ConfigurationError, InvalidSchedule
from pgtasks.serialization import dumps, loads_json
from pgtasks.task import check_key, check_priority, check_queue, check_tenant, resolve_key
from pgtasks.validation import check_utf8, short

if TYPE_CHECKING:
    from pgtasks.task import Task

__all__ = [
    "DEFAULT_CATCH_UP_LIMIT",
    "INHERIT",
    "MAX_CATCH_UP_LIMIT",
    "MISFIRE_POLICIES",
    "OVERLAP_POLICIES",
    "ScheduleSpec",
    "check_schedule_name",
]

#: ``skip``: at most one active (queued or running) run; a tick or trigger that finds
#: one is skipped. ``queue``: runs wait for each other (a lock key, one running at a
#: time). ``allow``: runs may overlap.
OVERLAP_POLICIES: Final = ("skip", "queue", "allow")
#: ``skip``: after downtime, run only the latest missed fire time. ``catch_up``: run
#: the latest ``catch_up_limit`` missed fire times, oldest first.
MISFIRE_POLICIES: Final = ("skip", "catch_up")
DEFAULT_CATCH_UP_LIMIT: Final = 10
MAX_CATCH_UP_LIMIT: Final = 1000
_MAX_NAME = 200


class _Inherit:
    """Marker: take the value from the task's options."""

    _instance: _Inherit | None = None

    def __new__(cls) -> _Inherit:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "INHERIT"


#: Default of ``max_retries``: use the task's ``max_retries``.
INHERIT: Final = _Inherit()


def check_schedule_name(name: object, label: str = "schedule name") -> str:
    """Validate a schedule name: a non-empty str of at most 200 characters of valid
    UTF-8 (no lone surrogate), no NUL, no surrounding whitespace.

    Raises:
        InvalidSchedule: naming the problem.
    """
    if not isinstance(name, str):
        raise InvalidSchedule(f"{label} must be a str, not {type(name).__name__}")
    if not name or name != name.strip() or "\x00" in name or len(name) > _MAX_NAME:
        raise InvalidSchedule(
            f"{label} {short(name)} is refused: use 1..{_MAX_NAME} characters, no NUL, "
            "no leading or trailing whitespace"
        )
    try:
        check_utf8(label, name)
    except ConfigurationError as exc:
        raise InvalidSchedule(str(exc)) from None
    return name


def _canonical(value: Any, path: str) -> Any:
    """The value as it reads back from jsonb (tuples become lists, ...)."""
    return loads_json(dumps(value, path).encode("utf-8"))


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A validated schedule definition (what a row of ``pgtasks.schedules`` defines).

    Attributes:
        name: the schedule's name (unique).
        task_name: registered name of the task each run calls.
        cron: five-field cron or an ``@`` alias, normalised; None for a schedule that
            runs only when triggered (by hand, or by its prerequisites in ``after``).
        timezone: IANA zone the cron fields are read in.
        args, kwargs: the call's arguments, in the form they read back from jsonb.
        queue, tenant, priority: where each run goes (default: the task's).
        lock_key: lock key copied to every run (the task's, resolved with these
            arguments; for ``overlap="queue"`` without one, ``schedule:<name>``).
        overlap: one of `OVERLAP_POLICIES`.
        misfire: one of `MISFIRE_POLICIES`.
        catch_up_limit: most missed fire times run by ``misfire="catch_up"``
            (1..1000).
        max_retries: retry runs after a transient failure (None: no limit).
        retry_policy: backoff of retry runs: ``{"backoff", "backoff_max", "delay",
            "jitter"}`` with the meaning of the task options ``retry_backoff``,
            ``retry_backoff_max`` (seconds), ``default_retry_delay`` (seconds),
            ``retry_jitter``.
        retry_on_worker_lost: False for non-idempotent tasks: a run whose worker
            vanished is not retried.
        after: prerequisite schedule names.

    Raises:
        InvalidSchedule: a refused cron expression, time zone, policy, bound, name,
            or a schedule with neither ``cron`` nor ``after``.
        SerializationError: ``args`` or ``kwargs`` cannot be stored exactly.
        ConfigurationError: a bad queue, tenant, lock key or priority (queue, tenant
            and lock key: at most `pgtasks.task.MAX_KEY_BYTES` bytes in UTF-8, as they
            go into indexes of every run).
    """

    name: str
    task_name: str
    cron: str | None
    timezone: str = "UTC"
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    queue: str = "default"
    tenant: str = ""
    priority: int = 0
    lock_key: str | None = None
    overlap: str = "skip"
    misfire: str = "skip"
    catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT
    max_retries: int | None = 0
    retry_policy: Mapping[str, Any] = field(default_factory=dict)
    retry_on_worker_lost: bool = True
    after: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_schedule_name(self.name)
        check_schedule_name(self.task_name, "task name")
        if self.cron is None:
            if not self.after:
                raise InvalidSchedule(
                    f"schedule {self.name!r} needs a cron expression, or prerequisites (after=[...]) "
                    "to be triggered by"
                )
            load_zone(self.timezone)  # still refuse an unknown zone
        else:
            object.__setattr__(self, "cron", CronSchedule.parse(self.cron, self.timezone).expression)
        _choice("overlap", self.overlap, OVERLAP_POLICIES)
        _choice("misfire", self.misfire, MISFIRE_POLICIES)
        limit = self.catch_up_limit
        if type(limit) is not int or not 1 <= limit <= MAX_CATCH_UP_LIMIT:
            raise InvalidSchedule(f"catch_up_limit must be an int in 1..{MAX_CATCH_UP_LIMIT}, got {limit!r}")
        if self.misfire == "catch_up" and self.overlap == "skip":
            raise InvalidSchedule(
                f"schedule {self.name!r}: misfire='catch_up' creates several runs at once, and with "
                "overlap='skip' all but the first would be refused; use overlap='queue' (runs one "
                "after another) or 'allow'"
            )
        if self.max_retries is not None and (type(self.max_retries) is not int or self.max_retries < 0):
            raise InvalidSchedule(f"max_retries must be None or an int >= 0, got {self.max_retries!r}")
        after = tuple(self.after)
        for item in after:
            check_schedule_name(item, "prerequisite name")
        if self.name in after:
            raise InvalidSchedule(f"schedule {self.name!r} cannot be its own prerequisite")
        object.__setattr__(self, "after", tuple(dict.fromkeys(after)))
        check_queue(self.queue)
        check_priority(self.priority)
        check_tenant(self.tenant)
        check_key("lock key", self.lock_key)
        if not isinstance(self.kwargs, Mapping):
            raise InvalidSchedule(f"kwargs must be a dict, got {type(self.kwargs).__name__}")
        object.__setattr__(self, "args", tuple(_canonical(list(self.args), "args")))
        object.__setattr__(self, "kwargs", _canonical(dict(self.kwargs), "kwargs"))
        object.__setattr__(self, "retry_policy", _canonical(dict(self.retry_policy), "retry_policy"))

    @classmethod
    def for_task(
        cls,
        task: Task,
        cron: str | None,
        *,
        name: str | None = None,
        timezone: str = "UTC",
        args: Iterable[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        priority: int | None = None,
        overlap: str = "skip",
        misfire: str = "skip",
        catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT,
        max_retries: int | _Inherit | None = INHERIT,
        after: Iterable[str] | None = (),
    ) -> ScheduleSpec:
        """Build a spec for a registered task; unset options come from the task's.

        Args:
            task: the task each run calls.
            cron: five-field cron, an ``@`` alias, or None (see `ScheduleSpec`).
            name: schedule name (default: the task's name).
            timezone: IANA zone key (default ``"UTC"``).
            args, kwargs: the call's arguments.
            queue, tenant, priority: default the task's.
            overlap, misfire, catch_up_limit: policies (see `ScheduleSpec`).
            max_retries: retry runs after a transient failure; `INHERIT` (default)
                takes the task's ``max_retries``.
            after: prerequisite schedule names (None: none).

        Raises:
            InvalidSchedule, SerializationError, ConfigurationError: see the class;
                `ConfigurationError` also when ``args``/``kwargs`` do not fit the
                task's signature (unless the task has ``typing=False``).
        """
        opts = task.options
        if after is None:
            after = ()
        if not isinstance(after, list | tuple):
            raise InvalidSchedule(f"after must be a list of schedule names, not {type(after).__name__}")
        if not isinstance(args, list | tuple):
            raise InvalidSchedule(f"args must be a tuple or list, not {type(args).__name__}")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise InvalidSchedule(f"kwargs must be a dict, not {type(kwargs).__name__}")
        args_tuple = tuple(args)
        kwargs_dict = dict(kwargs or {})
        task.check_call(args_tuple, kwargs_dict)
        if not isinstance(overlap, str) or overlap not in OVERLAP_POLICIES:
            _choice("overlap", overlap, OVERLAP_POLICIES)
        lock = resolve_key(opts.lock, args_tuple, kwargs_dict)
        schedule_name = opts.name if name is None else name
        if lock is None and overlap == "queue" and isinstance(schedule_name, str):
            lock = f"schedule:{schedule_name}"
        return cls(
            name=schedule_name,
            task_name=task.name,
            cron=cron,
            timezone=timezone,
            args=args_tuple,
            kwargs=kwargs_dict,
            queue=opts.queue if queue is None else queue,
            tenant=opts.tenant if tenant is None else tenant,
            priority=opts.priority if priority is None else priority,
            lock_key=lock,
            overlap=overlap,
            misfire=misfire,
            catch_up_limit=catch_up_limit,
            max_retries=opts.max_retries if isinstance(max_retries, _Inherit) else max_retries,
            retry_policy={
                "backoff": opts.retry_backoff,
                "backoff_max": opts.retry_backoff_max,
                "delay": opts.default_retry_delay,
                "jitter": opts.retry_jitter,
            },
            retry_on_worker_lost=opts.retry_on_worker_lost,
            after=tuple(after),
        )

    def cron_schedule(self) -> CronSchedule | None:
        """The parsed cron expression in its zone, or None for a trigger-only schedule."""
        return None if self.cron is None else CronSchedule.parse(self.cron, self.timezone)

    def params(self) -> dict[str, Any]:
        """The definition columns by name (JSON as text), as `pgtasks.db.ScheduleStore.insert`
        and `pgtasks.db.ScheduleStore.update_definition` take them."""
        return {
            "name": self.name,
            "task_name": self.task_name,
            "cron": self.cron,
            "timezone": self.timezone,
            "args": dumps(list(self.args), "args"),
            "kwargs": dumps(dict(self.kwargs), "kwargs"),
            "queue": self.queue,
            "tenant": self.tenant,
            "priority": self.priority,
            "lock_key": self.lock_key,
            "overlap": self.overlap,
            "misfire": self.misfire,
            "catch_up_limit": self.catch_up_limit,
            "max_retries": self.max_retries,
            "retry_policy": dumps(dict(self.retry_policy), "retry_policy"),
            "retry_on_worker_lost": self.retry_on_worker_lost,
            "after": list(self.after),
        }

    def same_definition(self, row: Mapping[str, Any]) -> bool:
        """Whether a stored row (``SELECT *`` of schedules) holds exactly this definition."""
        return (
            row["task_name"] == self.task_name
            and row["cron"] == self.cron
            and row["timezone"] == self.timezone
            and row["args"] == list(self.args)
            and row["kwargs"] == dict(self.kwargs)
            and row["queue"] == self.queue
            and row["tenant"] == self.tenant
            and row["priority"] == self.priority
            and row["lock_key"] == self.lock_key
            and row["overlap"] == self.overlap
            and row["misfire"] == self.misfire
            and row["catch_up_limit"] == self.catch_up_limit
            and row["max_retries"] == self.max_retries
            and row["retry_policy"] == dict(self.retry_policy)
            and row["retry_on_worker_lost"] == self.retry_on_worker_lost
            and list(row["after"]) == list(self.after)
        )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ScheduleSpec:
        """The definition stored in a schedules row (validated again).

        Raises:
            InvalidSchedule: the stored definition is refused (e.g. written by hand;
                a bad queue, tenant or lock key too).
        """
        try:
            return cls._from_row(row)
        except InvalidSchedule:
            raise
        except ConfigurationError as exc:
            raise InvalidSchedule(str(exc)) from None

    @classmethod
    def _from_row(cls, row: Mapping[str, Any]) -> ScheduleSpec:
        return cls(
            name=row["name"],
            task_name=row["task_name"],
            cron=row["cron"],
            timezone=row["timezone"],
            args=tuple(row["args"]),
            kwargs=row["kwargs"],
            queue=row["queue"],
            tenant=row["tenant"],
            priority=row["priority"],
            lock_key=row["lock_key"],
            overlap=row["overlap"],
            misfire=row["misfire"],
            catch_up_limit=row["catch_up_limit"],
            max_retries=row["max_retries"],
            retry_policy=row["retry_policy"],
            retry_on_worker_lost=row["retry_on_worker_lost"],
            after=tuple(row["after"]),
        )


def _choice(label: str, value: object, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise InvalidSchedule(f"{label} policy must be one of {', '.join(map(repr, allowed))}, got {value!r}")
