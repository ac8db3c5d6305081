"""OpenTelemetry spans for gate calls: on when the standard `OTEL_*` variables configure an
exporter, and then only; otherwise nothing of OpenTelemetry is imported.

    OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 mcp-knecht serve --transport http
    OTEL_TRACES_EXPORTER=console mcp-knecht serve          # spans on stderr, for a look

On when `OTEL_TRACES_EXPORTER` names an exporter (`otlp`, `console`; not `none`) or an OTLP endpoint
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, unless
`OTEL_SDK_DISABLED=true`. The exporter reads the rest of its `OTEL_EXPORTER_OTLP_*` variables
itself; `OTEL_SERVICE_NAME` defaults to `mcp-knecht`. A process that already installed a tracer
provider (e.g. under `opentelemetry-instrument`) keeps its own. The provider is installed globally,
so the MCP SDK's own server spans (`tools/call <tool>`, which continue a client's trace when its
request carries `_meta.traceparent`) are exported too, and each gate span is their child.

One span per gate outcome, `knecht.gate <tool>`, timed as the call was, with the tool, action,
outcome, policy rule, source, proposal id and error code as attributes — never the arguments or
the result, and not the caller's identity (that stays in the audit log). A name that is not a
served tool is `(unknown)`: a caller's invented names stay in the audit log too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from mcp_knecht import __version__
from mcp_knecht.core.audit import AuditEntry
from mcp_knecht.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

SERVICE_NAME = "mcp-knecht"
UNKNOWN_TOOL = "(unknown)"
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_INSTALL = "install them with: pip install 'mcp-knecht[otel]'"


def exporters_configured(env: Mapping[str, str]) -> tuple[str, ...]:
    """The trace exporters the environment asks for; empty when tracing is off."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    named = [part.strip().lower() for part in env.get("OTEL_TRACES_EXPORTER", "").split(",") if part.strip()]
    if named:
        return tuple(name for name in named if name != "none")
    return ("otlp",) if any(env.get(name, "").strip() for name in _ENDPOINTS) else ()


class Tracing(msgspec.Struct):
    """The OpenTelemetry tracer gate outcomes become spans of."""
    tracer: Tracer
    shutdown: Callable[[], None]
    tools: frozenset[str] = frozenset()

    def observe(self, entry: AuditEntry) -> None:
        """The gate hook: one span, ended now, begun when the call entered the gate."""
        from opentelemetry.trace import SpanKind, Status, StatusCode

        end = time.time_ns()
        start = end - int((entry.duration_ms or 0.0) * 1_000_000)
        tool = entry.tool if entry.tool in self.tools else UNKNOWN_TOOL
        attributes: dict[str, Any] = {
            "knecht.tool": tool, "knecht.outcome": entry.outcome, "knecht.source": entry.source,
        }
        optional = {"knecht.action": entry.action, "knecht.rule": entry.rule,
                    "knecht.proposal_id": entry.proposal_id, "knecht.error": entry.detail.get("error")}
        attributes.update({key: value for key, value in optional.items() if value is not None})
        span = self.tracer.start_span(f"knecht.gate {tool}", kind=SpanKind.INTERNAL, attributes=attributes,
                                      start_time=start)
        if entry.outcome == "failed":
            span.set_status(Status(StatusCode.ERROR, str(entry.detail.get("error") or "failed")))
        span.end(end_time=end)


def tracing_from_env(env: Mapping[str, str], *, provider: Any = None) -> Tracing | None:
    """Spans as the environment configures them, or None (then nothing is imported). `provider`:
    a tracer provider of the caller's (tests pass one with an in-memory exporter)."""
    if provider is not None:
        return Tracing(provider.get_tracer("mcp_knecht", __version__), lambda: None)
    exporters = exporters_configured(env)
    if not exporters:
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigError(f"OTEL_* variables ask for traces, but the OpenTelemetry SDK is missing; {_INSTALL}.") \
            from exc
    current = trace.get_tracer_provider()
    if not isinstance(current, trace.ProxyTracerProvider):  # someone else set one up: use it
        return Tracing(current.get_tracer("mcp_knecht", __version__), lambda: None)
    resource = Resource.create({"service.version": __version__})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    for name in exporters:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name, env)))
    # Global, so that the MCP SDK's own server spans (`tools/call get_run`, continuing a client's
    # trace from `_meta.traceparent`) are exported too, with ours inside them.
    trace.set_tracer_provider(provider)
    return Tracing(provider.get_tracer("mcp_knecht", __version__), provider.shutdown)


def _exporter(name: str, env: Mapping[str, str]) -> Any:
    if name == "console":
        import sys

        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=sys.stderr)  # stdout is the MCP channel of a stdio server
    if name != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER={name!r}: mcp-knecht exports traces with 'otlp' or 'console'.")
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip()
    try:
        return _otlp_grpc() if protocol == "grpc" else _otlp_http()
    except ImportError as exc:
        install = "install opentelemetry-exporter-otlp-proto-grpc" if protocol == "grpc" else _INSTALL
        raise ConfigError(f"OTEL_* variables ask for OTLP traces over {protocol}, but its exporter is "
                          f"missing; {install}.") from exc


def _otlp_http() -> Any:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # reads OTEL_EXPORTER_OTLP_* itself


def _otlp_grpc() -> Any:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()
