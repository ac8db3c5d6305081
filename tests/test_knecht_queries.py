"""The first Knecht read tools, called through their handlers (the gate is tested elsewhere)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from mcp_knecht.core.actor import Actor
from mcp_knecht.core.database import Database
from mcp_knecht.core.tools import MCP, Tool, ToolContext
from mcp_knecht.errors import NotFoundError
from mcp_knecht.knecht import knecht_tools, open_store
from mcp_knecht.knecht.demo import DemoSummary, fill_demo_data

pytestmark = pytest.mark.anyio

CTX = ToolContext(
    actor=Actor(subject="alice", client="pytest", scopes=frozenset({"projects:read", "runs:read"})),
    source=MCP,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def demo(tmp_path: Path) -> AsyncIterator[tuple[Database, DemoSummary]]:
    db = await open_store(f"sqlite:///{tmp_path / 'knecht.db'}")
    try:
        summary = await fill_demo_data(db)
        yield db, summary
    finally:
        await db.close()


@pytest.fixture
def db(demo: tuple[Database, DemoSummary]) -> Database:
    return demo[0]


def read_tools(db: Database) -> dict[str, Tool]:
    return {tool.name: tool for tool in knecht_tools(db) if tool.effects == {"read"}}


@pytest.fixture
def call(db: Database) -> Any:
    tools = read_tools(db)

    async def _call(name: str, **arguments: Any) -> Any:
        tool = tools[name]
        # As the gate does: validate raw JSON-like arguments, then hand over the model.
        return await tool.handler(tool.input_model.model_validate(arguments), CTX)

    return _call


async def test_tools_declare_scopes_and_describe_every_field(db: Database) -> None:
    tools = read_tools(db)
    assert {name: tool.scope for name, tool in tools.items()} == {
        "list_projects": "projects:read",
        "get_project": "projects:read",
        "list_runs": "runs:read",
        "get_run": "runs:read",
        "list_workflows": "workflows:read",
        "get_workflow": "workflows:read",
        "get_run_log": "logs:read",
        "get_action_log": "logs:read",
    }
    for tool in tools.values():
        assert tool.effect == "read"
        assert len(tool.description) > 100
        for name, prop in tool.input_schema.get("properties", {}).items():
            assert prop.get("description"), f"{tool.name}.{name} has no description"


async def test_list_projects(call: Any, db: Database) -> None:
    result = await call("list_projects")
    projects = result["projects"]
    assert len(projects) >= 5
    assert {"payments-api", "knecht-cli", "storefront-web", "fastcodec", "infra-live"} <= {
        p["slug"] for p in projects
    }
    for project in projects:
        assert project["workflow_count"] == 3
        latest = await db.fetch_one(
            "SELECT id, status FROM runs WHERE project_id = ? ORDER BY id DESC LIMIT 1", (project["id"],)
        )
        assert latest is not None
        assert (project["latest_run_id"], project["latest_run_status"]) == (latest["id"], latest["status"])


async def test_get_project_by_slug_or_id(call: Any) -> None:
    by_slug = await call("get_project", project="payments-api")
    by_id = await call("get_project", project=by_slug["id"])
    by_digits = await call("get_project", project=str(by_slug["id"]))
    assert by_slug == by_id == by_digits
    assert {w["name"] for w in by_slug["workflows"]} == {"ci", "release", "nightly"}
    assert any(b["name"] == "main" for b in by_slug["branches"])
    recent = [r["id"] for r in by_slug["recent_runs"]]
    assert len(recent) == 5 and recent == sorted(recent, reverse=True)
    assert all(r["project"] == "payments-api" for r in by_slug["recent_runs"])


async def test_unknown_project_is_not_found(call: Any) -> None:
    with pytest.raises(NotFoundError, match="nope"):
        await call("get_project", project="nope")
    with pytest.raises(NotFoundError):
        await call("get_project", project=999)
    with pytest.raises(NotFoundError):
        await call("list_runs", project="nope")


async def test_list_runs_defaults_to_newest_twenty(call: Any, demo: tuple[Database, DemoSummary]) -> None:
    _, summary = demo
    result = await call("list_runs")
    ids = [r["id"] for r in result["runs"]]
    assert ids == list(range(summary.runs, summary.runs - 20, -1))
    assert result["next_cursor"] == ids[-1]


async def test_list_runs_filters(call: Any) -> None:
    failed = await call("list_runs", status="failed", limit=50)
    assert len(failed["runs"]) == 50 and all(r["status"] == "failed" for r in failed["runs"])

    scoped = await call("list_runs", project="storefront-web", workflow="ci", branch="main", limit=50)
    assert scoped["runs"]
    assert all(
        (r["project"], r["workflow"], r["branch"]) == ("storefront-web", "ci", "main") for r in scoped["runs"]
    )

    reruns = await call("list_runs", trigger="rerun")
    assert reruns["runs"] and all(r["rerun_of"] is not None for r in reruns["runs"])

    nightly = await call("list_runs", workflow="nightly", limit=50)
    assert {r["workflow"] for r in nightly["runs"]} == {"nightly"}
    assert len({r["project"] for r in nightly["runs"]}) > 1  # a name matches in every project

    by_id = await call("list_runs", workflow=nightly["runs"][0]["workflow_id"])
    assert {r["workflow_id"] for r in by_id["runs"]} == {nightly["runs"][0]["workflow_id"]}

    nothing = await call("list_runs", branch="no-such-branch")
    assert nothing == {"runs": [], "next_cursor": None}

    with pytest.raises(NotFoundError):
        await call("list_runs", workflow="deploy-everything")
    with pytest.raises(NotFoundError):
        await call("list_runs", project="knecht-cli", workflow=by_id["runs"][0]["workflow_id"] + 100)


async def test_list_runs_refuses_bad_arguments(call: Any) -> None:
    for bad in (
        {"limit": 0},
        {"limit": 51},
        {"limit": "20"},
        {"status": "broken"},
        {"before": 0},
        {"colour": 1},
    ):
        with pytest.raises(ValidationError):
            await call("list_runs", **bad)


async def test_paging_visits_every_run_once(call: Any, db: Database) -> None:
    project = await call("get_project", project="knecht-cli")
    expected = [
        r["id"]
        for r in await db.fetch_all(
            "SELECT id FROM runs WHERE project_id = ? ORDER BY id DESC", (project["id"],)
        )
    ]
    seen: list[int] = []
    cursor = None
    pages = 0
    while True:
        arguments: dict[str, Any] = {"project": "knecht-cli", "limit": 7}
        if cursor is not None:
            arguments["before"] = cursor
        page = await call("list_runs", **arguments)
        pages += 1
        assert len(page["runs"]) <= 7
        seen.extend(r["id"] for r in page["runs"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == expected
    assert pages == -(-len(expected) // 7)


async def test_get_run_shows_the_failed_action(call: Any, demo: tuple[Database, DemoSummary]) -> None:
    _, summary = demo
    run = await call("get_run", run_id=summary.example_failed_runs["out_of_memory"])
    assert run["status"] == "failed"
    assert run["failed_action"]["name"] == "test"
    assert run["failed_action"]["exit_code"] == 137
    positions = [a["position"] for a in run["actions"]]
    assert positions == sorted(positions)
    failed_at = run["failed_action"]["position"]
    for action in run["actions"]:
        if action["position"] < failed_at:
            assert action["status"] == "succeeded" and action["exit_code"] == 0
            assert action["duration_seconds"] is not None and action["log_lines"] > 0
        elif action["position"] > failed_at:
            assert action["status"] == "skipped" and action["log_lines"] == 0
    assert run["run_log_lines"] > 0
    assert isinstance(run["inputs"], dict)

    syntax = await call("get_run", run_id=summary.example_failed_runs["bad_workflow_syntax"])
    assert syntax["failed_action"]["name"] == "parse-workflow"
    assert syntax["failed_action"]["position"] == 1


async def test_get_run_links_reruns(call: Any) -> None:
    rerun = (await call("list_runs", trigger="rerun", limit=1))["runs"][0]
    run = await call("get_run", run_id=rerun["id"])
    assert run["rerun_of"] == rerun["rerun_of"]
    original = await call("get_run", run_id=rerun["rerun_of"])
    assert original["status"] == "failed"
    assert rerun["id"] in [r["id"] for r in original["reruns"]]


async def test_get_run_not_found(call: Any) -> None:
    with pytest.raises(NotFoundError, match="Run 999999 does not exist"):
        await call("get_run", run_id=999999)
    with pytest.raises(ValidationError):
        await call("get_run", run_id=0)
