"""Signing in and out.

    GET  /login?link=SECRET   "Continue as alice" — shows what the link grants; does not use it
    POST /login               link=SECRET (used once) or token=JWT (verified as for /mcp) → a session
    GET  /logout              a page with the sign-out button;  POST /logout ends the session

Using a link takes a click on our own page (a POST): a link previewer that fetches the URL cannot
use it up, and the session cookie is set by a same-site response, which `SameSite=Strict` needs.
The sign-in form itself is protected against login CSRF by a double-submit cookie.
"""

from __future__ import annotations

import hmac
import secrets

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from mcp_knecht.errors import AuthError
from mcp_knecht.web.pages import MAX_FORM_BYTES, View, Web, local_target
from mcp_knecht.web.reads import PageError
from mcp_knecht.web.sessions import expiry_of, same_origin
from mcp_knecht.web.store import Grant

_LOGIN_FIELD = "login_csrf"
_MAX_TOKEN = 16_384


def _login_cookie(web: Web, request: Request) -> str:
    return "__Host-knecht-login" if web.sessions.secure(request) else "knecht-login"


def _login_form(view: View, status: int = 200, *, error: str | None = None, link: str = "",
                grant: Grant | None = None, next_path: str | None = None) -> Response:
    nonce = secrets.token_urlsafe(18)
    response = view.render("login.html", status, error=error, link=link, grant=grant, login_csrf=nonce,
                           next=local_target(next_path or view.request.query_params.get("next")),
                           signed_out="signed_out" in view.request.query_params)
    response.set_cookie(_login_cookie(view.web, view.request), nonce, max_age=1800, path="/", httponly=True,
                        samesite="strict", secure=view.web.sessions.secure(view.request))
    return response


async def login_page(view: View) -> Response:
    link = view.request.query_params.get("link", "")
    if not link:
        return _login_form(view)
    grant = await view.web.links.peek(link)
    if grant is None:
        return _login_form(view, 410, error="This sign-in link was used already or has expired. Ask for a new "
                                            "one (`mcp-knecht login-link`), or paste a token below.")
    return _login_form(view, link=link, grant=grant)


async def login(view: View) -> Response:
    request = view.request
    if int(request.headers.get("content-length") or 0) > MAX_FORM_BYTES:
        raise PageError(400, "The form is too large.")
    form = await request.form(max_files=0, max_fields=10)
    nonce, cookie = form.get(_LOGIN_FIELD), request.cookies.get(_login_cookie(view.web, request))
    wanted = form.get("next")
    next_path = local_target(wanted if isinstance(wanted, str) else None)
    if not (same_origin(request) and isinstance(nonce, str) and cookie
            and hmac.compare_digest(nonce, cookie)):
        return _login_form(view, 403, error="The sign-in form expired or was not sent from this page. "
                                            "Try again.", next_path=next_path)
    link, token = form.get("link"), form.get("token")
    grant: Grant | None
    if isinstance(link, str) and link:
        grant = await view.web.links.redeem(link)
        if grant is None:
            return _login_form(view, 410, error="This sign-in link was used already or has expired. Ask for a "
                                                "new one (`mcp-knecht login-link`).", next_path=next_path)
    elif isinstance(token, str) and token.strip():
        if len(token) > _MAX_TOKEN:
            return _login_form(view, 400, error="That is not a token.", next_path=next_path)
        try:
            actor = await view.web.verifier.averify(token.strip())
        except AuthError as exc:
            return _login_form(view, 401, error=f"The token was refused: {exc.message}", next_path=next_path)
        grant = Grant(actor.subject, actor.scopes, expiry_of(actor.claims))
    else:
        return _login_form(view, 400, error="Paste a token, or open a sign-in link.", next_path=next_path)
    response = RedirectResponse(next_path, status_code=303)
    if view.session is not None:
        await view.web.sessions.end(view.session)
    await view.web.sessions.start(grant, request, response)
    response.delete_cookie(_login_cookie(view.web, request), path="/")
    return response


async def logout_page(view: View) -> Response:
    return view.render("logout.html")


async def logout(view: View) -> Response:
    await view.form()
    response = RedirectResponse("/login?signed_out=1", status_code=303)
    assert view.session is not None
    await view.web.sessions.end(view.session)
    view.web.sessions.forget(view.request, response)
    return response


def routes(web: Web) -> list[Route]:
    return [
        Route("/login", web.page(login_page, public=True), methods=["GET"]),
        Route("/login", web.page(login, public=True), methods=["POST"]),
        Route("/logout", web.page(logout_page), methods=["GET"]),
        Route("/logout", web.page(logout), methods=["POST"]),
    ]
