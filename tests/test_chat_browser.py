"""The web page's assistant against the real chat endpoint, in Chromium: `mcp-knecht serve` as a
subprocess with a fake Anthropic behind the real SDK. A person asks, the assistant reads through the
gate and answers; asked for a change, it opens the proposal's page; an operator approves it through
the decision API; the follow-up and the assistant's continuation appear in the widget by themselves.

Screenshots go under `<pytest's base temp>/web-screenshots/` (chat-*.png)."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from mcp_knecht.chat.texts import FOLLOW_UP_PREFIX
from mcp_knecht.core.auth import TokenSettings, mint_token
from tests.ai_fakes import FakeProvider, Received, Turn
from tests.browser import Shots
from tests.servers import http_server
from tests.test_chat_end_to_end import _last_user_text
from tests.test_web_browser import Person, browser, expect, shots  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow

PERSON = ("projects:read", "workflows:read", "runs:read", "runs:write", "logs:read", "proposals:read", "ai:chat")
OPERATOR = ("proposals:decide", "proposals:read", "projects:read", "runs:read")


def assistant(received: Received) -> Turn:
    said = _last_user_text(received)
    if said.startswith(FOLLOW_UP_PREFIX):
        return Turn(text="The re-run of run 11 has started; I'll keep an eye on it.")
    if said.startswith("Re-run"):
        return Turn.call("rerun_run", run_id=11)
    if not received.tool_results:
        return Turn.call("get_run", run_id=66)
    return Turn(text="Run 66 failed in parse-workflow: its YAML is invalid.")


def test_the_widget_asks_opens_the_proposal_and_shows_the_follow_up_after_the_decision(
    browser: Any, demo_env: dict[str, str], shots: Shots  # noqa: F811
) -> None:
    with FakeProvider(assistant) as fake:
        env = {**demo_env, "KNECHT_MODEL_DEFAULT": "anthropic:claude-haiku-4-5", "ANTHROPIC_API_KEY": "sk-test",
               "ANTHROPIC_BASE_URL": fake.url}
        with http_server(env) as base:
            erin = Person(browser, base, env, "erin", PERSON).sign_in()
            page = erin.page
            page.click("#chat summary")
            page.locator("#chat-message").fill("Why did run 66 fail?")
            page.click("#chat-send")
            expect(page.locator("#chat-log li.assistant")).to_contain_text("its YAML is invalid")
            shots.take(page, "chat-answer")

            page.locator("#chat-message").fill("Re-run run 11, please.")
            with page.expect_request(lambda r: r.url.endswith("/api/ai/chat")) as sent:
                page.click("#chat-send")
            assert sent.value.headers.get("x-csrf-token")
            page.wait_for_url(re.compile(rf"{re.escape(base)}/proposals/\d+"))
            proposal_id = int(re.search(r"/proposals/(\d+)", page.url).group(1))  # type: ignore[union-attr]
            expect(page.locator("#ai-banner")).to_contain_text("create")
            expect(page.locator("#chat-log")).to_contain_text(f"I've prepared this change as proposal #{proposal_id}")
            shots.take(page, "chat-proposal-opened")

            token = mint_token(TokenSettings(secret=env["KNECHT_JWT_SECRET"]), subject="bob", scopes=OPERATOR)
            approved = httpx.post(f"{base}/api/proposals/{proposal_id}/approve", json={},
                                  headers={"Authorization": f"Bearer {token}"}, timeout=30)
            assert approved.status_code == 200 and approved.json()["status"] == "succeeded", approved.text

            # The widget looks for news every 10 s while it is open.
            note = page.locator("#chat-log li.note")
            expect(note).to_contain_text(f"proposal #{proposal_id} (rerun_run): approved by bob and executed",
                                         timeout=25_000)
            assert note.locator(".visually-hidden").inner_text() == "Knecht:"
            expect(page.locator("#chat-log li.assistant").last).to_contain_text("The re-run of run 11 has started")
            shots.take(page, "chat-follow-up")
            erin.close()
