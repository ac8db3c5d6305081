"""The chat's HTTP routes, in memory: who may talk (a bearer token with ai:chat, or a web session with
its CSRF token), every error status with the contract's body, the shapes the web page's widget reads,
and the real provider path (each provider's SDK against a fake provider on 127.0.0.1)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import httpx
import pytest
from starlette.applications import Starlette

from mcp_knecht.app import App, open_app
from mcp_knecht.chat import ChatService
from mcp_knecht.chat.texts import SYSTEM_PROMPT
from mcp_knecht.core.auth import TokenSettings, TokenVerifier
from mcp_knecht.core.settings import load_settings
from mcp_knecht.store.audit_log import recent_entries
from mcp_knecht.transports.chat_api import chat_routes
from mcp_knecht.web import web_routes
from tests.ai_fakes import FakeProvider, Turn
from tests.chat_support import CHATTER, Assistant, call, chatter, scripted_chat, text
from tests.web_support import ORIGIN, csrf, sign_in

pytestmark = pytest.mark.anyio

CHAT = "/api/ai/chat"
LIST = "/api/ai/conversations"


@pytest.fixture
def verifier(token_settings: TokenSettings) -> TokenVerifier:
    return TokenVerifier(token_settings)


@asynccontextmanager
async def client_for(app: App, verifier: TokenVerifier, chat: ChatService | None = None
                     ) -> AsyncIterator[httpx.AsyncClient]:
    """The chat routes (and the web's, for sessions) in memory, and a client that keeps cookies."""
    asgi = Starlette(routes=[*chat_routes(app, verifier, chat=chat), *web_routes(app, verifier, public_url=ORIGIN)])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url=ORIGIN) as client:
        yield client


def bearer(mint: Callable[..., str], subject: str = "alice", scopes: tuple[str, ...] = CHATTER) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint(subject, scopes)}"}


def _error(response: httpx.Response) -> dict[str, str]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return body["error"]  # type: ignore[no-any-return]


async def test_who_may_talk_401_without_a_token_or_session_403_without_the_scope(
    app: App, verifier: TokenVerifier, mint: Callable[..., str]
) -> None:
    async with client_for(app, verifier, scripted_chat(app, Assistant())) as http:
        for method, path in (("POST", CHAT), ("GET", LIST), ("GET", f"{LIST}/x")):
            nobody = await http.request(method, path, json={"message": "hi"} if method == "POST" else None)
            assert nobody.status_code == 401 and _error(nobody)["code"] == "unauthenticated"
            assert "ai:chat" in _error(nobody)["message"]
            forged = await http.request(method, path, headers={"Authorization": "Bearer not.a.jwt"})
            assert forged.status_code == 401
        reader = await http.post(CHAT, json={"message": "hi"}, headers=bearer(mint, scopes=("runs:read",)))
        assert reader.status_code == 403 and _error(reader) == {
            "code": "insufficient_scope", "message": "The assistant needs scope ai:chat."}
        ok = await http.post(CHAT, json={"message": "hi"}, headers=bearer(mint))
        assert ok.status_code == 200 and ok.json()["reply"] == "Hello."


@pytest.mark.parametrize("body, problem", [
    (b"{not json", "not valid JSON"),
    (b"", "not valid JSON"),
    (b'["hi"]', "must be a JSON object"),
    (b'{"message": ""}', "`message` must be a non-empty string"),
    (b'{"message": "   "}', "`message` must be a non-empty string"),
    (b'{"conversationId": "x"}', "`message` must be a non-empty string"),
    (b'{"message": 5}', "`message` must be a non-empty string"),
    (b'{"message": "hi", "conversationId": 7}', "`conversationId` must be a string"),
    (b'{"message": "hi", "role": "system"}', "Unknown field 'role'"),
    (json.dumps({"message": "x" * 8001}).encode(), "longer than 8000 characters"),
])
async def test_400_for_an_empty_message_or_invalid_json(
    app: App, verifier: TokenVerifier, mint: Callable[..., str], body: bytes, problem: str
) -> None:
    assistant = Assistant()
    async with client_for(app, verifier, scripted_chat(app, assistant)) as http:
        response = await http.post(CHAT, content=body, headers={**bearer(mint), "Content-Type": "application/json"})
    assert response.status_code == 400 and _error(response)["code"] == "bad_request"
    assert problem in _error(response)["message"]
    assert assistant.requests == []


async def test_404_for_an_unknown_and_for_another_subjects_conversation_alike(
    app: App, verifier: TokenVerifier, mint: Callable[..., str]
) -> None:
    async with client_for(app, verifier, scripted_chat(app, Assistant())) as http:
        started = (await http.post(CHAT, json={"message": "hi"}, headers=bearer(mint, "alice"))).json()
        mallory = bearer(mint, "mallory")
        answers = []
        for conversation_id in (started["conversationId"], "DoesNotExist0000000000"):
            posted = await http.post(CHAT, json={"message": "hi", "conversationId": conversation_id}, headers=mallory)
            read = await http.get(f"{LIST}/{conversation_id}", headers=mallory)
            assert posted.status_code == read.status_code == 404
            answers.append([_error(r)["message"].replace(conversation_id, "ID") for r in (posted, read)])
        assert answers[0] == answers[1]
        assert (await http.get(LIST, headers=mallory)).json() == {"conversations": []}
        own = await http.get(f"{LIST}/{started['conversationId']}", headers=bearer(mint, "alice"))
        assert [m["role"] for m in own.json()["messages"]] == ["user", "assistant"]


async def test_503_without_a_model_says_what_to_set_with_a_reference(
    app: App, verifier: TokenVerifier, mint: Callable[..., str]
) -> None:
    async with client_for(app, verifier) as http:  # the app's own chat: no model is configured
        for method, path in (("POST", CHAT), ("GET", LIST), ("GET", f"{LIST}/x")):
            response = await http.request(method, path, json={"message": "hi"} if method == "POST" else None,
                                          headers=bearer(mint))
            assert response.status_code == 503, response.text
            error = _error(response)
            assert error["code"] == "ai_unavailable" and "KNECHT_MODEL_DEFAULT" in error["message"]
            assert "(reference " in error["message"]


async def test_500_when_the_model_fails_with_a_reference_and_no_internals(
    demo_env: dict[str, str], verifier: TokenVerifier, mint: Callable[..., str]
) -> None:
    key = "sk-test-0123456789abcdef"
    with FakeProvider([Turn(status=400)] * 3) as fake:
        env = {**demo_env, "KNECHT_MODEL_DEFAULT": "openai:gpt-5-mini", "OPENAI_API_KEY": key,
               "OPENAI_BASE_URL": fake.url + "/v1"}
        async with open_app(load_settings(env=env), watch_policy=False) as app, client_for(app, verifier) as http:
            response = await http.post(CHAT, json={"message": "hi"}, headers=bearer(mint))
            assert await app.chat.conversations(chatter("alice"), 10) == []  # nothing stored
    assert response.status_code == 500
    error = _error(response)
    assert error["code"] == "ai_model"
    assert error["message"].startswith("The assistant's model could not answer; try again in a moment. (reference ")
    assert "fake provider failure" not in response.text and key not in response.text and fake.url not in response.text


async def test_500_when_the_model_wants_a_sixth_round_of_tools(
    app: App, verifier: TokenVerifier, mint: Callable[..., str]
) -> None:
    chat = scripted_chat(app, Assistant({"": [call("list_projects")]}))
    async with client_for(app, verifier, chat) as http:
        response = await http.post(CHAT, json={"message": "loop"}, headers=bearer(mint))
    assert response.status_code == 500
    error = _error(response)
    assert error["code"] == "chat_round_limit" and "more than 5 rounds" in error["message"]
    assert "(reference " in error["message"]


async def test_500_for_an_unexpected_error_names_only_a_reference(
    app: App, verifier: TokenVerifier, mint: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    chat = scripted_chat(app, Assistant())

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("SELECT secret FROM internals")

    chat.store.record_turn = broken  # type: ignore[method-assign]
    async with client_for(app, verifier, chat) as http:
        response = await http.post(CHAT, json={"message": "hi"}, headers=bearer(mint))
    assert response.status_code == 500 and _error(response)["code"] == "internal"
    assert "internals" not in response.text
    reference = _error(response)["message"].split("reference ")[1].rstrip(")")
    assert any(reference in record.getMessage() and record.exc_info for record in caplog.records)


async def test_the_shapes_the_widget_reads_and_an_action_pointing_at_the_proposal(
    app: App, verifier: TokenVerifier, mint: Callable[..., str]
) -> None:
    assistant = Assistant({"rerun": [call("rerun_run", run_id=66)], "": [text("Run 66 failed on bad YAML.")]})
    async with client_for(app, verifier, scripted_chat(app, assistant)) as http:
        alice = bearer(mint)
        first = await http.post(CHAT, json={"message": "Why did run 66 fail?"}, headers=alice)
        assert first.status_code == 200 and first.headers["cache-control"] == "no-store"
        assert set(first.json()) == {"conversationId", "reply"}
        conversation_id = first.json()["conversationId"]
        assert isinstance(conversation_id, str) and len(conversation_id) >= 16
        second = (await http.post(CHAT, json={"message": "rerun it", "conversationId": conversation_id},
                                  headers=alice)).json()
        [proposal] = await app.proposals.list()
        assert second["conversationId"] == conversation_id
        assert second["action"]["path"] == f"/proposals/{proposal.id}"
        assert second["action"]["queryParams"]["aiAction"] == "create"
        assert second["reply"].startswith(f"I've prepared this change as proposal #{proposal.id}")

        listed = (await http.get(LIST, headers=alice)).json()
        assert [(c["id"], c["title"]) for c in listed["conversations"]] == [(conversation_id, "Why did run 66 fail?")]
        one = (await http.get(f"{LIST}/{conversation_id}", headers=alice)).json()
        assert one["id"] == conversation_id
        assert [(m["role"], m["content"]) for m in one["messages"]] == [
            ("user", "Why did run 66 fail?"), ("assistant", "Run 66 failed on bad YAML."),
            ("user", "rerun it"), ("assistant", second["reply"])]
        assert one["messages"][3]["action"] == second["action"]
        assert (await http.get(LIST, params={"limit": "0"}, headers=alice)).status_code == 400


async def test_a_web_session_holding_ai_chat_may_talk_with_its_csrf_token(
    app: App, verifier: TokenVerifier
) -> None:
    async with client_for(app, verifier, scripted_chat(app, Assistant())) as http:
        await sign_in(http, app, "paula", ("runs:read", "ai:chat"))
        page = await http.get("/")
        token = csrf(page.text)
        without = await http.post(CHAT, json={"message": "hi"})
        assert without.status_code == 401, "a POST from a session needs the page's CSRF token"
        foreign = await http.post(CHAT, json={"message": "hi"},
                                  headers={"X-CSRF-Token": token, "Origin": "https://evil.example"})
        assert foreign.status_code == 401
        posted = await http.post(CHAT, json={"message": "hi"}, headers={"X-CSRF-Token": token, "Origin": ORIGIN})
        assert posted.status_code == 200, posted.text
        listed = await http.get(LIST)  # a read needs no CSRF token
        assert [c["id"] for c in listed.json()["conversations"]] == [posted.json()["conversationId"]]
        await sign_in(http, app, "quinn", ("runs:read",))
        assert (await http.get(LIST)).status_code == 403


@pytest.mark.parametrize("provider, provider_env", [
    ("anthropic", lambda url: {"ANTHROPIC_API_KEY": "sk-test", "ANTHROPIC_BASE_URL": url}),
    ("openai", lambda url: {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": url + "/v1"}),
    ("google", lambda url: {"GOOGLE_API_KEY": "sk-test", "GOOGLE_GEMINI_BASE_URL": url}),
], ids=["anthropic", "openai", "google"])
async def test_a_turn_through_each_providers_sdk(
    demo_env: dict[str, str], verifier: TokenVerifier, mint: Callable[..., str], provider: str,
    provider_env: Callable[[str], dict[str, str]]
) -> None:
    models = {"anthropic": "claude-haiku-4-5", "openai": "gpt-5-mini", "google": "gemini-2.5-flash"}
    turns = [Turn.call("get_run", run_id=66), Turn(text="Run 66 failed: the workflow's YAML is invalid."),
             Turn(text="Sure: it was run 66.")]
    with FakeProvider(turns) as fake:
        settings = load_settings(env={**demo_env, "KNECHT_MODEL_DEFAULT": f"{provider}:{models[provider]}",
                                      **provider_env(fake.url)})
        async with open_app(settings, watch_policy=False) as app, client_for(app, verifier) as http:
            first = (await http.post(CHAT, json={"message": "Why did run 66 fail?"}, headers=bearer(mint))).json()
            second = (await http.post(CHAT, json={"message": "Which run was it?",
                                                  "conversationId": first["conversationId"]},
                                      headers=bearer(mint))).json()
            await app.audit.flush()
            [entry] = await recent_entries(app.db, source="chat")
    assert first["reply"] == "Run 66 failed: the workflow's YAML is invalid."
    assert second["reply"] == "Sure: it was run 66."
    assert (entry["tool"], entry["outcome"], entry["subject"]) == ("get_run", "ran", "alice")
    assert len(fake.requests) == 3
    offered = fake.requests[0].tools
    assert "get_run" in offered and "rerun_run" in offered and "final_result" not in offered
    assert "You never create, change or delete data yourself." in fake.requests[0].text
    assert json.loads(fake.requests[1].tool_results[0])["id"] == 66
    # The next turn carries the conversation as text: no tool call or result of the turn before.
    assert fake.requests[2].tool_results == []
    assert "Run 66 failed: the workflow's YAML is invalid." in fake.requests[2].text
    assert SYSTEM_PROMPT.splitlines()[0][:40] in fake.requests[2].text


async def test_a_model_that_does_not_answer_in_time_is_a_500(
    demo_env: dict[str, str], verifier: TokenVerifier, mint: Callable[..., str]
) -> None:
    with FakeProvider([Turn(delay=5.0, text="too late")] * 3) as fake:
        env = {**demo_env, "KNECHT_MODEL_DEFAULT": "anthropic:claude-haiku-4-5", "ANTHROPIC_API_KEY": "sk-test",
               "ANTHROPIC_BASE_URL": fake.url, "KNECHT_MODEL_TIMEOUT": "0.5"}
        async with open_app(load_settings(env=env), watch_policy=False) as app, client_for(app, verifier) as http:
            with anyio.fail_after(20):
                response = await http.post(CHAT, json={"message": "hi"}, headers=bearer(mint))
    assert response.status_code == 500 and _error(response)["code"] == "ai_model"
