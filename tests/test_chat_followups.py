"""The follow-up after a decision (seed 004, 3a/3b), on SQLite and PostgreSQL: when a proposal a
conversation staged is approved and executed, fails, is rejected or expires, the conversation gets
the outcome and the assistant's turn on it — exactly once, with racing workers, lost claims, failing
models, restarts and shutdowns."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import anyio
import pytest
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from mcp_knecht.app import App, open_app
from mcp_knecht.chat import ChatService
from mcp_knecht.chat.service import MAX_ATTEMPTS
from mcp_knecht.chat.store import CHAT_MIGRATIONS, Exchange, Message
from mcp_knecht.chat.texts import FOLLOW_UP_PREFIX
from mcp_knecht.core import clock
from mcp_knecht.core.approval import Operator
from mcp_knecht.core.settings import load_settings
from tests.chat_support import Assistant, call, chatter, prompts_of, scripted_chat, text
from tests.toolsets import EFFECTS_TABLE

pytestmark = pytest.mark.anyio

ALICE = chatter("alice", ("projects:read", "runs:read", "runs:write", "proposals:read", "ai:chat"))
BOB = Operator("bob", verified=True)


def test_both_dialects_have_the_same_chat_migrations() -> None:
    names = {d: [(m.version, m.name) for m in CHAT_MIGRATIONS.available(d)] for d in ("sqlite", "postgresql")}
    assert names["sqlite"] == names["postgresql"] != []
    tables = {d: sorted(line.split()[2] for m in CHAT_MIGRATIONS.available(d) for line in m.sql.splitlines()
                        if line.startswith(("CREATE TABLE", "CREATE INDEX"))) for d in ("sqlite", "postgresql")}
    assert tables["sqlite"] == tables["postgresql"]


@asynccontextmanager
async def working(*chats: ChatService) -> AsyncIterator[None]:
    """Each chat's follow-up worker running (as in a server process) for the block."""
    async with anyio.create_task_group() as tasks:
        for chat in chats:
            tasks.start_soon(chat.followups.run)
        yield
        tasks.cancel_scope.cancel()


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
    with anyio.fail_after(timeout):
        while not await check():
            await anyio.sleep(0.02)


async def messages(chat: ChatService, conversation_id: str) -> list[Message]:
    return (await chat.conversation(ALICE, conversation_id))[1]


def has(chat: ChatService, conversation_id: str, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return len(await messages(chat, conversation_id)) >= count
    return check


async def staged(chat: ChatService, label: str = "deploy") -> tuple[str, int]:
    reply = await chat.send(ALICE, f"record {label}")
    assert reply.proposal_id is not None and reply.action is not None
    return reply.conversation_id, reply.proposal_id


def recorder() -> Assistant:
    return Assistant({"record deploy": [call("record_effect", label="deploy")]})


async def test_an_approval_appends_the_follow_up_and_the_assistants_continuation_once(staged_app: App) -> None:
    assistant = recorder()
    chat = scripted_chat(staged_app, assistant)
    conversation_id, proposal_id = await staged(chat)
    approved = await staged_app.approvals.approve(proposal_id, BOB)
    assert approved.status == "succeeded"
    async with working(chat):
        await until(has(chat, conversation_id, 4))
        await anyio.sleep(0.3)  # more scans: nothing more is added
    shown = [m.shown() for m in await messages(chat, conversation_id)]
    assert [(m["role"], m.get("followUp", False)) for m in shown] == [
        ("user", False), ("assistant", False), ("user", True), ("assistant", False)]
    follow_up = shown[2]["content"]
    assert follow_up == (f"{FOLLOW_UP_PREFIX}{proposal_id} (record_effect): approved by bob and executed. "
                         'Result: {"recorded": "deploy"}. Continue from here.')
    assert shown[3]["content"] == f"Noted: {follow_up[:80]}"
    assert assistant.follow_ups == [follow_up]
    # The follow-up turn saw the conversation so far and then the follow-up, as text.
    assert prompts_of(assistant.requests[-1]) == ["record deploy", follow_up]
    # The agent has seen this outcome: it is not in the proposer's MCP inbox any more.
    assert await staged_app.proposals.take_unseen("alice", 10) == []


async def test_a_rejection_with_its_reason_and_a_failed_execution_with_its_error(staged_app: App, tmp_path: Path,
                                                                                 staged_env: dict[str, str]) -> None:
    chat = scripted_chat(staged_app, Assistant({"record deploy": [call("record_effect", label="a")],
                                                "again please": [call("record_effect", label="b")]}))
    rejected_in, rejected = await staged(chat)
    failed_reply = await chat.send(ALICE, "again please")
    failed_in, failed = failed_reply.conversation_id, failed_reply.proposal_id
    await staged_app.approvals.reject(rejected, BOB, "not on a Friday")
    # The policy denies the tool after it was proposed: the approved execution fails.
    Path(staged_env["KNECHT_CONFIG_DIR"], "policies.toml").write_text('[tools]\nrecord_effect = "deny"\n')
    assert staged_app.policy.reload_if_changed()
    assert failed is not None and (await staged_app.approvals.approve(failed, BOB)).status == "failed"
    async with working(chat):
        await until(has(chat, rejected_in, 4))
        await until(has(chat, failed_in, 4))
    [_, _, rejection, _] = await messages(chat, rejected_in)
    assert rejection.content == (f"{FOLLOW_UP_PREFIX}{rejected} (record_effect): rejected by bob. Reason: not on a "
                                 "Friday. Nothing was changed. Continue from here.")
    [_, _, failure, _] = await messages(chat, failed_in)
    assert failure.content.startswith(
        f"{FOLLOW_UP_PREFIX}{failed} (record_effect): approved by bob, but the execution failed: record_effect has "
        "been denied by policy since it was proposed.")


async def test_an_expired_proposal_is_followed_up_too(staged_env: dict[str, str]) -> None:
    async with open_app(load_settings(env={**staged_env, "KNECHT_PROPOSAL_TTL": "1s"}), watch_policy=False) as app:
        chat = scripted_chat(app, recorder())
        conversation_id, proposal_id = await staged(chat)
        async with working(chat):
            await until(has(chat, conversation_id, 4))
        follow_up = (await messages(chat, conversation_id))[2].content
    assert follow_up.startswith(f"{FOLLOW_UP_PREFIX}{proposal_id} (record_effect): expired at ")
    assert follow_up.endswith("without a decision. Nothing was changed. Continue from here.")


async def test_a_follow_up_turn_may_itself_end_with_a_proposal_which_is_followed_up_in_turn(staged_app: App) -> None:
    assistant = Assistant({'Result: {"recorded": "first"}': [call("record_effect", label="second")],
                           'Result: {"recorded": "second"}': [text("Both are recorded.")],
                           "record first": [call("record_effect", label="first")]})
    chat = scripted_chat(staged_app, assistant)
    conversation_id, first = await staged(chat, "first")
    await staged_app.approvals.approve(first, BOB)
    async with working(chat):
        await until(has(chat, conversation_id, 4))
        [second] = await staged_app.proposals.list(status="pending")
        reply = (await messages(chat, conversation_id))[3]
        assert reply.content.startswith(f"I've prepared this change as proposal #{second.id}")
        assert reply.action == {"path": f"/proposals/{second.id}",
                                "queryParams": {"aiAction": "edit", "aiPrefill": '{"label":"second"}',
                                                "aiPreview": '{"label":"second","note":"nothing recorded yet"}'}}
        await staged_app.approvals.approve(second.id, Operator("carol", verified=True))
        await until(has(chat, conversation_id, 6))
    shown = await messages(chat, conversation_id)
    assert shown[4].content.startswith(f"{FOLLOW_UP_PREFIX}{second.id} ") and shown[5].content == "Both are recorded."


async def test_racing_workers_of_two_replicas_deliver_each_follow_up_exactly_once(staged_env: dict[str, str]) -> None:
    asked: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompt = prompts_of(messages)[-1]
        if prompt.startswith(FOLLOW_UP_PREFIX):
            asked.append(prompt)
            return ModelResponse(parts=[TextPart(f"Noted {prompt.split()[5]}")])
        return ModelResponse(parts=[ToolCallPart("record_effect", {"label": prompt.split()[-1]})])

    count = 12
    async with open_app(load_settings(env=staged_env), watch_policy=False) as one, \
            open_app(load_settings(env=staged_env), watch_policy=False) as two:
        async with one.db.transaction() as tx:
            await tx.execute(EFFECTS_TABLE)
        chats = [scripted_chat(app, FunctionModel(model), concurrency=4) for app in (one, two, one, two)]
        conversations = {}
        for n in range(count):
            conversation_id, proposal_id = await staged(chats[n % 2], f"effect-{n}")
            conversations[proposal_id] = conversation_id
        async with working(*chats):
            await anyio.sleep(0.2)  # the workers are waiting for decisions
            async with anyio.create_task_group() as operators:
                for n, proposal_id in enumerate(conversations):
                    operators.start_soon((one if n % 2 else two).approvals.approve, proposal_id, BOB)

            async def all_delivered() -> bool:
                return all([len(await messages(chats[0], c)) >= 4 for c in conversations.values()])

            await until(all_delivered, timeout=60)
            await anyio.sleep(0.5)  # every worker scans again: nothing is delivered twice
        for proposal_id, conversation_id in conversations.items():
            shown = await messages(chats[0], conversation_id)
            assert len(shown) == 4 and shown[2].content.startswith(f"{FOLLOW_UP_PREFIX}{proposal_id} ")
            assert shown[3].content == f"Noted #{proposal_id}"
        assert sorted(asked) == sorted({*asked}) and len(asked) == count, "one follow-up turn per proposal"
        assert sum(chat.followups.delivered for chat in chats) == count
        rows = await one.db.fetch_all("SELECT status, owner, attempts FROM chat_followups")
        assert {(r["status"], r["owner"], r["attempts"]) for r in rows} == {("done", None, 1)}


async def test_a_lapsed_claim_is_taken_over_and_its_stale_owner_can_no_longer_deliver(staged_app: App) -> None:
    chat = scripted_chat(staged_app, recorder())
    conversation_id, proposal_id = await staged(chat)
    await staged_app.approvals.approve(proposal_id, BOB)
    now = clock.now()
    # A worker claimed it and then stopped (a crash): while its lease lasts nobody else delivers it …
    assert await chat.store.claim(proposal_id, "crashed", now=clock.timestamp(now),
                                  lease_until=clock.timestamp(now + timedelta(seconds=1)))
    assert not await chat.store.claim(proposal_id, "other", now=clock.timestamp(now),
                                      lease_until=clock.timestamp(now + timedelta(minutes=10)))
    async with working(chat):
        await anyio.sleep(0.3)
        assert len(await messages(chat, conversation_id)) == 2
        # … then its lease runs out and a live worker takes over.
        await until(has(chat, conversation_id, 4), timeout=10)
    assert not await chat.follow_up(proposal_id, "crashed"), "the stale owner's delivery is refused"
    assert not await chat.store.deliver(proposal_id, "crashed", conversation_id,
                                        Exchange("late", "late reply", "followup"))
    assert len(await messages(chat, conversation_id)) == 4
    row = await staged_app.db.fetch_one("SELECT attempts, status FROM chat_followups WHERE proposal_id = ?",
                                        (proposal_id,))
    assert row == {"attempts": 2, "status": "done"}


async def test_a_failing_model_is_retried_and_then_the_follow_up_is_delivered_with_a_note(staged_app: App) -> None:
    tries: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompt = prompts_of(messages)[-1]
        if prompt.startswith(FOLLOW_UP_PREFIX):
            tries.append(prompt)
            raise ModelHTTPError(503, "scripted", body="overloaded")
        return ModelResponse(parts=[ToolCallPart("record_effect", {"label": "deploy"})])

    chat = scripted_chat(staged_app, FunctionModel(model))
    conversation_id, proposal_id = await staged(chat)
    await staged_app.approvals.reject(proposal_id, BOB, "no")
    async with working(chat):
        await until(has(chat, conversation_id, 4))
    assert len(tries) == MAX_ATTEMPTS
    [_, _, follow_up, note] = await messages(chat, conversation_id)
    assert follow_up.kind == "followup" and "rejected by bob" in follow_up.content
    assert note.role == "assistant" and note.content.startswith(
        "I could not continue after this decision (the model did not answer (reference ")
    assert "overloaded" not in note.content
    row = await staged_app.db.fetch_one("SELECT error FROM chat_followups WHERE proposal_id = ?", (proposal_id,))
    assert row["error"].startswith("the model did not answer")


async def test_a_shutdown_hands_the_claim_back_and_a_restarted_worker_delivers_it(staged_app: App) -> None:
    started = anyio.Event()

    async def slow(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if prompts_of(messages)[-1].startswith(FOLLOW_UP_PREFIX):
            started.set()
            await anyio.sleep(3600)
        return ModelResponse(parts=[ToolCallPart("record_effect", {"label": "deploy"})])

    chat = scripted_chat(staged_app, FunctionModel(slow))
    conversation_id, proposal_id = await staged(chat)
    await staged_app.approvals.approve(proposal_id, BOB)
    async with working(chat):
        with anyio.fail_after(10):
            await started.wait()
    row = await staged_app.db.fetch_one("SELECT * FROM chat_followups WHERE proposal_id = ?", (proposal_id,))
    assert (row["status"], row["owner"], row["lease_until"], row["attempts"]) == ("waiting", None, None, 0)
    assert len(await messages(chat, conversation_id)) == 2

    restarted = scripted_chat(staged_app, recorder())  # the next process, with a model that answers
    async with working(restarted):
        await until(has(restarted, conversation_id, 4))
    assert (await messages(restarted, conversation_id))[3].content.startswith("Noted: ")


async def test_without_a_model_the_worker_does_nothing_and_creates_no_tables(staged_app: App) -> None:
    assert not staged_app.chat.configured
    with anyio.fail_after(5):
        await staged_app.chat.followups.run()  # returns at once
    namespaces = {r["namespace"] for r in await staged_app.db.fetch_all("SELECT namespace FROM applied_migrations")}
    assert "chat" not in namespaces


async def test_the_follow_up_runs_as_the_person_who_chatted_with_their_token_claims(staged_app: App) -> None:
    chat = scripted_chat(staged_app, recorder())
    actor = chatter("alice", ALICE.scopes, knecht_role="support", exp=123)
    reply = await chat.send(actor, "record deploy")
    assert reply.proposal_id is not None
    followup = await chat.store.followup(reply.proposal_id)
    assert followup is not None and followup.actor == actor
    assert followup.actor.claims == {"knecht_role": "support"}, "token times are not kept"
    assert json.loads((await staged_app.db.fetch_one(
        "SELECT actor_json FROM chat_followups WHERE proposal_id = ?", (reply.proposal_id,)))["actor_json"])["client"] \
        == "pytest"


@pytest.mark.parametrize("rewrite", ["scopes", "claims", "conversation", "no seal"])
async def test_a_follow_up_rewritten_in_the_database_runs_no_turn_and_is_audited(staged_app: App, rewrite: str) -> None:
    """Who a follow-up's turn runs as is sealed with the server key: someone who can write the database
    cannot make the assistant act with more scopes or other token claims (a role claim unmasks entity
    fields), nor carry the follow-up into another conversation."""
    assistant = recorder()
    chat = scripted_chat(staged_app, assistant)
    conversation_id, proposal_id = await staged(chat)
    other = (await chat.send(ALICE, "hello")).conversation_id
    row = await staged_app.db.fetch_one("SELECT actor_json FROM chat_followups WHERE proposal_id = ?", (proposal_id,))
    assert row is not None
    actor = json.loads(row["actor_json"])
    if rewrite == "scopes":
        actor["scopes"].append("variables:write")
    elif rewrite == "claims":
        actor["claims"]["knecht_role"] = "admin"
    change = {"scopes": ("actor_json", json.dumps(actor)), "claims": ("actor_json", json.dumps(actor)),
              "conversation": ("conversation_id", other), "no seal": ("actor_seal", None)}[rewrite]
    async with staged_app.db.transaction() as tx:
        await tx.execute(f"UPDATE chat_followups SET {change[0]} = ? WHERE proposal_id = ?", (change[1], proposal_id))
    assert (await staged_app.approvals.approve(proposal_id, BOB)).status == "succeeded"

    async def done() -> bool:
        status = await staged_app.db.fetch_one("SELECT status FROM chat_followups WHERE proposal_id = ?",
                                               (proposal_id,))
        return status is not None and status["status"] == "done"

    async with working(chat):
        await until(done)
    assert assistant.follow_ups == []  # no turn ran, as anyone
    assert len(await messages(chat, conversation_id)) == 2 and len(await messages(chat, other)) == 2
    await staged_app.audit.flush()
    refused = await staged_app.db.fetch_all(
        "SELECT source FROM audit_log WHERE proposal_id = ? AND outcome = 'tampered'", (proposal_id,))
    assert refused == [{"source": "chat"}]


async def test_a_message_whose_action_was_rewritten_as_no_json_reads_without_it(staged_app: App) -> None:
    chat = scripted_chat(staged_app, recorder())
    conversation_id, proposal_id = await staged(chat)
    async with staged_app.db.transaction() as tx:  # written around the store
        await tx.execute("UPDATE chat_messages SET action_json = 'garbage' WHERE proposal_id = ?", (proposal_id,))
    shown = [m.shown() for m in await messages(chat, conversation_id)]
    assert [m["role"] for m in shown] == ["user", "assistant"] and "action" not in shown[1]
