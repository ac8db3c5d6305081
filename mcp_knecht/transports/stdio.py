"""stdio: one client, one process; the actor is fixed by the token in KNECHT_TOKEN.

The token is checked at start and its expiry on every request, as over HTTP: a session does not
outlive its token (the same clock leeway as the verifier's). Without a usable token at start the
process still answers, with a session that says why and what to do (`serve_refusal`).
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


REFUSAL_TOOL = "knecht_token_problem"


async def serve_refusal(message: str) -> None:
    """A session that only says why this server cannot serve and what to do: clients such as
    Claude Code show a connected server with one tool, not just a closed connection, and the model
    reads the message (instructions, the tool's description and its result)."""
    import mcp_types as types
    from mcp.server import Server

    from mcp_knecht import __version__

    tool = types.Tool(
        name=REFUSAL_TOOL, title="mcp-knecht needs a new token", description=message,
        input_schema={"type": "object", "properties": {}, "additionalProperties": False},
        annotations=types.ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                                          open_world_hint=False),
    )

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool])

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)

    server: Server[Any] = Server("mcp-knecht", version=__version__, instructions=message,
                                 on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
