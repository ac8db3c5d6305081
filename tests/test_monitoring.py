"""What an operator's monitoring gets: Prometheus metrics at /metrics, OpenTelemetry spans, JSON
log events — all fed from the gate's one observer hook."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client.parser import text_string_to_metric_families

from mcp_knecht import testing
from mcp_knecht.app import App, open_app
from mcp_knecht.core.settings import load_settings
from mcp_knecht.observe import build_telemetry
from mcp_knecht.observe.tracing import exporters_configured
from tests.conftest import server_env
from tests.servers import http_server, knecht_executable
from tests.staging import acli

pytestmark = pytest.mark.anyio

METRICS_TOKEN = "scrape-me-" + "x" * 30
AGENT = ("projects:read", "runs:read", "runs:write", "logs:read", "proposals:read")
MARKER = "do-not-log-me-7f3a"


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _scrape(base_url: str, token: str | None = METRICS_TOKEN) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(f"{base_url}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _parse(text: str) -> Samples:
    """Every sample of the exposition, parsed by prometheus_client's own parser."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text) for sample in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


async def _calls(base_url: str, bearer: str, calls: list[tuple[str, dict[str, Any]]]) -> list[bool]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"}, timeout=30) as http, Client(
        streamable_http_client(f"{base_url}/mcp", http_client=http)
    ) as client:
        return [(await client.call_tool(name, arguments)).is_error for name, arguments in calls]


@pytest.fixture
def metrics_server(demo_env: dict[str, str]) -> Iterator[str]:
    with http_server({**demo_env, "KNECHT_METRICS_TOKEN": METRICS_TOKEN}) as url:
        yield url


# --- metrics -------------------------------------------------------------------------------------


async def test_metrics_after_a_few_calls_count_outcomes_latency_and_proposals(  # type: ignore[no-untyped-def]
    metrics_server: str, mint: Callable[..., str], demo_env: dict[str, str]
) -> None:
    errors = await _calls(metrics_server, mint("erin", AGENT), [
        ("list_projects", {}),
        ("list_projects", {}),
        ("get_run", {"run_id": "seven"}),              # invalid
        ("no_such_tool", {}),                          # forbidden, and not a label value of its own
        ("rerun_run", {"run_id": 1}),                  # staged
    ])
    assert errors == [False, False, True, True, False]

    for _ in range(50):  # the audit log's next group commit (every 50 ms) may not have run yet
        status, text = _scrape(metrics_server)
        assert status == 200
        samples = _parse(text)
        if (_value(samples, "knecht_audit_flush_duration_seconds_count") or 0) >= 1:
            break
        await anyio.sleep(0.1)
    calls = "knecht_gate_calls_total"
    assert _value(samples, calls, tool="list_projects", outcome="ran", source="mcp") == 2
    assert _value(samples, calls, tool="get_run", outcome="invalid", source="mcp") == 1
    assert _value(samples, calls, tool="(unknown)", outcome="forbidden", source="mcp") == 1
    assert _value(samples, calls, tool="rerun_run", outcome="staged", source="mcp") == 1
    assert not any("no_such_tool" in str(labels) for _, labels in samples)
    latency = "knecht_gate_call_duration_seconds"
    assert _value(samples, latency + "_count", tool="list_projects", outcome="ran") == 2
    assert 0 < (_value(samples, latency + "_sum", tool="list_projects", outcome="ran") or 0) < 10
    assert _value(samples, latency + "_bucket", tool="list_projects", outcome="ran", le="+Inf") == 2

    assert _value(samples, "knecht_proposals_pending") == 1
    assert _value(samples, "knecht_proposals", status="pending") == 1
    assert 0 <= (_value(samples, "knecht_proposal_oldest_pending_age_seconds") or -1) < 300
    assert _value(samples, "knecht_proposal_decisions_total", decision="approved") == 0
    assert (_value(samples, "knecht_audit_flush_duration_seconds_count") or 0) >= 1
    assert _value(samples, "knecht_audit_backlog_entries") is not None
    assert _value(samples, "knecht_sessions_open") is not None
    assert _value(samples, "knecht_build_info", version="0.1.0") == 1
    assert "knecht_store_errors" in {family.name for family in text_string_to_metric_families(text)}

    # An operator approves in another process: the store-derived series follow.
    approved = await acli("knecht-approve", demo_env, "approve", "1", "--as", "bob")
    assert approved.returncode == 0, approved.stderr
    samples = _parse(_scrape(metrics_server)[1])
    assert _value(samples, "knecht_proposals_pending") == 0
    assert _value(samples, "knecht_proposal_oldest_pending_age_seconds") == 0
    assert _value(samples, "knecht_proposal_decisions_total", decision="approved") == 1
    assert _value(samples, "knecht_proposals", status="succeeded") == 1


async def test_sessions_open_counts_the_stateful_sessions(metrics_server: str, mint: Callable[..., str]) -> None:
    headers = {"Authorization": f"Bearer {mint('erin', AGENT)}"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http, Client(
        streamable_http_client(f"{metrics_server}/mcp", http_client=http), mode="legacy"
    ) as client:
        await client.list_tools()
        during = _value(_parse(_scrape(metrics_server)[1]), "knecht_sessions_open")
    assert during is not None and during >= 1


def test_metrics_need_their_own_token(metrics_server: str, mint: Callable[..., str]) -> None:
    for bearer in (None, "wrong-" + "y" * 30, mint("erin", AGENT)):  # an MCP token does not open it
        status, body = _scrape(metrics_server, bearer)
        assert status == 401 and "KNECHT_METRICS_TOKEN" in json.loads(body)["error"]["message"]


async def test_without_a_metrics_token_metrics_are_off_and_say_how_to_switch_them_on(
    demo_env: dict[str, str],
) -> None:
    with http_server(demo_env) as url:
        status, body = _scrape(url, "anything-" + "z" * 30)
    assert status == 404
    assert "KNECHT_METRICS_TOKEN" in json.loads(body)["error"]["message"]


def test_a_short_metrics_token_stops_the_server(demo_env: dict[str, str]) -> None:
    with (pytest.raises(RuntimeError, match="KNECHT_METRICS_TOKEN is too short"),
          http_server({**demo_env, "KNECHT_METRICS_TOKEN": "short"})):
        pass


async def test_proposal_series_read_from_either_store_count_overdue_ones_as_expired(staged_app: App) -> None:
    from mcp_knecht.observe.metrics import Metrics

    metrics = Metrics()
    metrics.watch(db=staged_app.db, tools=[tool.name for tool in staged_app.registry])
    async with testing.connect(staged_app, testing.actor("erin", ["runs:write"])) as client:
        for label in ("a", "b", "c"):
            assert not (await client.call_tool("record_effect", {"label": label})).is_error
    async with staged_app.db.transaction() as tx:  # one of them is overdue, not yet swept
        await tx.execute("UPDATE proposals SET expires_at = '2000-01-01T00:00:00.000000Z' WHERE id = 1")
    samples = _parse((await metrics.render()).decode())
    assert _value(samples, "knecht_proposals_pending") == 2
    assert _value(samples, "knecht_proposals", status="expired") == 1
    assert _value(samples, "knecht_proposal_decisions_total", decision="expired") == 1
    assert 0 <= (_value(samples, "knecht_proposal_oldest_pending_age_seconds") or -1) < 60


# --- traces --------------------------------------------------------------------------------------


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def test_every_gate_call_is_a_span_with_tool_outcome_rule_and_duration_but_no_arguments(
    demo_env: dict[str, str], spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    settings = load_settings(env=demo_env)
    telemetry = build_telemetry(settings, tracer_provider=provider)
    async with open_app(settings, observe=telemetry.observe) as app:
        telemetry.attach(app)
        async with testing.connect(app, testing.actor("erin", AGENT)) as client:
            await client.call_tool("get_run", {"run_id": 3})
            await client.call_tool("get_run", {"run_id": 999_999})                 # failed: no such run
            await client.call_tool("get_run_log", {"run_id": 3, "grep": MARKER})  # an argument to keep out
            await client.call_tool("list_runs", {"status": MARKER})                # invalid
            await client.call_tool(MARKER, {})                                     # forbidden
            await client.call_tool("rerun_run", {"run_id": 1})                     # staged

    finished: tuple[ReadableSpan, ...] = exporter.get_finished_spans()
    seen = [(s.name, s.attributes["knecht.outcome"]) for s in finished if s.attributes]
    assert seen == [
        ("knecht.gate get_run", "ran"), ("knecht.gate get_run", "failed"), ("knecht.gate get_run_log", "ran"),
        ("knecht.gate list_runs", "invalid"), ("knecht.gate (unknown)", "forbidden"),
        ("knecht.gate rerun_run", "staged"),
    ]
    ran, failed, staged = finished[0], finished[1], finished[5]
    assert ran.attributes is not None and staged.attributes is not None and failed.attributes is not None
    assert ran.attributes["knecht.tool"] == "get_run"
    assert ran.attributes["knecht.rule"] == "built-in: read effects are auto"
    assert ran.attributes["knecht.source"] == "mcp"
    assert staged.attributes["knecht.rule"] == "built-in: write effects are approve"
    assert isinstance(staged.attributes["knecht.proposal_id"], int)
    assert failed.status.status_code is StatusCode.ERROR and failed.attributes["knecht.error"] == "not_found"
    assert ran.status.status_code is StatusCode.UNSET
    for span in finished:
        assert span.start_time is not None and span.end_time is not None and span.start_time < span.end_time
        assert MARKER not in json.dumps({**(span.attributes or {}), "name": span.name}, default=str)
        assert not {"knecht.subject", "knecht.client", "knecht.arguments"} & set(span.attributes or {})


def test_tracing_is_on_only_when_the_otel_variables_ask_for_it() -> None:
    assert exporters_configured({}) == ()
    assert exporters_configured({"OTEL_SERVICE_NAME": "knecht"}) == ()
    assert exporters_configured({"OTEL_TRACES_EXPORTER": "none"}) == ()
    assert exporters_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}) == ("otlp",)
    assert exporters_configured({"OTEL_TRACES_EXPORTER": "otlp,console"}) == ("otlp", "console")
    assert exporters_configured({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}) == ()


def _json_objects(text: str) -> list[dict[str, Any]]:
    """The JSON objects in `text` (the console exporter writes indented spans among other lines)."""
    decoder, found, index = json.JSONDecoder(), [], 0
    while (index := text.find("{", index)) != -1:
        try:
            value, end = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            index += 1
            continue
        found.append(value)
        index = end
    return found


@pytest.mark.slow
async def test_otel_variables_switch_spans_on_inside_the_sdks_own_request_spans(
    demo_env: dict[str, str], mint: Callable[..., str]
) -> None:
    env = server_env(demo_env, KNECHT_TOKEN=mint("erin", AGENT), OTEL_TRACES_EXPORTER="console",
                     OTEL_SERVICE_NAME="knecht-under-test")
    params = StdioServerParameters(command=knecht_executable(), args=["serve"], env=env)
    with tempfile.TemporaryFile(mode="w+") as stderr:
        async with Client(stdio_client(params, errlog=stderr)) as client:  # stdout stays the MCP channel
            assert not (await client.call_tool("get_run", {"run_id": 3})).is_error
        stderr.seek(0)
        exported = [span for span in _json_objects(stderr.read()) if "context" in span]
    by_name = {span["name"]: span for span in exported}
    gate, request = by_name["knecht.gate get_run"], by_name["tools/call get_run"]
    assert gate["parent_id"] == request["context"]["span_id"]
    assert gate["context"]["trace_id"] == request["context"]["trace_id"]
    assert gate["attributes"]["knecht.outcome"] == "ran"
    assert gate["resource"]["attributes"]["service.name"] == "knecht-under-test"


def _imported_by_a_stdio_start(env: dict[str, str]) -> str:
    """`python -X importtime` of a stdio server that starts and sees its client leave at once."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "mcp_knecht.cli.main", "serve"], env=server_env(env),
        input="", capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


@pytest.mark.slow
def test_a_stdio_cold_start_imports_neither_opentelemetry_nor_prometheus(
    demo_env: dict[str, str], mint: Callable[..., str]
) -> None:
    env = {**demo_env, "KNECHT_TOKEN": mint()}
    plain = _imported_by_a_stdio_start(env)
    assert "mcp_knecht.app" in plain
    # (The MCP SDK itself imports the OpenTelemetry *API*, whose spans are no-ops without an SDK.)
    assert "opentelemetry.sdk" not in plain and "prometheus_client" not in plain
    traced = _imported_by_a_stdio_start({**env, "OTEL_TRACES_EXPORTER": "console"})
    assert "opentelemetry.sdk.trace" in traced


# --- logs ----------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_json_logs_carry_one_event_per_gate_outcome_with_the_audit_fields(
    demo_env: dict[str, str], mint: Callable[..., str]
) -> None:
    env = server_env(demo_env, KNECHT_TOKEN=mint("erin", AGENT))
    params = StdioServerParameters(command=knecht_executable(), args=["serve", "--log-format", "json"], env=env)
    with tempfile.TemporaryFile(mode="w+") as stderr:
        async with Client(stdio_client(params, errlog=stderr)) as client:
            await client.call_tool("get_run", {"run_id": 3})
            await client.call_tool("list_runs", {"status": MARKER})
            await client.call_tool("rerun_run", {"run_id": 1})
        stderr.seek(0)
        lines = [line for line in stderr.read().splitlines() if line.strip()]

    records = [json.loads(line) for line in lines]  # every line is JSON
    events = [r for r in records if r.get("event") == "gate_outcome"]
    assert [(e["tool"], e["outcome"]) for e in events] == [
        ("get_run", "ran"), ("list_runs", "invalid"), ("rerun_run", "staged")]
    audit_fields = {"at", "source", "subject", "client", "tool", "action", "outcome", "rule", "proposal_id",
                    "arguments_hash", "duration_ms"}
    for event in events:
        assert audit_fields <= set(event) and event["level"] == "info" and event["subject"] == "erin"
        assert "arguments" not in event and MARKER not in json.dumps(event)
    ran, invalid, staged = events
    assert ran["rule"] == "built-in: read effects are auto" and len(ran["arguments_hash"]) == 64
    assert invalid["error"] == "invalid_arguments"
    assert isinstance(staged["proposal_id"], int) and staged["source"] == "mcp"
    # The events match the audit rows the gate wrote (a staged row is written with its proposal, a
    # moment before the gate is done: there `at` and `duration_ms` differ by that moment).
    shown = subprocess.run([knecht_executable(), "audit", "list", "--json", "--limit", "3"], env=env,
                           capture_output=True, text=True, timeout=60)
    rows = {(row["tool"], row["outcome"]): row for row in json.loads(shown.stdout)}
    for event in events:
        row = rows[(event["tool"], event["outcome"])]
        same = audit_fields - ({"at", "duration_ms"} if event["outcome"] == "staged" else set())
        assert {key: row[key] for key in same} == {key: event[key] for key in same}


def test_the_default_text_log_has_no_per_call_lines(demo_env: dict[str, str], mint: Callable[..., str]) -> None:
    done = subprocess.run([knecht_executable(), "serve"], env=server_env(demo_env, KNECHT_TOKEN=mint()),
                          input="", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "gate_outcome" not in done.stderr


def test_an_unknown_log_format_is_refused(demo_env: dict[str, str]) -> None:
    done = subprocess.run([knecht_executable(), "serve"], env=server_env(demo_env, KNECHT_LOG_FORMAT="xml"),
                          input="", capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "KNECHT_LOG_FORMAT" in done.stderr


