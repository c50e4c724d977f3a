"""OpenTelemetry tracing for pgtasks, as a plugin: spans for enqueue and execution.

Installed with the ``otel`` extra (``pip install 'pgtasks[otel]'``: opentelemetry-api)
and loaded through the ``pgtasks`` entry-point group like the other built-in plugins;
without opentelemetry-api it is skipped. It uses the tracer provider the application
configures with the OpenTelemetry SDK (or the one given to `configure`); with none, the
API's no-op tracer makes every hook return at once. See docs/tracing.md.
"""

from pgtasks_otel.plugin import OtelConfig, configure, current_config

__all__ = ["OtelConfig", "configure", "current_config"]
