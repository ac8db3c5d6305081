"""stdio: one client, one process; the actor is fixed by the token in KNECHT_TOKEN."""

from __future__ import annotations

from mcp.server.stdio import stdio_server

from mcp_knecht.app import App
from mcp_knecht.core.actor import Actor
from mcp_knecht.transports.mcp_server import server_for_app


async def serve_stdio(app: App, actor: Actor) -> None:
    server = server_for_app(app, lambda ctx: actor)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
