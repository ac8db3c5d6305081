"""Issue 11, items 5 (first half) and 8: hostile values get a clear error, are audited, and reach
nothing they should not — not a handler, not the database, not the audit writer, not an
operator's terminal."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from pydantic.json_schema import GenerateJsonSchema

from mcp_knecht import testing
from mcp_knecht.app import App
from mcp_knecht.core.tools import _BoundedSchema
from mcp_knecht.core.validation import MAX_INT
from mcp_knecht.store.audit_log import verify_chain
from tests.conftest import READONLY, server_env
from tests.knecht_harness import AGENT, Knecht, build
from tests.servers import http_server, knecht_executable
from tests.staging import acli

pytestmark = pytest.mark.anyio

SURROGATE = "\ud800"


@pytest.fixture
async def kn(app: App) -> AsyncIterator[Knecht]:
    yield await build(app)


async def _audited(app: App) -> list[dict[str, Any]]:
    await app.audit.flush()
    return await app.db.fetch_all("SELECT tool, outcome, subject, detail FROM audit_log ORDER BY id")


async def test_arguments_that_cannot_be_encoded_are_invalid_and_audited(kn: Knecht, protocol_mode: str) -> None:
    """Item 5: a lone surrogate anywhere in the arguments (or in a tool's name) is refused as invalid
    before any tool sees it, the refusal is audited, and the audit chain stays whole."""
    before = len(await _audited(kn.app))
    eve, nobody = testing.actor("eve", READONLY), testing.actor("mallory", ())  # mallory: not a single scope
    async with testing.connect(kn.app, eve, mode=protocol_mode) as client, \
            testing.connect(kn.app, nobody, mode=protocol_mode) as mallory:
        for arguments in ({"branch": SURROGATE}, {"branch": f"main{SURROGATE}x"}, {"project": "\udfff"}):
            refused = await client.call_tool("list_runs", arguments)
            assert refused.is_error and "cannot be encoded" in refused.content[0].text
            json.dumps(refused.structured_content).encode("utf-8")  # what went back is valid UTF-8
        assert (await mallory.call_tool("list_runs", {"branch": SURROGATE})).is_error
        assert not (await client.call_tool("list_projects", {})).is_error  # still serving
    # Where the SDK's client cannot even send them (in a header): straight through the gate.
    keyed = await kn.gate.call_tool(eve, "list_runs", {SURROGATE: 1})  # a surrogate in a field's name
    assert keyed.error_code == "invalid_arguments" and "cannot be encoded" in keyed.text
    assert (await kn.gate.call_tool(nobody, f"list_runs{SURROGATE}", {"x": SURROGATE})).is_error
    rows = (await _audited(kn.app))[before:]
    assert [row["outcome"] for row in rows] == ["invalid"] * 3 + ["forbidden", "ran", "invalid", "forbidden"]
    assert all(SURROGATE not in json.dumps(row, ensure_ascii=False) for row in rows)
    assert await verify_chain(kn.app.db, kn.app.audit.chain) == []


@pytest.mark.slow
async def test_one_request_cannot_stop_the_http_server(demo_env: dict[str, str], mint: Callable[..., str]) -> None:
    """Item 5 over HTTP, as reported: raw JSON with lone surrogates from a token with no scopes, on
    both protocol versions. Each gets an answer (a parse error from the SDK, or our refusal); the
    server goes on serving everyone, and the audit log verifies."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    with http_server(demo_env) as base:
        nobody = mint("mallory", [])
        session = _post(base, nobody, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "x", "version": "1"}}}))
        legacy = {"Mcp-Session-Id": session[1]["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
        _post(base, nobody, json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}), legacy)
        modern = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "list_runs"}
        envelope = {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                              "io.modelcontextprotocol/clientCapabilities": {}}}
        cases = [(modern, {"name": "list_runs", "arguments": {"branch": "@"}, **envelope}),
                 (legacy, {"name": "list_runs", "arguments": {"branch": "@"}}),
                 (legacy, {"name": "@", "arguments": {"@": 1}})]
        for headers, params in cases:
            for hostile in ("\\ud800", "\\udfff", "a\\udc00b", "\\ud800\\u0041"):
                body = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params})
                status, _, answer = _post(base, nobody, body.replace('"@"', f'"{hostile}"'), headers)
                assert status in (200, 400), (status, answer)  # an answer: the SDK's parse error, or ours
                assert "Parse error" in answer or "Unknown tool" in answer, answer
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {mint('erin')}"}) as http, Client(
                streamable_http_client(f"{base}/mcp", http_client=http)) as client:
            assert not (await client.call_tool("list_projects", {})).is_error
    verified = await acli("mcp-knecht", demo_env, "audit", "verify", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def _post(base: str, bearer: str, body: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(f"{base}/mcp", data=body.encode(), method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {bearer}", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read().decode()


async def test_integers_beyond_64_bits_are_validation_errors(kn: Knecht) -> None:
    """Item 8: `2**70` as a run id is an invalid argument naming the field, not an internal error."""
    eve = testing.actor("eve", (*READONLY, "runs:write", "workflows:write"))
    for tool, arguments in (("get_run", {"run_id": 2**70}), ("list_runs", {"before": -(2**70)}),
                            ("get_action_log", {"run_id": 1, "action": 2**64}),
                            ("dispatch_workflow", {"workflow": 1, "branch": "main", "inputs": {"n": 2**63}})):
        result = await kn.gate.call_tool(eve, tool, arguments)
        assert result.is_error and result.error_code == "invalid_arguments", (tool, result.text)
        assert "integer out of range" in result.text
    schema = next(t for t in kn.app.registry if t.name == "get_run").input_schema
    assert schema["properties"]["run_id"]["maximum"] == MAX_INT
    assert [r["outcome"] for r in (await _audited(kn.app))[-4:]] == ["invalid"] * 4


async def test_published_schemas_give_every_default_as_pydantic_would_encode_it(kn: Knecht) -> None:
    """The schema generator writes JSON scalars as their own default, sparing pydantic a TypeAdapter
    each; every tool's input schema is still exactly the one pydantic's own encoding gives."""

    class PydanticDefaults(_BoundedSchema):
        def encode_default(self, dft: Any) -> Any:
            return GenerateJsonSchema.encode_default(self, dft)

    defaults = 0
    for tool in kn.app.registry:
        assert tool.input_schema == tool.input_model.model_json_schema(schema_generator=PydanticDefaults), tool.name
        defaults += sum("default" in prop for prop in tool.input_schema.get("properties", {}).values())
    assert defaults >= 10


async def test_search_strings_cannot_contain_nul(kn: Knecht) -> None:
    """Item 8: the database cuts a pattern at NUL, so `grep "\\x00"` matched every line."""
    run = await kn.app.db.fetch_one("SELECT id FROM runs ORDER BY id LIMIT 1")
    result = await kn.gate.call_tool(testing.actor("eve", READONLY), "get_run_log", {"run_id": run["id"],  # type: ignore[index]
                                                                                        "grep": "\x00"})
    assert result.is_error and "grep: text must not contain NUL" in result.text
    assert "lines" not in (result.data or {})


@pytest.mark.slow
async def test_a_huge_argument_is_not_echoed_back_over_stdio(demo_env: dict[str, str],
                                                             mint: Callable[..., str]) -> None:
    """Item 8: `get_project` with a 10 MB argument answered with the 10 MB in its error."""
    params = StdioServerParameters(command=knecht_executable(), args=["serve"],
                                   env=server_env(demo_env, KNECHT_TOKEN=mint("dave", ["projects:read"])))
    async with Client(params) as client:
        for project in ("x" * 10_000_000, "y" * 50_000):
            result = await client.call_tool("get_project", {"project": project})
            assert result.is_error
            assert len(result.content[0].text) < 3_000 and len(json.dumps(result.structured_content)) < 3_000


async def test_the_operator_terminal_shows_controls_and_bidi_characters_as_escapes(
    kn: Knecht, demo_env: dict[str, str]
) -> None:
    """Item 8: `knecht-approve show` printed U+202E (and escape sequences) to the operator's terminal."""
    hostile = "release.\u202egpj.exe \x1b[2J\x1b[31mAPPROVED\x1b[0m\rok\u200b"
    staged = await kn.gate.call_tool(testing.actor("alice", AGENT), "project_variable", {
        "action": "set", "project": "payments-api", "name": "NOTE", "value": hostile})
    assert staged.data is not None and staged.outcome == "staged", staged.text
    outputs = [await acli("knecht-approve", demo_env, "show", str(staged.data["id"])),
               await acli("knecht-approve", demo_env, "list"),
               await acli("mcp-knecht", demo_env, "audit", "list", "--limit", "5")]
    shown_json = await acli("knecht-approve", demo_env, "show", str(staged.data["id"]), "--json")
    for done in [*outputs, shown_json]:
        assert done.returncode == 0, done.stderr
        for bad in ("\u202e", "\x1b", "\r", "\u200b"):
            assert bad not in done.stdout + done.stderr
    assert "\\u202e" in outputs[0].stdout and "\\u001b[31m" in outputs[0].stdout
    assert json.loads(shown_json.stdout)["arguments"]["value"] == hostile  # JSON escapes: the same value


@pytest.mark.slow
async def test_a_terminated_http_server_writes_its_last_audit_rows_before_it_exits(
    demo_env: dict[str, str], mint: Callable[..., str]
) -> None:
    """Every call audited, also at the end: SIGTERM while another process holds the store's write
    lock (so the rows wait in the buffer) — the server shuts down, writes them once it can, exits 0."""
    import signal
    import sqlite3
    import threading

    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    from tests.servers import http_server_process

    with http_server_process(demo_env) as (base, process):
        path = demo_env["KNECHT_DATABASE_URL"].removeprefix("sqlite:///")
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")  # the store is busy: audit rows wait in the buffer
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {mint('erin')}"}) as http, Client(
                streamable_http_client(f"{base}/mcp", http_client=http)) as client:
            for _ in range(5):
                assert not (await client.call_tool("list_projects", {})).is_error
        process.send_signal(signal.SIGTERM)
        threading.Timer(2.0, lambda: (other.execute("ROLLBACK"), other.close())).start()
        assert process.wait(timeout=60) == 0
    listed = json.loads((await acli("mcp-knecht", demo_env, "audit", "list", "--json", "--tool", "list_projects",
                                    "--subject", "erin")).stdout)
    assert len(listed) == 5
