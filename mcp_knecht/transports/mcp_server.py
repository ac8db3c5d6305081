"""The MCP face of the gate: a low-level SDK server whose tool list is computed per caller."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from mcp_knecht import __version__
from mcp_knecht.app import App
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.gate import Gate, GateResult
from mcp_knecht.core.policy_text import policy_note
from mcp_knecht.core.prompts import Prompt
from mcp_knecht.core.tools import MCP, Tool
from mcp_knecht.errors import KnechtError
from mcp_knecht.transports.proposal_feed import ProposalFeed

logger = logging.getLogger(__name__)

ActorResolver = Callable[[ServerRequestContext[Any]], Actor | None]


def _mcp_tool(tool: Tool, note: str) -> types.Tool:
    description = tool.description + (f"\n\n{note}" if note else "")
    annotations = tool.annotations()
    return types.Tool(
        name=tool.name,
        title=tool.title,
        description=description,
        input_schema=tool.input_schema,
        output_schema=tool.output_schema,
        annotations=types.ToolAnnotations(
            title=annotations.get("title"),  # type: ignore[arg-type]
            read_only_hint=bool(annotations["readOnlyHint"]),
            destructive_hint=bool(annotations["destructiveHint"]),
            idempotent_hint=bool(annotations["idempotentHint"]),
            open_world_hint=False,
        ),
    )


def _call_result(result: GateResult) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=result.text)],
        structured_content=result.data,
        is_error=result.is_error,
    )


_INTERNAL_ERROR = types.CallToolResult(
    content=[types.TextContent(type="text", text="Internal error; the server log has details.")],
    is_error=True,
)

_NOT_AUTHENTICATED = types.CallToolResult(
    content=[types.TextContent(type="text", text=(
        "Not authenticated: this request carries no valid token, or the session's token has expired. Mint a new "
        "one (mcp-knecht token mint --sub NAME --profile claude-code) and reconnect with it."))],
    is_error=True,
)


def _mcp_prompt(prompt: Prompt) -> types.Prompt:
    return types.Prompt(
        name=prompt.name,
        title=prompt.title,
        description=prompt.description,
        arguments=[types.PromptArgument(name=a.name, description=a.description, required=a.required)
                   for a in prompt.arguments],
    )


def _no_header_arguments(name: str) -> None:
    return None


def build_mcp_server(
    gate: Gate,
    resolve_actor: ActorResolver,
    prompts: Sequence[Prompt] = (),
    feed: ProposalFeed | None = None,
    instructions: str | None = None,
) -> Server[Any]:
    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        actor = resolve_actor(ctx)
        if actor is None:
            return types.ListToolsResult(tools=[])
        policy = gate.policy()
        tools = [_mcp_tool(tool, policy_note(tool, policy, actor)) for tool in gate.visible_tools(actor)]
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        actor = resolve_actor(ctx)
        if actor is None:
            return _NOT_AUTHENTICATED
        try:
            result = await gate.call_tool(actor, params.name, params.arguments, source=MCP)
        except Exception:  # the gate answers every tool failure itself; this is the last line
            logger.exception("The gate failed on %s", params.name[:200])
            return _INTERNAL_ERROR
        return _call_result(result)

    def prompts_for(actor: Actor | None) -> dict[str, Prompt]:
        """The prompts `actor` can follow: its scopes hold the prompt's, and it may call every tool named."""
        if actor is None or not prompts:
            return {}
        callable_tools = {tool.name for tool in gate.visible_tools(actor)}
        return {p.name: p for p in prompts if actor.holds(p.scope) and callable_tools.issuperset(p.tools)}

    async def list_prompts(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[_mcp_prompt(p) for p in prompts_for(resolve_actor(ctx)).values()])

    async def get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> types.GetPromptResult:
        prompt = prompts_for(resolve_actor(ctx)).get(params.name)
        if prompt is None:  # unknown and out of scope look the same, as with tools
            raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {params.name!r}.")
        missing = [a.name for a in prompt.arguments if a.required and not (params.arguments or {}).get(a.name)]
        if missing:
            raise MCPError(types.INVALID_PARAMS, f"Prompt {prompt.name} needs: {', '.join(missing)}.")
        try:
            text = await prompt.render(dict(params.arguments or {}))
        except KnechtError as exc:
            raise MCPError(types.INVALID_PARAMS, exc.message) from None
        return types.GetPromptResult(
            description=prompt.description,
            messages=[types.PromptMessage(role="user", content=types.TextContent(type="text", text=text))],
        )

    handlers: dict[str, Any] = {"on_list_prompts": list_prompts, "on_get_prompt": get_prompt} if prompts else {}
    if feed is not None:
        handlers.update(feed.handlers(resolve_actor))
    return Server(
        "mcp-knecht",
        version=__version__,
        instructions=instructions,
        # No tool maps an argument to an `Mcp-Param-*` header (`x-mcp-header`), so there is nothing
        # to check against; without this the SDK runs the caller's whole `tools/list` before every
        # 2026-07-28 `tools/call` over HTTP just to find that out.
        get_tool_input_schema=_no_header_arguments,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        **handlers,
    )


def server_for_app(app: App, resolve_actor: ActorResolver) -> Server[Any]:
    """The MCP server of an assembled app: its gate, prompts and proposal notifications."""
    feed = ProposalFeed(app.gate, app.watcher, listens_per_subject=app.settings.sessions_per_subject)
    return build_mcp_server(app.gate, resolve_actor, app.prompts, feed,
                            instructions=app.instructions)
