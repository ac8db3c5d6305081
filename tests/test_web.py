"""The web page without a browser: sessions, CSRF, headers, scopes, what each page shows. The
browser tests (`test_web_browser.py`) drive the same pages in Chromium."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio
import pytest

from mcp_knecht.app import App
from mcp_knecht.core import clock
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.auth import TokenSettings, TokenVerifier
from mcp_knecht.core.settings import load_settings
from mcp_knecht.store import open_database
from mcp_knecht.web import session_actor
from mcp_knecht.web.ci_pages import split_definition
from mcp_knecht.web.diagnosis import PENDING_TEXT, DiagnosisCard
from mcp_knecht.web.render import Renderer
from mcp_knecht.web.security import CONTENT_SECURITY_POLICY
from mcp_knecht.web.store import LoginLinks, WebSchema
from tests.web_support import AGENT, OPERATOR, ORIGIN, csrf, field, link_for, pages, sign_in, stage, use_link

pytestmark = pytest.mark.anyio

READER = ("projects:read", "workflows:read", "runs:read", "logs:read")


@pytest.fixture
def verifier(token_settings: TokenSettings) -> TokenVerifier:
    return TokenVerifier(token_settings)


# --- the status card's diagnosis, from the dicts the diagnosis API answers ----------------------------

RUN = {"id": 11, "workflow_id": 4, "workflow_version": 2,
       "actions": [{"id": 70, "name": "install"}, {"id": 71, "name": "test"}]}


def _card(diagnosis: dict[str, Any]) -> str:
    card = {"project": {"id": 1, "name": "Payments API", "slug": "payments-api", "description": "",
                        "workflow_count": 3, "latest_run_id": 11},
            "run": None, "status": "failed", "diagnosis": DiagnosisCard.of(diagnosis, RUN), "live": True,
            "refresh_ms": 3000}
    return Renderer().html("_card.html", {"card": card})


def test_the_card_shows_a_pending_diagnosis_with_the_seeds_sentence_and_keeps_asking() -> None:
    shown = _card({"status": "pending"})
    assert PENDING_TEXT == "Knecht is looking into why the last run failed."
    assert PENDING_TEXT in shown and "diagnosis-pending" in shown
    assert 'data-refresh="/?card=1"' in shown


def test_the_card_shows_a_done_diagnosis_with_one_button_per_action() -> None:
    shown = _card({"status": "done", "summary": "The test job ran out of memory; raise its limit.",
                   "actionIds": [71, 70, 71, 99], "model": "anthropic:claude-haiku"})
    assert "The test job ran out of memory; raise its limit." in shown
    buttons = re.findall(r'<a class="button" href="([^"]+)">([^<]+)</a>', shown)
    assert buttons == [("/workflows/4?action=test#action-test", "Open test"),
                       ("/workflows/4?action=install#action-install", "Open install"),
                       ("/runs/11?action=99", "Open Action #99")]  # an id the run does not name: its log
    assert "Diagnosed by anthropic:claude-haiku" in shown


@pytest.mark.parametrize(("state", "sentence"), [
    ("failed", "Knecht could not work out why this run failed."),
    ("unavailable", "No diagnosis is available for this run."),
])
def test_the_card_says_plainly_when_there_is_no_diagnosis(state: str, sentence: str) -> None:
    shown = _card({"status": state, "error": "model timed out"})
    assert sentence in shown and "model timed out" in shown and f"diagnosis-{state}" in shown
    assert '<a class="button"' not in shown


def test_markup_in_a_diagnosis_is_shown_as_text() -> None:
    shown = _card({"status": "done", "summary": "<script>alert(1)</script>", "actionIds": []})
    assert "<script>alert(1)" not in shown and "&lt;script&gt;" in shown


# --- signing in ------------------------------------------------------------------------------------------


async def test_a_login_link_starts_a_session_once(app: App, verifier: TokenVerifier) -> None:
    secret = await link_for(app, "bob", OPERATOR)
    async with pages(app, verifier) as browser:
        assert (await browser.get("/")).headers["location"] == "/login?next=%2F"
        confirm = await browser.get("/login", params={"link": secret})
        assert confirm.status_code == 200 and "Continue as bob" in confirm.text
        assert "proposals:decide" in confirm.text
        signed_in = await use_link(browser, secret)
        assert signed_in.status_code == 303 and signed_in.headers["location"] == "/"
        cookie = next(v for k, v in signed_in.headers.multi_items() if k == "set-cookie" and "knecht-session=" in v)
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" not in cookie and "Max-Age=" in cookie
        assert (await browser.get("/")).status_code == 200
    async with pages(app, verifier) as other_browser:
        again = await use_link(other_browser, secret)
        assert again.status_code == 410 and "used already or has expired" in again.text
        assert (await other_browser.get("/login", params={"link": secret})).status_code == 410


async def test_over_tls_the_cookie_is_secure_and_host_only(app: App, verifier: TokenVerifier) -> None:
    async with pages(app, verifier, base_url="https://knecht.example") as browser:
        signed_in = await use_link(browser, await link_for(app, "bob", OPERATOR))
        cookie = signed_in.headers["set-cookie"]
        assert cookie.startswith("__Host-knecht-session=") and "Secure" in cookie and "Path=/" in cookie
        assert "Strict-Transport-Security" in (await browser.get("/")).headers


async def test_an_expired_or_altered_link_is_refused(app: App, verifier: TokenVerifier) -> None:
    links = LoginLinks(WebSchema(app.db), app.keys)
    expired = await links.create("bob", ["projects:read"], ttl=timedelta(seconds=-1))
    widened = await links.create("bob", ["projects:read"])
    async with app.db.transaction() as tx:  # someone with write access to the table widens a link
        await tx.execute("UPDATE web_login_links SET scopes = 'projects:read proposals:decide'"
                         " WHERE used_at IS NULL AND expires_at > ?", (clock.timestamp(),))
    assert await links.redeem(expired) is None
    assert await links.redeem(widened) is None
    assert await links.redeem("not-a-link") is None
    rows = await app.db.fetch_all("SELECT token_hash FROM web_login_links")
    assert all(widened not in row["token_hash"] for row in rows)  # only a keyed hash is stored


async def test_a_link_is_used_once_however_many_replicas_race_for_it(database_url: str, env: dict[str, str]) -> None:
    keys_env = {**env, "KNECHT_DATABASE_URL": database_url}
    from mcp_knecht.core.keys import load_server_keys

    keys = load_server_keys(load_settings(env=keys_env))
    replicas = [await open_database(database_url) for _ in range(4)]
    try:
        secret = await LoginLinks(WebSchema(replicas[0]), keys).create("bob", ["projects:read"])
        granted: list[object] = []

        async def redeem(db: Any) -> None:
            granted.append(await LoginLinks(WebSchema(db), keys).redeem(secret))

        async with anyio.create_task_group() as tasks:
            for db in replicas:
                for _ in range(3):
                    tasks.start_soon(redeem, db)
        assert sum(grant is not None for grant in granted) == 1
    finally:
        for db in replicas:
            await db.close()


async def test_a_pasted_token_starts_a_session_that_ends_with_the_token(
    app: App, verifier: TokenVerifier, mint: Callable[..., str]
) -> None:
    async with pages(app, verifier) as browser:
        form = await browser.get("/login")
        assert "Paste a JWT" in form.text
        refused = await browser.post("/login", data={"login_csrf": field(form.text, "login_csrf"),
                                                     "token": "not.a.jwt"})
        assert refused.status_code == 401 and "The token was refused" in refused.text
        form = await browser.get("/login")
        token = mint("dora", READER, ttl=timedelta(minutes=5))
        signed_in = await browser.post("/login", data={"login_csrf": field(form.text, "login_csrf"), "token": token,
                                                       "next": "/runs/11"})
        assert signed_in.status_code == 303 and signed_in.headers["location"] == "/runs/11"
        max_age = int(re.search(r"Max-Age=(\d+)", signed_in.headers["set-cookie"]).group(1))  # type: ignore[union-attr]
        assert 240 < max_age <= 300
        assert "dora" in (await browser.get("/runs/11")).text


async def test_the_sign_in_form_needs_its_own_nonce_and_never_redirects_elsewhere(
    app: App, verifier: TokenVerifier, mint: Callable[..., str]
) -> None:
    async with pages(app, verifier) as browser:
        token = mint("dora", READER)
        forged = await browser.post("/login", data={"login_csrf": "guess", "token": token})
        assert forged.status_code == 403 and "knecht-session" not in forged.headers.get("set-cookie", "")
        form = await browser.get("/login")
        away = await browser.post("/login", data={"login_csrf": field(form.text, "login_csrf"), "token": token,
                                                  "next": "//evil.example/x"})
        assert away.headers["location"] == "/"


async def test_signing_out_ends_the_session_even_for_a_kept_cookie(app: App, verifier: TokenVerifier) -> None:
    async with pages(app, verifier) as browser:
        await sign_in(browser, app, "bob", OPERATOR)
        kept = dict(browser.cookies)
        page = await browser.get("/logout")
        assert (await browser.post("/logout", data={})).status_code == 403  # no CSRF token
        out = await browser.post("/logout", data={"csrf_token": csrf(page.text)}, headers={"Origin": ORIGIN})
        assert out.status_code == 303 and out.headers["location"] == "/login?signed_out=1"
        assert (await browser.get("/")).status_code == 303
    async with pages(app, verifier) as thief:
        thief.cookies.update(kept)
        assert (await thief.get("/")).status_code == 303


async def test_a_forged_cookie_is_no_session(app: App, verifier: TokenVerifier) -> None:
    async with pages(app, verifier) as browser:
        await sign_in(browser, app, "dora", READER)
        value = browser.cookies["knecht-session"]
        payload, mac = value.split(".")
        import base64

        data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        data["scp"].append("proposals:decide")
        forged = base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()
        browser.cookies.set("knecht-session", f"{forged}.{mac}")
        assert (await browser.get("/proposals")).status_code == 303


# --- headers, CSRF, and the session hook for the chat --------------------------------------------------


async def test_every_page_and_file_carries_the_security_headers(app: App, verifier: TokenVerifier) -> None:
    async with pages(app, verifier) as browser:
        await sign_in(browser, app, "bob", OPERATOR)
        for path in ("/", "/login", "/runs/11", "/workflows/1", "/proposals", "/static/knecht.js", "/nope/404"):
            response = await browser.get(path)
            if path == "/nope/404":
                continue  # not ours
            assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
            assert response.headers["x-content-type-options"] == "nosniff"
            assert response.headers["x-frame-options"] == "DENY"
            assert response.headers["referrer-policy"] == "same-origin"
            assert "no-store" in response.headers["cache-control"] or path.startswith("/static")
            if response.headers["content-type"].startswith("text/html"):
                assert "<script>" not in response.text and " style=" not in response.text
                assert not re.search(r"\son[a-z]+=", response.text), path  # no inline event handlers
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY and "unsafe" not in CONTENT_SECURITY_POLICY


async def test_a_decision_without_the_csrf_token_or_from_another_site_is_refused(
    app: App, verifier: TokenVerifier
) -> None:
    proposal_id = await stage(app, "rerun_run", {"run_id": 11})
    async with pages(app, verifier) as browser:
        await sign_in(browser, app, "bob", OPERATOR)
        page = await browser.get(f"/proposals/{proposal_id}")
        arguments_hash = field(page.text, "expect_hash")
        approve = {"decision": "approve", "expect_hash": arguments_hash}
        missing = await browser.post(f"/proposals/{proposal_id}", data=approve)
        assert missing.status_code == 403 and "CSRF" in missing.text
        wrong = await browser.post(f"/proposals/{proposal_id}", data={**approve, "csrf_token": "0" * 64})
        assert wrong.status_code == 403
        elsewhere = await browser.post(f"/proposals/{proposal_id}", data={**approve, "csrf_token": csrf(page.text)},
                                       headers={"Origin": "https://evil.example"})
        assert elsewhere.status_code == 403
        assert (await app.proposals.get(proposal_id)).status == "pending"  # type: ignore[union-attr]


async def test_session_actor_is_the_chat_endpoints_way_to_accept_a_session(app: App, verifier: TokenVerifier) -> None:
    from starlette.requests import Request

    async with pages(app, verifier) as browser:
        await sign_in(browser, app, "erin", ("ai:chat", "projects:read"))
        page = await browser.get("/")
        cookie = f"knecht-session={browser.cookies['knecht-session']}"

    def request(method: str, **headers: str) -> Request:
        raw = [(b"cookie", cookie.encode()), (b"host", b"testserver"),
               *((k.lower().encode(), v.encode()) for k, v in headers.items())]
        return Request({"type": "http", "method": method, "path": "/api/ai/chat", "headers": raw,
                        "scheme": "http", "server": ("testserver", 80), "query_string": b""})

    actor = await session_actor(app, request("GET"))
    assert actor is not None and actor.subject == "erin" and actor.holds("ai:chat") and actor.client == "web"
    assert await session_actor(app, request("POST")) is None  # no CSRF token
    assert (await session_actor(app, request("POST", **{"X-CSRF-Token": csrf(page.text)}))) is not None
    assert await session_actor(app, request("POST", **{"X-CSRF-Token": csrf(page.text),
                                                       "Origin": "https://evil.example"})) is None


# --- what the pages show, as whom ------------------------------------------------------------------------


async def test_pages_check_the_sessions_scopes(app: App, verifier: TokenVerifier) -> None:
    async with pages(app, verifier) as browser:
        await sign_in(browser, app, "frank", ("runs:read",))
        dashboard = await browser.get("/")
        assert dashboard.status_code == 403 and "projects:read" in dashboard.text
        run = await browser.get("/runs/11")
        assert run.status_code == 200 and "needs the scope logs:read" in run.text
        assert (await browser.get("/workflows/1")).status_code == 403
        assert (await browser.get("/proposals")).status_code == 403


async def test_the_dashboard_has_a_card_per_project_with_the_latest_run(app: App, verifier: TokenVerifier) -> None:
    async with pages(app, verifier) as browser:
        await sign_in(browser, app, "dora", READER)
        page = await browser.get("/")
        projects = await app.db.fetch_all("SELECT id, name FROM projects")
        assert page.text.count('<article class="card') == len(projects) == 5
        latest = await app.db.fetch_one("SELECT id, status FROM runs WHERE project_id = 1 ORDER BY id DESC LIMIT 1")
        card = (await browser.get("/?card=1")).text
        assert card.startswith("<article") and f'href="/runs/{latest["id"]}"' in card  # type: ignore[index]
        failed = await app.db.fetch_one("SELECT project_id FROM runs r WHERE id = (SELECT MAX(id) FROM runs"
                                        " WHERE project_id = r.project_id) AND status = 'failed' LIMIT 1")
        if failed is not None:
            assert "No diagnosis is available" in (await browser.get(f"/?card={failed['project_id']}")).text


async def test_a_run_page_shows_each_log_scrubbed_exactly_as_the_tools_and_paged_from_the_end(
    app: App, verifier: TokenVerifier
) -> None:
    secret_line = await app.db.fetch_one(
        "SELECT run_id, action_id, text FROM log_lines WHERE text LIKE '%AWS_ACCESS_KEY_ID=%' LIMIT 1")
    assert secret_line is not None
    raw_secret = secret_line["text"].split("AWS_ACCESS_KEY_ID=")[1].split()[0]
    run_id, action_id = secret_line["run_id"], secret_line["action_id"]
    async with pages(app, verifier) as browser:
        await sign_in(browser, app, "dora", READER)
        page = (await browser.get(f"/runs/{run_id}?action={action_id}")).text
        assert raw_secret not in page
        tool = await app.gate.call_tool(Actor("dora", "pytest", frozenset(READER)), "get_action_log",
                                        {"run_id": run_id, "action": action_id, "tail": 200})
        assert tool.data is not None
        numbered = r'<span class="n" aria-hidden="true">\d+</span>(.*?)</span>'
        shown = [html.unescape(line) for line in re.findall(numbered, page)]
        assert shown == [line["text"] for line in tool.data["lines"]]

    async with app.db.transaction() as tx:  # a long log: 450 lines
        await tx.execute("DELETE FROM log_lines WHERE run_id = ? AND action_id = ?", (run_id, action_id))
        await tx.execute_many("INSERT INTO log_lines (run_id, action_id, line_no, text) VALUES (?, ?, ?, ?)",
                              [(run_id, action_id, n, f"line {n}") for n in range(1, 451)])
    async with pages(app, verifier) as browser:
        await sign_in(browser, app, "dora", READER)
        tail = (await browser.get(f"/runs/{run_id}?action={action_id}")).text
        assert "Lines 251\u2013450 of 450 (the newest)" in tail and "line 450" in tail and "line 250<" not in tail
        assert f'href="/runs/{run_id}?action={action_id}&amp;offset=50#log">Earlier lines' in tail
        assert "Later lines" not in tail
        start = (await browser.get(f"/runs/{run_id}?action={action_id}&offset=0")).text
        assert "Lines 1\u2013200 of 450." in start and "Newest lines" in start
        assert 'offset=200#log">Later lines' in start and "Earlier lines" not in start


async def test_audit_rows_show_page_reads_as_web(app: App, verifier: TokenVerifier) -> None:
    async with pages(app, verifier) as browser:
        await sign_in(browser, app, "dora", READER)
        await browser.get("/runs/11")
    await app.audit.flush()
    rows = await app.db.fetch_all("SELECT source, subject, client, tool FROM audit_log WHERE subject = 'dora'")
    assert {(r["source"], r["client"], r["tool"]) for r in rows} >= {("web", "web", "get_run")}


async def test_the_workflow_page_opens_the_asked_action() -> None:
    definition = ("name: ci\non:\n  push: {}\nactions:\n  - name: checkout\n    run: git checkout\n"
                  "  - name: test\n    run: pytest\n    env:\n      - A\nfinally: done\n")
    sections = split_definition(definition)
    assert [s.name for s in sections] == [None, "checkout", "test", None]
    assert sections[2].lines == [(7, "  - name: test"), (8, "    run: pytest"), (9, "    env:"), (10, "      - A")]
    assert sum(len(s.lines) for s in sections) == len(definition.splitlines())


async def test_a_workflow_page_marks_the_action_and_says_when_it_does_not_exist(
    app: App, verifier: TokenVerifier
) -> None:
    async with pages(app, verifier) as browser:
        await sign_in(browser, app, "dora", READER)
        page = (await browser.get("/workflows/1?action=test")).text
        assert re.search(r'<details class="action focused" id="action-test" open data-focus>', page)
        assert page.count(" open") == 1
        missing = (await browser.get("/workflows/1?action=deploy-to-mars")).text
        assert "has no action" in missing and "data-focus" not in missing


# --- proposals ------------------------------------------------------------------------------------------


async def test_an_operator_reviews_and_approves_exactly_the_hash_shown(app: App, verifier: TokenVerifier) -> None:
    proposal_id = await stage(app, "rerun_run", {"run_id": 11})
    proposal = await app.proposals.get(proposal_id)
    assert proposal is not None
    async with pages(app, verifier) as browser:
        await sign_in(browser, app, "bob", OPERATOR)
        listing = (await browser.get("/proposals")).text
        assert f'href="/proposals/{proposal_id}"' in listing and "rerun_run" in listing
        page = (await browser.get(f"/proposals/{proposal_id}")).text
        assert proposal.arguments_hash in page and field(page, "expect_hash") == proposal.arguments_hash
        assert "claude" in page and '"commit_sha"' in html.unescape(page)
        mismatch = await browser.post(f"/proposals/{proposal_id}", headers={"Origin": ORIGIN}, data={
            "csrf_token": csrf(page), "decision": "approve", "expect_hash": "0" * 64})
        assert mismatch.status_code == 403 and "look at it again" in mismatch.text
        done = await browser.post(f"/proposals/{proposal_id}", headers={"Origin": ORIGIN}, data={
            "csrf_token": csrf(page), "decision": "approve", "expect_hash": field(page, "expect_hash")})
        assert done.status_code == 303
        after = (await browser.get(f"/proposals/{proposal_id}")).text
        assert "Succeeded" in after and '<strong class="decided-by">bob</strong>' in after
        new_run = await app.db.fetch_one("SELECT MAX(id) AS id FROM runs WHERE rerun_of = 11")
        assert new_run is not None and f'<a href="/runs/{new_run["id"]}">Open run' in after
        assert 'name="decision"' not in after
    decided = await app.proposals.get(proposal_id)
    assert decided is not None and decided.status == "succeeded" and decided.decided_by == "bob"


async def test_reject_needs_a_reason_and_self_approval_is_refused_with_the_reason(
    app: App, verifier: TokenVerifier
) -> None:
    own = await stage(app, "rerun_run", {"run_id": 11}, subject="bob", scopes=(*AGENT, "proposals:decide"))
    async with pages(app, verifier) as browser:
        await sign_in(browser, app, "bob", OPERATOR)
        page = (await browser.get(f"/proposals/{own}")).text
        mine = await browser.post(f"/proposals/{own}", headers={"Origin": ORIGIN}, data={
            "csrf_token": csrf(page), "decision": "approve", "expect_hash": field(page, "expect_hash")})
        assert mine.status_code == 403 and "another operator must approve it" in mine.text
        empty = await browser.post(f"/proposals/{own}", headers={"Origin": ORIGIN}, data={
            "csrf_token": csrf(page), "decision": "reject", "reason": "   "})
        assert empty.status_code == 400 and "needs a reason" in empty.text
        rejected = await browser.post(f"/proposals/{own}", headers={"Origin": ORIGIN}, data={
            "csrf_token": csrf(page), "decision": "reject", "reason": "not on a Friday"})
        assert rejected.status_code == 303
        after = (await browser.get(f"/proposals/{own}")).text
        assert "Rejected" in after and "not on a Friday" in after
        again = await browser.post(f"/proposals/{own}", headers={"Origin": ORIGIN}, data={
            "csrf_token": csrf(page), "decision": "reject", "reason": "twice"})
        assert again.status_code == 409 and "not pending any more" in again.text


async def test_without_proposals_decide_a_person_sees_their_own_proposals_and_no_buttons(
    app: App, verifier: TokenVerifier
) -> None:
    mine = await stage(app, "rerun_run", {"run_id": 11}, subject="claude")
    others = await stage(app, "rerun_run", {"run_id": 13}, subject="someone-else")
    async with pages(app, verifier) as browser:
        await sign_in(browser, app, "claude", AGENT)
        page = await browser.get(f"/proposals/{mine}")
        assert page.status_code == 200 and 'name="decision"' not in page.text and "proposals:decide" in page.text
        assert (await browser.get(f"/proposals/{others}")).status_code == 404
        listing = (await browser.get("/proposals?status=all")).text
        assert f"#{mine}<" in listing and f"#{others}<" not in listing
        tried = await browser.post(f"/proposals/{mine}", headers={"Origin": ORIGIN}, data={
            "csrf_token": csrf(page.text), "decision": "reject", "reason": "mine"})
        assert tried.status_code == 403


async def test_the_decision_part_and_the_assistants_banner(app: App, verifier: TokenVerifier) -> None:
    proposal_id = await stage(app, "rerun_run", {"run_id": 11})
    async with pages(app, verifier) as browser:
        await sign_in(browser, app, "bob", OPERATOR)
        part = (await browser.get(f"/proposals/{proposal_id}?part=decision")).text
        assert part.startswith('<section id="decision"') and 'data-version="pending"' in part
        banner = (await browser.get(f"/proposals/{proposal_id}", params={
            "aiAction": "edit", "aiPreview": json.dumps({"run": "<b>11</b>"})})).text
        assert 'id="ai-banner"' in banner and "&lt;b&gt;11&lt;/b&gt;" in banner
        ignored = (await browser.get(f"/proposals/{proposal_id}", params={"aiAction": "launch"})).text
        assert 'id="ai-banner"' not in ignored


async def test_the_proposals_list_pages_through_many(app: App, verifier: TokenVerifier) -> None:
    ids = [await stage(app, "rerun_run", {"run_id": run_id}) for run_id in range(11, 11 + 60)
           if (await app.db.fetch_one("SELECT status FROM runs WHERE id = ?", (run_id,)))["status"]  # type: ignore[index]
           not in ("queued", "running")]
    async with pages(app, verifier) as browser:
        await sign_in(browser, app, "bob", OPERATOR)
        first = (await browser.get("/proposals")).text
        shown = [int(i) for i in re.findall(r'<tr id="proposal-(\d+)"', first)]
        assert shown == sorted(ids, reverse=True)[:50]
        older = re.search(r'href="/proposals\?status=pending&amp;before=(\d+)"', first)
        assert older is not None
        second = (await browser.get(f"/proposals?status=pending&before={older.group(1)}")).text
        assert [int(i) for i in re.findall(r'<tr id="proposal-(\d+)"', second)] == sorted(ids, reverse=True)[50:]
        assert "data-live" not in second  # only the newest page is live
        assert (await browser.get("/proposals?status=bogus")).status_code == 400


async def test_settings_give_the_session_lifetime(env: dict[str, str]) -> None:
    assert load_settings(env=env).web_session_ttl == timedelta(hours=8)
    assert load_settings(env={**env, "KNECHT_WEB_SESSION_TTL": "30m"}).web_session_ttl == timedelta(minutes=30)
    from mcp_knecht.errors import ConfigError

    with pytest.raises(ConfigError, match=r"web session lifetime.*7 days"):
        load_settings(env={**env, "KNECHT_WEB_SESSION_TTL": "30d"})


def test_without_chromium_the_browser_tests_skip_with_the_reason_and_fail_in_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from tests import browser

    monkeypatch.setattr(browser, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y chromium"):
        browser.chromium_path()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="in CI the browser tests must run"):
        browser.chromium_path()
