"""The server as the SDK's own client sees it, in memory, on both protocol versions."""

from __future__ import annotations

import json

import pytest

from mcp_knecht.app import App
from mcp_knecht.transports.mcp_server import build_mcp_server

pytestmark = pytest.mark.anyio

READ_TOOLS = {"list_projects", "get_project", "list_runs", "get_run"}


async def tool_names(client) -> set[str]:  # type: ignore[no-untyped-def]
    return {tool.name for tool in (await client.list_tools()).tools}


async def audit_outcomes(app: App) -> list[tuple[str, str, str]]:
    await app.audit.flush()
    rows = await app.db.fetch_all("SELECT subject, tool, outcome FROM audit_log ORDER BY id")
    return [(r["subject"], r["tool"], r["outcome"]) for r in rows]


async def test_each_token_sees_only_the_tools_its_scopes_allow(connect) -> None:  # type: ignore[no-untyped-def]
    async with connect(scopes=["projects:read"]) as narrow:
        assert await tool_names(narrow) == {"list_projects", "get_project"}
    async with connect(scopes=["projects:read", "runs:read"]) as wider:
        assert await tool_names(wider) >= READ_TOOLS
    async with connect(scopes=[]) as nothing:
        assert await tool_names(nothing) == set()


async def test_listed_tools_carry_schemas_and_read_only_annotations(connect) -> None:  # type: ignore[no-untyped-def]
    async with connect() as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    list_runs = tools["list_runs"]
    assert list_runs.input_schema["properties"]["limit"]["maximum"] == 50
    assert list_runs.input_schema.get("additionalProperties") is False
    assert list_runs.annotations.read_only_hint is True
    assert list_runs.annotations.destructive_hint is False
    assert all(tool.description for tool in tools.values())


async def test_a_read_tool_returns_text_and_structured_content(connect) -> None:  # type: ignore[no-untyped-def]
    async with connect() as client:
        result = await client.call_tool("list_projects", {})
        assert not result.is_error
        projects = result.structured_content["projects"]
        assert len(projects) >= 5
        slug = projects[0]["slug"]
        assert slug in result.content[0].text
        project = await client.call_tool("get_project", {"project": slug})
        assert not project.is_error
        runs = await client.call_tool("list_runs", {"status": "failed", "limit": 5})
        assert not runs.is_error
        assert 0 < len(runs.structured_content["runs"]) <= 5
        assert {run["status"] for run in runs.structured_content["runs"]} == {"failed"}
        run_id = runs.structured_content["runs"][0]["id"]
        run = await client.call_tool("get_run", {"run_id": run_id})
        assert not run.is_error
        assert any(action["status"] == "failed" for action in run.structured_content["actions"])


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"limit": 10000}, "limit"),
        ({"limit": "20"}, "limit"),
        ({"limit": 0}, "limit"),
        ({"status": "exploded"}, "status"),
        ({"colour": "red"}, "colour"),
        ({"project": ["a", "b"]}, "project"),
    ],
)
async def test_invalid_arguments_name_the_field_and_run_nothing(  # type: ignore[no-untyped-def]
    connect, app: App, arguments, field
) -> None:
    async with connect() as client:
        result = await client.call_tool("list_runs", arguments)
    assert result.is_error
    assert field in result.content[0].text
    problems = result.structured_content["error"]["problems"]
    assert any(p["field"].split(".")[0] == field for p in problems)
    assert await audit_outcomes(app) == [("alice", "list_runs", "invalid")]


async def test_a_tool_outside_the_scopes_answers_exactly_like_an_unknown_tool(connect, app: App) -> None:  # type: ignore[no-untyped-def]
    async with connect(scopes=["projects:read"]) as client:
        hidden = await client.call_tool("get_run", {"run_id": 1})
        unknown = await client.call_tool("get_runz", {"run_id": 1})
    assert hidden.is_error and unknown.is_error
    assert hidden.content[0].text.replace("get_run", "T") == unknown.content[0].text.replace("get_runz", "T")
    assert hidden.structured_content["error"]["code"] == unknown.structured_content["error"]["code"]
    assert await audit_outcomes(app) == [("alice", "get_run", "forbidden"), ("alice", "get_runz", "forbidden")]


async def test_a_missing_run_is_a_clear_tool_error(connect) -> None:  # type: ignore[no-untyped-def]
    async with connect() as client:
        result = await client.call_tool("get_run", {"run_id": 987654321})
    assert result.is_error
    assert "987654321" in result.content[0].text


async def test_every_outcome_is_audited_with_the_subject_of_the_token(connect, app: App) -> None:  # type: ignore[no-untyped-def]
    async with connect(subject="carol") as client:
        await client.call_tool("list_projects", {})
        await client.call_tool("get_run", {"run_id": 987654321})
        await client.call_tool("list_runs", {"limit": 10000})
        await client.call_tool("nope", {})
    assert await audit_outcomes(app) == [
        ("carol", "list_projects", "ran"),
        ("carol", "get_run", "failed"),
        ("carol", "list_runs", "invalid"),
        ("carol", "nope", "forbidden"),
    ]


async def test_no_tool_maps_an_argument_to_a_header_so_the_server_has_none_to_check(app: App) -> None:
    """The server tells the SDK there are no `Mcp-Param-*` headers to check (which spares a whole
    `tools/list` per call over HTTP); that holds only while no tool declares `x-mcp-header`."""
    server = build_mcp_server(app.gate, lambda ctx: None)
    for tool in app.registry:
        assert "x-mcp-header" not in json.dumps(tool.input_schema), tool.name
        assert server.get_tool_input_schema is not None and server.get_tool_input_schema(tool.name) is None
