"""A chat turn's rules, with a scripted model over the real gate, store, policy and audit log of a demo
server: what is stored, what the model sees, what it may reach, and how a write ends the turn."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart

from mcp_knecht.app import App, open_app
from mcp_knecht.chat.errors import ConversationNotFound, RoundLimitError
from mcp_knecht.chat.texts import MAX_ROUNDS, SYSTEM_PROMPT
from mcp_knecht.core.settings import load_settings
from mcp_knecht.store.audit_log import recent_entries
from tests.chat_support import Assistant, call, chatter, prompts_of, scripted_chat, text
from tests.staging import make_config

pytestmark = pytest.mark.anyio

FAILED_RUN = 66  # demo data: a failed run (bad workflow syntax)
READONLY = ("projects:read", "workflows:read", "runs:read", "logs:read", "ai:chat")


async def _audit(app: App, source: str = "chat") -> list[dict]:
    await app.audit.flush()
    return list(reversed(await recent_entries(app.db, source=source, limit=100)))


async def _runs(app: App) -> int:
    return int((await app.db.fetch_one("SELECT COUNT(*) AS n FROM runs"))["n"])


async def test_a_turn_answers_in_text_and_the_conversation_keeps_only_what_was_said(app: App) -> None:
    assistant = Assistant({"fail": [call("get_run", run_id=FAILED_RUN), text("Run 66 failed on bad YAML.")],
                           "fix": [text("Fix the indentation in line 3.")]})
    chat = scripted_chat(app, assistant)
    alice = chatter()
    first = await chat.send(alice, "Why did run 66 fail?")
    assert first.reply == "Run 66 failed on bad YAML." and first.action is None
    second = await chat.send(alice, "How do I fix it?", first.conversation_id)
    assert second.conversation_id == first.conversation_id and second.reply == "Fix the indentation in line 3."

    conversation, messages = await chat.conversation(alice, first.conversation_id)
    assert conversation.title == "Why did run 66 fail?"
    assert [(m.role, m.content) for m in messages] == [
        ("user", "Why did run 66 fail?"), ("assistant", "Run 66 failed on bad YAML."),
        ("user", "How do I fix it?"), ("assistant", "Fix the indentation in line 3.")]
    # The second turn's model saw the history as text only: no tool call, no tool result of turn one.
    second_request = assistant.requests[-1]
    assert prompts_of(second_request) == ["Why did run 66 fail?", "How do I fix it?"]
    assert not any(isinstance(part, ToolCallPart | ToolReturnPart) for m in second_request for part in m.parts)
    assert [p.content for m in second_request if isinstance(m, ModelResponse) for p in m.parts
            if isinstance(p, TextPart)] == ["Run 66 failed on bad YAML."]
    assert second_request[-1].instructions == SYSTEM_PROMPT  # type: ignore[union-attr]


async def test_read_tools_run_through_the_gate_as_the_caller_with_source_chat(app: App) -> None:
    assistant = Assistant({"": [call("get_run", run_id=FAILED_RUN), call("get_run_log", run_id=FAILED_RUN, tail=5),
                                text("Done.")]})
    await scripted_chat(app, assistant).send(chatter("rita", READONLY), "Look at run 66")
    entries = await _audit(app)
    assert [(e["tool"], e["outcome"], e["subject"], e["client"]) for e in entries] == [
        ("get_run", "ran", "rita", "pytest"), ("get_run_log", "ran", "rita", "pytest")]
    assert json.loads(assistant.tool_results()[0])["id"] == FAILED_RUN


async def test_the_tools_offered_are_those_the_callers_token_allows(app: App) -> None:
    assistant = Assistant()
    chat = scripted_chat(app, assistant)
    await chat.send(chatter("rita", READONLY), "hello")
    await chat.send(chatter("ian", ("runs:read", "ai:chat")), "hello")
    reader, narrow = assistant.offered
    assert {"list_projects", "get_run", "get_action_log", "get_workflow"} <= set(reader)
    assert not {"rerun_run", "cancel_run", "update_workflow", "list_proposals"} & set(reader)
    assert sorted(narrow) == ["get_run", "list_runs"]


async def test_a_tool_outside_the_token_is_refused_and_audited_and_the_turn_goes_on(app: App) -> None:
    assistant = Assistant({"": [call("rerun_run", run_id=FAILED_RUN), text("I cannot do that.")]})
    reply = await scripted_chat(app, assistant).send(chatter("rita", READONLY), "Rerun 66")
    assert reply.reply == "I cannot do that." and reply.action is None
    assert "Unknown tool: 'rerun_run'" in assistant.tool_results()[0]
    [entry] = await _audit(app)
    assert (entry["tool"], entry["outcome"]) == ("rerun_run", "forbidden")
    assert await app.proposals.list() == []


async def test_at_most_five_rounds_of_tools_a_sixth_is_an_audited_error_and_nothing_is_stored(app: App) -> None:
    assistant = Assistant({"": [call("get_run", run_id=n) for n in range(1, 10)]})
    chat = scripted_chat(app, assistant)
    with pytest.raises(RoundLimitError, match=f"more than {MAX_ROUNDS} rounds"):
        await chat.send(chatter(), "Read everything")
    assert len(assistant.requests) == MAX_ROUNDS + 1
    entries = await _audit(app)
    assert [(e["tool"], e["outcome"]) for e in entries] == [("get_run", "ran")] * MAX_ROUNDS + [("get_run", "denied")]
    assert entries[-1]["rule"] == f"chat: at most {MAX_ROUNDS} rounds of tool calls per turn"
    assert entries[-1]["detail"] == {"error": "round_limit"}
    assert await chat.conversations(chatter(), 10) == []  # a failed turn leaves no conversation behind


async def test_five_rounds_and_then_an_answer_is_fine(app: App) -> None:
    assistant = Assistant({"": [*(call("get_run", run_id=n) for n in range(1, MAX_ROUNDS + 1)), text("Five read.")]})
    reply = await scripted_chat(app, assistant).send(chatter(), "Read five runs")
    assert reply.reply == "Five read."


async def test_a_write_ends_the_turn_at_once_with_the_fixed_reply_and_the_proposals_page(app: App) -> None:
    before = await _runs(app)
    assistant = Assistant({"": [
        [ToolCallPart("get_run", {"run_id": FAILED_RUN}), ToolCallPart("rerun_run", {"run_id": FAILED_RUN}),
         ToolCallPart("cancel_run", {"run_id": 1}), ToolCallPart("get_run", {"run_id": 2})],
        text("never asked")]})
    chat = scripted_chat(app, assistant)
    reply = await chat.send(chatter(), "Please rerun run 66")
    assert len(assistant.requests) == 1, "the turn ended with the write: no further model request"
    [proposal] = await app.proposals.list()
    assert (proposal.tool, proposal.status, proposal.proposer_subject) == ("rerun_run", "pending", "alice")
    assert reply.proposal_id == proposal.id
    assert reply.reply.startswith(f"I've prepared this change as proposal #{proposal.id} (rerun_run)")
    assert reply.action == {"path": f"/proposals/{proposal.id}", "queryParams": {
        "aiAction": "create", "aiPrefill": json.dumps({"ref": "same_commit", "run_id": FAILED_RUN},
                                                      separators=(",", ":"))}}
    entries = await _audit(app)
    # (A staged row commits with its proposal; other rows are group-committed a moment later.)
    assert sorted((e["tool"], e["outcome"]) for e in entries) == [("get_run", "ran"), ("rerun_run", "staged")], \
        "the calls after the write were not run"
    assert await _runs(app) == before
    _, messages = await chat.conversation(chatter(), reply.conversation_id)
    assert [m.role for m in messages] == ["user", "assistant"] and messages[1].action == reply.action
    assert "never asked" not in messages[1].content


async def test_asking_for_the_same_write_again_points_at_the_pending_proposal(app: App) -> None:
    chat = scripted_chat(app, Assistant({"": [call("rerun_run", run_id=FAILED_RUN)]}))
    first = await chat.send(chatter(), "rerun 66")
    again = await chat.send(chatter(), "rerun 66 again", first.conversation_id)
    assert again.proposal_id == first.proposal_id and again.action == first.action
    assert again.reply.startswith(f"This exact change is already waiting for approval as proposal #{first.proposal_id}")
    assert len(await app.proposals.list()) == 1


async def test_an_edit_names_the_record_shows_its_preview_and_prefills_only_what_the_caller_may_set(app: App) -> None:
    run = await app.db.fetch_one("SELECT workflow_id FROM runs WHERE id = ?", (FAILED_RUN,))
    workflow = run["workflow_id"]
    definition = "name: nightly\nactions:\n  - name: test\n    run: go test ./...\n"
    assistant = Assistant({"": [call("update_workflow", workflow=workflow, definition=definition, message="Fix")]})
    scopes = (*READONLY, "workflows:write")
    reply = await scripted_chat(app, assistant).send(chatter("wes", scopes), "Fix the workflow")
    params = reply.action["queryParams"]  # type: ignore[index]
    assert params["aiAction"] == "edit" and params["aiId"] == str(workflow)
    assert json.loads(params["aiPrefill"]) == {"workflow": workflow, "definition": definition, "message": "Fix"}
    [proposal] = await app.proposals.list()
    assert "base_version" in proposal.arguments, "frozen by the server, so not the caller's to prefill"
    assert json.loads(params["aiPreview"]) == proposal.preview


async def test_another_subjects_conversation_behaves_exactly_like_a_missing_one(app: App) -> None:
    chat = scripted_chat(app, Assistant())
    mine = await chat.send(chatter("alice"), "hello")
    problems = []
    for conversation_id in (mine.conversation_id, "no-such-conversation"):
        with pytest.raises(ConversationNotFound) as raised:
            await chat.send(chatter("mallory"), "hello", conversation_id)
        problems.append(raised.value.message.replace(conversation_id, "ID"))
        with pytest.raises(ConversationNotFound):
            await chat.conversation(chatter("mallory"), conversation_id)
    assert problems[0] == problems[1]
    assert await chat.conversations(chatter("mallory"), 10) == []
    _, messages = await chat.conversation(chatter("alice"), mine.conversation_id)
    assert len(messages) == 2, "nothing was added to alice's conversation"


async def test_tool_results_reach_the_model_scrubbed(app: App) -> None:
    from mcp_knecht.knecht import secret_values

    secret_run, secret_action = 146, 885  # demo data: an action log that prints a secret variable's value
    known = await secret_values(app.db)
    assistant = Assistant({"": [call("get_action_log", run_id=secret_run, action=secret_action, limit=50),
                                text("The log prints a secret.")]})
    await scripted_chat(app, assistant).send(chatter(), "Show the log")
    sent = "\n".join(assistant.tool_results())
    assert "***" in sent and not any(value in sent for value in known)


@pytest.fixture
async def policy_app(demo_env: dict[str, str], tmp_path: Path) -> AsyncIterator[App]:
    policy = '[tools]\nrerun_run = "auto"\n"project_variable.set" = "deny"\ncancel_run = "deny"\n'
    config = make_config(tmp_path / "config", policy)
    async with open_app(load_settings(env={**demo_env, "KNECHT_CONFIG_DIR": str(config)})) as running:
        yield running


async def test_in_chat_a_write_is_staged_even_when_the_policy_runs_it_at_once(policy_app: App) -> None:
    app = policy_app
    before = await _runs(app)
    auto = await app.gate.call_tool(chatter(), "rerun_run", {"run_id": FAILED_RUN})
    assert auto.outcome == "ran" and await _runs(app) == before + 1, "an MCP client's call runs at once"

    reply = await scripted_chat(app, Assistant({"": [call("rerun_run", run_id=FAILED_RUN)]})).send(
        chatter(), "rerun 66")
    assert await _runs(app) == before + 1, "the chat ran nothing"
    [proposal] = await app.proposals.list()
    assert reply.action["path"] == f"/proposals/{proposal.id}"  # type: ignore[index]
    assert proposal.rule == "policies.toml: rerun_run; staged: this caller never writes by itself"


async def test_in_chat_a_deny_still_denies_and_the_model_is_told(policy_app: App) -> None:
    project = await policy_app.db.fetch_one("SELECT slug FROM projects ORDER BY id LIMIT 1")
    assistant = Assistant({"": [call("project_variable", project=project["slug"], action="set", name="X", value="1"),
                                text("Setting variables is not allowed here.")]})
    scopes = (*READONLY, "variables:read", "variables:write")
    reply = await scripted_chat(policy_app, assistant).send(chatter(scopes=scopes), "set X to 1")
    assert reply.reply == "Setting variables is not allowed here." and reply.action is None
    assert "denied by policy" in assistant.tool_results()[0]
    assert "cancel_run" not in assistant.offered[0], "a tool the policy denies entirely is not offered"
    assert await policy_app.proposals.list() == []
    [entry] = await _audit(policy_app)
    assert (entry["tool"], entry["action"], entry["outcome"]) == ("project_variable", "set", "denied")


async def test_a_long_conversation_sends_only_its_newest_messages_starting_with_the_person(app: App) -> None:
    from pydantic_ai.messages import ModelRequest

    from mcp_knecht.chat.service import HISTORY_CHARS, HISTORY_LIMIT

    assistant = Assistant({"": [text("x" * 4_000)]})
    chat = scripted_chat(app, assistant)
    conversation_id = (await chat.send(chatter(), "message 0")).conversation_id
    for n in range(1, 30):
        await chat.send(chatter(), f"message {n}", conversation_id)
    *history, asked = assistant.requests[-1]
    assert prompts_of([asked]) == ["message 29"]
    sent = [p.content for m in history for p in m.parts]
    assert len(history) <= HISTORY_LIMIT and sum(len(str(c)) for c in sent) <= HISTORY_CHARS
    assert isinstance(history[0], ModelRequest) and len(history) % 2 == 0, "it starts with the person"
    assert prompts_of(history)[-1] == "message 28"
    assert len((await chat.conversation(chatter(), conversation_id))[1]) == 60, "everything is kept"
