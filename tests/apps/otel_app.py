"""Tasks the tracing tests run, and the tracing set-up of their worker processes.

The test process builds the app with `make_app` on its own database and traces with
an in-memory exporter. A worker process loads this module
(``pgtasks -A tests.apps.otel_app:app --plugin pgtasks_otel.plugin worker``); when
``OTEL_TEST_SPANS`` names a file, the module gives the process an SDK tracer provider
that appends each finished span there as one JSON line, for the test to read.
"""

from __future__ import annotations

import os
from typing import IO

import pgtasks
from pgtasks.context import TaskContext

__all__ = ["QUEUE", "SECRET", "app", "make_app"]

#: The queue of every task here.
QUEUE = "traced"
#: A password that appears in a failing task's error message and must never reach a span.
SECRET = "s3cr3t-Pa55word-4711"


def make_app(dsn: str | None) -> pgtasks.App:
    """An app with the tracing plugin and the test tasks (``otel.*``, queue `QUEUE`)."""
    import pgtasks_otel.plugin

    application = pgtasks.App("otel", dsn=dsn, load_entry_points=False, plugins=[pgtasks_otel.plugin])

    @application.task(name="otel.double", queue=QUEUE)
    def double(x: int) -> int:
        return 2 * x

    @application.task(name="otel.flaky", queue=QUEUE, bind=True, max_retries=2)
    def flaky(self: TaskContext) -> str:
        if self.request.attempt == 1:
            self.retry(exc=OSError("storage briefly away"), countdown=0)
        return "second time lucky"

    @application.task(name="otel.leaky", queue=QUEUE, max_retries=0)
    def leaky(host: str) -> None:
        raise ConnectionError(f"cannot reach postgresql://backup:{SECRET}@{host}:5432/archive")

    return application


def _trace_to_file(path: str) -> None:
    """Give this process an SDK provider writing finished spans to ``path`` as JSON lines."""
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    import pgtasks_otel

    out: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the process's life

    def line(span: ReadableSpan) -> str:
        return str(span.to_json(indent=None)) + "\n"

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=line)))
    pgtasks_otel.configure(tracer_provider=provider)


if os.environ.get("OTEL_TEST_SPANS"):
    _trace_to_file(os.environ["OTEL_TEST_SPANS"])

app = make_app(os.environ.get("PGTASKS_DSN"))
