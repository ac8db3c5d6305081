"""What a model reads: tool notes that say exactly which calls are staged, errors that name the tool
and speak JSON, prompts offered only to tokens that can follow them, a staged result that says how
to follow up, and lists that save a call per item."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from mcp_knecht.core.policy import Policy
from mcp_knecht.core.proposals import STATUSES
from mcp_knecht.transports.mcp_server import policy_note
from tests.conftest import READONLY

pytestmark = pytest.mark.anyio

CLAUDE_CODE = (*READONLY, "workflows:write", "runs:write", "variables:read", "variables:write", "proposals:read")


async def _tools(connect: Callable[..., Any], scopes: tuple[str, ...] = CLAUDE_CODE) -> dict[str, Any]:
    async with connect("erin", scopes) as client:
        return {tool.name: tool for tool in (await client.list_tools()).tools}


# --- 5: the staged note ------------------------------------------------------------------------------


async def test_the_staged_note_names_exactly_the_staged_actions(connect) -> None:  # type: ignore[no-untyped-def]
    tools = await _tools(connect)
    variable = tools["project_variable"].description
    assert "Actions set and delete are staged: such a call submits a proposal" in variable
    assert "list and get run at once." in variable
    assert "This tool is staged" not in variable
    assert "This tool is staged: calling it submits a proposal" in tools["rerun_run"].description
    assert "staged" not in tools["list_runs"].description


async def test_the_note_follows_the_policy_action_by_action(app) -> None:  # type: ignore[no-untyped-def]
    variable = app.registry.get("project_variable")
    rerun = app.registry.get("rerun_run")
    one_denied = policy_note(variable, Policy(rules={"project_variable.delete": "deny"}))
    assert one_denied == ("Action set is staged: such a call submits a proposal for human approval and returns "
                          "'Submitted for approval (#ID)' immediately; it does not run until an operator approves "
                          "it. list and get run at once. delete is denied by policy.")
    everything = policy_note(variable, Policy(default="approve"))
    assert everything.startswith("This tool is staged (every action)")
    assert policy_note(variable, Policy(rules={"project_variable": "auto"})) == ""
    assert policy_note(rerun, Policy(rules={"rerun_run": "auto"})) == ""


# --- 6: error texts, prompts ---------------------------------------------------------------------------


async def test_a_log_error_names_its_tool(connect) -> None:  # type: ignore[no-untyped-def]
    async with connect("erin", READONLY) as client:
        for tool, arguments in (("get_action_log", {"run_id": 3, "action": "test"}), ("get_run_log", {"run_id": 3})):
            result = await client.call_tool(tool, {**arguments, "tail": 5, "offset": 10})
            assert result.is_error
            assert result.content[0].text == (f"Invalid arguments for {tool}: tail: give either tail or offset, "
                                               "not both")


async def test_a_wrong_value_is_quoted_as_json(connect) -> None:  # type: ignore[no-untyped-def]
    async with connect("erin", READONLY) as client:
        null = (await client.call_tool("get_run", {"run_id": None})).content[0].text
        text = (await client.call_tool("get_run", {"run_id": "7"})).content[0].text
        flag = (await client.call_tool("list_runs", {"limit": True})).content[0].text
    assert "(got null)" in null and "None" not in null
    assert '(got "7")' in text
    assert "(got true)" in flag and "True" not in flag


@pytest.mark.parametrize(("scopes", "offered"), [
    (("logs:read",), False),
    (("runs:read", "logs:read"), False),                      # cannot read the workflow
    (("runs:read", "logs:read", "workflows:read"), True),
    (READONLY, True),
])
async def test_diagnose_run_is_offered_only_to_tokens_that_can_call_its_tools(  # type: ignore[no-untyped-def]
    connect, scopes: tuple[str, ...], offered: bool
) -> None:
    async with connect("erin", scopes) as client:
        names = [prompt.name for prompt in (await client.list_prompts()).prompts]
        assert names == (["diagnose_run"] if offered else [])
        if not offered:
            with pytest.raises(MCPError, match="Unknown prompt"):
                await client.get_prompt("diagnose_run", {"run_id": "3"})


async def test_diagnose_run_for_a_run_that_does_not_exist_says_so(connect) -> None:  # type: ignore[no-untyped-def]
    async with connect("erin", READONLY) as client:
        with pytest.raises(MCPError, match="Run 999999 does not exist"):
            await client.get_prompt("diagnose_run", {"run_id": "999999"})
        rendered = await client.get_prompt("diagnose_run", {"run_id": "3"})
    assert "get_run(run_id=3)" in rendered.messages[0].content.text  # type: ignore[union-attr]


# --- 7: the staged result ------------------------------------------------------------------------------


async def test_the_staged_text_carries_the_follow_up_and_the_expiry(connect) -> None:  # type: ignore[no-untyped-def]
    async with connect("erin", CLAUDE_CODE) as client:
        result = await client.call_tool("rerun_run", {"run_id": 1})
    proposal = result.structured_content
    assert proposal is not None
    expires = proposal["expires_at"][:16].replace("T", " ")
    assert result.content[0].text == (
        f"Submitted for approval (#{proposal['id']}). A human decides; follow up with "
        f"get_proposal(id={proposal['id']}). It expires at {expires} UTC unless decided."
    )
    assert re.match(r"Submitted for approval \(#\d+\)\. ", result.content[0].text)


# --- 8: titles, enums, list_runs -----------------------------------------------------------------------


async def test_follow_up_tools_have_titles_and_an_enum_of_statuses(connect) -> None:  # type: ignore[no-untyped-def]
    tools = await _tools(connect)
    assert tools["get_proposal"].title == "Get one of your proposals"
    assert tools["list_proposals"].title == "List your proposals"
    status = tools["list_proposals"].input_schema["properties"]["status"]
    enum = next(option["enum"] for option in status["anyOf"] if "enum" in option)
    assert enum == list(STATUSES) and "pattern" not in str(status)
    async with connect("erin", CLAUDE_CODE) as client:
        refused = await client.call_tool("list_proposals", {"status": "done"})
    assert refused.is_error and "pending" in refused.content[0].text


async def test_list_runs_says_which_action_failed(connect) -> None:  # type: ignore[no-untyped-def]
    async with connect("erin", READONLY) as client:
        failed = (await client.call_tool("list_runs", {"status": "failed", "limit": 10})).structured_content
        others = (await client.call_tool("list_runs", {"status": "succeeded", "limit": 5})).structured_content
        assert failed is not None and others is not None
        for run in failed["runs"]:
            detail = (await client.call_tool("get_run", {"run_id": run["id"]})).structured_content
            assert detail is not None
            assert run["failed_action"] == detail["failed_action"] and run["failed_action"]["name"]
    assert all(run["failed_action"] is None for run in others["runs"])
