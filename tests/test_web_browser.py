"""The web page in a real browser: Debian's Chromium, driven by Playwright, against a real server.

Each test saves screenshots of the pages it visits under `<pytest's base temp>/web-screenshots/`.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from mcp_knecht.app import App, open_app
from mcp_knecht.core.keys import load_server_keys
from mcp_knecht.core.settings import load_settings
from mcp_knecht.store import open_database
from mcp_knecht.web import session_actor
from mcp_knecht.web.store import LoginLinks, WebSchema
from tests.browser import CHROMIUM_FLAGS, UNLABELLED_CONTROLS, Shots, chromium_path, in_process_server, run_async
from tests.servers import free_port, http_server
from tests.staging import cli
from tests.web_support import AGENT, OPERATOR, stage

pytestmark = pytest.mark.slow

READER = ("projects:read", "workflows:read", "runs:read", "logs:read")
CHATTER = (*READER, "proposals:read", "ai:chat")


def expect(target: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(target)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS, headless=True)
        yield launched
        launched.close()


@pytest.fixture(scope="session")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Shots:
    return Shots(tmp_path_factory.getbasetemp() / "web-screenshots")


@pytest.fixture
def server(demo_env: dict[str, str]) -> Iterator[str]:
    """`mcp-knecht serve --transport http` on demo data: the pages are served beside /mcp."""
    with http_server(demo_env) as base:
        yield base


# --- helpers -------------------------------------------------------------------------------------------


async def _link(env: dict[str, str], subject: str, scopes: tuple[str, ...]) -> str:
    settings = load_settings(env=env)
    db = await open_database(settings.database_url)
    try:
        return await LoginLinks(WebSchema(db), load_server_keys(settings)).create(subject, list(scopes))
    finally:
        await db.close()


async def _stage(env: dict[str, str], tool: str, arguments: dict[str, Any], subject: str = "claude",
                 scopes: tuple[str, ...] = AGENT) -> int:
    async with open_app(load_settings(env=env), watch_policy=False) as app:
        return await stage(app, tool, arguments, subject, scopes)


async def _query(env: dict[str, str], sql: str, *params: Any) -> list[dict[str, Any]]:
    db = await open_database(load_settings(env=env).database_url)
    try:
        return await db.fetch_all(sql, params)
    finally:
        await db.close()


class Person:
    """One person at one browser: their own cookies, console and page."""

    def __init__(self, browser: Any, base: str, env: dict[str, str], subject: str, scopes: tuple[str, ...],
                 *, width: int = 1280) -> None:
        self.base, self.env, self.subject, self.scopes = base, env, subject, scopes
        self.context = browser.new_context(viewport={"width": width, "height": 900})
        self.page = self.context.new_page()
        self.problems: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.problems.append(f"script error: {error}"))

    def _console(self, message: Any) -> None:
        if "Content Security Policy" in message.text or (message.type == "error" and "Refused" in message.text):
            self.problems.append(message.text)

    def sign_in(self) -> Person:
        secret = run_async(_link, self.env, self.subject, self.scopes)
        self.page.goto(f"{self.base}/login?link={secret}")
        self.page.click("#continue")
        self.page.wait_for_url(f"{self.base}/")
        return self

    def open(self, path: str) -> Any:
        self.page.goto(self.base + path)
        return self.page

    def close(self) -> None:
        assert self.problems == [], self.problems  # no policy violation, no script error
        self.context.close()


# --- signing in -----------------------------------------------------------------------------------------


def test_a_login_link_signs_in_once(browser: Any, server: str, demo_env: dict[str, str], shots: Shots) -> None:
    made = cli("mcp-knecht", demo_env, "login-link", "--sub", "bob", "--profile", "operator", "--base-url", server)
    assert made.returncode == 0, made.stderr
    link = made.stdout.strip()
    assert link.startswith(f"{server}/login?link=") and "works once, for 10 minutes" in made.stderr

    bob = Person(browser, server, demo_env, "bob", OPERATOR)
    page = bob.open(link.removeprefix(server))
    assert page.locator("#continue").inner_text() == "Continue as bob"
    shots.take(page, "login-link")
    page.click("#continue")
    page.wait_for_url(f"{server}/")
    assert page.locator("article.card").count() == 5
    cookie = next(c for c in bob.context.cookies() if c["name"] == "knecht-session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and not cookie["secure"]
    shots.take(page, "dashboard")
    bob.close()

    again = Person(browser, server, demo_env, "mallory", ())
    page = again.open(link.removeprefix(server))
    assert "used already or has expired" in page.locator("#login-error").inner_text()
    shots.take(page, "login-link-used-twice")
    assert again.open("/").url.startswith(f"{server}/login")
    again.close()


# --- the review --------------------------------------------------------------------------------------------


def test_an_operator_approves_a_staged_rerun_bound_to_its_hash_and_a_second_operator_sees_it_decided(
    browser: Any, server: str, demo_env: dict[str, str], shots: Shots
) -> None:
    proposal_id = run_async(_stage, demo_env, "rerun_run", {"run_id": 11})
    bob = Person(browser, server, demo_env, "bob", OPERATOR).sign_in()
    carol = Person(browser, server, demo_env, "carol", OPERATOR).sign_in()

    listing = bob.open("/proposals")
    assert listing.locator(f"#proposal-{proposal_id}").is_visible()
    later = run_async(_stage, demo_env, "rerun_run", {"run_id": 13})  # staged while the list is open
    listing.locator(f"#proposal-{later}").wait_for(timeout=10_000)
    assert listing.locator("tbody tr").first.get_attribute("id") == f"proposal-{later}"
    shots.take(listing, "proposals-live")

    carols = carol.open(f"/proposals/{proposal_id}")
    assert carols.locator("#approve").is_visible()

    page = bob.open(f"/proposals/{proposal_id}")
    shown_hash = page.locator("#hash").inner_text()
    assert len(shown_hash) == 64
    shots.take(page, "proposal-review")
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith(f"/proposals/{proposal_id}")) as sent:
        page.click("#approve")
    assert f"expect_hash={shown_hash}" in (sent.value.post_data or "")
    page.wait_for_url(f"{server}/proposals/{proposal_id}")
    assert "Succeeded" in page.locator("#decision .state").inner_text()
    assert page.locator("#decision .decided-by").inner_text() == "bob"
    assert page.locator("#approve").count() == 0
    shots.take(page, "proposal-approved")

    # Carol's page, opened before the decision, shows it without a reload.
    carols.locator("#decision .decided-by").wait_for(timeout=10_000)
    assert carols.locator("#decision .decided-by").inner_text() == "bob"
    assert carols.locator("#approve").count() == 0
    shots.take(carols, "proposal-decided-seen-by-a-second-operator")

    rows = run_async(_query, demo_env, "SELECT status, decided_by FROM proposals WHERE id = ?", proposal_id)
    assert rows == [{"status": "succeeded", "decided_by": "bob"}]
    assert run_async(_query, demo_env, "SELECT id FROM runs WHERE rerun_of = 11")
    bob.close()
    carol.close()


def test_a_rejection_needs_a_reason_and_works_from_the_keyboard(
    browser: Any, server: str, demo_env: dict[str, str], shots: Shots
) -> None:
    proposal_id = run_async(_stage, demo_env, "rerun_run", {"run_id": 11})
    bob = Person(browser, server, demo_env, "bob", OPERATOR).sign_in()
    page = bob.open(f"/proposals/{proposal_id}")
    page.click("#reject")  # an empty reason: the browser does not send the form
    assert page.evaluate("document.querySelector('#reason').validity.valueMissing")
    assert "Pending" in page.locator("#decision .state").inner_text()

    page.locator("body").focus()
    for _ in range(60):  # keyboard only: Tab to the reason, type it, Tab to Reject, Enter
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "reason":
            break
    else:
        pytest.fail("Tab never reached the reason field")
    page.keyboard.type("Not on a Friday: wait for Monday.")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "reject"
    page.keyboard.press("Enter")
    page.wait_for_url(f"{server}/proposals/{proposal_id}")
    page.locator("#decision .reason").wait_for()
    assert page.locator("#decision .reason").inner_text() == "Not on a Friday: wait for Monday."
    assert "Rejected" in page.locator("#decision .state").inner_text()
    shots.take(page, "proposal-rejected")
    bob.close()


def test_self_approval_is_refused_with_the_reason_shown(
    browser: Any, server: str, demo_env: dict[str, str], shots: Shots
) -> None:
    own = run_async(_stage, demo_env, "rerun_run", {"run_id": 11}, "bob", (*AGENT, "proposals:decide"))
    bob = Person(browser, server, demo_env, "bob", OPERATOR).sign_in()
    page = bob.open(f"/proposals/{own}")
    page.click("#approve")
    error = page.locator("#decision-error")
    error.wait_for()
    assert "another operator must approve it" in error.inner_text()
    assert "Pending" in page.locator("#decision .state").inner_text()
    shots.take(page, "self-approval-refused")
    bob.close()


def test_without_proposals_decide_there_are_no_buttons(
    browser: Any, server: str, demo_env: dict[str, str], shots: Shots
) -> None:
    mine = run_async(_stage, demo_env, "rerun_run", {"run_id": 11}, "claude")
    claude = Person(browser, server, demo_env, "claude", AGENT).sign_in()
    page = claude.open(f"/proposals/{mine}")
    assert page.locator("h1").inner_text().startswith(f"Proposal #{mine}")
    assert page.locator("#approve").count() == 0 and page.locator("#reject").count() == 0
    assert "proposals:decide" in page.locator("#no-decide").inner_text()
    shots.take(page, "proposal-without-decide")
    claude.close()


def test_a_forged_post_without_the_csrf_token_is_refused(
    browser: Any, server: str, demo_env: dict[str, str], shots: Shots
) -> None:
    proposal_id = run_async(_stage, demo_env, "rerun_run", {"run_id": 11})
    bob = Person(browser, server, demo_env, "bob", OPERATOR).sign_in()
    shown_hash = bob.open(f"/proposals/{proposal_id}").locator("#hash").inner_text()

    # With bob's cookie, but without the token the page embeds.
    forged = bob.context.request.post(f"{server}/proposals/{proposal_id}",
                                      form={"decision": "approve", "expect_hash": shown_hash})
    assert forged.status == 403 and "CSRF" in forged.text()

    # A page of another origin on the same host (so the SameSite cookie is sent) posting a form.
    port = free_port()
    attack = (f'<form id="f" method="post" action="{server}/proposals/{proposal_id}">'
              f'<input name="decision" value="approve"><input name="expect_hash" value="{shown_hash}">'
              '<input name="csrf_token" value="guessed"></form>'
              "<script>document.getElementById('f').submit()</script>").encode()

    class Attacker(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(attack)

        def log_message(self, *args: Any) -> None:
            pass

    evil = http.server.HTTPServer(("127.0.0.1", port), Attacker)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        page = bob.page
        with page.expect_response(lambda r: r.url.endswith(f"/proposals/{proposal_id}")) as answered:
            page.goto(f"http://127.0.0.1:{port}/")
        assert answered.value.status == 403
        page.wait_for_load_state()
        shots.take(page, "forged-post-refused")
    finally:
        evil.shutdown()
        evil.server_close()
    rows = run_async(_query, demo_env, "SELECT status FROM proposals WHERE id = ?", proposal_id)
    assert rows == [{"status": "pending"}]
    bob.problems.clear()  # the refused post is logged by the browser; nothing of ours failed
    bob.close()


# --- the status card and the workflow it points at --------------------------------------------------------


class ScriptedDiagnosis:
    """What the diagnosis API would answer, set by the test."""

    def __init__(self) -> None:
        self.answer: dict[str, Any] = {"status": "pending"}
        self.asked = 0

    async def __call__(self, actor: Any, run_id: int) -> dict[str, Any]:
        self.asked += 1
        return dict(self.answer)


def test_the_card_goes_from_pending_to_done_without_a_reload_and_its_button_opens_the_action(
    browser: Any, demo_env: dict[str, str], shots: Shots
) -> None:
    failing = run_async(_query, demo_env, """
        SELECT p.id AS project, r.id AS run, a.id AS action, a.name, r.workflow_id FROM projects p
        JOIN runs r ON r.id = (SELECT MAX(id) FROM runs WHERE project_id = p.id)
        JOIN actions a ON a.run_id = r.id AND a.status = 'failed' WHERE r.status = 'failed' LIMIT 1""")
    assert failing, "the demo data has a project whose latest run failed"
    project, action = failing[0]["project"], failing[0]
    diagnosis = ScriptedDiagnosis()
    with in_process_server(demo_env, diagnosis=diagnosis) as base:
        dora = Person(browser, base, demo_env, "dora", READER).sign_in()
        page = dora.page
        card = page.locator(f"#project-{project}")
        assert "Knecht is looking into why the last run failed." in card.inner_text()
        page.evaluate("window.stillTheSamePage = true")
        shots.take(page, "card-pending")

        diagnosis.answer = {"status": "done", "actionIds": [action["action"]], "model": "scripted:model",
                            "summary": f"The {action['name']} action failed: the health check got 500 from "
                                       "staging. Fix the staging config, then re-run."}
        button = page.locator(f"#project-{project} .diagnosis a.button")
        button.wait_for(timeout=15_000)
        assert page.evaluate("window.stillTheSamePage === true")  # no reload
        assert button.inner_text() == f"Open {action['name']}"
        assert "health check got 500" in page.locator(f"#project-{project} .summary").inner_text()
        shots.take(page, "card-done")

        button.click()
        page.wait_for_url(f"{base}/workflows/{action['workflow_id']}?action={action['name']}*")
        opened = page.locator(f"details#action-{action['name']}")
        assert opened.get_attribute("open") is not None
        assert page.locator("details.action[open]").count() == 1
        assert page.evaluate(f"""(() => {{ const box = document.getElementById('action-{action["name"]}')
            .getBoundingClientRect(); return box.top >= 0 && box.top < window.innerHeight; }})()""")
        assert page.evaluate("document.activeElement.tagName") == "SUMMARY"
        shots.take(page, "workflow-action-opened")

        for state, text in (("failed", "Knecht could not work out why this run failed."),
                            ("unavailable", "No diagnosis is available for this run.")):
            diagnosis.answer = {"status": state, "error": "the model answered with nonsense" if state == "failed"
                                else "This server has no AI model configured."}
            dora.open("/")
            assert text in page.locator(f"#project-{project} .diagnosis").inner_text()
            shots.take(page, f"card-{state}")
        run_page = dora.open(f"/runs/{action['run']}")
        assert run_page.locator("tr.current").inner_text().split()[1] == action["name"]
        shots.take(run_page, "run")
        dora.close()


def test_the_servers_own_diagnosis_reaches_the_card_without_a_reload(
    browser: Any, demo_env: dict[str, str], shots: Shots
) -> None:
    """The real path: the card asks, the server's AI feature runs in the background on a scripted model
    (get_run, the failed action's log, an answer through the gate), and the card changes by itself."""
    from pydantic_ai.models.function import FunctionModel

    from mcp_knecht.ai.testing import scripted_diagnoser

    scripted = scripted_diagnoser()

    async def slow(messages: Any, info: Any) -> Any:
        await anyio.sleep(2.0)  # long enough for the page to show the pending state first
        return scripted.function(messages, info)  # type: ignore[misc]

    failing = run_async(_query, demo_env, """
        SELECT p.id AS project, r.id AS run, a.id AS action, a.name, r.workflow_id FROM projects p
        JOIN runs r ON r.id = (SELECT MAX(id) FROM runs WHERE project_id = p.id)
        JOIN actions a ON a.run_id = r.id AND a.status = 'failed' WHERE r.status = 'failed' LIMIT 1""")
    assert failing
    project, action = failing[0]["project"], failing[0]
    with in_process_server(demo_env, ai_model=FunctionModel(slow, model_name="scripted-diagnoser")) as base:
        dora = Person(browser, base, demo_env, "dora", READER).sign_in()
        page = dora.page
        assert "Knecht is looking into why the last run failed." in page.locator(f"#project-{project}").inner_text()
        page.evaluate("window.stillTheSamePage = true")
        button = page.locator(f"#project-{project} .diagnosis a.button")
        button.wait_for(timeout=30_000)
        assert page.evaluate("window.stillTheSamePage === true")
        assert button.inner_text() == f"Open {action['name']}"
        assert f"{action['name']} failed:" in page.locator(f"#project-{project} .summary").inner_text()
        shots.take(page, "card-done-by-the-servers-diagnosis")
        dora.close()
    stored = run_async(_query, demo_env, "SELECT status, action_ids FROM run_diagnoses WHERE run_id = ?",
                       action["run"])
    assert stored and stored[0]["status"] == "done"
    audited = run_async(_query, demo_env, "SELECT DISTINCT tool FROM audit_log WHERE source = ?",
                        "feature:failure-diagnosis")
    assert {row["tool"] for row in audited} == {"get_run", "get_action_log"}


# --- the chat ---------------------------------------------------------------------------------------------


def chat_stub(proposal_id: int) -> Any:
    """A stand-in for `POST /api/ai/chat` and the conversation routes, on the contract's shapes, that
    accepts web sessions the way the real endpoint must (`session_actor`, CSRF header on the POST)."""

    def routes(app: App) -> list[Route]:
        conversations: dict[str, list[dict[str, str]]] = {}

        async def who(request: Request) -> Any:
            actor = await session_actor(app, request)
            return actor if actor is not None and actor.holds("ai:chat") else None

        async def chat(request: Request) -> JSONResponse:
            if await who(request) is None:
                return JSONResponse({"error": {"code": "unauthenticated", "message": "Sign in."}}, 401)
            body = await request.json()
            message = str(body.get("message", "")).strip()
            if not message:
                return JSONResponse({"error": {"code": "bad_request", "message": "Empty message."}}, 400)
            conversation = str(body.get("conversationId") or f"c{len(conversations) + 1}")
            reply = "I've opened the proposal to re-run run 11. Please review it and decide."
            conversations.setdefault(conversation, []).extend(
                [{"role": "user", "content": message}, {"role": "assistant", "content": reply}])
            return JSONResponse({"conversationId": conversation, "reply": reply, "action": {
                "path": f"/proposals/{proposal_id}",
                "queryParams": {"aiAction": "edit", "aiPreview": json.dumps({"run_id": 11, "ref": "same_commit"})}}})

        async def listed(request: Request) -> JSONResponse:
            if await who(request) is None:
                return JSONResponse({"error": {"code": "unauthenticated", "message": "Sign in."}}, 401)
            return JSONResponse({"conversations": [{"id": key, "title": messages[0]["content"][:40]}
                                                   for key, messages in conversations.items()]})

        async def one(request: Request) -> JSONResponse:
            messages = conversations.get(request.path_params["conversation_id"])
            if await who(request) is None or messages is None:
                return JSONResponse({"error": {"code": "not_found", "message": "No such conversation."}}, 404)
            return JSONResponse({"id": request.path_params["conversation_id"], "messages": messages})

        return [Route("/api/ai/chat", chat, methods=["POST"]),
                Route("/api/ai/conversations", listed, methods=["GET"]),
                Route("/api/ai/conversations/{conversation_id}", one, methods=["GET"])]

    return routes


def test_the_chat_sends_a_message_and_follows_an_action_to_the_proposal_page(
    browser: Any, demo_env: dict[str, str], shots: Shots
) -> None:
    proposal_id = run_async(_stage, demo_env, "rerun_run", {"run_id": 11}, "erin")
    with in_process_server(demo_env, extra_routes=chat_stub(proposal_id)) as base:
        erin = Person(browser, base, demo_env, "erin", CHATTER).sign_in()
        page = erin.page
        page.click("#chat summary")
        page.locator("#chat-message").fill("Re-run the failed nightly of infra-live, please.")
        shots.take(page, "chat-open")
        with page.expect_request(lambda r: r.url.endswith("/api/ai/chat")) as sent:
            page.click("#chat-send")
        assert sent.value.headers.get("x-csrf-token")
        page.wait_for_url(f"{base}/proposals/{proposal_id}*")
        banner = page.locator("#ai-banner")
        banner.wait_for()
        assert "to edit" in banner.inner_text() and '"run_id": 11' in banner.inner_text()
        expect(page).not_to_have_url(re.compile("aiAction"))  # the parameters are dropped once shown
        page.locator("#chat-log li.assistant").wait_for()  # the conversation went along
        assert "opened the proposal" in page.locator("#chat-log").inner_text()
        shots.take(page, "chat-followed-to-proposal")
        erin.close()

        dora = Person(browser, base, demo_env, "dora", READER).sign_in()
        assert dora.page.locator("#chat").count() == 0  # no ai:chat, no assistant
        dora.close()


def test_without_the_chat_endpoint_the_widget_says_the_assistant_is_unavailable(
    browser: Any, demo_env: dict[str, str], shots: Shots
) -> None:
    with in_process_server(demo_env) as base:
        erin = Person(browser, base, demo_env, "erin", CHATTER).sign_in()
        page = erin.page
        page.click("#chat summary")
        expect(page.locator("#chat-status")).to_contain_text("The assistant is unavailable", timeout=10_000)
        assert page.locator("#chat-send").is_disabled()
        shots.take(page, "chat-unavailable")
        erin.problems.clear()  # the 404 of the missing endpoint is logged by the browser
        erin.close()


# --- every page: narrow screens, labels, the policy ------------------------------------------------------


def test_every_page_fits_360_pixels_and_labels_every_control(
    browser: Any, server: str, demo_env: dict[str, str], shots: Shots
) -> None:
    proposal_id = run_async(_stage, demo_env, "update_workflow", {
        "workflow": 1, "definition": "name: ci\non:\n  push: {}\nactions:\n  - name: test\n    run: pytest -q\n",
        "message": "Run only the tests"})
    bob = Person(browser, server, demo_env, "bob", (*OPERATOR, "ai:chat"), width=360).sign_in()
    pages = {"dashboard": "/", "run": "/runs/11", "workflow": "/workflows/1?action=test", "proposals": "/proposals",
             "proposal-diff": f"/proposals/{proposal_id}", "sign-out": "/logout"}
    for name, path in pages.items():
        page = bob.open(path)
        page.wait_for_load_state("networkidle")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 360, f"{path} is {width}px wide at 360px"
        assert page.evaluate(UNLABELLED_CONTROLS) == [], path
        shots.take(page, f"narrow-{name}")
    signed_out = Person(browser, server, demo_env, "nobody", (), width=360)
    page = signed_out.open("/login")
    assert page.evaluate(UNLABELLED_CONTROLS) == []
    assert page.evaluate("document.documentElement.scrollWidth") <= 360
    shots.take(page, "narrow-login")
    signed_out.close()
    bob.close()
