"""The tracing plugin (``pgtasks_otel``): spans for enqueue and execution, on a real
database and a real worker, read back from OpenTelemetry's SDK exporters.

The test process traces through a provider of its own (`spans` fixture: an SDK
``TracerProvider`` with an in-memory exporter, handed to `pgtasks_otel.configure` and
taken back afterwards; OpenTelemetry's global provider is never set). Worker
processes write their spans to a file (``tests/apps/otel_app.py``), so the trace
context is seen crossing processes in the job's headers alone.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apps.otel_app import QUEUE, SECRET, make_app
from opentelemetry import propagate
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import pgtasks
import pgtasks_otel
from pgtasks.errors import AlreadyQueued, ConfigurationError
from pgtasks.plugins import describe_plugins
from pgtasks.states import JobStatus
from pgtasks.worker import Worker, WorkerConfig

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Spans finished in this test, from a provider the plugin uses for this test only."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    previous = pgtasks_otel.configure(tracer_provider=provider)
    yield memory
    pgtasks_otel.configure(tracer_provider=previous.tracer_provider, record_tenant=previous.record_tenant)
    provider.shutdown()


@pytest.fixture
def otel_app(dsn: str) -> Iterator[pgtasks.App]:
    application = make_app(dsn)
    yield application
    application.close()


def run_worker(application: pgtasks.App, timeout: float = 60.0) -> None:
    """A burst worker in a thread of this process until no job of `QUEUE` is due."""
    worker = Worker(application, WorkerConfig(queues=(QUEUE,), concurrency=2, burst=True, poll_interval=0.1))
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.run(install_signal_handlers=False)))
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        worker.request_stop()
        thread.join(30)
        pytest.fail(f"the worker did not finish within {timeout:g} s")
    assert codes == [0]


def of_kind(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], kind: SpanKind) -> list[ReadableSpan]:
    return [s for s in spans if s.kind is kind]


def traceparent(span: ReadableSpan) -> str:
    """The W3C ``traceparent`` header of ``span`` (https://www.w3.org/TR/trace-context/)."""
    context = span.context
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def every_text(span: ReadableSpan) -> str:
    """Everything a span exports, as text: name, attributes, events, status."""
    return str(span.to_json(indent=None))


def test_the_plugin_is_a_built_in_entry_point_and_loads_with_an_app(dsn: str) -> None:
    names = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="pgtasks")}
    assert names["pgtasks_otel"] == "pgtasks_otel.plugin"
    application = pgtasks.App("entry", dsn=dsn, load_entry_points=True)
    try:
        hooks = {p.name: p.hooks for p in describe_plugins(application.plugin_manager)}
        assert "pgtasks_execute_job" in hooks["pgtasks_otel"]
        assert "pgtasks_before_enqueue" in hooks["pgtasks_otel"]
    finally:
        application.close()


def test_enqueue_and_execution_make_a_producer_and_a_child_consumer_span(
    otel_app: pgtasks.App, exporter: InMemorySpanExporter
) -> None:
    result = otel_app.get_task("otel.double").delay(21)
    (producer,) = exporter.get_finished_spans()
    assert producer.kind is SpanKind.PRODUCER and producer.name == f"send {QUEUE}"
    assert dict(producer.attributes or {}) == {
        "messaging.system": "pgtasks",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": QUEUE,
        "messaging.message.id": str(result.id),
        "pgtasks.task.name": "otel.double",
        "pgtasks.enqueue.in_transaction": False,
    }
    headers = otel_app.get_job(result.id).headers
    assert producer.context is not None
    trace_id, span_id = producer.context.trace_id, producer.context.span_id
    assert headers["traceparent"] == traceparent(producer)

    run_worker(otel_app)
    assert result.get(timeout=10) == 42
    (consumer,) = of_kind(exporter.get_finished_spans(), SpanKind.CONSUMER)
    assert consumer.name == f"process {QUEUE}"
    assert consumer.context is not None and consumer.parent is not None
    assert consumer.context.trace_id == trace_id  # the same trace ...
    assert consumer.parent.span_id == span_id  # ... as a child of the producer's span
    assert consumer.parent.is_remote  # taken from the job's headers, not from this thread
    attributes = dict(consumer.attributes or {})
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.destination.name"] == QUEUE
    assert attributes["messaging.message.id"] == str(result.id)
    assert attributes["pgtasks.task.name"] == "otel.double"
    assert attributes["pgtasks.job.attempt"] == 1
    assert attributes["pgtasks.job.outcome"] == "succeeded"
    assert "pgtasks.tenant" not in attributes  # off unless configured
    assert [e.name for e in consumer.events] == ["pgtasks.job.succeeded"]
    assert consumer.status.status_code is StatusCode.UNSET
    assert "21" not in json.dumps(attributes)  # never the job's arguments


def test_a_retried_job_has_one_span_per_attempt_with_the_retry_and_the_success(
    otel_app: pgtasks.App, exporter: InMemorySpanExporter
) -> None:
    result = otel_app.get_task("otel.flaky").delay()
    run_worker(otel_app)
    assert result.get(timeout=10) == "second time lucky"
    (producer,) = of_kind(exporter.get_finished_spans(), SpanKind.PRODUCER)
    attempts = sorted(
        of_kind(exporter.get_finished_spans(), SpanKind.CONSUMER),
        key=lambda s: str((s.attributes or {})["pgtasks.job.attempt"]),
    )
    assert [(s.attributes or {})["pgtasks.job.attempt"] for s in attempts] == [1, 2]
    assert producer.context is not None
    for span in attempts:  # both attempts hang under the enqueue: the headers stay with the job
        assert span.parent is not None and span.parent.span_id == producer.context.span_id
    first, second = attempts
    assert [e.name for e in first.events] == ["pgtasks.job.retrying", "exception"]
    retrying, exception = first.events
    assert dict(retrying.attributes or {})["pgtasks.job.attempt"] == 1
    assert dict(retrying.attributes or {})["pgtasks.retry.delay"] == 0.0
    assert dict(exception.attributes or {})["exception.type"] == "OSError"
    assert "storage briefly away" in str(dict(exception.attributes or {})["exception.message"])
    assert first.status.status_code is StatusCode.ERROR
    assert (first.attributes or {})["pgtasks.job.outcome"] == "retrying"
    assert (second.attributes or {})["pgtasks.job.trigger"] == "retry"
    assert [e.name for e in second.events] == ["pgtasks.job.succeeded"]
    assert second.status.status_code is StatusCode.UNSET


def test_a_failing_job_is_an_error_span_whose_exception_has_the_password_masked(
    otel_app: pgtasks.App, exporter: InMemorySpanExporter
) -> None:
    result = otel_app.get_task("otel.leaky").delay("db.internal")
    run_worker(otel_app)
    job = otel_app.get_job(result.id)
    assert job.status is JobStatus.FAILED
    (consumer,) = of_kind(exporter.get_finished_spans(), SpanKind.CONSUMER)
    assert consumer.status.status_code is StatusCode.ERROR
    assert [e.name for e in consumer.events] == ["pgtasks.job.failed", "exception"]
    failed, exception = consumer.events
    assert dict(failed.attributes or {})["pgtasks.job.final_status"] == "failed"
    attributes = dict(exception.attributes or {})
    assert attributes["exception.type"] == "ConnectionError"
    assert attributes["exception.message"] == "cannot reach postgresql://backup:***@db.internal:5432/archive"
    assert "exception.stacktrace" in attributes
    assert consumer.status.description is not None and "***" in consumer.status.description
    for span in exporter.get_finished_spans():
        assert SECRET not in every_text(span), span.name


def test_delay_many_makes_one_producer_span_with_the_job_count(
    otel_app: pgtasks.App, exporter: InMemorySpanExporter
) -> None:
    results = otel_app.get_task("otel.double").delay_many([(i,) for i in range(5)])
    (producer,) = exporter.get_finished_spans()
    attributes = dict(producer.attributes or {})
    assert attributes["messaging.batch.message_count"] == 5
    assert "messaging.message.id" not in attributes
    assert producer.context is not None
    parents = {otel_app.get_job(r.id).headers["traceparent"] for r in results}
    assert parents == {traceparent(producer)}
    run_worker(otel_app)
    consumers = of_kind(exporter.get_finished_spans(), SpanKind.CONSUMER)
    assert len(consumers) == 5
    assert {c.parent.span_id for c in consumers if c.parent is not None} == {producer.context.span_id}


def test_a_failed_enqueue_exports_no_span_and_the_next_one_is_whole(
    otel_app: pgtasks.App, exporter: InMemorySpanExporter
) -> None:
    task = otel_app.get_task("otel.double")
    task.apply_async((1,), unique_key="only-one")
    with pytest.raises(AlreadyQueued):
        task.apply_async((2,), unique_key="only-one")  # refused after the hook ran
    second = task.delay(3)
    spans = exporter.get_finished_spans()
    assert len(spans) == 2
    assert (spans[-1].attributes or {})["messaging.message.id"] == str(second.id)


def test_the_tenant_is_recorded_only_when_configured(
    otel_app: pgtasks.App, exporter: InMemorySpanExporter
) -> None:
    acme = otel_app.tenant("acme")
    acme.send_task("otel.double", args=(1,))
    provider = pgtasks_otel.current_config().tracer_provider
    pgtasks_otel.configure(tracer_provider=provider, record_tenant=True)
    acme.send_task("otel.double", args=(2,))
    run_worker(otel_app)
    producers = of_kind(exporter.get_finished_spans(), SpanKind.PRODUCER)
    assert ["pgtasks.tenant" in (s.attributes or {}) for s in producers] == [False, True]
    assert (producers[1].attributes or {})["pgtasks.tenant"] == "acme"
    for consumer in of_kind(exporter.get_finished_spans(), SpanKind.CONSUMER):
        assert (consumer.attributes or {})["pgtasks.tenant"] == "acme"  # the worker ran after the change


def test_without_a_tracer_provider_nothing_is_injected_and_jobs_run(otel_app: pgtasks.App) -> None:
    assert pgtasks_otel.current_config().tracer_provider is None  # the global, no-op provider here
    result = otel_app.get_task("otel.double").delay(4)
    assert otel_app.get_job(result.id).headers == {}
    run_worker(otel_app)
    assert result.get(timeout=10) == 8


def test_configure_refuses_values_of_the_wrong_type() -> None:
    before = pgtasks_otel.current_config()
    with pytest.raises(ConfigurationError, match="tracer_provider"):
        pgtasks_otel.configure(tracer_provider="jaeger")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="record_tenant"):
        pgtasks_otel.configure(record_tenant="yes")  # type: ignore[arg-type]
    assert pgtasks_otel.current_config() is before  # nothing changed


def _spans_from(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_the_trace_context_crosses_into_a_worker_process(
    pool: str, dsn: str, otel_app: pgtasks.App, exporter: InMemorySpanExporter, tmp_path: Path
) -> None:
    ok = otel_app.get_task("otel.double").delay(5)
    bad = otel_app.get_task("otel.leaky").delay("db.internal")
    producers = {
        (s.attributes or {})["messaging.message.id"]: s
        for s in of_kind(exporter.get_finished_spans(), SpanKind.PRODUCER)
    }
    spans_file = tmp_path / "spans.jsonl"
    done = subprocess.run(
        [
            sys.executable, "-m", "pgtasks", "-A", "tests.apps.otel_app:app",
            "--plugin", "pgtasks_otel.plugin",
            "worker", "-Q", QUEUE, "-P", pool, "-c", "1", "--burst", "--poll-interval", "0.1",
        ],
        env={**os.environ, "PGTASKS_DSN": dsn, "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1",
             "OTEL_TEST_SPANS": str(spans_file)},
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert ok.get(timeout=10) == 10
    consumers = {
        s["attributes"]["messaging.message.id"]: s
        for s in _spans_from(spans_file)
        if s["kind"] == "SpanKind.CONSUMER"
    }
    assert set(consumers) == {str(ok.id), str(bad.id)}
    for job_id, consumer in consumers.items():
        producer = producers[job_id]
        assert producer.context is not None
        assert consumer["context"]["trace_id"] == f"0x{producer.context.trace_id:032x}"
        assert consumer["parent_id"] == f"0x{producer.context.span_id:016x}"
        assert SECRET not in json.dumps(consumer)
    failed = consumers[str(bad.id)]
    assert failed["status"]["status_code"] == "ERROR"
    if pool == "threads":  # the worker's own process: the stored, masked record
        assert [e["name"] for e in failed["events"]] == ["pgtasks.job.failed", "exception"]
        assert "postgresql://backup:***@db.internal" in failed["events"][1]["attributes"]["exception.message"]
    else:  # a child of the processes pool: the exception's type alone
        assert failed["events"] == [
            {"name": "exception", "timestamp": failed["events"][0]["timestamp"],
             "attributes": {"exception.type": "ConnectionError"}}
        ]  # fmt: skip


def test_a_schedule_run_carries_the_trace_context_of_its_own_producer_span(
    otel_app: pgtasks.App, exporter: InMemorySpanExporter
) -> None:
    otel_app.schedules.create("nightly", "otel.double", "@daily", args=(8,))
    run = otel_app.schedules.trigger("nightly")
    (producer,) = exporter.get_finished_spans()  # ended as the run was made: its id comes later
    assert producer.kind is SpanKind.PRODUCER
    assert "messaging.message.id" not in (producer.attributes or {})
    assert otel_app.get_job(run.id).headers["traceparent"] == traceparent(producer)
    run_worker(otel_app)
    (consumer,) = of_kind(exporter.get_finished_spans(), SpanKind.CONSUMER)
    assert consumer.parent is not None and producer.context is not None
    assert consumer.parent.span_id == producer.context.span_id
    assert (consumer.attributes or {})["pgtasks.job.trigger"] == "manual"


def test_without_opentelemetry_the_plugin_is_skipped_and_apps_work(dsn: str) -> None:
    """The entry point's import fails on the missing library: pgtasks skips the plugin
    (one log line naming the extra) and the other built-in plugins load as usual."""
    blocker = textwrap.dedent(
        """
        import importlib.abc, json, sys
        class NotInstalled(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.partition(".")[0] == "opentelemetry":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None
        sys.meta_path.insert(0, NotInstalled())
        import pgtasks
        app = pgtasks.App("lean", load_entry_points=True)
        result = app.get_task("pgtasks.index") is not None
        print(json.dumps({"skipped": app.plugin_manager.skipped, "index": result}))
        app.close()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", blocker],
        env={**os.environ, "PGTASKS_DSN": dsn},
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {
        "skipped": {
            "pgtasks_otel": "it needs opentelemetry, which is not installed (pip install 'pgtasks[otel]')"
        },
        "index": True,
    }
    assert done.stderr.count("built-in plugin pgtasks_otel skipped") == 1, done.stderr


def test_a_job_whose_trace_headers_are_not_text_runs_in_a_trace_of_its_own(
    otel_app: pgtasks.App, exporter: InMemorySpanExporter
) -> None:
    provider = pgtasks_otel.current_config().tracer_provider
    pgtasks_otel.configure()  # enqueued untraced: the headers stay as given
    result = otel_app.get_task("otel.double").apply_async((6,), headers={"traceparent": 7, "tracestate": [1]})
    pgtasks_otel.configure(tracer_provider=provider)
    run_worker(otel_app)
    assert result.get(timeout=10) == 12
    (consumer,) = exporter.get_finished_spans()
    assert consumer.kind is SpanKind.CONSUMER and consumer.parent is None
    assert [e.name for e in consumer.events] == ["pgtasks.job.succeeded"]


class BrokenPropagator(TextMapPropagator):
    """A propagator that fails both ways, standing in for a misconfigured one."""

    def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
        raise RuntimeError("inject broke")

    def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Any:
        raise RuntimeError("extract broke")

    @property
    def fields(self) -> set[str]:
        return {"traceparent"}


def test_an_error_of_tracing_is_logged_and_changes_no_job(
    otel_app: pgtasks.App, exporter: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    previous = propagate.get_global_textmap()
    propagate.set_global_textmap(BrokenPropagator())
    try:
        result = otel_app.get_task("otel.double").apply_async((7,), headers={"traceparent": "given"})
        run_worker(otel_app)
    finally:
        propagate.set_global_textmap(previous)
    assert result.get(timeout=10) == 14
    assert "no span for an enqueue of otel.double" in caplog.text
    assert f"job {result.id}: no span for its execution" in caplog.text
    assert of_kind(exporter.get_finished_spans(), SpanKind.CONSUMER) == []
