"""What every page shares: who is signed in, the page wrapper, forms with their CSRF check.

    @web.page                       # a signed-in person: `view.actor`; else a redirect to /login
    async def run_page(view: View) -> Response: ...

The wrapper turns a `PageError` into an error page with its status, anything unexpected into a
500 page with a reference (the log has the details), and puts the security headers on every
response.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import msgspec
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from mcp_knecht.app import App
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.auth import TokenVerifier
from mcp_knecht.web.diagnosis import DiagnosisSource
from mcp_knecht.web.reads import PageError
from mcp_knecht.web.render import Renderer
from mcp_knecht.web.security import secure_headers
from mcp_knecht.web.sessions import CSRF_FIELD, Session, Sessions, same_origin
from mcp_knecht.web.store import LoginLinks

logger = logging.getLogger(__name__)

CHAT_SCOPE = "ai:chat"
MAX_FORM_BYTES = 65_536


class View(msgspec.Struct):
    """One request to a page: the request, and the session behind it (None on public pages)."""

    request: Request
    session: Session | None
    web: Web
    extra: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def actor(self) -> Actor:
        assert self.session is not None, "a signed-in page"
        return self.session.actor

    @property
    def app(self) -> App:
        return self.web.app

    def context(self, **values: Any) -> dict[str, Any]:
        """What the base template needs, and the page's own values."""
        session = self.session
        return {
            "session": session,
            "csrf": self.web.sessions.csrf_token(session) if session else "",
            "chat": bool(session and session.actor.holds(CHAT_SCOPE)),
            "path": self.request.url.path,
            **values,
        }

    def render(self, template: str, status: int = 200, /, **values: Any) -> Response:
        return self.web.renderer.response(template, self.context(**values), status)

    def fragment(self, template: str, **values: Any) -> str:
        return self.web.renderer.html(template, self.context(**values))

    async def form(self) -> FormData:
        """The posted form, refused unless it carries this session's CSRF token and comes from us."""
        if int(self.request.headers.get("content-length") or 0) > MAX_FORM_BYTES:
            raise PageError(400, "The form is too large.")
        form = await self.request.form(max_files=0, max_fields=20)
        token = form.get(CSRF_FIELD)
        if (self.session is None or not same_origin(self.request)
                or not self.web.sessions.csrf_ok(self.session, token if isinstance(token, str) else None)):
            raise PageError(403, "This form was not sent from this site's own page (its CSRF token is missing or "
                                 "wrong). Reload the page and try again.", title="Refused")
        return form


PageHandler = Callable[[View], Awaitable[Response]]


class Web(msgspec.Struct):
    app: App
    verifier: TokenVerifier
    sessions: Sessions
    links: LoginLinks
    diagnosis: DiagnosisSource
    renderer: Renderer = msgspec.field(default_factory=Renderer)

    def page(self, handler: PageHandler, *, public: bool = False) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            view = View(request, None, self)
            try:
                view.session = await self.sessions.current(request)
                if view.session is None and not public:
                    response: Response = _to_login(request)
                else:
                    response = await handler(view)
            except PageError as exc:
                response = self.error_page(view, exc)
            except Exception:
                reference = uuid.uuid4().hex[:12]
                logger.exception("Internal error on %s %s (reference %s)", request.method, request.url.path[:200],
                                 reference)
                response = self.error_page(view, PageError(
                    500, f"Internal error (reference {reference}); the server log has details."))
            return secure_headers(response, tls=self.sessions.secure(request))

        return endpoint

    def error_page(self, view: View, error: PageError) -> Response:
        return view.render("error.html", error.status, error=error)


def _to_login(request: Request) -> Response:
    if request.method != "GET" or "text/event-stream" in request.headers.get("accept", ""):
        return Response("Sign in first.", status_code=401, media_type="text/plain")
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)


def local_target(value: str | None, default: str = "/") -> str:
    """Where to go after signing in: a path on this site only (never `//host` or a scheme)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value or len(value) > 2000:
        return default
    return value


def positive_int(value: str | None, what: str, *, default: int | None = None) -> int | None:
    if value is None or value == "":
        return default
    if not value.isdigit() or not 0 < int(value) < 2**63:
        raise PageError(400 if what != "id" else 404, f"{what} must be a positive whole number.")
    return int(value)
