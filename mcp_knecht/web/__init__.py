"""The web page for people, served beside /mcp by `mcp-knecht serve --transport http`.

    /                     projects, each with a status card: the latest run, a failed run's diagnosis
    /login, /logout       a one-time link (`mcp-knecht login-link`) or a pasted token starts a session
    /runs/{id}            a run, its actions, each action's log (bounded, paged, newest lines first)
    /workflows/{id}       a workflow's definition, `?action=NAME` opened and scrolled into view
    /proposals            proposals, live; `/proposals/{id}` the frozen call, Approve / Reject
    /static/…             our stylesheet and scripts (no CDN, no inline script)

Every page reads through the gate as the session's actor (subject and scopes, like a token's), so
it shows what a token with those scopes could read, scrubbed the same way, and audited as `web`.

Hooks for the parts built elsewhere: `diagnosis.run_diagnosis` (the card's diagnosis) and
`Sessions.actor` (how the chat endpoint accepts a web session; `session_actor` below).
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.routing import Route

from mcp_knecht.app import App
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.auth import TokenVerifier
from mcp_knecht.web import ci_pages, login, proposal_pages
from mcp_knecht.web.diagnosis import DiagnosisSource, diagnosis_source
from mcp_knecht.web.pages import Web
from mcp_knecht.web.security import static_route
from mcp_knecht.web.sessions import Sessions
from mcp_knecht.web.store import LoginLinks, WebSchema

__all__ = ["build_web", "session_actor", "web_routes"]

STATIC = Path(__file__).resolve().parent / "static"
_SESSIONS: dict[int, Sessions] = {}
"""The sessions of each app's web (by the id of its store), so that `session_actor` checks a session
exactly as the pages do."""


def build_web(app: App, verifier: TokenVerifier, *, public_url: str | None = None,
              diagnosis: DiagnosisSource | None = None) -> Web:
    schema = WebSchema(app.db)
    sessions = Sessions(schema, app.keys, ttl=app.settings.web_session_ttl, public_url=public_url)
    _SESSIONS[id(app.db)] = sessions
    return Web(app, verifier, sessions, LoginLinks(schema, app.keys), diagnosis or diagnosis_source(app))


def web_routes(app: App, verifier: TokenVerifier, *, public_url: str | None = None,
               diagnosis: DiagnosisSource | None = None) -> list[Route]:
    """The pages and their static files, to be served beside /mcp (after the API routes)."""
    web = build_web(app, verifier, public_url=public_url, diagnosis=diagnosis)
    return [*ci_pages.routes(web), *login.routes(web), *proposal_pages.routes(web),
            static_route(STATIC)]


async def session_actor(app: App, request: Request) -> Actor | None:
    """The actor of `request`'s web session, or None — for routes outside the pages that also accept a
    session (the chat: "scope ai:chat, or a web session holding it"). A state-changing request must
    carry the session's CSRF token in `X-CSRF-Token` and come from this site."""
    sessions = _SESSIONS.get(id(app.db))
    if sessions is None:
        sessions = _SESSIONS[id(app.db)] = Sessions(WebSchema(app.db), app.keys, ttl=app.settings.web_session_ttl)
    return await sessions.actor(request)
