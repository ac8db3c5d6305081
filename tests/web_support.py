"""Shared pieces of the web page's tests: the pages in memory, signing in, staging proposals."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from starlette.applications import Starlette

from mcp_knecht.app import App
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.auth import TokenVerifier
from mcp_knecht.web import web_routes
from mcp_knecht.web.diagnosis import DiagnosisSource
from mcp_knecht.web.store import LoginLinks, WebSchema

OPERATOR = ("proposals:decide", "proposals:read", "projects:read", "workflows:read", "runs:read", "logs:read",
            "variables:read")
AGENT = ("projects:read", "workflows:read", "workflows:write", "runs:read", "runs:write", "logs:read",
         "variables:read", "variables:write", "proposals:read")
ORIGIN = "http://testserver"


@asynccontextmanager
async def pages(app: App, verifier: TokenVerifier, *, diagnosis: DiagnosisSource | None = None,
                base_url: str = ORIGIN) -> AsyncIterator[httpx.AsyncClient]:
    """The web routes in memory, and a client (a browser without scripts) that keeps cookies."""
    asgi = Starlette(routes=web_routes(app, verifier, public_url=base_url, diagnosis=diagnosis))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url=base_url,
                                 follow_redirects=False) as client:
        yield client


def field(html: str, name: str) -> str:
    found = re.search(rf'name="{re.escape(name)}" value="([^"]*)"', html)
    assert found, f"no field {name!r} in the page"
    return found.group(1)


def csrf(html: str) -> str:
    found = re.search(r'<meta name="csrf-token" content="([^"]*)"', html)
    assert found and found.group(1), "no CSRF token in the page"
    return found.group(1)


async def link_for(app: App, subject: str, scopes: Iterable[str]) -> str:
    return await LoginLinks(WebSchema(app.db), app.keys).create(subject, list(scopes))


async def use_link(client: httpx.AsyncClient, secret: str) -> httpx.Response:
    """Open the link's page and press "Continue", as a person would."""
    page = await client.get("/login", params={"link": secret})
    return await client.post("/login", data={"login_csrf": field(page.text, "login_csrf"), "link": secret,
                                             "next": "/"}, headers={"Origin": str(client.base_url).rstrip("/")})


async def sign_in(client: httpx.AsyncClient, app: App, subject: str, scopes: Iterable[str]) -> None:
    signed_in = await use_link(client, await link_for(app, subject, scopes))
    assert signed_in.status_code == 303, signed_in.text


async def stage(app: App, tool: str, arguments: dict[str, Any], subject: str = "claude",
                scopes: Iterable[str] = AGENT) -> int:
    staged = await app.gate.call_tool(Actor(subject, "claude-code", frozenset(scopes)), tool, arguments)
    assert staged.outcome == "staged", staged.text
    assert staged.data is not None
    return int(staged.data["id"])
