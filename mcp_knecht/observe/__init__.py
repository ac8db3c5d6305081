"""Monitoring: what an operator's Prometheus, OpenTelemetry collector and log shipper get.

Everything is fed from one hook, the gate's observer (`Gate(observe=…)`), which sees the audit
entry of every gate outcome, and fans it out to

    metrics   `metrics.py`  prometheus-client, served at /metrics over HTTP (KNECHT_METRICS_TOKEN)
    traces    `tracing.py`  OpenTelemetry spans, when the OTEL_* variables configure an exporter
    logs      `logs.py`     one JSON event per outcome, with --log-format json

    telemetry = build_telemetry(settings, log_format="json", metrics=True)
    async with open_app(settings, observe=telemetry.observe) as app:
        telemetry.attach(app)              # tool names, and what is read when scraped
        ...
    telemetry.close()

What is not configured is not imported: a stdio server without OTEL_* variables and with text logs
loads neither prometheus-client nor OpenTelemetry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from mcp_knecht.core.audit import AuditEntry, Observer
from mcp_knecht.core.settings import LogFormat, Settings
from mcp_knecht.observe.logs import configure_logging, log_gate_outcome

if TYPE_CHECKING:
    from mcp_knecht.app import App
    from mcp_knecht.observe.metrics import Metrics
    from mcp_knecht.observe.tracing import Tracing

__all__ = ["Telemetry", "build_telemetry"]

logger = logging.getLogger(__name__)


class Telemetry(msgspec.Struct):
    """Metrics and tracing as configured, and the observers that feed them."""
    metrics: Metrics | None = None
    tracing: Tracing | None = None
    observers: list[Observer] = msgspec.field(default_factory=list)

    @property
    def observe(self) -> Observer | None:
        """The gate's hook, or None when nothing watches (the gate then skips the call)."""
        return self._fan_out if self.observers else None

    def _fan_out(self, entry: AuditEntry) -> None:
        for observer in self.observers:
            try:
                observer(entry)
            except Exception:  # one failing sink (an exporter, a log handler) does not silence the others
                logger.exception("Monitoring %s failed for an outcome of %s", observer, entry.tool)

    def attach(self, app: App, *, sessions_open: Callable[[], int] | None = None) -> None:
        """Learn the served tools (label values) and what the metrics read when scraped."""
        tools = frozenset(tool.name for tool in app.registry)
        if self.tracing is not None:
            self.tracing.tools = tools
        if self.metrics is not None:
            self.metrics.watch(db=app.db, tools=tools, audit_backlog=lambda: app.audit.depth,
                               sessions_open=sessions_open)
            app.audit.on_flush = self.metrics.audit_flushed

    def close(self) -> None:
        """Send the spans still buffered."""
        if self.tracing is not None:
            self.tracing.shutdown()


def build_telemetry(settings: Settings, *, log_format: LogFormat = "text", metrics: bool = False,
                    tracer_provider: Any = None) -> Telemetry:
    """Logs as `log_format` says, metrics if asked for, spans if OTEL_* configures them (or for
    the given `tracer_provider`)."""
    telemetry = Telemetry()
    configure_logging(log_format)
    if log_format == "json":
        telemetry.observers.append(log_gate_outcome)
    if metrics:
        from mcp_knecht.observe.metrics import Metrics

        telemetry.metrics = Metrics()
        telemetry.observers.append(telemetry.metrics.observe)
    from mcp_knecht.observe.tracing import tracing_from_env

    telemetry.tracing = tracing_from_env(settings.env, provider=tracer_provider)
    if telemetry.tracing is not None:
        telemetry.observers.append(telemetry.tracing.observe)
    return telemetry
