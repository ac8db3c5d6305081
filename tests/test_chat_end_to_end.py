"""End to end, in real processes: the chat over real HTTP, servers as subprocesses, the model a fake
Anthropic on 127.0.0.1 behind the real SDK. Two replicas on one store (SQLite and PostgreSQL): a person
chats on either, each turn ends with a proposal, an operator approves them through the decision API of
the other replica, and every conversation gets its follow-up and the assistant's continuation exactly
once — while both replicas' workers race for them."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import ExitStack

import anyio
import httpx
import pytest

from mcp_knecht.chat.texts import FOLLOW_UP_PREFIX
from mcp_knecht.core.auth import TokenSettings, mint_token
from tests.ai_fakes import FakeProvider, Received, Turn
from tests.servers import http_server
from tests.staging import AGENT
from tests.test_replicas import _client, _effects, shared_env  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

CHATTER = (*AGENT, "ai:chat")
OPERATOR = ("proposals:decide", "proposals:read", "projects:read", "runs:read")
CONVERSATIONS = 6


def _last_user_text(received: Received) -> str:
    """The newest thing the person (or Knecht's follow-up) said, in an Anthropic Messages request."""
    for message in reversed(received.body["messages"]):
        if message["role"] != "user":
            continue
        content = message["content"]
        if isinstance(content, str):
            return content
        texts = [block["text"] for block in content if block.get("type") == "text"]
        if texts:
            return str(texts[-1])
    return ""


class FakeAssistant:
    """Stages `record_effect` when asked to record something; notes a follow-up; else says hello."""

    def __init__(self) -> None:
        self.follow_ups: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, received: Received) -> Turn:
        said = _last_user_text(received)
        if said.startswith(FOLLOW_UP_PREFIX):
            with self._lock:
                self.follow_ups.append(said)
            return Turn(text=f"Noted {said.split()[5]}: it is recorded.")
        if said.startswith("record "):
            return Turn.call("record_effect", label=said.split()[-1])
        return Turn(text="Hello from the fake model.")


def _bearer(env: dict[str, str], subject: str, scopes: tuple[str, ...]) -> dict[str, str]:
    token = mint_token(TokenSettings(secret=env["KNECHT_JWT_SECRET"]), subject=subject, scopes=scopes)
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def assistant() -> FakeAssistant:
    return FakeAssistant()


@pytest.fixture
def model_env(shared_env: dict[str, str], assistant: FakeAssistant) -> Iterator[dict[str, str]]:  # noqa: F811
    with FakeProvider(assistant) as fake:
        yield {**shared_env, "KNECHT_MODEL_DEFAULT": "anthropic:claude-haiku-4-5",
               "ANTHROPIC_API_KEY": "sk-e2e-test", "ANTHROPIC_BASE_URL": fake.url}


@pytest.fixture
def chat_replicas(model_env: dict[str, str]) -> Iterator[tuple[str, str]]:
    with ExitStack() as stack:
        yield tuple(stack.enter_context(http_server(model_env, "--stateless")) for _ in range(2))  # type: ignore[misc]


async def test_two_replicas_follow_up_each_decision_exactly_once(
    chat_replicas: tuple[str, str], model_env: dict[str, str], assistant: FakeAssistant
) -> None:
    alice, bob = _bearer(model_env, "alice", CHATTER), _bearer(model_env, "bob", OPERATOR)
    started: dict[int, str] = {}  # proposal id → conversation id
    async with httpx.AsyncClient(timeout=60) as http:
        for n in range(CONVERSATIONS):
            replica = chat_replicas[n % 2]
            hello = await http.post(f"{replica}/api/ai/chat", json={"message": "hello"}, headers=alice)
            assert hello.status_code == 200 and hello.json()["reply"] == "Hello from the fake model."
            conversation_id = hello.json()["conversationId"]
            turn = await http.post(f"{replica}/api/ai/chat", headers=alice,
                                   json={"conversationId": conversation_id, "message": f"record e2e-{n}"})
            assert turn.status_code == 200, turn.text
            action = turn.json()["action"]
            proposal_id = int(re.fullmatch(r"/proposals/(\d+)", action["path"]).group(1))  # type: ignore[union-attr]
            assert action["queryParams"] == {"aiAction": "edit", "aiPrefill": f'{{"label":"e2e-{n}"}}',
                                             "aiPreview": f'{{"label":"e2e-{n}","note":"nothing recorded yet"}}'}
            assert turn.json()["reply"].startswith(f"I've prepared this change as proposal #{proposal_id}")
            started[proposal_id] = conversation_id

        # The operator decides on the other replica, through the decision API.
        async with anyio.create_task_group() as operators:
            for n, proposal_id in enumerate(started):
                async def approve(base: str = chat_replicas[(n + 1) % 2], pid: int = proposal_id) -> None:
                    decided = await http.post(f"{base}/api/proposals/{pid}/approve", json={}, headers=bob)
                    assert decided.status_code == 200 and decided.json()["status"] == "succeeded", decided.text
                operators.start_soon(approve)

        async def conversation(conversation_id: str, replica: str) -> list[dict]:
            shown = await http.get(f"{replica}/api/ai/conversations/{conversation_id}", headers=alice)
            assert shown.status_code == 200, shown.text
            return shown.json()["messages"]  # type: ignore[no-any-return]

        with anyio.fail_after(60):
            for n, conversation_id in enumerate(started.values()):
                while len(await conversation(conversation_id, chat_replicas[n % 2])) < 6:
                    await anyio.sleep(0.1)
        await anyio.sleep(1.5)  # every worker has scanned again since: nothing is delivered twice

        for n, (proposal_id, conversation_id) in enumerate(started.items()):
            messages = await conversation(conversation_id, chat_replicas[(n + 1) % 2])
            assert [(m["role"], m.get("followUp", False)) for m in messages] == [
                ("user", False), ("assistant", False), ("user", False), ("assistant", False),
                ("user", True), ("assistant", False)]
            assert messages[4]["content"] == (
                f"{FOLLOW_UP_PREFIX}{proposal_id} (record_effect): approved by bob and executed. "
                f'Result: {{"recorded": "e2e-{n}"}}. Continue from here.')
            assert messages[5]["content"] == f"Noted #{proposal_id}: it is recorded."
        listed = (await http.get(f"{chat_replicas[0]}/api/ai/conversations", headers=alice)).json()
        assert sorted(c["id"] for c in listed["conversations"]) == sorted(started.values())

    assert len(assistant.follow_ups) == CONVERSATIONS, "one follow-up turn per decision, on whichever replica"
    assert await _effects(model_env["KNECHT_DATABASE_URL"]) == {f"e2e-{n}": 1 for n in range(CONVERSATIONS)}
    # The chat delivered these outcomes: the MCP inbox does not offer them again.
    async with _client(chat_replicas[1], model_env) as mcp:
        inbox = await mcp.call_tool("list_proposals", {"unseen": True})
    assert inbox.structured_content == {"proposals": []}


async def test_the_routes_answer_each_case_over_real_http(model_env: dict[str, str],
                                                          shared_env: dict[str, str]) -> None:  # noqa: F811
    alice = _bearer(model_env, "alice", CHATTER)
    async with httpx.AsyncClient(timeout=60) as http:
        with http_server(model_env) as base:
            chat = f"{base}/api/ai/chat"
            assert (await http.post(chat, json={"message": "hi"})).status_code == 401
            assert (await http.post(chat, json={"message": "hi"}, headers={"Authorization": "Bearer x"})
                    ).status_code == 401
            no_scope = await http.post(chat, json={"message": "hi"}, headers=_bearer(model_env, "al", AGENT))
            assert no_scope.status_code == 403
            broken = await http.post(chat, content=b"{", headers={**alice, "Content-Type": "application/json"})
            assert broken.status_code == 400 and broken.json()["error"]["code"] == "bad_request"
            assert (await http.post(chat, json={"message": ""}, headers=alice)).status_code == 400
            unknown = await http.post(chat, json={"message": "hi", "conversationId": "nope"}, headers=alice)
            assert unknown.status_code == 404 and unknown.json() == {
                "error": {"code": "not_found", "message": "Conversation 'nope' does not exist."}}
            ok = await http.post(chat, json={"message": "hi"}, headers=alice)
            assert ok.status_code == 200 and ok.json()["reply"] == "Hello from the fake model."
        with http_server(shared_env) as base:  # no model configured
            unavailable = await http.post(f"{base}/api/ai/chat", json={"message": "hi"}, headers=alice)
            assert unavailable.status_code == 503
            message = unavailable.json()["error"]["message"]
            assert "KNECHT_MODEL_DEFAULT" in message and "(reference " in message
