"""Flow control: concurrency keys, rate limits and job cost (docs/flow-control.md).

A task (``@app.task(concurrency_key=..., concurrency_limit=..., rate_limit=...,
rate_limit_key=..., cost=...)``) or one enqueue (``apply_async`` with the same
option names) asks for flow control; this module checks the values where they are
given and, per call, resolves them to the job's columns (`FlowFields`). The claim
(``job_claim_batch``, migration 0008) enforces them.

Key rules:

* a string names an argument of the task's function: the key is
  ``"<name>=<value>"`` (``concurrency_key="agent"`` and ``agent="host-1"`` give
  ``"agent=host-1"``), so tasks keyed on the same argument share their keys. The
  value is written as `str` writes it (a str or an int as it is, ``42``, ``1.5``),
  except a value whose text would depend on the order of a dict's keys or a set's
  members (a dict, set or frozenset, or a list or tuple holding one): that one is
  written as canonical JSON (`pgtasks.serialization.canonical_dumps`: the encoding of
  a job's arguments, keys and set members sorted), so ``{"a": 1, "b": 2}`` and
  ``{"b": 2, "a": 1}`` give one key, ``'p={"a":1,"b":2}'``;
* `TENANT`: the key is ``"tenant=<the job's tenant>"``;
* a callable is called with the call's arguments and returns the key (a string) or
  None (no limit for that call).

Per enqueue, ``concurrency_key=`` and ``rate_limit_key=`` are the key itself.
A job with a rate limit and no rate key is limited per task (``"task=<name>"``).
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pgtasks.db.jobs import NO_FLOW, FlowFields
from pgtasks.errors import ConfigurationError
from pgtasks.serialization import canonical_dumps
from pgtasks.validation import check_int, check_name, short

__all__ = [
    "FLOW_OPTIONS",
    "MAX_COST",
    "MAX_LIMIT",
    "MAX_WEIGHT",
    "NO_FLOW",
    "TENANT",
    "FlowFields",
    "FlowRule",
    "Rate",
    "check_cost",
    "check_limit",
    "check_weight",
    "flow_fields",
    "parse_rate",
]

#: The enqueue options of flow control (`Task.apply_async` takes them too).
FLOW_OPTIONS: Final = frozenset(
    {"concurrency_key", "concurrency_limit", "rate_limit", "rate_limit_key", "cost"}
)

#: The concurrency key rule "the job's tenant" (``concurrency_key=pgtasks.TENANT``).
TENANT: Final = "@tenant"
#: Largest concurrency limit or rate count (PostgreSQL integer).
MAX_LIMIT: Final = 2**31 - 1
#: Largest cost of one job.
MAX_COST: Final = 1_000_000.0

_PERIODS: Final = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"\s*(\d+)\s*(?:/\s*(\d*)\s*([smh]))?\s*")

KeyRule = str | Callable[..., str | None] | None


@dataclass(frozen=True, slots=True)
class Rate:
    """A rate limit: at most ``limit`` starts per ``period`` seconds, fleet-wide."""

    limit: int
    period: float

    def __str__(self) -> str:
        return f"{self.limit}/{self.period:g}s"


def parse_rate(label: str, value: object) -> Rate:
    """A rate in Celery's syntax: ``"10/s"``, ``"100/m"``, ``"1000/h"``, a count per
    ``"<n><unit>"`` (``"5/10s"``), or a bare count per second (``"10"``, ``10``).

    Raises:
        ConfigurationError: anything else, a count below 1 or above `MAX_LIMIT`, or a
            period of 0.
    """
    if type(value) is int:
        return Rate(check_limit(label, value), 1.0)
    match = _RATE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ConfigurationError(
            f'{label} must look like "10/s", "100/m" or "1000/h" (Celery\'s syntax), got {short(value)}'
        )
    count, multiple, unit = match.groups()
    if len(count) > 10:
        raise ConfigurationError(f"{label} {value!r}: the count must be at most {MAX_LIMIT}")
    period = _PERIODS[unit or "s"] * (int(multiple) if multiple else 1)
    if period <= 0 or period > 366 * 86400:
        raise ConfigurationError(f"{label} {value!r}: the period must be more than 0 and at most a year")
    return Rate(check_limit(label, int(count)), period)


def check_limit(label: str, value: object) -> int:
    """A concurrency limit or rate count: an int from 1 to `MAX_LIMIT`.

    Raises:
        ConfigurationError: naming the label and the range.
    """
    return check_int(label, value, 1, MAX_LIMIT)


#: Largest tenant weight.
MAX_WEIGHT: Final = 1_000_000.0


def check_weight(value: object) -> float:
    """A tenant's weight: a finite number above 0, at most `MAX_WEIGHT`.

    Raises:
        ConfigurationError: naming the range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigurationError(f"weight must be a number above 0, got {short(value)}")
    if not 0 < value <= MAX_WEIGHT:
        raise ConfigurationError(f"weight must be above 0 and at most {MAX_WEIGHT:g}, got {value!r}")
    return float(value)


def check_cost(value: object) -> float:
    """A job's cost: a finite number above 0, at most `MAX_COST`.

    Raises:
        ConfigurationError: naming the range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigurationError(f"cost must be a number above 0, got {short(value)}")
    if not 0 < value <= MAX_COST:
        raise ConfigurationError(f"cost must be above 0 and at most {MAX_COST:g}, got {value!r}")
    return float(value)


def _check_rule(label: str, rule: object, fn: Callable[..., Any] | None, bind: bool) -> None:
    if rule is None or rule == TENANT or callable(rule):
        return
    if not isinstance(rule, str):
        raise ConfigurationError(
            f"{label} must be an argument name, pgtasks.TENANT or a callable, got {short(rule)}"
        )
    if fn is None:
        return
    params = list(inspect.signature(fn).parameters.values())[1 if bind else 0 :]
    names = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    if rule not in names and not any(p.kind is p.VAR_KEYWORD for p in params):
        raise ConfigurationError(
            f"{label} {rule!r} names no argument of the task (it has {', '.join(sorted(names)) or 'none'})"
        )


@dataclass(frozen=True, slots=True)
class FlowRule:
    """A task's flow control, checked when the task is defined.

    Attributes:
        concurrency_key: argument name, `TENANT`, a callable, or None.
        concurrency_limit: most running jobs per key, checked when a job starts against
            the key's running jobs whatever their limits (None: no concurrency limit);
            jobs of one key should share one limit (docs/flow-control.md).
        rate: starts per period per rate key, spaced one per step, counted on a grid
            since the key's first start (None: no rate limit).
        rate_key: argument name, `TENANT`, a callable, or None (per task).
        cost: what one job counts for in its tenant's weighted share (default 1).
    """

    concurrency_key: KeyRule = None
    concurrency_limit: int | None = None
    rate: Rate | None = None
    rate_key: KeyRule = None
    cost: float = 1.0

    @classmethod
    def of(
        cls,
        *,
        concurrency_key: object = None,
        concurrency_limit: object = None,
        rate_limit: object = None,
        rate_limit_key: object = None,
        cost: object = 1.0,
        fn: Callable[..., Any] | None = None,
        bind: bool = False,
    ) -> FlowRule:
        """Check a task's options (``fn``: its function, whose arguments key rules name).

        Raises:
            ConfigurationError: a limit below 1, a bad rate string, a key rule naming no
                argument of ``fn``, a limit without a key or a key without a limit, a
                rate key without a rate, or a bad cost.
        """
        _check_rule("concurrency_key", concurrency_key, fn, bind)
        _check_rule("rate_limit_key", rate_limit_key, fn, bind)
        limit = None if concurrency_limit is None else check_limit("concurrency_limit", concurrency_limit)
        if (concurrency_key is None) != (limit is None):
            raise ConfigurationError(
                "concurrency_key and concurrency_limit go together: give both or neither"
            )
        rate = None if rate_limit is None else parse_rate("rate_limit", rate_limit)
        if rate_limit_key is not None and rate is None:
            raise ConfigurationError("rate_limit_key needs a rate_limit")
        return cls(concurrency_key, limit, rate, rate_limit_key, check_cost(cost))  # type: ignore[arg-type]

    @property
    def active(self) -> bool:
        """Whether the task has any flow control (else a call may still add some)."""
        return self.concurrency_limit is not None or self.rate is not None or self.cost != 1.0


def _key(
    label: str, rule: KeyRule, *, fn: Callable[..., Any], bind: bool, args: tuple[Any, ...],
    kwargs: Mapping[str, Any], tenant: str,
) -> str | None:  # fmt: skip
    if rule is None:
        return None
    if rule == TENANT:
        return check_name(label, "tenant=" + tenant)
    if callable(rule):
        key = rule(*args, **kwargs)
        if key is not None and not isinstance(key, str):
            raise ConfigurationError(
                f"{label} rule {rule!r} returned {type(key).__name__}, expected str or None"
            )
        return None if key is None else check_name(label, key)
    signature = inspect.signature(fn)
    if bind:
        params = list(signature.parameters.values())[1:]
        signature = signature.replace(parameters=params)
    try:
        bound = signature.bind_partial(*args, **kwargs)
    except TypeError as exc:
        raise ConfigurationError(f"{label} {rule!r}: the arguments do not fit the task: {exc}") from None
    bound.apply_defaults()
    if rule in bound.arguments:
        value = bound.arguments[rule]
    else:  # an argument caught by **kwargs
        var_keyword = inspect.Parameter.VAR_KEYWORD
        extra: object = next(
            (v for p, v in bound.arguments.items() if signature.parameters[p].kind is var_keyword), {}
        )
        value = extra.get(rule) if isinstance(extra, Mapping) else None
    if value is None:
        return None
    if _order_dependent(value):
        value = canonical_dumps(value, f"{label} {rule!r}")
    elif not isinstance(value, str | int) or isinstance(value, bool):
        value = str(value)
    return check_name(label, f"{rule}={value}")


def _order_dependent(value: object) -> bool:
    """Whether ``str(value)`` depends on the order a dict was built in or a set iterates
    in (a set of str iterates in an order that differs between processes): a dict, a
    set or frozenset, or a list or tuple that holds one at any depth."""
    if isinstance(value, dict | set | frozenset):
        return True
    if isinstance(value, list | tuple):
        return any(_order_dependent(item) for item in value)
    return False


def flow_fields(
    rule: FlowRule,
    *,
    task_name: str,
    fn: Callable[..., Any],
    bind: bool,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    tenant: str,
    options: Mapping[str, Any],
    queue: str = "",
    queue_rate: Rate | None = None,
) -> FlowFields | None:
    """The job's flow-control columns for one call, or None when it has none.

    ``queue_rate``: the rate limit of the job's ``queue`` (``App.queue_rate_limit``),
    which a job without a rate limit of its own gets, keyed ``"queue=<queue>"``.

    ``options``: the enqueue's options; ``concurrency_key``, ``concurrency_limit``,
    ``rate_limit``, ``rate_limit_key`` and ``cost`` there override the task's (a key
    given there is the key itself; None there removes the task's).

    Raises:
        ConfigurationError: a bad option value, a key rule that cannot be resolved, a key
            longer than `pgtasks.validation.MAX_KEY_BYTES` in UTF-8 or holding a control
            character (`pgtasks.validation.check_name`), or a key without a limit.
        SerializationError: a key rule names an argument whose value (a dict or set,
            written as canonical JSON) pgtasks' encoding refuses.
    """
    key: str | None
    if "concurrency_key" in options:
        given = options["concurrency_key"]
        key = None if given is None else check_name("concurrency_key", given)
    else:
        key = _key(
            "concurrency_key", rule.concurrency_key, fn=fn, bind=bind, args=args, kwargs=kwargs, tenant=tenant
        )
    limit = rule.concurrency_limit
    if "concurrency_limit" in options:
        given = options["concurrency_limit"]
        limit = None if given is None else check_limit("concurrency_limit", given)
    if key is None or limit is None:
        if "concurrency_key" in options and key is not None:
            raise ConfigurationError("concurrency_key needs a concurrency_limit (the task has none)")
        key = limit = None
    rate = rule.rate
    if "rate_limit" in options:
        given = options["rate_limit"]
        rate = None if given is None else parse_rate("rate_limit", given)
    rate_key: str | None = None
    if rate is not None:
        if options.get("rate_limit_key") is not None:
            rate_key = check_name("rate_limit_key", options["rate_limit_key"])
        else:
            rate_key = _key(
                "rate_limit_key", rule.rate_key, fn=fn, bind=bind, args=args, kwargs=kwargs, tenant=tenant
            )
            if rate_key is None:
                rate_key = check_name("rate_limit_key", "task=" + task_name)
    elif options.get("rate_limit_key") is not None:
        raise ConfigurationError("rate_limit_key needs a rate_limit (the task has none)")
    elif queue_rate is not None and "rate_limit" not in options:
        rate, rate_key = queue_rate, check_name("queue", "queue=" + queue)
    cost = rule.cost if options.get("cost") is None else check_cost(options["cost"])
    if key is None and rate is None and cost == 1.0:
        return None
    return (
        key,
        limit,
        rate_key,
        None if rate is None else rate.limit,
        None if rate is None else rate.period,
        cost,
    )
