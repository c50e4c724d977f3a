"""The tracing plugin: a PRODUCER span per enqueue, a CONSUMER span per execution.

Enqueue (``pgtasks_before_enqueue`` … ``pgtasks_after_enqueue``):
    one PRODUCER span ``send <queue>`` per job, or one for a whole bulk enqueue
    (``delay_many``, ``bulk_apply``) with the job count; its W3C trace context
    (``traceparent``, ``tracestate``) goes into the job's headers through the
    propagation API (`opentelemetry.propagate.inject`, the application's propagators),
    so it crosses processes and hosts with the job. A schedule's run gets a span that
    ends when its headers are made (its job id comes only after the scheduler's commit).
Execution (``pgtasks_execute_job``, a wrapper around the task):
    one CONSUMER span ``process <queue>`` per attempt, child of the context found in
    the job's headers, current while the task runs (spans the task makes are its
    children). It stays open until the worker has written the attempt's outcome:
    ``pgtasks_job_succeeded``, ``pgtasks_job_retrying`` and ``pgtasks_job_failed``
    add an event, set the status (ERROR for a retried or failed attempt) and record
    the exception from the error record pgtasks stored, whose message and traceback
    the worker has already masked (`pgtasks.plugin_api.redact_text` masks them once
    more). Where those hooks are not called in the process that ran the task (a child
    of the ``processes`` pool), the span ends with the task and records the
    exception's type alone, never its message.

Attributes follow OpenTelemetry's messaging semantic conventions
(https://opentelemetry.io/docs/specs/semconv/messaging/messaging-spans/):
``messaging.system`` (``pgtasks``), ``messaging.operation.type`` and ``.name``
(``send``, ``process``), ``messaging.destination.name`` (the queue),
``messaging.message.id`` (the job id), ``messaging.batch.message_count``; pgtasks'
own under ``pgtasks.*`` (task name, attempt, trigger). Never a job's arguments. The
tenant (``pgtasks.tenant``) only with ``configure(record_tenant=True)``: tenant names
can be sensitive.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Final

from opentelemetry import propagate, trace
from opentelemetry.trace import (
    NoOpTracerProvider,
    ProxyTracerProvider,
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    TracerProvider,
)

from pgtasks.context import Request, TaskContext
from pgtasks.errors import ConfigurationError
from pgtasks.plugin_api import hookimpl, redact_text

__all__ = [
    "OUTCOME_WAIT",
    "OtelConfig",
    "configure",
    "current_config",
    "pgtasks_after_enqueue",
    "pgtasks_before_enqueue",
    "pgtasks_execute_job",
    "pgtasks_job_failed",
    "pgtasks_job_retrying",
    "pgtasks_job_succeeded",
    "pgtasks_worker_started",
]

log = logging.getLogger("pgtasks.otel")

#: Name of the instrumentation scope of every span.
SCOPE: Final = "pgtasks_otel"
#: Seconds a CONSUMER span waits, after its task returned, for the worker to report the
#: outcome; a span still waiting then (its outcome was never written here: the job was
#: handed back at shutdown or reaped meanwhile) ends with ``pgtasks.job.outcome`` unknown.
OUTCOME_WAIT: Final = 300.0
#: Most bytes of a masked error message or traceback put on a span.
MAX_TEXT: Final = 4096

SYSTEM: Final = "pgtasks"

try:
    _VERSION: str | None = metadata.version("pgtasks")
except metadata.PackageNotFoundError:  # run from a source tree that is not installed
    _VERSION = None


@dataclass(frozen=True, slots=True)
class OtelConfig:
    """What the plugin traces with, for every app of the process.

    Attributes:
        tracer_provider: the provider spans come from; None for OpenTelemetry's global
            one (``opentelemetry.trace.set_tracer_provider``, or the no-op provider
            when none is set).
        record_tenant: whether spans carry the job's tenant as ``pgtasks.tenant``
            (off by default: tenant names can be sensitive).
    """

    tracer_provider: TracerProvider | None = None
    record_tenant: bool = False
    tracer: Tracer = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.tracer_provider is not None and not isinstance(self.tracer_provider, TracerProvider):
            raise ConfigurationError(
                "tracer_provider must be an opentelemetry.trace.TracerProvider or None, "
                f"got a {type(self.tracer_provider).__name__}"
            )
        if not isinstance(self.record_tenant, bool):
            raise ConfigurationError(
                f"record_tenant must be True or False, got a {type(self.record_tenant).__name__}"
            )
        # The global provider's tracer is a proxy: it follows set_tracer_provider.
        provider = self.tracer_provider
        tracer = trace.get_tracer(SCOPE, _VERSION, tracer_provider=provider)
        object.__setattr__(self, "tracer", tracer)


_config = OtelConfig()
_config_lock = threading.Lock()


def configure(*, tracer_provider: TracerProvider | None = None, record_tenant: bool = False) -> OtelConfig:
    """Set how the plugin traces, in this process (every app in it); returns the previous setting.

    Call it where the application sets up OpenTelemetry, in the module the worker
    loads (``-A module:app``), so that worker processes, and the children of the
    ``processes`` pool, configure it too. ``configure()`` restores the defaults.

    Args:
        tracer_provider: a provider of its own (tests: an SDK ``TracerProvider`` with an
            in-memory exporter), or None for OpenTelemetry's global one.
        record_tenant: put the job's tenant on the spans (``pgtasks.tenant``).

    Raises:
        ConfigurationError: a value of the wrong type (nothing changes).
    """
    global _config
    new = OtelConfig(tracer_provider=tracer_provider, record_tenant=record_tenant)
    with _config_lock:
        previous, _config = _config, new
    return previous


def current_config() -> OtelConfig:
    """The setting in force (`configure`)."""
    return _config


def _tracing(config: OtelConfig) -> bool:
    """Whether spans can be recorded: a provider was configured here, or OpenTelemetry's
    global one is set and is not the no-op provider. When not, the hooks return before
    reading headers or making attributes (a job then costs pluggy's wrapper call alone)."""
    if config.tracer_provider is not None:
        return True
    return not isinstance(trace.get_tracer_provider(), ProxyTracerProvider | NoOpTracerProvider)


# -- enqueue ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Producer:
    span: Span
    batch: bool
    queues: set[str]
    carrier: dict[str, str]  # the injected headers, copied into each job of a batch


# The span of the enqueue under way in this thread, or this asyncio task (a context
# variable: concurrent enqueues of one event loop do not see each other's).
_producer: contextvars.ContextVar[_Producer | None] = contextvars.ContextVar(
    "pgtasks_otel_producer", default=None
)


def _inject(span: Span) -> dict[str, str]:
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


@hookimpl
def pgtasks_before_enqueue(task_name: str, options: dict[str, Any], headers: dict[str, Any]) -> None:
    """Open the enqueue's PRODUCER span (or join the bulk enqueue's) and put its trace
    context into ``headers``. An error of tracing is logged and the enqueue goes on."""
    try:
        _start_producer(task_name, options, headers)
    except Exception:
        log.exception("no span for an enqueue of %s", task_name)


def _start_producer(task_name: str, options: Mapping[str, Any], headers: dict[str, Any]) -> None:
    index = options.get("batch_index", -1)
    if index is not None and index > 0:
        current = _producer.get()
        if current is not None and current.batch:
            current.queues.add(options["queue"])
            headers.update(current.carrier)
            return
    # A span left here by an enqueue that failed after this hook is dropped, unended:
    # nothing was written for it, and an unended span is never exported.
    if _producer.get() is not None:
        _producer.set(None)
    config = _config
    if not _tracing(config):
        return
    queue = options["queue"]
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": queue,
        "pgtasks.task.name": task_name,
    }
    if config.record_tenant:
        attributes["pgtasks.tenant"] = options.get("tenant") or ""
    span = config.tracer.start_span(f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes)
    if not span.get_span_context().is_valid:  # the no-op tracer: nothing to do
        return
    carrier = _inject(span)
    headers.update(carrier)
    if index == -1:  # a schedule's run: its job id comes after the scheduler's commit
        span.end()
        return
    _producer.set(_Producer(span, batch=index is not None, queues={queue}, carrier=carrier))


@hookimpl
def pgtasks_after_enqueue(task_name: str, job_ids: list[int], in_transaction: bool) -> None:
    """End the enqueue's PRODUCER span with the job id, or the job count of a bulk enqueue."""
    producer = _producer.get()
    if producer is None:
        return
    _producer.set(None)
    span = producer.span
    span.set_attribute("pgtasks.enqueue.in_transaction", in_transaction)
    if producer.batch:
        span.set_attribute("messaging.batch.message_count", len(job_ids))
        if len(producer.queues) > 1:  # one span for jobs in several queues: no single destination
            span.set_attribute("messaging.destination.name", ",".join(sorted(producer.queues)))
            span.update_name("send")
        if task_name == "*":
            span.set_attribute("pgtasks.task.name", "*")
    elif len(job_ids) == 1:
        span.set_attribute("messaging.message.id", str(job_ids[0]))
    span.end()


# -- execution -------------------------------------------------------------------------

# Processes whose workers call the outcome hooks (pgtasks_worker_started ran here): a
# CONSUMER span waits there for its outcome, elsewhere it ends with the task.
_worker_pids: set[int] = set()
# CONSUMER spans waiting for their outcome, by job id: (span, monotonic deadline).
_waiting: dict[int, tuple[Span, float]] = {}
_waiting_lock = threading.Lock()


@hookimpl
def pgtasks_worker_started(worker_id: str, queues: list[str], concurrency: int) -> None:
    """Note that this process reports outcomes (its CONSUMER spans wait for them)."""
    _worker_pids.add(os.getpid())


@hookimpl(wrapper=True)
def pgtasks_execute_job(context: TaskContext) -> Generator[None, Any, Any]:
    """Run the task inside a CONSUMER span, child of the trace context in the job's headers.

    Tracing never changes how a job ends: an error of its own is logged, and the task
    runs (untraced, if the span could not be made).
    """
    config = _config
    if not _tracing(config):
        return (yield)
    request = context.request
    try:
        span = _consumer_span(config, request)
    except Exception:
        log.exception("job %s: no span for its execution", request.id)
        span = None
    if span is None:
        return (yield)
    try:
        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            result = yield
    except BaseException as exc:
        _body_ended(span, request.id, exc)
        raise
    _body_ended(span, request.id, None)
    return result


def _consumer_span(config: OtelConfig, request: Request) -> Span | None:
    """The attempt's CONSUMER span, started; None from a no-op tracer."""
    # Headers hold any JSON a plugin added; propagators read text, so only text is given.
    carrier = {k: v for k, v in request.headers.items() if isinstance(v, str)}
    parent = propagate.extract(carrier) if carrier else None
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": request.queue,
        "pgtasks.task.name": request.task_name,
        "pgtasks.job.attempt": request.attempt,
        "pgtasks.job.trigger": request.attempt_trigger,
    }
    if request.id is not None:
        attributes["messaging.message.id"] = str(request.id)
    if config.record_tenant:
        attributes["pgtasks.tenant"] = request.tenant
    span = config.tracer.start_span(
        f"process {request.queue}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    )
    return span if span.get_span_context().is_valid else None


def _body_ended(span: Span, job_id: int | None, exc: BaseException | None) -> None:
    """The task returned or raised: wait for the outcome hooks, or end the span now.

    A span still waiting for the same job (its outcome hook never came) and spans past
    `OUTCOME_WAIT` end here, with ``pgtasks.job.outcome`` unknown.
    """
    try:
        now = time.monotonic()
        if job_id is not None and os.getpid() in _worker_pids:
            with _waiting_lock:
                stale = _overdue(now)
                previous = _waiting.pop(job_id, None)
                if previous is not None:
                    stale.append(previous[0])
                _waiting[job_id] = (span, now + OUTCOME_WAIT)
        else:
            stale = []
            if exc is not None:  # no stored, masked record here: the type alone
                kind = type(exc).__name__
                span.add_event("exception", {"exception.type": kind})
                span.set_status(Status(StatusCode.ERROR, kind))
            span.end()
        for old in stale:
            old.set_attribute("pgtasks.job.outcome", "unknown")
            old.end()
    except Exception:
        log.exception("job %s: its span could not be ended", job_id)


def _overdue(now: float) -> list[Span]:
    """Remove and return the waiting spans past their deadline (oldest first; under the lock)."""
    stale: list[Span] = []
    for job_id, (span, deadline) in list(_waiting.items()):
        if deadline > now:
            break  # insertion order is deadline order
        del _waiting[job_id]
        stale.append(span)
    return stale


def _take(job_id: int) -> Span | None:
    with _waiting_lock:
        entry = _waiting.pop(job_id, None)
    return None if entry is None else entry[0]


def _masked(text: object) -> str:
    """Text from a stored error record, masked once more and bounded."""
    return redact_text(str(text or ""))[:MAX_TEXT]


def _record_error(span: Span, error: Mapping[str, Any]) -> None:
    """Record the stored (masked) error as the span's exception and ERROR status."""
    kind = str(error.get("type") or "Exception")
    message = _masked(error.get("message"))
    attributes: dict[str, Any] = {"exception.type": kind, "exception.message": message}
    if error.get("traceback"):
        attributes["exception.stacktrace"] = _masked(error["traceback"])
    span.add_event("exception", attributes)
    span.set_status(Status(StatusCode.ERROR, f"{kind}: {message}" if message else kind))
    span.set_attribute("error.type", str(error.get("code") or kind))


def _error_attributes(error: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "error.type": str(error.get("code") or error.get("type") or "Exception"),
        "pgtasks.error.class": str(error.get("class") or ""),
    }


@hookimpl
def pgtasks_job_succeeded(job_id: int, task_name: str, result: Any, runtime: float) -> None:
    """End the attempt's span with a ``pgtasks.job.succeeded`` event (never the result)."""
    span = _take(job_id)
    if span is None:
        return
    span.add_event("pgtasks.job.succeeded", {"pgtasks.job.runtime": float(runtime)})
    span.set_attribute("pgtasks.job.outcome", "succeeded")
    span.end()


@hookimpl
def pgtasks_job_retrying(
    job_id: int, task_name: str, error: dict[str, Any], delay: float, attempt: int
) -> None:
    """End the failed attempt's span: a ``pgtasks.job.retrying`` event, its exception, ERROR."""
    span = _take(job_id)
    if span is None:
        return
    span.add_event(
        "pgtasks.job.retrying",
        {**_error_attributes(error), "pgtasks.job.attempt": attempt, "pgtasks.retry.delay": float(delay)},
    )
    _record_error(span, error)
    span.set_attribute("pgtasks.job.outcome", "retrying")
    span.end()


@hookimpl
def pgtasks_job_failed(job_id: int, task_name: str, error: dict[str, Any], final_status: str) -> None:
    """End the last attempt's span: a ``pgtasks.job.failed`` event and, unless the job was
    cancelled, its exception and ERROR."""
    span = _take(job_id)
    if span is None:
        return
    span.add_event(
        "pgtasks.job.failed", {**_error_attributes(error), "pgtasks.job.final_status": final_status}
    )
    if final_status != "cancelled":
        _record_error(span, error)
    span.set_attribute("pgtasks.job.outcome", final_status)
    span.end()
