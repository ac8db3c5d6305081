"""stdio: one client, one process; the actor is fixed by the token in KNECHT_TOKEN.

The token is checked at start and its expiry on every request, as over HTTP: a session does not
outlive its token (the same clock leeway as the verifier's).
"""

from __future__ import annotations

import time
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server

from mcp_knecht.app import App
from mcp_knecht.core.actor import Actor
from mcp_knecht.transports.mcp_server import server_for_app


def expiring(actor: Actor, leeway_seconds: int) -> Any:
    """A resolver that gives `actor` until its token's `exp` (plus leeway) has passed, then nobody."""
    expires = actor.claims.get("exp")

    def resolve(ctx: ServerRequestContext[Any]) -> Actor | None:
        if isinstance(expires, int | float) and time.time() > expires + leeway_seconds:
            return None
        return actor

    return resolve


async def serve_stdio(app: App, actor: Actor, *, leeway_seconds: int = 30) -> None:
    server = server_for_app(app, expiring(actor, leeway_seconds))
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
